"""The real embedded judge (SmolLM2-135M on CPU), loaded once per session."""

import json

import litellm
import pytest
from typer.testing import CliRunner

from judges import EMBEDDED_JUDGE
from ruler import TrajectoryGroup, group_advantages, ruler_score_group
from ruler.cli import app
from ruler.prompt import response_schema

pytestmark = pytest.mark.slow


def demo_group() -> TrajectoryGroup:
    from importlib import resources

    return TrajectoryGroup.model_validate_json((resources.files("ruler") / "data" / "demo_group.json").read_text())


async def test_embedded_judge_scores_a_real_group(embedded_model):
    group = demo_group()
    scored = await ruler_score_group(group, EMBEDDED_JUDGE, cache=False)
    assert len(scored) == len(group)
    for t in scored:
        assert 0.0 <= t.reward <= 1.0 and t.metrics["ruler_score"] == t.reward
        assert any(line.startswith("RULER explanation: ") for line in t.logs)
    assert scored.metadata["judge_prompt_tokens"] > 500 and scored.metadata["judge_cost"] == 0
    assert len(group_advantages([t.reward for t in scored])) == len(group)


def test_embedded_model_is_a_litellm_model_string_with_constrained_json(embedded_model):
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": response_schema(["1", "2"])}}
    resp = litellm.completion(model=EMBEDDED_JUDGE, messages=[
        {"role": "user", "content": "Score two answers to 2+2: '4' and '5'."}], response_format=fmt, max_tokens=200)
    data = json.loads(resp.choices[0].message.content)
    assert [s["trajectory_id"] for s in data["scores"]] == ["1", "2"]
    assert all(0 <= s["score"] <= 1 for s in data["scores"])
    assert resp.usage.prompt_tokens > 10 and resp.usage.completion_tokens > 5


def test_cli_scores_a_file_with_the_embedded_default(tmp_path, embedded_model):
    path = demo_group().save(tmp_path / "demo.json")
    res = CliRunner().invoke(app, ["score", str(path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["metadata"]["judge_model"] == EMBEDDED_JUDGE
    assert len(out["scores"]) == 4 and all(0 <= s["score"] <= 1 for s in out["scores"])
