"""Token-exact training sequences: for every assistant turn the training context is exactly the prompt the
server tokenized (`prompt_token_ids`) and the trained tokens exactly what it sampled (`token_ids`), with the
CPU server's real SmolLM2 generations, for several chat-template shapes. The tests that sample from the server
load the model and are slow; those of rendering, parsing and refusals need only SmolLM2's tokenizer and run in
the default tier."""

import json
import math

import pytest
from openai.types.chat.chat_completion import Choice

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.trainer.chat import HERMES_CHATML_TEMPLATE, parse_tool_calls, pick_chat_template, prompt_ids
from ruler_rl.trainer.config import TrainConfig
from ruler_rl.trainer.sequences import MissingTokenIdsError, SequenceReport, trained_spans, training_sequences
from ruler_rl.trainer.server import BackgroundServer, Served, create_server_app
from ruler_rl.trainer.training import prepare

TOOLS = [{"type": "function", "function": {"name": "search_inbox", "description": "Search the inbox.",
                                           "parameters": {"type": "object", "properties": {
                                               "keywords": {"type": "array", "items": {"type": "string"}}},
                                               "required": ["keywords"]}}}]

# Chat templates in the shapes of real model families, written for these tests (SmolLM2's tokenizer renders
# them; their special markers are plain text to it, which is fine: the property is about token identity).
QWEN25 = """{%- if tools %}<|im_start|>system
{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are Qwen, a helpful assistant.' }}

# Tools

You may call one or more functions to assist with the user query.

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object within <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% else %}<|im_start|>system
You are Qwen, a helpful assistant.<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'assistant' and m.tool_calls -%}
<|im_start|>assistant
{% if m.content %}{{ m.content }}{% endif -%}
{%- for tc in m.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' %}<|im_start|>user{% endif %}
<tool_response>
{{ m.content }}
</tool_response>
{%- if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>
{% endif -%}
{%- else -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""

# Qwen3's shape: like Qwen2.5, plus think blocks: the generation prompt carries an empty think block when
# thinking is off, and earlier assistant turns are shown without their reasoning.
QWEN3 = QWEN25.replace("You are Qwen, a helpful assistant.", "").replace(
    """{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}""", """{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif -%}""").replace(
    """<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>""", """<|im_start|>{{ m.role }}
{{ (m.content or '').split('</think>')[-1].lstrip('\\n') }}<|im_end|>""")

LLAMA31 = """{{- bos_token }}<|start_header_id|>system<|end_header_id|>

{% if tools %}Environment: ipython
{% endif %}Cutting Knowledge Date: December 2023

{{ messages[0]['content'] if messages[0]['role'] == 'system' else '' }}<|eot_id|>
{%- for m in messages -%}
{%- if m.role == 'system' -%}
{%- elif m.role == 'user' and tools and loop.index0 == (1 if messages[0]['role'] == 'system' else 0) -%}
<|start_header_id|>user<|end_header_id|>

Given the following functions, respond with a JSON for a function call with its proper arguments.
Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.
{% for t in tools %}{{ t | tojson }}
{% endfor %}
{{ m.content }}<|eot_id|>
{%- elif m.role == 'assistant' and m.tool_calls -%}
<|start_header_id|>assistant<|end_header_id|>

{% for tc in m.tool_calls %}{"name": "{{ tc.function.name }}", "parameters": {{ tc.function.arguments | tojson }}}{% endfor %}<|eot_id|>
{%- elif m.role == 'tool' -%}
<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else -%}
<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif -%}"""


def _call(i, keywords):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function",
         "function": {"name": "search_inbox", "arguments": json.dumps({"keywords": keywords})}}]}


# a few written examples (plain messages, never trained) so that greedy SmolLM2 answers with a tool call
FEW_SHOT = [{"role": "system", "content": "You search email with the search_inbox tool."}]
for _i, (_q, _kw) in enumerate([("Find emails about the gas contract.", ["gas", "contract"]),
                                ("Find emails about the holiday party.", ["holiday", "party"]),
                                ("Find emails about the power plant.", ["power", "plant"])]):
    FEW_SHOT += [{"role": "user", "content": _q}, _call(_i, _kw), {"role": "tool", "tool_call_id": f"c{_i}",
                                                                     "content": "[]"},
                 {"role": "assistant", "content": "Nothing found."}]


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer (no model)."""
    from transformers import AutoTokenizer

    from ruler_rl.judges.embedded import embedded_model_path

    return AutoTokenizer.from_pretrained(embedded_model_path())


