"""`ruler distill`: the cache records and exports judgments by judge and date; teacher data from the cache and
from labelled groups; the held-out split by group; a 20-step CPU distillation that beats the untrained student
on its held-out split; the distilled folder as a `local/<folder>` judge with its own cache namespace."""

import asyncio
import json
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.cache import export_judgments, judgment_record, open_cache
from ruler_rl.judges import JudgeConfigError
from ruler_rl.judges.local_provider import check_local_model, model_identity
from ruler_rl.prompt import build_prompt
from ruler_rl.scoring import ruler_result, ruler_score_group
from ruler_rl.trainer.distill import (
    LabelledGroup,
    agreement_figures,
    from_cache,
    from_labels,
    group_key,
    paired_agreement,
    render_answer,
    shown_ids,
    split_by_group,
)
from tests.helpers import convo

runner = CliRunner()
RUBRIC = "Score each answer by the quality word it states: excellent 1, mediocre 0.5, terrible 0."


def _group_convs(*answers):
    return [convo(a) for a in answers]


async def test_cache_records_each_judgment_and_export_selects_one_judge(tmp_path, judge):
    cache = tmp_path / "cache"
    params = {**judge.params}
    await ruler_result(_group_convs("GOOD a", "BAD b", "OK c"), "openai/fake-judge", params, cache=str(cache))
    await ruler_result(_group_convs("GOOD x", "BAD y"), "openai/fake-judge", params, cache=str(cache),
                       num_permutations=2)
    await ruler_result(_group_convs("OK p", "BAD q"), "openai/other-judge", params, cache=str(cache))
    got, report = export_judgments(cache, "openai/fake-judge")
    assert len(got) == 3 and report.exported == 3 and report.other_models == 1
    assert report.models == {"openai/fake-judge": 3, "openai/other-judge": 1}
    assert {j.model for j in got} == {"openai/fake-judge"}
    first = got[0]
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert shown_ids(first.messages) == ["1", "2", "3"] and "GOOD a" in first.messages[1]["content"]
    assert [s["score"] for s in first.scores] == [0.9, 0.1, 0.5] and '"scores"' in first.answer
    other, _ = export_judgments(cache, "openai/other-judge")
    assert len(other) == 1 and "OK p" in other[0].messages[1]["content"]
    # a hit is still served from the new record
    again = await ruler_result(_group_convs("GOOD a", "BAD b", "OK c"), "openai/fake-judge", params, cache=str(cache))
    assert again.cached


def test_export_by_date_and_what_it_leaves_out(tmp_path):
    store = open_cache(tmp_path / "c")
    msgs = build_prompt(_group_convs("GOOD a", "BAD b"), RUBRIC).messages
    day = datetime(2026, 11, 1, tzinfo=UTC)
    scores = [{"trajectory_id": "1", "explanation": "x", "score": 1.0},
              {"trajectory_id": "2", "explanation": "y", "score": 0.0}]
    for k in range(5):  # one a day, Nov 1..5
        store.set(f"ruler:{k}", judgment_record(scores, [], model="openai/o3", messages=msgs, answer="{}",
                                                created=(day + timedelta(days=k)).timestamp()))
    store.set("ruler:old", {"scores": scores, "notes": []})          # written before prompts were recorded
    store.set("ruler:verdict", {"verdict": True})                    # another cache user's entry
    store.set("ruler:other", judgment_record(scores, [], model="openai/gpt-4.1", messages=msgs, answer="{}"))
    got, report = export_judgments(tmp_path / "c", "openai/o3", since=day + timedelta(days=1),
                                   until=day + timedelta(days=3))
    assert [j.key for j in got] == ["ruler:1", "ruler:2"]
    assert (report.entries, report.exported, report.outside_dates, report.unrecorded, report.not_judgments,
            report.other_models) == (8, 2, 3, 1, 1, 1)
    got, _ = export_judgments(store, "openai/o3", since=(day + timedelta(days=4)).timestamp())
    assert [j.key for j in got] == ["ruler:4"]


