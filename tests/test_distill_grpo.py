"""`ruler distill --method grpo`: the agreement-with-teacher reward on hand-made answers, the refusals, the
shared JSON-list reader of LLM answers, and (slow) a few GRPO steps of the embedded model on the CPU that
train its LoRA and write a judge folder."""

import asyncio
import json

import pytest
from typer.testing import CliRunner

from ruler_rl import group_advantages
from ruler_rl.judges.completion import json_list
from ruler_rl.trainer.distill import (
    LabelledGroup,
    agreement_figures,
    agreement_reward,
    answer_scores,
    answer_token_bound,
    from_labels,
    pair_agreement,
    pair_counts,
    render_answer,
    step_answer_stats,
    teacher_orders_a_pair,
    train_grpo,
)
from tests.helpers import convo

runner = CliRunner()
RUBRIC = "Score each answer by the quality word it states: excellent 1, mediocre 0.5, terrible 0."


def _example(labels=(2, 0, 1)):
    groups = [LabelledGroup("g", [convo(f"answer {k}") for k in range(len(labels))], list(labels))]
    return from_labels(groups, RUBRIC)[0]


def _answer(scores: dict) -> str:
    return json.dumps({"scores": [{"trajectory_id": i, "explanation": "x", "score": s} for i, s in scores.items()]})


def test_agreement_reward_on_hand_made_answers():
    ex = _example()  # teacher: 1 best, 3 middle, 2 worst
    assert ex.scores == {"1": 1.0, "2": 0.0, "3": 0.5}
    assert agreement_reward(_answer({"1": 0.9, "2": 0.1, "3": 0.4}), ex) == 1.0        # same order, other values
    assert agreement_reward(ex.answer, ex) == 1.0                                      # the teacher's own answer
    assert agreement_reward(_answer({"1": 0.0, "2": 1.0, "3": 0.5}), ex) == 0.0        # reversed
    assert agreement_reward(_answer({"1": 0.5, "2": 0.5, "3": 0.5}), ex) == 0.5        # all tied: half of each pair
    # one tie (2 and 3) among three pairs, the other two right: (2 + 1/2) / 3
    assert agreement_reward(_answer({"1": 1.0, "2": 0.3, "3": 0.3}), ex) == pytest.approx(2.5 / 3)
    # one pair wrong (2 above 3), two right: 2 / 3
    assert agreement_reward(_answer({"1": 1.0, "2": 0.6, "3": 0.5}), ex) == pytest.approx(2 / 3)
    # RULER's parser reads it: a code fence and text around it, ids as numbers, a consistent 0-10 scale
    fenced = "Here:\n```json\n" + json.dumps({"scores": [{"trajectory_id": 3, "explanation": "", "score": 5},
                                                        {"trajectory_id": 1, "explanation": "", "score": 9},
                                                        {"trajectory_id": 2, "explanation": "", "score": 2}]}) + "\n```"
    assert agreement_reward(fenced, ex) == 1.0
    assert answer_scores(fenced, ex.ids) == {"1": 0.9, "2": 0.2, "3": 0.5}
    # invalid answers: 0, whatever they rank
    for bad in (None, "", "prose, no JSON", _answer({"1": 1.0, "2": 0.0}),              # missing id
                _answer({"1": 1.0, "2": 0.0, "3": 0.5, "4": 0.2}),                      # an id not shown
                _answer({"1": 1.0, "2": 0.0, "3": 500}),                                 # off every scale
                _answer({"1": 1.0, "2": 0.0, "3": "high"}),                              # not a number
                '{"scores": [{"trajectory_id": "1", "score": 1.0}, {"trajectory_id": "1", "score": 0}]}'):
        assert agreement_reward(bad, ex) == 0.0, bad
        assert answer_scores(bad, ex.ids) is None
    # the valid-JSON bonus: a valid answer ranking backwards gets it, an invalid one still 0, a perfect one 1
    assert agreement_reward(_answer({"1": 0.0, "2": 1.0, "3": 0.5}), ex, valid_bonus=0.2) == pytest.approx(0.2)
    assert agreement_reward("nope", ex, valid_bonus=0.2) == 0.0
    assert agreement_reward(ex.answer, ex, valid_bonus=0.2) == pytest.approx(1.0)