@pytest.fixture(scope="module")
async def served(tokenizer):
    """The CPU server over the real SmolLM2 engine, one served name per chat-template shape."""
    import threading

    import torch
    from transformers import AutoModelForCausalLM

    from ruler_rl.judges.embedded import embedded_model_path
    from ruler_rl.trainer.engine_transformers import TransformersEngine
    from ruler_rl.trainer.sequences import end_of_turn_ids

    model = AutoModelForCausalLM.from_pretrained(embedded_model_path(), dtype=torch.float32).eval()
    engine = TransformersEngine(model, tokenizer, threading.Lock(), stop_token_ids=end_of_turn_ids(tokenizer))
    default, _ = pick_chat_template(tokenizer)
    models = {name: Served(name, engine, tokenizer, 4096, chat_template=template, tool_parser=parser,
                           reasoning_parser=reasoning)
              for name, template, parser, reasoning in [("chatml", default, "hermes", None),
                                                        ("qwen25", QWEN25, "hermes", None),
                                                        ("qwen3", QWEN3, "hermes", "qwen3"),
                                                        ("llama31", LLAMA31, "llama3_json", None)]}
    server = BackgroundServer(create_server_app(models), "127.0.0.1")
    await server.start()
    from openai import AsyncOpenAI

    yield AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0), tokenizer, models
    await server.stop()


async def agent(client, name, *, extra=None, drop_tool_result=False):
    """Three turns: a (greedy, few-shot) tool call, an answer after the tool result, a reply to a follow-up."""
    items = [*FEW_SHOT, {"role": "user", "content": "Find emails about the budget meeting."}]
    replies = []

    def history():
        return [i if isinstance(i, dict) else {"role": "assistant", "content": i.message.content,
                                               "tool_calls": [c.model_dump() for c in i.message.tool_calls or []]
                                               or None} for i in items]

    async def turn(**kw):
        later = extra if replies else None  # the first (greedy) turn always renders the plain way
        reply = await client.chat.completions.create(model=name, messages=history(), tools=TOOLS, max_tokens=40,
                                                     extra_body=later or {}, **kw)
        replies.append(reply)
        items.append(reply.choices[0])
        return reply.choices[0]

    # greedy, except for the Llama shape, where SmolLM2 writes the call at this seed (its greedy answer is prose)
    first = await turn(**({"temperature": 1.0, "seed": 1} if name == "llama31" else {"temperature": 0}))
    call_id = first.message.tool_calls[0].id if first.message.tool_calls else "none"
    items.append({"role": "tool", "tool_call_id": call_id, "content": '[{"message_id": "<1@enron>"}]'})
    await turn(temperature=1.0, seed=3)
    if drop_tool_result:  # the agent edits its own history
        items[:] = [i for i in items if not (isinstance(i, dict) and i.get("role") == "tool"
                                             and i["tool_call_id"] == call_id)]
    items.append({"role": "user", "content": "Thanks. Who sent it?"})
    await turn(temperature=1.0, seed=4)
    return Trajectory(messages_and_choices=items, tools=TOOLS, reward=1.0), replies


def assert_token_exact(traj, replies, tokenizer, report=None):
    seqs = training_sequences(traj, tokenizer, report=report)
    spans = trained_spans(seqs)
    assert len(spans) == len(replies) == 3
    for (context, trained, old), reply in zip(spans, replies):
        choice = reply.choices[0]
        served_prompt = reply.model_extra["prompt_token_ids"]
        assert context == served_prompt                       # what the model saw, exactly
        assert trained == choice.model_extra["token_ids"]     # what it sampled, exactly
        assert old == choice.model_extra["token_logprobs"] and choice.logprobs is None  # compact: not asked for
    return seqs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["chatml", "qwen25", "qwen3", "llama31"])