def test_export_validation_errors(tmp_path):
    open_cache(tmp_path / "c")
    with pytest.raises(ValueError, match="must name a judge"):
        export_judgments(tmp_path / "c", " ")
    with pytest.raises(ValueError, match="must be before until"):
        export_judgments(tmp_path / "c", "m", since=10.0, until=5.0)
    with pytest.raises(ValueError, match="timezone-aware"):
        export_judgments(tmp_path / "c", "m", since=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="Unix seconds"):
        export_judgments(tmp_path / "c", "m", until=float("nan"))
    with pytest.raises(FileNotFoundError, match="no judge cache"):
        export_judgments(tmp_path / "missing", "m")
    with pytest.raises(TypeError, match="cache folder or a diskcache"):
        export_judgments({"a": 1}, "m")
    with pytest.raises(ValueError, match="model must be"):
        judgment_record([], [], model="", messages=[], answer="")


def test_teacher_examples_from_cache_and_labels_and_split_by_group(tmp_path):
    msgs = build_prompt(_group_convs("GOOD a", "BAD b", "OK c"), RUBRIC, order=[2, 0, 1]).messages
    assert shown_ids(msgs) == ["3", "1", "2"]
    from ruler_rl.cache import CachedJudgment

    scores = [{"trajectory_id": i, "explanation": e, "score": s}
              for i, e, s in (("1", "good " * 40, 0.9), ("2", "bad", 0.1), ("3", "ok", 0.5))]
    ok = CachedJudgment("k", "openai/o3", msgs, scores, "raw", 1.0)
    wrong_ids = CachedJudgment("k2", "openai/o3", msgs, scores[:2], "raw", 1.0)
    not_ruler = CachedJudgment("k3", "openai/o3", [{"role": "user", "content": "hi"}], scores, "raw", 1.0)
    examples, skipped = from_cache([ok, wrong_ids, not_ruler])
    assert skipped == 2 and len(examples) == 1
    ex = examples[0]
    assert ex.ids == ["3", "1", "2"] and ex.scores == {"1": 0.9, "2": 0.1, "3": 0.5}
    answer = json.loads(ex.answer)
    assert [e["trajectory_id"] for e in answer["scores"]] == ["1", "2", "3"]  # the schema's order: by id
    assert len(answer["scores"][0]["explanation"]) <= 80 and answer["scores"][1] == {
        "trajectory_id": "2", "explanation": "bad", "score": 0.1}
    # every ordering of one group has one key; another group another
    assert group_key(msgs) == group_key(build_prompt(_group_convs("GOOD a", "BAD b", "OK c"), RUBRIC).messages)
    assert group_key(msgs) != group_key(build_prompt(_group_convs("GOOD a", "BAD b", "OK d"), RUBRIC).messages)
    # a pair judged as [a, b] and again as [b, a] (judge_meta's two orders) is one group, though the ids swap
    ab = build_prompt(_group_convs("GOOD a", "BAD b"), RUBRIC).messages
    ba = build_prompt(_group_convs("BAD b", "GOOD a"), RUBRIC).messages
    assert shown_ids(ab) == shown_ids(ba) == ["1", "2"] and ab[1]["content"] != ba[1]["content"]
    assert group_key(ab) == group_key(ba)

    groups = [LabelledGroup(f"g{k}", _group_convs(f"excellent {k}", f"terrible {k}", f"mediocre {k}"), [2, 0, 1])
              for k in range(10)]
    labelled = from_labels(groups, RUBRIC, orderings=3)
    assert len(labelled) == 30
    first = labelled[0]
    assert first.scores == {"1": 1.0, "2": 0.0, "3": 0.5}
    assert json.loads(first.answer)["scores"][0] == {"trajectory_id": "1", "explanation": "ranked 1 of 3", "score": 1}
    assert len({e.group for e in labelled}) == 10
    train, held = split_by_group(labelled, 0.3, seed=1)
    assert len(held) == 9 and len(train) == 21
    assert not {e.group for e in train} & {e.group for e in held}  # by group, not by row
    assert split_by_group(labelled, 0.3, seed=1) == (train, held)  # seeded