def test_teacher_ties_are_not_pairs_and_reward_errors():
    # the teacher ties 1 and 2: only the pairs with 3 count, whatever the student says of 1 against 2
    assert pair_agreement({"1": 0.2, "2": 0.9, "3": 0.0}, {"1": 1.0, "2": 1.0, "3": 0.0}) == 1.0
    assert pair_agreement({"1": 0.2, "2": 0.9, "3": 0.5}, {"1": 1.0, "2": 1.0, "3": 0.0}) == 0.5
    with pytest.raises(ValueError, match="scores every trajectory alike"):
        pair_agreement({"1": 0.2, "2": 0.9}, {"1": 1.0, "2": 1.0})
    with pytest.raises(ValueError, match="the student scores ids"):
        pair_agreement({"1": 0.2}, {"1": 1.0, "2": 0.0})
    ex = _example()
    flat = _example()
    flat.scores = {"1": 0.5, "2": 0.5, "3": 0.5}  # as a cached judgment that scored all alike can be
    with pytest.raises(ValueError, match="every trajectory alike"):
        agreement_reward(ex.answer, flat)
    for bonus in (1.0, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="valid_bonus"):
            agreement_reward(ex.answer, ex, valid_bonus=bonus)
    with pytest.raises(TypeError, match="TeacherExample"):
        agreement_reward(ex.answer, {"1": 1.0})
    with pytest.raises(TypeError, match="answer must be text"):
        agreement_reward({"scores": []}, ex)


async def test_train_grpo_refuses_what_it_cannot_train():
    from ruler_rl.trainer import TrainConfig

    ex = _example()
    with pytest.raises(TypeError, match="registered ruler_rl.trainer.TrainableModel"):
        await train_grpo(object(), [ex], TrainConfig(), steps=1)
    model = _ScriptedStudent("http://127.0.0.1:9/v1")
    for kwargs, why in (({"seed": True}, "seed must be an integer"), ({"seed": 1.5}, "seed must be an integer"),
                        ({"constrained": 1}, "constrained must be True or False"),
                        ({"constrained": "yes"}, "constrained must be True or False"),
                        ({"on_step": "print"}, "on_step must be a callable")):
        with pytest.raises(TypeError, match=why):
            await train_grpo(model, [ex], TrainConfig(), steps=1, **kwargs)
    assert model.trained == []


def _near_tie_example():
    ex = _example((1, 0))
    ex.scores = {"1": 0.12345678949, "2": 0.12345678951}  # 2e-11 apart: one side of round(v, 9) each
    return ex


async def test_one_tie_rule_a_near_tie_teacher_is_left_out_not_a_crash():
    from ruler_rl.trainer import TrainConfig

    ex = _near_tie_example()
    # the rule that picks the training prompts is the rule that counts the pairs: no pair here
    assert not teacher_orders_a_pair(ex)
    assert pair_counts({"1": 0.9, "2": 0.1}, ex.scores) == (0, 0, 0)
    with pytest.raises(ValueError, match="every trajectory alike"):
        agreement_reward(_answer({"1": 0.9, "2": 0.1}), ex)
    with pytest.raises(ValueError, match="none of the 1 training prompts"):
        await train_grpo(_ScriptedStudent("http://127.0.0.1:9/v1"), [ex], TrainConfig(), steps=1)
    # a third trajectory the teacher does order: the near tie is still no pair, the other two are
    three = _example((2, 1, 0))
    three.scores = {"1": 0.12345678949, "2": 0.12345678951, "3": 0.9}
    assert teacher_orders_a_pair(three)
    assert pair_counts({"1": 0.1, "2": 0.1, "3": 0.5}, three.scores) == (2, 0, 2)
    assert pair_agreement({"1": 0.1, "2": 0.1, "3": 0.5}, three.scores) == 1.0
    # agreement_figures counts by the same helper: concordant, ties, pairs summed over prompts
    fig = agreement_figures("j", [three.scores, {"1": 1.0, "2": 0.0, "3": 0.5}],
                            [{"1": 0.1, "2": 0.1, "3": 0.5}, {"1": 0.2, "2": 0.2, "3": 0.9}])
    # prompt 2: (1,2) tie, (1,3) wrong, (2,3) right -> 1 right, 1 tie of 3 pairs; prompt 1: 2 right of 2
    assert (fig.pairs, fig.pairwise_accuracy, fig.ties) == (5, pytest.approx(3 / 5), pytest.approx(1 / 5))
    assert pair_counts({"1": 0.2, "2": 0.2, "3": 0.9}, {"1": 1.0, "2": 0.0, "3": 0.5}) == (1, 1, 3)


