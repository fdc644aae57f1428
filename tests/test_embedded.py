"""The real embedded judge (SmolLM2-135M on CPU), loaded once per session."""

import json

import litellm
import pytest
from typer.testing import CliRunner

from ruler_rl import TrajectoryGroup, group_advantages, ruler_score_group
from ruler_rl.cli import app
from ruler_rl.judges import EMBEDDED_JUDGE
from ruler_rl.prompt import response_schema

pytestmark = pytest.mark.slow


def demo_group() -> TrajectoryGroup:
    from importlib import resources

    return TrajectoryGroup.model_validate_json((resources.files("ruler_rl") / "data" / "demo_group.json").read_text())


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


async def test_cancelled_and_timed_out_calls_stop_the_generation(embedded_model, monkeypatch):
    """A thread cannot be cancelled: the generation must notice. A cancelled call stops before its next token,
    calls queued behind it never generate, a call past its deadline (a 504, a retried job group) stops too, and
    so does one still reading a long prompt. Uncancelled, each would take 10-25 s on a CPU."""
    import asyncio
    import time

    import ruler_rl.judges.embedded as emb
    from ruler_rl.judges import JudgeUnavailableError, RetryPolicy, complete

    runs = []  # (started, ended) of every generation that reached the decoder
    decode = embedded_model.decoder.generate

    def recorded(*args, **kwargs):
        runs.append([time.monotonic(), None])
        try:
            return decode(*args, **kwargs)
        finally:
            runs[-1][1] = time.monotonic()

    monkeypatch.setattr(embedded_model.decoder, "generate", recorded)
    story = [{"role": "user", "content": "Write a very long story about a cat and a lighthouse."}]

    async def settled(since: float, limit: float = 10) -> float:
        while emb._lock.locked() or any(end is None for _, end in runs):
            assert time.monotonic() - since < limit, "the generation kept running after its call was cancelled"
            await asyncio.sleep(0.01)
        return time.monotonic() - since

    calls = [asyncio.create_task(litellm.acompletion(model=EMBEDDED_JUDGE, messages=story, max_tokens=300))
             for _ in range(3)]
    while not runs:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    cancelled = time.monotonic()
    for c in calls:
        c.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    assert await settled(cancelled) < 1.5
    await asyncio.sleep(0.3)  # a queued call that still generated would have started by now
    assert len(runs) == 1 and not emb._lock.locked()

    runs.clear()
    started = time.monotonic()
    with pytest.raises(JudgeUnavailableError, match="deadline"):
        await complete(EMBEDDED_JUDGE, story, params={"max_tokens": 300}, retry=RetryPolicy(attempts=1, deadline=1.0))
    assert await settled(started) < 2.5 and len(runs) == 1

    # a long prompt (~4,000 tokens, ~9 s to read on an idle CPU) is read in pieces of PREFILL_CHUNK tokens:
    # cancelled, it stops at the next piece, before decoding (counted in pieces, not seconds: a loaded CI
    # machine reads a piece in several seconds)
    runs.clear()
    pieces = []  # the start time of every prompt piece read
    read = embedded_model.model.forward

    def counted(*args, **kwargs):
        pieces.append(time.monotonic())
        return read(*args, **kwargs)

    monkeypatch.setattr(embedded_model.model, "forward", counted)
    call = asyncio.create_task(litellm.acompletion(model=EMBEDDED_JUDGE, max_tokens=300, messages=[
        {"role": "user", "content": "Summarise: " + "the lighthouse keeper's cat " * 700}]))
    while not pieces:
        await asyncio.sleep(0.01)
    cancelled = time.monotonic()
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    await settled(cancelled, limit=60)  # the piece being read finishes first: seconds each on a loaded machine
    assert runs == []  # never reached the decoder
    assert len([t for t in pieces if t > cancelled]) <= 1  # at most the piece that had begun when cancelled
    assert len(pieces) < 4000 // emb.PREFILL_CHUNK  # the whole prompt was not read