def test_teacher_data_validation_errors():
    c = _group_convs("a", "b")
    with pytest.raises(ValueError, match="at least 2 conversations"):
        LabelledGroup("g", c[:1], [1])
    with pytest.raises(ValueError, match="2 labels for 3"):
        LabelledGroup("g", _group_convs("a", "b", "c"), [1, 0])
    with pytest.raises(ValueError, match="finite numbers"):
        LabelledGroup("g", c, [1, float("nan")])
    with pytest.raises(ValueError, match="every label is equal"):
        LabelledGroup("g", c, [1, 1])
    with pytest.raises(ValueError, match="identical"):
        from_labels([LabelledGroup("g", _group_convs("same", "same"), [1, 0])], RUBRIC)
    with pytest.raises(ValueError, match="rubric"):
        from_labels([LabelledGroup("g", c, [1, 0])], " ")
    with pytest.raises(ValueError, match="orderings"):
        from_labels([LabelledGroup("g", c, [1, 0])], RUBRIC, orderings=0)
    with pytest.raises(TypeError, match="LabelledGroup"):
        from_labels([("g", c)], RUBRIC)
    with pytest.raises(ValueError, match="outside"):
        render_answer(["1"], {"1": 1.5}, {})
    one = from_labels([LabelledGroup("g", c, [1, 0])], RUBRIC)
    with pytest.raises(ValueError, match="at least 2 groups"):
        split_by_group(one)
    with pytest.raises(ValueError, match="holdout"):
        split_by_group(one, 1.0)
    with pytest.raises(ValueError, match="two messages"):
        shown_ids([{"role": "user", "content": "x"}])


def test_agreement_figures_count_ties_as_wrong_and_errors_apart():
    teacher = [{"1": 1.0, "2": 0.5, "3": 0.0}, {"1": 0.0, "2": 1.0}]
    a = agreement_figures("j", [teacher[0], teacher[1], teacher[0], teacher[0]],
                          [{"1": 0.9, "2": 0.2, "3": 0.1}, {"1": 0.5, "2": 0.5}, None, {"1": 0.1, "2": 0.2, "3": 0.3}])
    # pairs: 3 right; 1 tie; 3 reversed -> 3 / 7 right, 1 / 7 ties
    assert (a.pairs, a.errors) == (7, 1)
    assert a.pairwise_accuracy == pytest.approx(3 / 7) and a.ties == pytest.approx(1 / 7)
    assert a.kendall_tau == pytest.approx((1.0 + 0.0 - 1.0) / 3)
    with pytest.raises(ValueError, match="differ"):
        agreement_figures("j", teacher[:1], [{"1": 1.0, "2": 0.0}])