def test_answer_token_bound_holds_the_longest_answer_the_schema_allows():
    from transformers import AutoTokenizer

    from ruler_rl.judges.embedded import embedded_model_path
    from ruler_rl.providers import LOCAL_EXPLANATION_CHARS

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path())
    ids = [str(i) for i in range(1, 9)]
    for text in ("x y" * 40, "é ü" * 40, "1234567890" * 8):  # explanations at the schema's bound
        answer = render_answer(ids, {i: 0.123 for i in ids}, {i: text for i in ids})
        long_scores = answer.replace("0.123", "0.12345678901234567")  # the schema bounds values, not digits
        assert len(tokenizer(long_scores)["input_ids"]) < answer_token_bound(ids)
    assert answer_token_bound(ids) == 16 + 8 * (2 * LOCAL_EXPLANATION_CHARS + 88)
    assert answer_token_bound(["1", "2"], 10) < answer_token_bound(["1", "2", "3"], 10)
    for bad, why in ((([], 80), "non-empty list"), ((["1"], 0), "max_explanation_chars"),
                     ((["1"], True), "max_explanation_chars"), (([1, 2], 80), "trajectory id strings")):
        with pytest.raises(ValueError, match=why):
            answer_token_bound(*bad)


def test_a_cut_answer_is_counted_apart_from_an_invalid_one():
    stats = step_answer_stats([[0.0, 1.0], [0.0, 0.5, 0.0]], [[False, True], [False, True, False]],
                              [[True, False], [False, False, False]])
    assert stats == {"group_rewards": [[0.0, 1.0], [0.0, 0.5, 0.0]], "valid_share": pytest.approx(2 / 5),
                     "answers_cut": 1, "invalid_answers": 2}
    empty = step_answer_stats([], [], [])
    assert empty["answers_cut"] == empty["invalid_answers"] == 0 and empty["valid_share"] != empty["valid_share"]
    with pytest.raises(ValueError, match="same lengths"):
        step_answer_stats([[0.0]], [[True, False]], [[False]])


class _ScriptedStudent:
    """A stand-in for a registered TrainableModel whose server is the scripted judge on loopback (its answers
    and 400s are real HTTP through the openai client); `train` records the groups it is given."""

    def __init__(self, base: str):
        self.base = base
        self.trained: list = []

    def openai_client(self):
        import openai

        return openai.AsyncOpenAI(base_url=self.base, api_key="sk-test", max_retries=0)

    async def get_step(self) -> int:
        return 0

    def get_inference_name(self) -> str:
        return "scripted"

    async def train(self, groups, config) -> dict:
        self.trained.append(groups)
        return {"step": len(self.trained), "trained": False}