async def test_every_turn_trains_on_the_served_prompt_and_the_sampled_tokens(served, name):
    client, tokenizer, _ = served
    extra = {"chat_template_kwargs": {"enable_thinking": False}} if name == "qwen3" else None
    traj, replies = await agent(client, name, extra=extra)
    first = replies[0].choices[0]
    assert first.message.tool_calls and first.message.tool_calls[0].function.name == "search_inbox", first.message
    report = SequenceReport()
    seqs = assert_token_exact(traj, replies, tokenizer, report)
    if name in ("chatml", "qwen25"):
        # an agent that appends to its history: the three turns share one sequence (one forward pass)
        assert len(seqs) == 1 and report.context_breaks == 0
    if name == "qwen3":
        # turn 2 was sampled after an empty think block (thinking off) that history does not show: turn 3's
        # prompt does not extend it, so turn 3 starts its own sequence instead of a context it never saw
        assert "<think>" in tokenizer.decode(replies[1].model_extra["prompt_token_ids"][-12:])
        assert [s.turns for s in seqs] == [2, 1] and report.context_breaks == 1
    if name == "qwen25":
        # tool-call arguments reach the template as an object (`| tojson`), not as a JSON string
        prompt = tokenizer.decode(replies[1].model_extra["prompt_token_ids"])
        assert '"arguments": {"keywords": ["budget", "meeting"]}' in prompt and '\\"keywords' not in prompt


@pytest.mark.slow
async def test_an_agent_that_drops_a_tool_result_gets_a_new_sequence_not_a_wrong_context(served):
    client, tokenizer, _ = served
    traj, replies = await agent(client, "chatml", drop_tool_result=True)
    report = SequenceReport()
    seqs = assert_token_exact(traj, replies, tokenizer, report)
    assert [s.turns for s in seqs] == [2, 1] and report.context_breaks == 1


@pytest.mark.slow
async def test_additional_histories_are_trained_too(served):
    client, tokenizer, _ = served
    traj, _ = await agent(client, "chatml")
    extra, extra_replies = await agent(client, "qwen25")
    both = Trajectory(messages_and_choices=traj.messages_and_choices, tools=TOOLS, reward=1.0,
                      additional_histories=[{"messages_and_choices": extra.messages_and_choices, "tools": TOOLS}])
    seqs = training_sequences(both, tokenizer)
    assert len(trained_spans(seqs)) == 6 and trained_spans(seqs)[3][0] == extra_replies[0].model_extra["prompt_token_ids"]


def test_choices_without_token_ids_are_refused_unless_off_policy_text_is_allowed(tokenizer):
    text_only = Choice.model_validate({"index": 0, "finish_reason": "stop", "logprobs": None,
                                       "message": {"role": "assistant", "content": "Monday."}})
    traj = Trajectory(messages_and_choices=[{"role": "user", "content": "When?"}, text_only], reward=1.0)
    with pytest.raises(MissingTokenIdsError, match=r"messages_and_choices\[1\] has no served token ids"):
        training_sequences(traj, tokenizer)
    report = SequenceReport()
    (seq,) = training_sequences(traj, tokenizer, allow_off_policy_text=True, report=report)
    trained = [t for t, m in zip(seq.token_ids, seq.trained) if m]
    assert tokenizer.decode(trained) == "Monday.<|im_end|>" and report.off_policy_turns == 1
    assert all(math.isnan(x) for x in seq.old_logprobs)  # no sampled logprobs: ratio 1 in training
    assert seq.token_ids[:-len(trained)] == prompt_ids(tokenizer, [{"role": "user", "content": "When?"}])
    # the batch: refused with the group and trajectory named, or trained with the count when allowed
    group = TrajectoryGroup([traj, Trajectory(messages_and_choices=traj.messages_and_choices, reward=0.0)])
    with pytest.raises(MissingTokenIdsError, match="group 0 trajectory 0"):
        prepare([group], tokenizer, TrainConfig(), 512)
    seqs, stats = prepare([group], tokenizer, TrainConfig(allow_off_policy_text=True), 512)
    assert len(seqs) == 2 and stats["off_policy_turns"] == 2


@pytest.mark.slow
async def test_aborted_turns_are_never_trained(served):
    client, tokenizer, _ = served
    reply = await client.chat.completions.create(model="chatml", messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, n=2, seed=1)
    ok, aborted = reply.choices
    aborted.finish_reason = "abort"
    group = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": "Hi"}, c], reward=r)
                             for c, r in ((ok, 1.0), (aborted, 0.0))])
    seqs, stats = prepare([group], tokenizer, TrainConfig(), 512)
    assert len(seqs) == 1 and stats["skipped"] == {"trajectory with an aborted turn": 1}