def test_paired_agreement_counts_the_same_pairs_and_resamples_groups():
    from ruler_rl.trainer.distill import TeacherExample

    def ex(group, scores):
        ids = sorted(scores)
        return TeacherExample(messages=[], ids=ids, scores=scores, explanations={i: "" for i in ids}, answer="",
                              group=group)

    three = {"1": 1.0, "2": 0.5, "3": 0.0}  # 3 ordered pairs
    two = {"1": 0.0, "2": 1.0}  # 1 ordered pair
    examples = [ex("a", three), ex("a", three), ex("b", two), ex("c", two)]
    before = agreement_figures("u", [e.scores for e in examples],
                               [{"1": 0.5, "2": 0.5, "3": 0.5}, None, {"1": 1.0, "2": 0.0}, {"1": 0.2, "2": 0.8}])
    after = agreement_figures("d", [e.scores for e in examples],
                              [{"1": 0.9, "2": 0.5, "3": 0.1}, {"1": 0.9, "2": 0.5, "3": 0.1}, None,
                               {"1": 0.1, "2": 0.9}])
    paired = paired_agreement(examples, before, after)
    # 8 teacher-ordered pairs; before: 0 + 0 (no answer: wrong) + 0 + 1 = 1 right; after: 3 + 3 + 0 (no answer) + 1
    assert (paired["groups"], paired["pairs"]) == (3, 8)
    assert (paired["before"], paired["after"], paired["difference"]) == (1 / 8, 7 / 8, 6 / 8)
    assert paired["low"] <= paired["difference"] <= paired["high"]
    # a tie worth one half: the untrained judge's three ties in group a give it 1.5 more
    assert (paired["before_half"], paired["after_half"]) == (2.5 / 8, 7 / 8)
    # always the trajectory shown first: right on group a's 6 pairs (the teacher ranks 1 > 2 > 3), wrong on b and c
    assert paired["first_shown"] == 6 / 8 and paired["excludes_zero"] is (paired["low"] > 0)
    same = paired_agreement(examples, after, after)
    assert (same["difference"], same["low"], same["high"]) == (0, 0, 0)
    # groups, not prompts, are resampled: five prompts of one group all gained, one prompt of another did not. By
    # group, a draw of the second group twice (1 in 4) gives 0; by prompt, the low end would be near 0.5
    one = {"1": 1.0, "2": 0.0}
    many = [ex("g", one)] * 5 + [ex("h", one)]
    wrong, right = {"1": 0.0, "2": 1.0}, {"1": 1.0, "2": 0.0}
    lifted = paired_agreement(many, agreement_figures("u", [one] * 6, [wrong] * 5 + [right]),
                              agreement_figures("d", [one] * 6, [right] * 6))
    assert lifted["groups"] == 2 and lifted["difference"] == 5 / 6
    assert lifted["low"] == 0 and lifted["high"] == 1 and not lifted["excludes_zero"]
    flat = paired_agreement([ex("t", {"1": 0.5, "2": 0.5})], agreement_figures("u", [{"1": 0.5, "2": 0.5}], [None]),
                            agreement_figures("d", [{"1": 0.5, "2": 0.5}], [None]))
    assert flat["groups"] == 0 and flat["difference"] != flat["difference"]  # NaN: the teacher orders no pair
    with pytest.raises(ValueError, match="measured on these 3 examples"):
        paired_agreement(examples[:3], before, after)
    with pytest.raises(ValueError, match="no held-out"):
        paired_agreement([], before, after)


def test_user_dataset_rows_become_labelled_groups(tmp_path):
    from ruler_rl.labels import load_user_dataset
    from ruler_rl.trainer.distill import labelled_groups

    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"task": "t", "response_a": "A", "response_b": "B", "preferred": "b"},
        {"instruction": "i", "output_1": "one", "output_2": "two", "label": 1},
        {"task": "g", "responses": ["x", "y", "z"], "ranking": [2, 0, 1]},
    ]) + "\n")
    pairs, groups, _, _ = load_user_dataset(path)
    got = labelled_groups([*pairs, *groups])
    assert [g.labels for g in got] == [[0.0, 1.0], [1.0, 0.0], [2.0, 1.0, 3.0]]
    assert got[0].message_lists[1][-1] == {"role": "assistant", "content": "B"}


def _cli(*args):
    from ruler_rl.cli import app

    return runner.invoke(app, ["distill", *args])


