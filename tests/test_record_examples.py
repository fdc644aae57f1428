"""Smoke runs of examples/email_agent_langgraph.py and examples/email_agent_agents_sdk.py: one tiny RULER-scored
training step of each framework's ART·E agent on the CPU (embedded SmolLM2-135M as the policy), with a scripted judge on loopback that favours the
trajectory it sees first, so the group has a learning signal."""

import importlib.util

import pytest

from ruler_rl.testing import FakeJudge

pytestmark = pytest.mark.slow


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, f"examples/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["email_agent_langgraph", "email_agent_agents_sdk"])
async def test_each_framework_email_agent_trains_one_step_with_ruler(inbox_db, tmp_path, name):
    db, _ = inbox_db
    example = load_example(name)
    judge = FakeJudge()
    judge.first_bonus = 0.4
    try:
        (row,) = await example.train(example.rollout, "smoke", policy=example.policy, argv=[
            "--steps", "1", "--groups-per-step", "1", "--group-size", "2", "--max-turns", "1", "--max-tokens", "12",
            "--per-inbox", "2", "--db", str(db), "--out", str(tmp_path), "--judge", f"openai/fake-judge@{judge.base}"])
    finally:
        judge.close()
    assert row["trained"] and row["step"] == 1 and row["sequences"] == 2 and row["trained_tokens"] > 0
    (request,) = judge.requests  # one RULER call for the group, showing both recorded rollouts
    prompt = "\n".join(str(m.get("content")) for m in request["messages"])
    assert prompt.count("<trajectory id=") == 2 and "email search agent" in prompt
