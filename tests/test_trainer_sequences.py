"""Which tokens are trained on: only those the model generated, with a real chat template and tool calls."""

import math

import pytest
from openai.types.chat.chat_completion import Choice

from ruler import Trajectory, TrajectoryGroup
from trainer.chat import parse_tool_calls, prompt_ids, template_messages
from trainer.config import TrainConfig
from trainer.sequences import TokenizeReport, tokenize_trajectory
from trainer.training import prepare

TOOLS = [{"type": "function", "function": {"name": "search_inbox", "description": "Search the inbox.",
                                           "parameters": {"type": "object", "properties": {
                                               "keywords": {"type": "array", "items": {"type": "string"}}}}}}]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from judges.embedded import embedded_model_path

    return AutoTokenizer.from_pretrained(embedded_model_path())


def sampled_choice(tokenizer, text, *, tool_calls=None, finish="stop"):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    content, calls = parse_tool_calls(text)
    return Choice.model_validate({
        "index": 0, "finish_reason": "tool_calls" if calls else finish,
        "message": {"role": "assistant", "content": content, "tool_calls": calls or None},
        "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": -0.5 - i / 100, "bytes": None,
                                  "top_logprobs": []} for i, t in enumerate(ids)]}})


def test_only_generated_tokens_are_masked_in_a_multi_turn_tool_conversation(tokenizer):
    call_text = '<tool_call>{"name": "search_inbox", "arguments": {"keywords": ["budget"]}}</tool_call>'
    first = sampled_choice(tokenizer, call_text)
    assert first.message.tool_calls[0].function.name == "search_inbox" and first.message.content is None
    final = Choice.model_validate({"index": 0, "finish_reason": "stop", "logprobs": None,
                                   "message": {"role": "assistant", "content": "The budget meeting is Monday."}})
    items = [{"role": "system", "content": "You answer questions about email."},
             {"role": "user", "content": "When is the budget meeting?"}, first,
             {"role": "tool", "tool_call_id": first.message.tool_calls[0].id, "content": '[{"id": "<1>"}]'},
             final]
    report = TokenizeReport()
    seq = tokenize_trajectory(tokenizer, items, TOOLS, 1.0, max_seq_length=4096, report=report)
    trained = [t for t, m in zip(seq.input_ids, seq.mask) if m]
    # exactly the two assistant turns, each ending with its end-of-turn token, are trained on
    assert tokenizer.decode(trained) == call_text + "<|im_end|>" + "The budget meeting is Monday.<|im_end|>"
    prompt = tokenizer.decode([t for t, m in zip(seq.input_ids, seq.mask) if not m])
    assert "When is the budget meeting?" in prompt and '[{"id": "<1>"}]' in prompt and "search_inbox" in prompt
    assert "budget meeting is Monday" not in prompt
    # the whole sequence is what the template renders for the same conversation (no doubled end-of-turn)
    plain = [i if isinstance(i, dict) else {"role": "assistant", "content": i.message.content or call_text}
             for i in items]
    msgs, _ = template_messages(plain, TOOLS, tokenizer)
    assert tokenizer.decode(seq.input_ids) == tokenizer.apply_chat_template(msgs, tokenize=False)
    # the server's prompt for the first turn is the sequence's prefix: training sees what sampling saw
    head = prompt_ids(tokenizer, items[:2], TOOLS)
    assert seq.input_ids[:len(head)] == head and not any(seq.mask[:len(head)])
    # sampled logprobs kept for the first turn; the re-tokenized second turn has none (NaN)
    lps = [lp for lp, m in zip(seq.old_logprobs, seq.mask) if m]
    assert lps[0] == pytest.approx(-0.5) and math.isnan(lps[-1])
    assert report.choices_without_token_ids == 1 and report.sequences == 1


def test_long_sequences_are_truncated_and_prompt_only_ones_skipped(tokenizer):
    choice = sampled_choice(tokenizer, "Paris " * 40)
    items = [{"role": "user", "content": "Capital of France?"}, choice]
    report = TokenizeReport()
    seq = tokenize_trajectory(tokenizer, items, None, 0.5, max_seq_length=50, report=report)
    assert len(seq.input_ids) == 50 and report.truncated == 1
    assert tokenize_trajectory(tokenizer, items, None, 0.5, max_seq_length=20, report=report) is None
    assert tokenize_trajectory(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                               None, 1.0, max_seq_length=99, report=report) is None
    assert report.skipped == {"no generated tokens within max_seq_length": 1, "no generated tokens": 1}
    with pytest.raises(ValueError):
        tokenize_trajectory(tokenizer, items, None, float("nan"), max_seq_length=99, report=report)


def test_groups_without_signal_are_dropped_and_counted(tokenizer):
    def traj(reward, text="Paris"):
        return Trajectory(messages_and_choices=[{"role": "user", "content": "Capital?"},
                                                sampled_choice(tokenizer, text)], reward=reward)

    groups = [TrajectoryGroup([traj(1.0), traj(0.0, "Rome")]),          # trained on
              TrajectoryGroup([traj(1.0)]),                             # one trajectory
              TrajectoryGroup([traj(0.5), traj(0.5)]),                  # all equal
              TrajectoryGroup([traj(float("nan")), traj(1.0)]),         # NaN reward
              TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": "a"},
                                                                {"role": "assistant", "content": "b"}], reward=1),
                               Trajectory(messages_and_choices=[{"role": "user", "content": "a"},
                                                                {"role": "assistant", "content": "c"}], reward=0)])]
    seqs, stats = prepare(groups, tokenizer, TrainConfig(), 256)
    assert len(seqs) == 2 and sorted(s.advantage for s in seqs) == pytest.approx([-1.0, 1.0], abs=1e-4)
    assert stats["skipped"] == {"group with fewer than 2 trajectories": 1, "group with all-equal rewards": 1,
                                "group with a NaN/inf/non-numeric reward": 1, "no generated tokens": 2}
    dr, _ = prepare(groups[:1], tokenizer, TrainConfig(loss="dr_grpo"), 256)
    assert sorted(s.advantage for s in dr) == pytest.approx([-0.5, 0.5])  # Dr. GRPO: not divided by the std


def test_tool_call_blocks_parse_and_bad_ones_stay_text():
    content, calls = parse_tool_calls('Let me look. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    assert content == "Let me look." and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert parse_tool_calls("<tool_call>{broken</tool_call>") == ("<tool_call>{broken</tool_call>", [])
    assert parse_tool_calls("plain answer") == ("plain answer", [])


def test_sampled_tokens_are_found_where_the_openai_client_and_litellm_put_them():
    from trainer.sequences import _sampled

    base = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}, "logprobs": None}
    direct = Choice.model_validate({**base, "token_ids": [5, 6], "token_logprobs": [-0.1, -0.2]})
    via_litellm = Choice.model_validate({**base, "token_ids": [5, 6], "provider_specific_fields": {
        "token_ids": [5, 6], "token_logprobs": [-0.1, -0.2]}})
    assert _sampled(direct) == _sampled(via_litellm) == ([5, 6], [-0.1, -0.2])
    assert _sampled(Choice.model_validate(base)) is None