def test_distill_command_errors(tmp_path):
    out = str(tmp_path / "judge")
    res = _cli("--out", out)
    assert res.exit_code == 2 and "no teacher data" in res.output
    res = _cli("--out", out, "--dataset", str(tmp_path / "x.jsonl"), "--since", "2026-11-01")
    assert res.exit_code == 2 and "give --teacher too" in res.output
    res = _cli("--out", out, "--teacher", "openai/o3", "--since", "last tuesday")
    assert res.exit_code == 2 and "ISO 8601" in res.output
    res = _cli("--out", out, "--teacher", "openai/o3", "--cache", str(tmp_path / "nocache"))
    assert res.exit_code == 2 and "no judge cache" in res.output
    store = open_cache(tmp_path / "c")
    msgs = build_prompt(_group_convs("GOOD a", "BAD b"), RUBRIC).messages
    store.set("ruler:1", judgment_record([], [], model="openai/gpt-4.1", messages=msgs, answer=""))
    res = _cli("--out", out, "--teacher", "openai/o3", "--cache", str(tmp_path / "c"))
    assert res.exit_code == 2 and "no usable judgments of 'openai/o3'" in res.output
    assert "openai/gpt-4.1 (1)" in res.output
    res = _cli("--out", out, "--dataset", str(tmp_path / "missing.jsonl"))
    assert res.exit_code == 2 and "dataset file not found" in res.output
    res = _cli("--out", out, "--dataset", str(tmp_path / "x.jsonl"), "--rubric", "no-such-rubric")
    assert res.exit_code == 2 and "rubric" in res.output


def test_local_folder_judge_errors(tmp_path):
    with pytest.raises(JudgeConfigError, match="not a folder"):
        check_local_model(f"local/{tmp_path / 'nothing-here'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(JudgeConfigError, match="neither a model"):
        check_local_model(f"local/{tmp_path / 'empty'}")
    assert model_identity("local/smollm2-135m-instruct") == "local/smollm2-135m-instruct"
    assert model_identity("openai/o3") == "openai/o3"


def synthetic_dataset(path: Path, n_groups: int = 16, seed: int = 0) -> Path:
    """A tiny ranking task: each response states its quality word; the labels follow the word."""
    rng = random.Random(seed)
    levels = [("excellent", 1.0), ("mediocre", 0.5), ("terrible", 0.0)]
    topics = ["the capital of France", "how to boil an egg", "the speed of light", "a haiku about rain",
              "sorting a list", "the boiling point of water", "why the sky is blue", "a tip for sleep",
              "the tallest mountain", "how tides work", "a good password", "the first computer",
              "how bees make honey", "a pasta recipe", "the largest ocean", "how vaccines work"]
    with open(path, "w") as f:
        for g in range(n_groups):
            lv = levels[:]
            rng.shuffle(lv)
            t = topics[g % len(topics)]
            f.write(json.dumps({"task": f"Write a short answer about {t}.",
                                "responses": [f"This is a {w} answer about {t}." for w, _ in lv],
                                "scores": [s for _, s in lv]}) + "\n")
    return path


@pytest.mark.slow
def test_distill_20_steps_beats_the_untrained_student_and_loads_as_a_judge(tmp_path):
    from ruler_rl.cli import app

    data = synthetic_dataset(tmp_path / "synth.jsonl")
    out = tmp_path / "my-judge"
    started = time.perf_counter()
    res = runner.invoke(app, ["distill", "--dataset", str(data), "--out", str(out), "--steps", "20", "--lr", "1e-3",
                              "--batch-size", "2", "--holdout", "0.25", "--max-eval", "4", "--seed", "0",
                              "--rubric", RUBRIC, "--cache", str(tmp_path / "cache"), "--json"])
    assert res.exit_code == 0, res.output
    assert len(res.stdout.strip().splitlines()) == 1  # stdout is the JSON alone
    result = json.loads(res.stdout)
    assert "step 20: loss" in res.stderr  # the progress, on stderr
    before, after = result["untrained"], result["distilled"]
    assert result["heldout"] == 4 and before["judge"] == "local/smollm2-135m-instruct"
    assert after["errors"] == 0 and after["pairs"] == 12
    assert after["pairwise_accuracy"] > before["pairwise_accuracy"], (before, after)
    paired = result["paired"]  # the same 12 pairs for both (no invalid answer), resampled by group
    assert paired["pairs"] == 12 and paired["difference"] == pytest.approx(paired["after"] - paired["before"])
    assert paired["after"] == pytest.approx(after["pairwise_accuracy"])
    assert paired["low"] <= paired["difference"] <= paired["high"]
    print(f"distill test: {time.perf_counter() - started:.0f} s; before {before}; after {after}")

    # the folder is a judge like any other: a litellm model string, scoring a group through RULER
    assert (out / "adapter_config.json").is_file() and json.loads((out / "ruler_judge.json").read_text())["steps"] == 20
    judge = f"local/{out}"
    group = TrajectoryGroup([Trajectory(messages_and_choices=[
        {"role": "user", "content": "Write a short answer about the tallest mountain."},
        {"role": "assistant", "content": f"This is a {w} answer about the tallest mountain."}])
        for w in ("terrible", "excellent")])
    scored = asyncio.run(ruler_score_group(group, judge, rubric=RUBRIC, cache=str(tmp_path / "cache")))
    assert scored is not None and all(0 <= t.reward <= 1 for t in scored.trajectories)
    # its own cache namespace: the key names the folder's weights, and changes when they change
    ident = model_identity(judge)
    assert ident.startswith(f"local/{out.resolve()}#") and ident != model_identity("local/smollm2-135m-instruct")
    got, _ = export_judgments(tmp_path / "cache", judge)
    assert got, "the distilled judge's answers are recorded under its own model string"
    weights = out / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"")  # same bytes: same identity
    assert model_identity(judge) == ident
    cfg = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**cfg, "lora_alpha": cfg["lora_alpha"] * 2}))
    assert model_identity(judge) != ident