async def test_a_refused_prompt_is_logged_with_the_servers_error_and_left_out(judge, caplog):
    from ruler_rl.trainer import TrainConfig

    judge.script = ["400", "ok"]
    model = _ScriptedStudent(judge.base)
    exs = [_example((2, 0, 1)), _example((0, 1, 2, 3))]
    rows = []
    with caplog.at_level("WARNING", logger="ruler.distill"):
        history = await train_grpo(model, exs, TrainConfig(), steps=1, batch_size=2, group_size=2,
                                   on_step=rows.append)
    assert rows == history and len(history) == 1
    row = history[0]
    assert row["prompts_refused"] == 1 and len(model.trained[0]) == 1 and row["answers_cut"] == 0
    assert row["valid_share"] == 1.0 and row["invalid_answers"] == 0  # the scripted judge answers valid JSON
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "BadRequestError" in refused[0].getMessage()
    assert "judge exploded" in refused[0].getMessage() and "max_seq_length" not in refused[0].getMessage()
    # the default max_tokens is the schema-derived bound of each prompt's ids, sent with the schema
    sent = sorted((len(r["response_format"]["json_schema"]["schema"]["properties"]["scores"]["prefixItems"]),
                   r["max_tokens"]) for r in judge.requests)
    assert sent == [(3, answer_token_bound(["1", "2", "3"])), (4, answer_token_bound(["1", "2", "3", "4"]))]


async def test_stop_ends_grpo_after_the_step_it_says_so_and_is_checked(judge):
    """`stop` (a time budget's end in evals.distill_bench) is asked after each step: training ends at the first True,
    before `steps`; a non-callable is refused before anything is sampled."""
    from ruler_rl.trainer import TrainConfig

    model = _ScriptedStudent(judge.base)
    asked = []

    def stop() -> bool:
        asked.append(len(model.trained))
        return len(model.trained) >= 2

    history = await train_grpo(model, [_example((2, 0, 1))], TrainConfig(), steps=5, batch_size=1, group_size=2,
                               stop=stop)
    assert len(history) == 2 and len(model.trained) == 2 and asked == [1, 2]
    with pytest.raises(TypeError, match="stop must be a callable"):
        await train_grpo(model, [_example((2, 0, 1))], TrainConfig(), steps=1, stop=True)
    assert len(model.trained) == 2


def test_json_list_reads_an_llm_list_answer_or_says_why_not():
    assert json_list(' {"tasks": [{"a": 1}, "x"], "other": 1}\n', "tasks") == [{"a": 1}, "x"]
    assert json_list('{"questions": []}', "questions") == []
    for text, why in (("prose", "not JSON"), ("[1, 2]", "not an object"), ('{"items": []}', "no 'tasks' field"),
                      ('{"tasks": {"a": 1}}', "'tasks' is not a list"), (None, "not text")):
        with pytest.raises(ValueError, match=why):
            json_list(text, "tasks")
    with pytest.raises(TypeError, match="key"):
        json_list("{}", "")


def _cli(*args):
    from ruler_rl.cli import app

    return runner.invoke(app, ["distill", *args])


async def test_run_distill_refuses_bad_types(tmp_path):
    from ruler_rl.trainer.distill_cli import run_distill

    common = {"teacher": None, "since": None, "until": None, "cache": tmp_path / "cache",
              "datasets": [tmp_path / "x.jsonl"], "student": "local/smollm2-135m-instruct", "steps": 1, "lr": 1e-3,
              "out": tmp_path / "judge", "method": "grpo", "print_fn": lambda *a, **k: None}
    for kwargs, why in (({"grpo_steps": True}, "grpo_steps must be an integer"),
                        ({"grpo_steps": 2.0}, "grpo_steps must be an integer"),
                        ({"grpo_steps": 0}, "grpo_steps must be an integer >= 1"),
                        ({"steps": True}, "steps must be an integer"), ({"steps": "3"}, "steps must be an integer"),
                        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
                        ({"max_eval": True}, "max_eval must be an integer"),
                        ({"seed": None}, "seed must be an integer"), ({"orderings": 1.0}, "orderings"),
                        ({"lr": True}, "lr must be a finite number > 0"),
                        ({"lr": float("inf")}, "lr must be a finite number > 0"),
                        ({"grpo_lr": "1e-3"}, "grpo_lr must be a finite number > 0"),
                        ({"grpo_lr": 0}, "grpo_lr must be a finite number > 0"),
                        ({"datasets": "x.jsonl"}, "datasets must be a list of paths"),
                        ({"student": ""}, "student must be")):
        with pytest.raises(ValueError, match=why):
            await run_distill(**{**common, **kwargs})
    assert not (tmp_path / "judge").exists() and not (tmp_path / "judge.grpo").exists()