@pytest.mark.slow
async def test_the_server_speaks_vllms_shapes_and_refuses_what_it_cannot_do(served):
    client, _, _ = served
    import httpx

    base = str(client.base_url).rstrip("/")
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        r = await http.post("/chat/completions", json={"model": "chatml", "messages": [{"role": "user", "content": "Hi"}],
                                                       "max_tokens": 3, "logprobs": True, "top_logprobs": 2,
                                                       "return_tokens_as_token_ids": True})
        body = r.json()
        choice = body["choices"][0]
        assert body["prompt_token_ids"] == choice["prompt_token_ids"] and len(choice["token_ids"]) == 3
        entries = choice["logprobs"]["content"]
        assert [int(e["token"].split(":")[1]) for e in entries] == choice["token_ids"]
        assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] >= e["logprob"] for e in entries)
        for bad, fragment in (({"model": "chatml@7"}, "unknown adapter step"), ({"model": "nope"}, "not served"),
                              ({"tools": [{"type": "function", "function": {}}]}, "tools[0]"),
                              ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": TOOLS},
                               "not among the tools"),
                              ({"tool_choice": "required"}, "needs tools"),
                              ({"stream": True}, "stream"),
                              ({"top_logprobs": 2}, "top_logprobs needs logprobs"),
                              ({"messages": [{"role": "assistant", "content": "x", "tool_calls": "oops"}]},
                               "tool_calls must be a list")):
            res = await http.post("/chat/completions", json={"model": "chatml", "max_tokens": 2,
                                                             "messages": [{"role": "user", "content": "Hi"}], **bad})
            assert res.status_code in (400, 404) and fragment in res.json()["error"]["message"], (bad, res.text)


def test_malformed_trajectories_are_refused_by_the_one_validation_naming_group_trajectory_and_field():
    from ruler_rl.trajectory import TrajectoryError

    ok = Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                    reward=1.0)
    bad = Trajectory(messages_and_choices=[{"role": "user", "content": "hi"},
                                           {"role": "tool", "content": "[]"}], reward=0.0)
    with pytest.raises(TrajectoryError, match=r"group 1, trajectory 2, message 2: .*tool_call_id"):
        prepare([TrajectoryGroup([ok, ok]), TrajectoryGroup([ok, bad])], None, TrainConfig(), 512)
    nan = Trajectory(messages_and_choices=ok.messages_and_choices, reward=float("nan"))
    with pytest.raises(TrajectoryError, match=r"group 0, trajectory 2: reward is nan"):
        prepare([TrajectoryGroup([ok, nan])], None, TrainConfig(), 512)