def test_cap_by_group_keeps_whole_groups_chosen_by_seed_not_the_oldest_prompts():
    """`--max-eval`: a prefix of the held-out prompts is the oldest judgments, one ordering only (2026-12-08: the
    first 200 of 485 were all shown as 1, 2). The cap keeps whole groups (every ordering), seeded, in order."""
    from ruler_rl.trainer.distill import TeacherExample, cap_by_group

    def ex(group, order):
        return TeacherExample(messages=[], ids=order, scores={"1": 1.0, "2": 0.0}, explanations={"1": "", "2": ""},
                              answer="", group=group)

    groups = [f"g{i:02d}" for i in range(20)]
    # as a judge run stores them: every group's first ordering, then every group's second
    examples = [ex(g, ["1", "2"]) for g in groups] + [ex(g, ["2", "1"]) for g in groups]
    kept = cap_by_group(examples, 10, seed=0)
    assert len(kept) == 10 and kept != examples[:10]
    by_group = {}
    for e in kept:
        by_group.setdefault(e.group, []).append(e.ids)
    assert len(by_group) == 5 and all(orders == [["1", "2"], ["2", "1"]] for orders in by_group.values())
    assert [examples.index(e) for e in kept] == sorted(examples.index(e) for e in kept)  # original order
    assert cap_by_group(examples, 10, seed=0) == kept and cap_by_group(examples, 10, seed=1) != kept
    assert cap_by_group(examples, 11, seed=0) == kept  # no half group: 11 holds five whole ones
    assert cap_by_group(examples, 40) == examples
    # a group of one prompt fits a cap of 1, whatever the seed's order
    assert [e.group for e in cap_by_group(examples + [ex("solo", ["1", "2"])], 1)] == ["solo"]
    # every group larger than the cap: the smallest one, whole (both orderings), rather than nothing
    fallback = cap_by_group(examples, 1)
    assert len(fallback) == 2 and fallback[0].group == fallback[1].group
    for bad in (0, -1, 2.5, True, None):
        with pytest.raises(ValueError, match="max_prompts"):
            cap_by_group(examples, bad)
