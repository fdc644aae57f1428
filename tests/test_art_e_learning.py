"""evals.art_e.learning: paired intervals, regrading and the reward's ranking of right answers, on the recorded
Qwen2.5-Coder-1.5B run (evals/reports/art_e/qwen15-h100) and on small hand-made tables."""

import json
from pathlib import Path

import numpy as np
import pytest

from evals.art_e.learning import load_run, paired, reward_signal

RUN = Path(__file__).resolve().parents[1] / "evals/reports/art_e/qwen15-h100/ruler-seed0"


def test_paired_interval_brackets_the_mean_difference_and_excludes_zero_only_when_it_should():
    before, after = np.zeros(100), np.r_[np.ones(30), np.zeros(70)]
    r = paired(before, after)
    assert r["difference"] == pytest.approx(0.3) and 0 < r["low"] < 0.3 < r["high"]
    same = paired(after, after)
    assert same["difference"] == 0 and same["low"] == 0 == same["high"]
    mixed = paired(np.r_[np.ones(5), np.zeros(95)], np.r_[np.zeros(5), np.ones(5), np.zeros(90)])
    assert mixed["low"] < 0 < mixed["high"]
    with pytest.raises(ValueError):
        paired(np.zeros(3), np.zeros(4))


def test_reward_signal_counts_right_over_wrong_pairs(tmp_path):
    lines = [{"scored": True, "rollouts": [{"reward": 1.0, "correct": 1}, {"reward": 0.2, "correct": 0},
                                           {"reward": 1.0, "correct": 0}, {"reward": 0.5, "correct": None}]},
             {"scored": True, "rollouts": [{"reward": 0.1, "correct": 1}, {"reward": 0.9, "correct": 0}]},
             {"scored": True, "rollouts": [{"reward": 0.3, "correct": 0}, {"reward": 0.4, "correct": 0}]},
             {"scored": False, "rollouts": [{"reward": None, "correct": 1}, {"reward": None, "correct": 0}]}]
    f = tmp_path / "groups.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines))
    s = reward_signal(f)
    assert (s["groups"], s["groups_mixed"], s["pairs"], s["wins"], s["ties"], s["losses"]) == (3, 2, 3, 1, 1, 1)
    assert s["pairwise_accuracy"] == pytest.approx(0.5)


def test_the_recorded_run_reads_back_and_regrading_uses_todays_matcher():
    before, after = load_run(RUN)
    assert len(before) == len(after) == 174
    assert int(before["correct"].sum()) == 5 and int(after["correct"].sum()) == 0
    regraded, _ = load_run(RUN, regrade=True)
    # "The email from Vince Kaminski to Margaret Carson about Fwd curves was read." does not say who replied:
    # the matcher of the run accepted it, today's does not
    q = "Who replied to my email about Fwd curves?"
    assert bool(before.loc[q, "correct"]) and not bool(regraded.loc[q, "correct"])
    kept, _ = load_run(RUN, keep={(q, "margaret.carson@enron.com")})
    assert list(kept.index) == [q]
    with pytest.raises(FileNotFoundError):
        load_run(RUN.parent / "no-such-run")


def test_a_run_cut_before_its_after_evaluation_is_read_against_its_latest_held_out_measure(tmp_path, capsys):
    import shutil

    from evals.art_e.learning import latest_eval, main

    cut = tmp_path / "cut"
    shutil.copytree(RUN, cut)
    (cut / "after.parquet").rename(cut / "eval-step0007.parquet")
    shutil.copy(cut / "before.parquet", cut / "eval-step0003.parquet")  # an earlier measure, not the latest
    assert latest_eval(cut) == "eval-step0007.parquet"
    with pytest.raises(FileNotFoundError):  # load_run alone still wants after.parquet
        load_run(cut)
    before, after = load_run(cut, after=latest_eval(cut))
    assert int(before["correct"].sum()) == 5 and int(after["correct"].sum()) == 0
    main([str(cut)])
    out = capsys.readouterr().out
    assert "cut (eval-step0007.parquet, no after.parquet)" in out and "-0.0287" in out
    (cut / "eval-step0007.parquet").unlink()
    (cut / "eval-step0003.parquet").unlink()
    main([str(cut)])
    assert "no after.parquet, no eval-step*.parquet; before 5/174 right" in capsys.readouterr().out