def test_messages_reach_the_template_as_vllm_hands_them_over(tokenizer):
    from ruler_rl.trainer.chat import template_messages
    from ruler_rl.trajectory import choice_to_message

    msgs = template_messages([
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "u"},
        {"role": "assistant", "content": None, "tool_calls": None},
        {"role": "assistant", "content": "x", "tool_calls": [], "reasoning": "think"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "f", "arguments": '{"k": [1]}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"}])
    assert msgs[0] == {"role": "user", "content": "a\nb"}                 # parts joined, other fields dropped
    assert msgs[1] == {"role": "assistant", "content": ""}                 # tool_calls None: not shown at all
    assert msgs[2] == {"role": "assistant", "content": "x", "reasoning": "think", "reasoning_content": "think"}
    assert msgs[3]["tool_calls"][0]["function"]["arguments"] == {"k": [1]}  # an object, for `| tojson`
    assert msgs[4] == {"role": "tool", "content": "ok", "tool_call_id": "c"}
    # a template that tests `'tool_calls' in message` (Llama-3.1's way) renders a plain assistant turn
    strict = ("{% for m in messages %}{% if 'tool_calls' in m %}{{ m.tool_calls | length }} calls"
              "{% else %}{{ m.role }}: {{ m.content }}|{% endif %}{% endfor %}")
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo",
                                                                      "tool_calls": None}], chat_template=strict)
    assert tokenizer.decode(ids) == "user: hi|assistant: yo|"
    # the reasoning a server parsed goes back into history
    choice = Choice.model_validate({"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "42", "reasoning": "six times seven"}})
    assert choice_to_message(choice) == {"role": "assistant", "content": "42", "reasoning": "six times seven"}


def test_tool_and_reasoning_parsers_default_by_model_family():
    from ruler_rl.trainer.vllm_server import default_parsers

    assert default_parsers("qwen3", "<|im_start|>") == ("hermes", "qwen3")
    assert default_parsers("qwen2", None) == ("hermes", None)
    assert default_parsers("llama", "<|start_header_id|>{{ m }}") == ("llama3_json", None)
    assert default_parsers("llama", "<|im_start|>") == ("hermes", None)       # a Hermes fine-tune of Llama
    assert default_parsers("llama", "[INST] {{ m }}") == ("mistral", None)     # no <|python_tag|>: not llama3_json
    assert default_parsers("mistral", None) == ("mistral", None)


def test_tool_call_parsers_follow_vllms():
    content, calls = parse_tool_calls('Let me look.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    assert content == "Let me look." and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    bad = '<tool_call>{"name": "f"}</tool_call><tool_call>{broken</tool_call>'
    assert parse_tool_calls(bad) == (bad, [])  # one malformed block: no calls, all text (as vLLM's hermes)
    assert parse_tool_calls("plain answer") == ("plain answer", [])
    content, calls = parse_tool_calls('{"name": "g", "parameters": {"q": "a"}}<|eot_id|>', "llama3_json")
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"q": "a"}
    with pytest.raises(ValueError, match="hermes"):
        parse_tool_calls("x", "pythonic")


def test_a_chatml_template_without_tools_gets_the_hermes_template_for_tool_requests_only(tokenizer):
    template, ok = pick_chat_template(tokenizer)
    assert HERMES_CHATML_TEMPLATE in template and ok  # SmolLM2's own template ignores tools
    hi = [{"role": "user", "content": "hi"}]
    text = tokenizer.decode(prompt_ids(tokenizer, hi, TOOLS, chat_template=template))
    assert '"name": "search_inbox"' in text and text.endswith("<|im_start|>assistant\n")
    # without tools: exactly the model's own rendering (SmolLM2's default system prompt included)
    assert prompt_ids(tokenizer, hi, chat_template=template) == prompt_ids(tokenizer, hi)
    assert "SmolLM" in tokenizer.decode(prompt_ids(tokenizer, hi))
    assert pick_chat_template(tokenizer, LLAMA31) == (LLAMA31, True)


@pytest.mark.slow
async def test_a_batch_whose_assistant_turns_are_all_plain_messages_is_refused(served):
    client, tokenizer, _ = served
    ask = {"role": "user", "content": "Hi"}
    said = [{"role": "assistant", "content": text} for text in ("Hello.", "Hey!")]
    group = TrajectoryGroup([Trajectory(messages_and_choices=[ask, m], reward=float(i)) for i, m in enumerate(said)])
    with pytest.raises(MissingTokenIdsError, match="none of the 2 trajectories .* plain messages"):
        prepare([group], tokenizer, TrainConfig(), 512)
    # one served choice in the batch: that trajectory trains, the message-only one is counted as before
    reply = await client.chat.completions.create(model="chatml", messages=[ask], max_tokens=4, seed=1)
    served_group = TrajectoryGroup([Trajectory(messages_and_choices=[ask, reply.choices[0]], reward=1.0),
                                    Trajectory(messages_and_choices=[ask, said[0]], reward=0.0)])
    seqs, stats = prepare([served_group], tokenizer, TrainConfig(), 512)
    assert len(seqs) == 1 and stats["skipped"] == {"no generated tokens": 1}
    # a group without a learning signal is not a mistake: skipped, no error
    flat = TrajectoryGroup([Trajectory(messages_and_choices=[ask, m], reward=1.0) for m in said])
    assert prepare([flat], tokenizer, TrainConfig(), 512)[1]["skipped"] == {"group with all-equal rewards": 1}


@pytest.mark.slow
async def test_an_aborted_trajectory_beside_a_message_only_one_is_not_called_a_batch_without_choices(served):
    client, tokenizer, _ = served
    ask = {"role": "user", "content": "Hi"}
    reply = await client.chat.completions.create(model="chatml", messages=[ask], max_tokens=4, seed=2)
    aborted = reply.choices[0]
    aborted.finish_reason = "abort"
    group = TrajectoryGroup([Trajectory(messages_and_choices=[ask, aborted], reward=1.0),
                             Trajectory(messages_and_choices=[ask, {"role": "assistant", "content": "Hey"}],
                                        reward=0.0)])
    seqs, stats = prepare([group], tokenizer, TrainConfig(), 512)  # it held a served choice: no refusal
    assert seqs == [] and stats["skipped"] == {"trajectory with an aborted turn": 1, "no generated tokens": 1}
