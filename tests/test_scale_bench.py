"""The pipeline benchmark's phases (issue #13), run on the CPU engine: one registered model trains the plain
steps, then the overlapped ones, and each step and phase is recorded as such."""

import json

import pytest

from evals.scale_bench import main, parse_phases


def test_phases_parse_and_bad_ones_are_refused_by_name():
    assert parse_phases("plain:2,overlap:3") == [("plain", 2), ("overlap", 3)]
    for bad in ("plain", "plain:0", "fast:2", "overlap:x"):
        with pytest.raises(Exception, match="KIND:STEPS"):
            parse_phases(bad)
    with pytest.raises(SystemExit):
        main(["pipeline", "--task", "tiny", "--dry-run", "--phases", "plain:1", "--overlap"])


def test_plain_then_overlapped_steps_on_one_model(tmp_path):
    main(["pipeline", "--task", "tiny", "--dry-run", "--placement", "dedicated", "--phases", "plain:1,overlap:2",
          "--groups", "2", "--group-size", "4", "--tiny-max-tokens", "8", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "pipeline-tiny-dedicated-plain-overlap.json").read_text())
    assert not result["errors"]
    assert [(s["phase"], s["step"]) for s in result["steps"]] == [("plain", 1), ("overlap", 2), ("overlap", 3)]
    # the overlapped phase's second step trained on rollouts its first step's policy sampled while it trained
    assert [s.get("policy_lag_max") for s in result["steps"]] == [0, 0, 1]
    assert [(p["kind"], p["steps"]) for p in result["phase_summary"]] == [("plain", 1), ("overlap", 2)]
    assert result["phase_summary"][0]["steady_step_s"] is None  # a phase's first step is not steady
    assert result["phase_summary"][1]["steady_step_s"] == result["steps"][2]["wall_step_s"]