def test_distill_refuses_a_bad_method_group_size_or_engine(tmp_path):
    out = str(tmp_path / "judge")
    data = str(tmp_path / "x.jsonl")
    res = _cli("--out", out, "--dataset", data, "--method", "bogus")
    assert res.exit_code == 2 and "method must be one of sft, grpo, sft+grpo" in res.output
    res = _cli("--out", out, "--dataset", data, "--method", "grpo", "--group-size", "1")
    assert res.exit_code == 2 and "group_size must be an integer >= 2" in res.output
    res = _cli("--out", out, "--dataset", data, "--method", "grpo", "--engine", "tpu")
    assert res.exit_code == 2 and "engine must be one of" in res.output
    res = _cli("--out", out, "--dataset", data, "--method", "grpo", "--valid-bonus", "1")
    assert res.exit_code == 2 and "valid_bonus" in res.output
    assert not (tmp_path / "judge").exists()


@pytest.mark.slow
def test_sft_then_grpo_starts_from_the_sft_adapter_and_grpo_trains_the_lora(tmp_path, monkeypatch):
    """`sft+grpo`: the SFT adapter is the GRPO run's step 1, so GRPO's first step is step 2 and trains on it;
    the SFT model is no longer referenced when GRPO starts (GRPO loads its own). GRPO's steps on the CPU (one
    run for both claims: each run of the embedded model's GRPO takes minutes here): answers sampled under
    RULER's schema (all valid), rewarded by agreement, groups with differing rewards trained (non-zero
    advantages), the run log written, the adapter moved on, and the folder written as a judge measured on the
    held-out prompts. Improvement is not claimed."""
    import weakref

    from safetensors.torch import load_file

    import ruler_rl.trainer.distill_cli
    import ruler_rl.trainer.sft
    from ruler_rl.trainer.distill_cli import run_distill
    from ruler_rl.trainer.runlog import load_run_log
    from tests.test_distill import synthetic_dataset

    loaded, alive_at_grpo = [], []
    real_load, real_stage = ruler_rl.trainer.sft.load_student, ruler_rl.trainer.distill_cli.grpo_stage

    def load_student(*a, **k):
        model, tokenizer, full_forward = real_load(*a, **k)
        loaded.append(weakref.ref(model))
        return model, tokenizer, full_forward

    async def grpo_stage(*a, **k):
        alive_at_grpo.extend(r() is not None for r in loaded)
        return await real_stage(*a, **k)

    monkeypatch.setattr(ruler_rl.trainer.sft, "load_student", load_student)
    monkeypatch.setattr(ruler_rl.trainer.distill_cli, "grpo_stage", grpo_stage)

    data = synthetic_dataset(tmp_path / "synth.jsonl", n_groups=6)
    out = tmp_path / "sft-grpo-judge"
    result = asyncio.run(run_distill(
        teacher=None, since=None, until=None, cache=tmp_path / "cache", datasets=[data],
        student="local/smollm2-135m-instruct", steps=1, lr=1e-3, out=out, rubric=RUBRIC, holdout=0.2, seed=0,
        batch_size=2, max_eval=1, method="sft+grpo", grpo_steps=2, group_size=4, print_fn=lambda *a, **k: None))
    assert result["method"] == "sft+grpo" and result["heldout"] == 1 and result["train"] == 5
    sft_rows, grpo_rows = result["history"][:1], result["history"][1:]
    assert "loss" in sft_rows[0] and "trained_tokens" in sft_rows[0] and len(grpo_rows) == 2
    for row in grpo_rows:
        assert row["valid_share"] == 1.0  # constrained decoding under RULER's schema: every answer parses
        assert len(row["group_rewards"]) == 2 and all(len(g) == 4 for g in row["group_rewards"])
        assert all(0.0 <= x <= 1.0 for g in row["group_rewards"] for x in g)
        advantages = [a for g in row["group_rewards"] for a in group_advantages(g)]
        assert row["trained"] == any(abs(a) > 1e-6 for a in advantages), row
    logged = load_run_log(out.parent / f"{out.name}.grpo" / "grpo" / "student")
    assert list(logged["trained"]) == [r["trained"] for r in grpo_rows]
    assert (logged[logged["trained"].astype(bool)]["trained_trajectories"] > 0).all()
    trained = [r["step"] for r in grpo_rows if r["trained"]]
    assert trained and trained[0] == 2, grpo_rows  # step 1 is the SFT adapter
    run = out.parent / f"{out.name}.grpo" / "grpo" / "student" / "checkpoints"
    state = json.loads((run / "0001" / "trainer_state.json").read_text())
    assert state["sft_steps"] == 1
    sft = load_file(str(run / "0001" / "adapter_model.safetensors"))
    final = load_file(str(out / "adapter_model.safetensors"))
    assert any(float(t.abs().max()) > 0 for k, t in sft.items() if "lora_B" in k)  # SFT moved it
    assert set(sft) == set(final) and any(not (sft[k] == final[k]).all() for k in sft)  # and GRPO moved it on
    meta = json.loads((out / "ruler_judge.json").read_text())
    assert meta["method"] == "sft+grpo" and meta["group_size"] == 4 and meta["grpo_trained_steps"] >= 1
    after = result["distilled"]
    assert after["judge"] == f"local/{out}" and after["prompts"] == 1 and after["errors"] == 0
    assert alive_at_grpo == [False]  # one SFT model loaded, dropped before GRPO