def test_training_curve_reads_right_shares_by_block(tmp_path):
    from evals.art_e.learning import training_curve

    def group(step, right, n=4):
        return {"step": step, "scored": True, "rollouts": [{"correct": int(i < right), "art_reward": 0.0, "turns": 2,
                                                            "reward": 0.5} for i in range(n)]}

    f = tmp_path / "groups.jsonl"
    f.write_text("\n".join(json.dumps(group(s, r)) for s, r in [(0, 0), (1, 1), (2, 4), (3, 3), (4, 4)]))
    table, comparison = training_curve(f, block=2)
    assert table["steps"].tolist() == ["0-1", "2-3", "4-4"] and table["right"].tolist() == [1, 7, 4]
    assert table["share"].tolist() == pytest.approx([1 / 8, 7 / 8, 1.0])
    assert comparison["first_share"] == pytest.approx(1 / 8)
    assert comparison["difference"] == pytest.approx(11 / 12 - 1 / 8) and 0 < comparison["low"] <= comparison["high"]
    with pytest.raises(ValueError):
        training_curve(f, block=0)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError):
        training_curve(tmp_path / "empty.jsonl")


def test_kinds_are_read_from_scenario_ids_and_a_curve_can_keep_one(tmp_path):
    from evals.art_e.learning import scenario_kind, training_curve

    assert [scenario_kind(i) for i in ("daren.farmer-3731-sender", "sally.beck-301-date-20",
                                       "vince.kaminski-8723-reply", "hub-test-17")] == ["sender", "date", "reply", None]
    rows = [{"step": 0, "scenario_id": "a-1-sender", "rollouts": [{"correct": 0}, {"correct": 0}]},
            {"step": 5, "scenario_id": "a-2-sender", "rollouts": [{"correct": 0}, {"correct": 1}]},
            {"step": 5, "scenario_id": "a-3-phone-1", "rollouts": [{"correct": 1}, {"correct": 1}]}]
    f = tmp_path / "groups.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    _, every = training_curve(f, block=4)
    _, sender = training_curve(f, block=4, kind="sender")
    assert every["difference"] == pytest.approx(0.75) and sender["difference"] == pytest.approx(0.5)
    table, phone = training_curve(f, block=4, kind="phone")  # one block: nothing to compare it with
    assert table["steps"].tolist() == ["5-5"] and "difference" not in phone
    with pytest.raises(ValueError):
        training_curve(f, kind="date")


def test_the_seeds_mean_is_formed_only_over_seeds_of_one_configuration(tmp_path, capsys):
    import shutil

    from evals.art_e.learning import main

    for name, seed, reward in (("s0", 0, "ruler"), ("s1", 1, "ruler"), ("art", 1, "art")):
        shutil.copytree(RUN, tmp_path / name)
        run = json.loads((tmp_path / name / "run.json").read_text())
        (tmp_path / name / "run.json").write_text(json.dumps({**run, "seed": seed, "reward": reward,
                                                              "name": name, "out": f"/x/{name}"}))
    main([str(tmp_path / "s0"), str(tmp_path / "s1")])
    assert "seeds' mean" in capsys.readouterr().out
    # stopping rules may differ (a --steps cap, a time budget) where the measured policy step is the same...
    step = json.loads((tmp_path / "s0" / "run.json").read_text())["policy_step"]

    def rewrite(name, **changes):
        path = tmp_path / name / "run.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    rewrite("s1", steps=step, time_budget_s=123.0, commit="b" * 40)
    main([str(tmp_path / "s0"), str(tmp_path / "s1")])
    out = capsys.readouterr().out
    assert "seeds' mean  " in out and "different commits" in out and "s1 bbbbbbbbbbbb" in out  # pooled, but said
    rewrite("s1", policy_step=step - 1)  # ...but a seed stopped a step earlier is not averaged in
    main([str(tmp_path / "s0"), str(tmp_path / "s1")])
    out = capsys.readouterr().out
    assert "no seeds' mean" in out and f"s0 {step}, s1 {step - 1}" in out
    rewrite("s1", policy_step=step)
    main([str(tmp_path / "s0"), str(tmp_path / "art")])
    out = capsys.readouterr().out
    assert "no seeds' mean" in out and "seeds' mean  " not in out
    (tmp_path / "s1" / "after.parquet").rename(tmp_path / "s1" / f"eval-step{step - 1:04d}.parquet")
    main([str(tmp_path / "s0"), str(tmp_path / "s1")])  # measured at different points
    assert "no seeds' mean" in capsys.readouterr().out
    # --step reads every folder at one policy step: s1's mid-run measure and s0's after.parquet (it ended there)
    main([str(tmp_path / "s0"), str(tmp_path / "s1"), "--step", str(step - 1)])
    out = capsys.readouterr().out
    assert "s0: not measured at policy step" in out and "seeds' mean  " not in out
    assert f"s1 (eval-step{step - 1:04d}.parquet, no after.parquet)" in out
    (tmp_path / "s1" / f"eval-step{step - 1:04d}.parquet").rename(tmp_path / "s1" / f"eval-step{step:04d}.parquet")
    main([str(tmp_path / "s0"), str(tmp_path / "s1")])  # the same policy step, once as after, once mid-run
    assert "seeds' mean  " in capsys.readouterr().out
    main([str(tmp_path / "s0"), str(tmp_path / "s1"), "--step", str(step)])
    assert "seeds' mean  " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "s0"), "--step", "0"])
    (tmp_path / "s1" / "before.parquet").unlink()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "s1")])