@pytest.mark.slow
async def test_cpu_server_answers_under_a_response_format_schema():
    """The CPU server's `response_format` (what GRPO samples RULER answers under): the answer matches the
    schema by constrained decoding; what it cannot honour is a 400 that never reaches the engine."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ruler_rl.judges.embedded import embedded_model_path
    from ruler_rl.prompt import response_schema
    from ruler_rl.trainer.engine_transformers import TransformersEngine
    from ruler_rl.trainer.sequences import end_of_turn_ids
    from ruler_rl.trainer.server import BackgroundServer, Served, create_server_app

    path = embedded_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ends = end_of_turn_ids(tokenizer, hf.generation_config)
    served = Served("judge", TransformersEngine(hf, tokenizer, stop_token_ids=ends), tokenizer, 1024, end_of_turn=ends)
    server = BackgroundServer(create_server_app({"judge": served}), "127.0.0.1")
    await server.start()
    ex = _example()
    schema = response_schema(ex.ids, max_explanation_chars=20)

    async def ask(http, **extra):
        body = {"model": "judge", "messages": ex.messages, "max_tokens": 120, "temperature": 1.0, "seed": 3, **extra}
        return await http.post("/chat/completions", json=body)

    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            r = await ask(http, n=2, response_format={"type": "json_schema",
                                                      "json_schema": {"name": "s", "schema": schema}})
            assert r.status_code == 200, r.text
            for choice in r.json()["choices"]:
                text = choice["message"]["content"]
                assert answer_scores(text, ex.ids) is not None, text
                assert [e["trajectory_id"] for e in json.loads(text)["scores"]] == ["1", "2", "3"]
                assert len(choice["token_ids"]) == len(choice["token_logprobs"]) > 0  # trainable as served
                assert "constrained" not in choice  # its logprobs are the unconstrained policy's (vLLM's are not)
            r = await ask(http, response_format={"type": "json_object"}, max_tokens=40)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("{")
            for fmt, why in (({"type": "yaml"}, "type must be text, json_object or json_schema"),
                             ({"type": "json_schema"}, "needs {'json_schema': {'schema'"),
                             ({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}},
                              "not a usable JSON schema")):
                r = await ask(http, response_format=fmt)
                assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
            assert (await ask(http, response_format={"type": "text"}, max_tokens=4)).status_code == 200
    finally:
        await server.stop()