def test_held_out_accuracy_is_split_by_question_kind(capsys):
    import pandas as pd

    from evals.art_e.learning import main, paired_by_kind

    before, after = load_run(RUN)
    table = paired_by_kind(before, after).set_index("kind")
    # the recorded run lost all five of its right answers: four reply questions and one date question
    assert table.loc["reply", ["right_before", "right_after", "questions"]].tolist() == [4, 0, 30]
    assert table.loc["date", ["right_before", "right_after"]].tolist() == [1, 0]
    assert table["questions"].sum() == 174 and table["right_before"].sum() == 5
    assert table.loc["reply", "high"] < 0  # four of 30 lost: the reply interval excludes 0 on its own
    # one kind moving while another stays: only the moved kind's interval leaves 0
    idx = [f"q{i}" for i in range(40)]
    b = pd.DataFrame({"kind": ["phone"] * 20 + ["date"] * 20, "correct": [False] * 40}, index=idx)
    a = b.assign(correct=[i < 12 for i in range(20)] + [False] * 20)
    moved = paired_by_kind(b, a).set_index("kind")
    assert moved.loc["phone", "right_after"] == 12 and moved.loc["phone", "low"] > 0
    assert moved.loc["date", "difference"] == 0 and moved.loc["date", "high"] == 0
    # both sides vary within a kind, after in another row order and holding a question before lacks: rows are
    # paired by question, not by position
    b2 = pd.DataFrame({"kind": ["phone"] * 4 + ["date"] * 2, "correct": [True, False, False, False, True, False]},
                      index=["p1", "p2", "p3", "p4", "d1", "d2"])
    a2 = pd.DataFrame({"kind": ["date", "phone", "phone", "phone", "date", "phone", "phone"],
                       "correct": [True, True, True, False, False, True, True]},
                      index=["d2", "p4", "p3", "p2", "d1", "p1", "extra"])
    t2 = paired_by_kind(b2, a2).set_index("kind")
    # phone: p1 1->1, p2 0->0, p3 0->1, p4 0->1; date: d1 1->0, d2 0->1
    assert t2.loc["phone", ["right_before", "right_after", "questions"]].tolist() == [1, 3, 4]
    assert t2.loc["phone", "difference"] == pytest.approx(0.5)
    assert t2.loc["phone", "low"] == 0  # no question lost: a mispairing would put a -1 among the differences
    assert t2.loc["date", ["right_before", "right_after", "difference"]].tolist() == [1, 1, 0]
    assert t2.loc["date", "low"] == pytest.approx(-1) and t2.loc["date", "high"] == pytest.approx(1)
    with pytest.raises(ValueError, match="'kind' and 'correct'"):
        paired_by_kind(b.drop(columns="kind"), a)
    with pytest.raises(ValueError, match="no question in common"):
        paired_by_kind(b, a.rename(index=lambda q: q + "x"))
    main([str(RUN)])
    out = capsys.readouterr().out
    assert "ruler-seed0: held out, by question kind" in out and " reply             4            0" in out


def test_a_table_holding_a_question_twice_is_refused_not_mispaired(tmp_path):
    import shutil

    import pandas as pd

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    after = pd.read_parquet(run / "after.parquet")
    pd.concat([after, after.iloc[[3]]]).to_parquet(run / "after.parquet")
    with pytest.raises(ValueError, match="1 question\\(s\\) more than once"):
        load_run(run)
    before, _ = load_run(run, after="before.parquet")  # the untouched table still reads
    assert len(before) == 174
    from evals.art_e.learning import main

    with pytest.raises(SystemExit) as exit_:  # the command line says so and exits 2, without a traceback
        main([str(run)])
    assert exit_.value.code == 2
