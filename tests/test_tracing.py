"""Tracing to Langfuse (ruler_rl.tracing) through the real langfuse SDK, against a Langfuse-compatible endpoint on
loopback: it takes the SDK's OTLP export (protobuf, decoded with opentelemetry.proto) at
/api/public/otel/v1/traces and its scores at /api/public/scores, and the tests read what arrived."""

import gzip
import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ruler_rl import (
    RetryPolicy,
    Trajectory,
    TrajectoryGroup,
    gather_trajectory_groups,
    group_advantages,
    ruler_score_group,
    tracing,
)
from ruler_rl.errors import JudgeUnavailableError
from ruler_rl.judges.extras import MissingExtraError, pip_command
from ruler_rl.messages import TrajectoryError
from ruler_rl.scoring import ruler_result
from ruler_rl.trajectory import validate_trajectories
from tests.helpers import convo

ROOT = Path(__file__).resolve().parents[1]
FAST = RetryPolicy(attempts=2, initial_wait=0.01, max_wait=0.05, timeout=5)
MODEL = "openai/fake-judge"
TOOLS = [{"type": "function", "function": {"name": "search_inbox", "parameters": {"type": "object"}}}]


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


class FakeLangfuse:
    """A Langfuse-compatible endpoint: records each span (trace id, name, attributes) and each score.
    `fail` makes every request a 503."""

    def __init__(self):
        self.spans: list[dict] = []
        self.scores: list[dict] = []
        self.auth: set[str] = set()
        self.fail = False
        self.refused: list[str] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if fake.fail:
                    with fake._lock:
                        fake.refused.append(self.path)
                    return self._send(503, b'{"message": "down"}')
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with fake._lock:
                    fake.auth.add(self.headers.get("authorization", ""))
                    if self.path == "/api/public/otel/v1/traces":
                        req = ExportTraceServiceRequest()
                        req.ParseFromString(body)
                        for rs in req.resource_spans:
                            for ss in rs.scope_spans:
                                for s in ss.spans:
                                    fake.spans.append({"trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                                       "name": s.name,
                                                       "attrs": {a.key: _value(a.value) for a in s.attributes}})
                        return self._send(200, b"{}")
                    if self.path == "/api/public/scores":
                        fake.scores += json.loads(body)
                        return self._send(202, b'{"message": "Accepted"}')
                return self._send(404, b"{}")

            def _send(self, code, data):
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def traces(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for s in self.spans:
            out.setdefault(s["trace_id"], []).append(s)
        return out

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def langfuse(monkeypatch):
    """The endpoint, and the environment configuring tracing to it (a fresh public key per test: the SDK keeps
    one client per key)."""
    fake = FakeLangfuse()
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", f"pk-lf-{uuid.uuid4().hex}")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-test")
    monkeypatch.setenv("LANGFUSE_HOST", fake.url)
    monkeypatch.setenv("LANGFUSE_TIMEOUT", "2")
    tracing.set_tracer(None)
    yield fake
    tracing.set_tracer(None)
    fake.close()


def group(*answers: str) -> TrajectoryGroup:
    return TrajectoryGroup([Trajectory(messages_and_choices=convo(a), tools=TOOLS, reward=0.25, metrics={"turns": 1})
                            for a in answers])


def meta(span: dict, key: str):
    """An observation metadata value as the SDK writes it (JSON-encoded per key)."""
    return json.loads(span["attrs"][f"langfuse.observation.metadata.{key}"])


async def test_scoring_sends_one_trace_per_trajectory_with_its_id_score_explanation_and_the_judge_call(judge,
                                                                                                     langfuse):
    g = group("GOOD: Tuesday 2pm", "BAD: no idea, Friday", "OK: Tuesday, probably")
    scored = await ruler_score_group(g, MODEL, judge.params, retry=FAST)
    tracing.flush()
    ids = [t.metadata[tracing.TRAJECTORY_ID_KEY] for t in scored.trajectories]
    assert len(set(ids)) == 3 and all(len(i) == 32 for i in ids)
    assert all(tracing.TRAJECTORY_ID_KEY not in t.metadata for t in g.trajectories)  # the input is untouched
    traces = langfuse.traces()
    assert {"Basic " + __import__("base64").b64encode(
        f"{os.environ['LANGFUSE_PUBLIC_KEY']}:sk-lf-test".encode()).decode()} == langfuse.auth
    for t, tid in zip(scored.trajectories, ids):
        spans = {s["name"]: s for s in traces[tid]}  # the trajectory id is its Langfuse trace id
        assert set(spans) == {"rollout", "ruler-judgment"}
        rollout = spans["rollout"]
        assert rollout["attrs"]["langfuse.trace.name"] == "rollout"
        assert json.loads(rollout["attrs"]["langfuse.trace.metadata.trajectory_id"]) == tid
        assert rollout["attrs"]["langfuse.observation.type"] == "agent"
        sent = json.loads(rollout["attrs"]["langfuse.observation.input"])
        assert sent["messages"] == t.messages() and sent["tools"] == TOOLS
        assert meta(rollout, "reward") == 0.25 and meta(rollout, "metrics") == {"turns": 1}  # before judging
        judgment = json.loads(spans["ruler-judgment"]["attrs"]["langfuse.observation.output"])
        assert judgment == {"score": t.reward, "explanation": t.metadata["ruler_explanation"]}
    assert [s["name"] for s in langfuse.scores] == ["ruler_score"] * 3
    by_trace = {s["traceId"]: s for s in langfuse.scores}
    assert {tid: (by_trace[tid]["value"], by_trace[tid]["comment"]) for tid in ids} == {
        tid: (t.reward, t.metadata["ruler_explanation"]) for t, tid in zip(scored.trajectories, ids)}
    assert [by_trace[tid]["value"] for tid in ids] == [0.9, 0.1, 0.5]
    # the judgment: one generation per judge call, with its usage, and a summary naming the trajectories
    judging_id = json.loads(by_trace[ids[0]]["metadata"]) if isinstance(by_trace[ids[0]]["metadata"], str) \
        else by_trace[ids[0]]["metadata"]
    judging = traces[judging_id["judging_trace_id"]]
    calls = [s for s in judging if s["name"] == "ruler-judge-call"]
    assert len(calls) == 1 == len(judge.requests)
    call = calls[0]["attrs"]
    assert call["langfuse.observation.type"] == "generation"
    assert call["langfuse.observation.model.name"] == MODEL
    assert json.loads(call["langfuse.observation.usage_details"]) == {"input": 100, "output": 20, "total": 120}
    assert json.loads(call["langfuse.observation.input"]) == judge.requests[0]["messages"]
    assert meta(calls[0], "cached") is False and meta(calls[0], "latency_s") > 0
    assert meta(calls[0], "prompt_chars") == sum(len(m["content"]) for m in judge.requests[0]["messages"])
    assert meta(calls[0], "answer_chars") == len(call["langfuse.observation.output"])  # the raw answer
    summary = next(s for s in judging if s["name"] == "ruler_score_group")
    assert json.loads(summary["attrs"]["langfuse.observation.input"]) == {"trajectory_ids": ids}
    assert meta(summary, "calls") == 1 and meta(summary, "prompt_tokens") == 100


async def test_a_cached_judgment_is_a_generation_marked_cached_and_ids_survive_rescoring(judge, langfuse):
    g = group("GOOD a", "BAD b")
    first = await ruler_score_group(g, MODEL, judge.params, retry=FAST)
    again = await ruler_score_group(first, MODEL, judge.params, retry=FAST)  # served from the cache
    tracing.flush()
    ids = [t.metadata[tracing.TRAJECTORY_ID_KEY] for t in first.trajectories]
    assert [t.metadata[tracing.TRAJECTORY_ID_KEY] for t in again.trajectories] == ids
    assert len(judge.requests) == 1
    cached = [s for s in langfuse.spans if s["name"] == "ruler-judge-call" and meta(s, "cached")]
    assert len(cached) == 1
    assert json.loads(cached[0]["attrs"]["langfuse.observation.usage_details"]) == {"input": 0, "output": 0, "total": 0}
    traces = langfuse.traces()
    for tid in ids:  # one rollout each, two judgments each
        names = sorted(s["name"] for s in traces[tid])
        assert names == ["rollout", "ruler-judgment", "ruler-judgment"]


async def test_gathered_rollouts_are_traced_once_and_concurrent_judgments_keep_their_own_calls(judge, langfuse):
    async def rollout(answer):
        return Trajectory(messages_and_choices=convo(answer), reward=7.0)

    judge.latency_s = 0.2  # both groups' judge calls are in flight at once
    groups = await gather_trajectory_groups(
        [TrajectoryGroup(rollout(a) for a in answers)
         for answers in (("GOOD x", "BAD y"), ("OK z", "BAD w", "GOOD v"))],
        after_each=lambda gr: ruler_score_group(gr, MODEL, judge.params, retry=FAST), pbar_desc=None)
    tracing.flush()
    assert judge.times[1] - judge.times[0] < 0.2  # the two judgments overlapped
    ids = [[t.metadata[tracing.TRAJECTORY_ID_KEY] for t in g.trajectories] for g in groups]
    rollouts = [s for s in langfuse.spans if s["name"] == "rollout"]
    assert sorted(s["trace_id"] for s in rollouts) == sorted(ids[0] + ids[1])  # once each
    assert all(meta(s, "reward") == 7.0 for s in rollouts)  # as gathered, before the judge's score
    assert sorted(s["traceId"] for s in langfuse.scores) == sorted(ids[0] + ids[1])
    traces = langfuse.traces()
    for group_ids in ids:
        summary = next(s for s in langfuse.spans if s["name"] == "ruler_score_group"
                       and json.loads(s["attrs"]["langfuse.observation.input"])["trajectory_ids"] == group_ids)
        calls = [s for s in traces[summary["trace_id"]] if s["name"] == "ruler-judge-call"]
        assert len(calls) == 1
        shown = json.loads(calls[0]["attrs"]["langfuse.observation.input"])[-1]["content"]
        assert shown.count("<trajectory id=") == len(group_ids)  # this group's prompt, not the other's


async def test_an_explicit_tracer_without_content_sends_sizes_only(judge, monkeypatch):
    fake = FakeLangfuse()
    for var in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_HOST"):
        monkeypatch.delenv(var, raising=False)
    assert tracing.current_tracer() is None  # nothing configured: off
    tracer = tracing.LangfuseTracer(public_key=f"pk-lf-{uuid.uuid4().hex}", secret_key="sk", host=fake.url,
                                    capture_content=False, timeout=2)
    tracing.set_tracer(tracer)
    try:
        assert tracing.current_tracer() is tracer
        scored = await ruler_score_group(group("GOOD a", "BAD b"), MODEL, judge.params, retry=FAST)
        tracing.flush()
    finally:
        tracing.set_tracer(None)
        fake.close()
    rollouts = [s for s in fake.spans if s["name"] == "rollout"]
    assert len(rollouts) == 2
    chars = {t.metadata[tracing.TRAJECTORY_ID_KEY]: sum(len(m["content"]) for m in t.messages())
             for t in scored.trajectories}
    assert {s["trace_id"]: meta(s, "message_chars") for s in rollouts} == chars
    for s in rollouts:
        assert "langfuse.observation.input" not in s["attrs"] and "langfuse.observation.output" not in s["attrs"]
    call = next(s for s in fake.spans if s["name"] == "ruler-judge-call")
    assert "langfuse.observation.input" not in call["attrs"] and meta(call, "prompt_chars") > 0
    assert len(fake.scores) == 2


async def test_ruler_result_traces_its_judge_calls_and_a_failed_judgment_is_marked(judge, langfuse):
    await ruler_result([convo("GOOD a"), convo("BAD b")], MODEL, judge.params, retry=FAST)
    judge.script = ["500", "500"]
    with pytest.raises(JudgeUnavailableError):
        await ruler_score_group(group("GOOD c", "BAD d"), MODEL, judge.params, retry=FAST, cache=False)
    tracing.flush()
    summaries = {s["name"]: s for s in langfuse.spans if s["name"] in ("ruler", "ruler_score_group")}
    assert "langfuse.observation.level" not in summaries["ruler"]["attrs"]
    failed = summaries["ruler_score_group"]["attrs"]
    assert failed["langfuse.observation.level"] == "ERROR" and "JudgeUnavailableError" in \
        failed["langfuse.observation.status_message"]
    errors = [s for s in langfuse.spans if s["name"] == "ruler-judge-call"
              and s["attrs"].get("langfuse.observation.level") == "ERROR"]
    assert len(errors) == 1 and errors[0]["trace_id"] == summaries["ruler_score_group"]["trace_id"]
    assert langfuse.scores == []  # nothing judged, nothing scored


async def test_a_failing_langfuse_never_breaks_scoring(judge, langfuse, caplog):
    langfuse.fail = True
    with caplog.at_level(logging.WARNING):
        scored = await ruler_score_group(group("GOOD a", "BAD b"), MODEL, judge.params, retry=FAST)
        tracing.flush()  # the export fails: logged by the SDK, not raised
    assert [t.reward for t in scored.trajectories] == [0.9, 0.1]
    assert langfuse.spans == [] and langfuse.scores == []
    assert {"/api/public/otel/v1/traces", "/api/public/scores"} <= set(langfuse.refused)  # it did try
    assert "Failed to export spans batch" in caplog.text


async def test_a_tracer_that_raises_is_logged_and_scoring_goes_on(judge, caplog):
    class Broken:
        def __getattr__(self, name):
            def fail(*args, **kwargs):
                raise RuntimeError(f"{name} exploded")
            return fail

    tracing.set_tracer(Broken())
    try:
        with caplog.at_level(logging.WARNING, logger="ruler.tracing"):
            scored = await ruler_score_group(group("GOOD a", "BAD b"), MODEL, judge.params, retry=FAST)
    finally:
        tracing.set_tracer(None)
    assert [t.reward for t in scored.trajectories] == [0.9, 0.1]
    assert "tracing: tracing a judge call failed (RuntimeError: start_judge_call exploded)" in caplog.text
    assert "tracing: tracing a judgment failed" in caplog.text


async def test_set_tracer_false_turns_tracing_off_whatever_the_environment(judge, langfuse):
    tracing.set_tracer(False)
    scored = await ruler_score_group(group("GOOD a", "BAD b"), MODEL, judge.params, retry=FAST)
    tracing.set_tracer(None)
    assert tracing.current_tracer() is not None
    tracing.flush()
    assert langfuse.spans == [] and langfuse.scores == []
    assert all(len(t.metadata[tracing.TRAJECTORY_ID_KEY]) == 32 for t in scored.trajectories)  # ids all the same


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="Tracer methods"):
        tracing.set_tracer(object())
    with pytest.raises(ValueError, match="False \\(off\\)"):
        tracing.set_tracer(True)
    with pytest.raises(TypeError, match="takes a Trajectory"):
        tracing.trajectory_id({"metadata": {}})
    with pytest.raises(ValueError, match="non-empty string"):
        tracing.trajectory_id(Trajectory(messages_and_choices=convo("a"), metadata={"ruler_trajectory_id": 3}))
    with pytest.raises(ValueError, match="needs secret_key"):
        tracing.LangfuseTracer(public_key="pk", secret_key="")
    with pytest.raises(ValueError, match="http\\(s\\) URL"):
        tracing.LangfuseTracer(public_key="pk", secret_key="sk", host="localhost:3000")
    with pytest.raises(ValueError, match="timeout"):
        tracing.LangfuseTracer(public_key="pk", secret_key="sk", host="http://127.0.0.1:9", timeout=0)
    own = Trajectory(messages_and_choices=convo("a"), metadata={"ruler_trajectory_id": "run-7/rollout-3"})
    assert tracing.trajectory_id(own) == "run-7/rollout-3"
    assert tracing.ensure_trajectory_id(own) == "run-7/rollout-3"
    bad = Trajectory(messages_and_choices=convo("a"), metadata={"ruler_trajectory_id": 3})
    assert tracing.ensure_trajectory_id(bad) is None and bad.metadata == {"ruler_trajectory_id": 3}  # never raises
    fresh = Trajectory(messages_and_choices=convo("a"), metadata={"ruler_trajectory_id": None})
    assert len(tracing.ensure_trajectory_id(fresh)) == 32 == len(fresh.metadata["ruler_trajectory_id"])
    assert tracing.langfuse_trace_id("run-7/rollout-3") == __import__("langfuse").Langfuse.create_trace_id(
        seed="run-7/rollout-3")


@pytest.mark.parametrize("bad", [3, "", "   ", True, 1.5])
async def test_a_bad_trajectory_id_is_refused_before_any_judge_call_and_swallowed_like_other_bad_input(
        judge, monkeypatch, bad):
    for var in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert tracing.current_tracer() is None  # tracing off: the id is input all the same
    g = group("GOOD a", "BAD b", "OK c")
    g.trajectories[1].metadata[tracing.TRAJECTORY_ID_KEY] = bad
    with pytest.raises(TrajectoryError, match="^trajectory 2: metadata\\['ruler_trajectory_id'\\] is .*non-empty "
                                              "string") as info:
        validate_trajectories(g)
    assert info.value.problems[0].loc == (1, "metadata", "ruler_trajectory_id")
    with pytest.raises(TrajectoryError, match="trajectory 2: metadata\\['ruler_trajectory_id'\\]"):
        await ruler_score_group(g, MODEL, judge.params, retry=FAST, cache=False)
    assert await ruler_score_group(g, MODEL, judge.params, retry=FAST, cache=False, swallow_exceptions=True) is None
    assert judge.requests == []  # refused before any judge call
    g.trajectories[1].metadata[tracing.TRAJECTORY_ID_KEY] = "rollout-2"  # a good one is kept, the others get one
    scored = await ruler_score_group(g, MODEL, judge.params, retry=FAST, cache=False)
    ids = [t.metadata[tracing.TRAJECTORY_ID_KEY] for t in scored.trajectories]
    assert ids[1] == "rollout-2" and len(ids[0]) == len(ids[2]) == 32 and len(judge.requests) == 1


async def test_gathering_leaves_a_rollout_with_a_bad_id_untraced_and_never_raises(langfuse, caplog):
    async def rollout(answer, **metadata):
        return Trajectory(messages_and_choices=convo(answer), reward=1.0, metadata=metadata)

    with caplog.at_level(logging.WARNING, logger="ruler.tracing"):
        groups = await gather_trajectory_groups(
            [TrajectoryGroup([rollout("a"), rollout("b", ruler_trajectory_id=7)]),
             TrajectoryGroup([rollout("c"), rollout("d", ruler_trajectory_id="mine")])], pbar_desc=None)
    tracing.flush()
    assert [[t.metadata.get(tracing.TRAJECTORY_ID_KEY) for t in g.trajectories][1] for g in groups] == [7, "mine"]
    good = [groups[0].trajectories[0], *groups[1].trajectories]
    assert sorted(s["trace_id"] for s in langfuse.spans if s["name"] == "rollout") == sorted(
        tracing.langfuse_trace_id(t.metadata[tracing.TRAJECTORY_ID_KEY]) for t in good)
    assert "a trajectory is left untraced: metadata['ruler_trajectory_id'] must be a non-empty string" in caplog.text


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)


SCORE_AND_REPORT = """
import asyncio, sys
from ruler_rl import Trajectory, TrajectoryGroup, ruler_score_group
from tests.helpers import convo
g = TrajectoryGroup([Trajectory(messages_and_choices=convo(a)) for a in ("GOOD a", "BAD b")])
try:
    scored = asyncio.run(ruler_score_group(g, "openai/fake-judge", {API}))
    print("scored", [t.reward for t in scored.trajectories])
except Exception as exc:
    print("raised", type(exc).__name__, exc)
print("langfuse imported:", "langfuse" in sys.modules, "opentelemetry imported:", "opentelemetry" in sys.modules)
"""


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANGFUSE_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_tracing_off_never_imports_langfuse(judge):
    res = _run(SCORE_AND_REPORT.replace("{API}", repr(judge.params)), _clean_env())
    assert res.returncode == 0, res.stderr
    assert "scored [0.9, 0.1]" in res.stdout and "langfuse imported: False opentelemetry imported: False" in res.stdout


def test_configured_without_the_package_is_a_clear_missing_extra_error(judge, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'langfuse':\n"
        "            raise ModuleNotFoundError(name, name=name)\n        return None\n"
        "sys.meta_path.insert(0, Block())\n")
    env = _clean_env(LANGFUSE_PUBLIC_KEY="pk", LANGFUSE_SECRET_KEY="sk", LANGFUSE_HOST="http://127.0.0.1:9",
                     PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    res = _run(SCORE_AND_REPORT.replace("{API}", repr(judge.params)), env)
    assert res.returncode == 0, res.stderr
    assert "raised MissingExtraError tracing to Langfuse needs the 'tracing' extra" in res.stdout
    assert pip_command("tracing") in res.stdout
    assert issubclass(MissingExtraError, ImportError)


GATHER_AND_REPORT = """
import asyncio
from ruler_rl import Trajectory, TrajectoryGroup, gather_trajectory_groups
from tests.helpers import convo
ran = []
async def rollout(a):
    ran.append(a)
    return Trajectory(messages_and_choices=convo(a))
items = [TrajectoryGroup(rollout(a) for a in ("x", "y")), TrajectoryGroup(rollout(a) for a in ("z", "w"))]
try:
    asyncio.run(gather_trajectory_groups(items, pbar_desc=None))
    print("gathered")
except Exception as exc:
    print("gather raised", type(exc).__name__, exc)
print("rollouts run:", len(ran))
from ruler_rl.trainer import TrainableModel
try:  # not registered: the tracer is resolved before anything else (RuntimeError 'not registered' otherwise)
    asyncio.run(TrainableModel("m", "p", "local/smollm2-135m-instruct").train([]))
except Exception as exc:
    print("train raised", type(exc).__name__)
"""


def test_gathering_configured_without_the_package_raises_before_any_rollout_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'langfuse':\n"
        "            raise ModuleNotFoundError(name, name=name)\n        return None\n"
        "sys.meta_path.insert(0, Block())\n")
    env = _clean_env(LANGFUSE_PUBLIC_KEY="pk", LANGFUSE_SECRET_KEY="sk", LANGFUSE_HOST="http://127.0.0.1:9",
                     PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    res = _run(GATHER_AND_REPORT, env)
    assert res.returncode == 0, res.stderr
    assert "gather raised MissingExtraError tracing to Langfuse needs the 'tracing' extra" in res.stdout
    assert "rollouts run: 0" in res.stdout
    assert "train raised MissingExtraError" in res.stdout


@pytest.mark.slow
async def test_a_training_step_is_traced_and_linked_to_its_trajectories_and_a_failing_langfuse_does_not_stop_it(
        judge, langfuse, tmp_path, caplog):
    from ruler_rl.trainer import LocalBackend, TrainableModel, TrainConfig

    model = TrainableModel("traced", "p", "local/smollm2-135m-instruct")
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    try:
        msgs = [{"role": "system", "content": "Answer with one word."},
                {"role": "user", "content": "Capital of France?"}]

        async def rollouts(seed):
            reply = await model.openai_client().chat.completions.create(model=model.name, messages=msgs, n=3,
                                                                        max_tokens=6, temperature=1.0, seed=seed)
            return TrajectoryGroup([Trajectory(messages_and_choices=[*msgs, c], reward=float(i))
                                    for i, c in enumerate(reply.choices)])

        group = await rollouts(1)  # rewards of its own, never scored by RULER: traced when trained
        row = await model.train([group], TrainConfig(learning_rate=1e-3))
        assert row["trained"] is True and row["step"] == 1
        tracing.flush()
        ids = [t.metadata[tracing.TRAJECTORY_ID_KEY] for t in group.trajectories]
        assert len(set(ids)) == 3
        steps = [s for s in langfuse.spans if s["name"] == "train-step" and
                 s["attrs"].get("langfuse.trace.name") == "train-step"]
        assert len(steps) == 1
        sent = json.loads(steps[0]["attrs"]["langfuse.observation.input"])
        assert sent["trajectory_ids"] == ids and sent["model"] == "traced" and sent["project"] == "p"
        out = json.loads(steps[0]["attrs"]["langfuse.observation.output"])
        assert out["step"] == 1 and out["loss"] == pytest.approx(row["loss"]) and out["reward_mean"] == 1.0
        traces = langfuse.traces()
        for t, tid in zip(group.trajectories, ids):
            spans = {s["name"]: s for s in traces[tid]}
            assert set(spans) == {"rollout", "train-step"}
            assert meta(spans["rollout"], "reward") == t.reward
            assert meta(spans["train-step"], "step") == 1
            assert meta(spans["train-step"], "train_trace_id") == steps[0]["trace_id"]
        events = {s["trace_id"]: s for s in langfuse.spans if s["name"] == "train-step" and s["trace_id"] in ids}
        assert [meta(events[tid], "advantage") for tid in ids] == group_advantages([0.0, 1.0, 2.0])
        assert meta(events[ids[0]], "advantage") < 0 < meta(events[ids[2]], "advantage")
        # the middle one's advantage is 0: the step did not train it
        assert [meta(events[tid], "trajectory_trained") for tid in ids] == [True, False, True]

        langfuse.fail = True  # Langfuse goes down: the next step trains all the same
        with caplog.at_level(logging.WARNING):
            second = await model.train([await rollouts(2)], TrainConfig(learning_rate=1e-3))
            tracing.flush()
        assert second["trained"] is True and second["step"] == 2
        assert "/api/public/otel/v1/traces" in langfuse.refused
    finally:
        await backend.close()


@pytest.mark.slow
async def test_traced_advantages_are_the_losses_own_and_no_tracing_failure_loses_a_step(langfuse, tmp_path, caplog):
    from ruler_rl.trainer import LocalBackend, TrainableModel, TrainConfig
    from ruler_rl.trainer.runlog import load_run_log

    model = TrainableModel("adv", "p", "local/smollm2-135m-instruct")
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    try:
        msgs = [{"role": "system", "content": "Answer with one word."},
                {"role": "user", "content": "Capital of Italy?"}]

        async def rollouts(seed, rewards=(0.0, 1.0, 3.0)):
            reply = await model.openai_client().chat.completions.create(model=model.name, messages=msgs, n=3,
                                                                        max_tokens=6, temperature=1.0, seed=seed)
            return TrajectoryGroup([Trajectory(messages_and_choices=[*msgs, c], reward=r)
                                    for r, c in zip(rewards, reply.choices)])

        # dr_grpo trains on unscaled advantages: the trace shows those, not group_advantages' default (scaled)
        group = await rollouts(1)
        row = await model.train([group], TrainConfig(learning_rate=1e-3, loss="dr_grpo"))
        assert row["trained"] is True and row["step"] == 1
        tracing.flush()
        ids = [t.metadata[tracing.TRAJECTORY_ID_KEY] for t in group.trajectories]
        events = {s["trace_id"]: s for s in langfuse.spans if s["name"] == "train-step" and s["trace_id"] in ids}
        shown = [meta(events[tid], "advantage") for tid in ids]
        assert shown == group_advantages([0.0, 1.0, 3.0], scale=False) == pytest.approx([-4 / 3, -1 / 3, 5 / 3])
        assert shown != pytest.approx(group_advantages([0.0, 1.0, 3.0]))
        assert [meta(events[tid], "trajectory_trained") for tid in ids] == [True, True, True]

        # a tracer whose hooks raise: the step is taken, and its row is returned and logged
        class Broken:
            def __getattr__(self, name):
                def fail(*args, **kwargs):
                    raise RuntimeError(f"{name} exploded")
                return fail

        tracing.set_tracer(Broken())
        with caplog.at_level(logging.WARNING):
            second = await model.train([await rollouts(2)], TrainConfig(learning_rate=1e-3))
        assert second["trained"] is True and second["step"] == 2 and await model.get_step() == 2
        assert "tracing: tracing a training step failed (RuntimeError: train_step exploded)" in caplog.text

        # a bad trajectory id is refused before the step, never found after it
        bad = await rollouts(3)
        bad.trajectories[2].metadata[tracing.TRAJECTORY_ID_KEY] = 5
        with pytest.raises(TrajectoryError, match="group 0, trajectory 3: metadata\\['ruler_trajectory_id'\\] is 5"):
            await model.train([bad], TrainConfig(learning_rate=1e-3))
        assert await model.get_step() == 2

        # whatever the after-step hook raises is logged: the row is the caller's
        def boom(row, seqs):
            raise RuntimeError(f"hook exploded after step {row['step']} on {len(seqs)} sequences")

        caplog.clear()
        with caplog.at_level(logging.WARNING):
            third = await backend.train(model, [await rollouts(4)], TrainConfig(learning_rate=1e-3), on_step=boom)
        assert third["trained"] is True and third["step"] == 3 and await model.get_step() == 3
        assert "the after-step hook failed (RuntimeError: hook exploded after step 3 on 3 sequences)" in caplog.text
        assert list(load_run_log(model.run_dir)["step"]) == [1, 2, 3]
    finally:
        tracing.set_tracer(None)
        await backend.close()


EXIT_SCRIPT = """
import socket, sys, threading, time
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(64)  # accepts, never answers
threading.Thread(target=lambda: [srv.accept() for _ in iter(int, 1)], daemon=True).start()
from ruler_rl.tracing import LangfuseTracer
if sys.argv[1] == "traced":
    tracer = LangfuseTracer(public_key="pk-lf-x", secret_key="sk-lf-x",
                            host=f"http://127.0.0.1:{srv.getsockname()[1]}", flush_timeout_s=0.5)
    tracer.client.create_event(name="buffered")
print(time.monotonic(), flush=True)
"""


def seconds_to_exit(mode: str) -> float:
    """From the end of a script's work to the end of its process (its exit handlers and teardown)."""
    import time

    proc = subprocess.Popen([sys.executable, "-c", EXIT_SCRIPT, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    done = float(proc.stdout.readline())
    proc.wait(timeout=120)
    return time.monotonic() - done


@pytest.mark.slow  # waits out the flush bound
def test_a_silent_langfuse_costs_an_exiting_process_at_most_the_flush_bound():
    """The SDK's own shutdown retries a host that accepts and never answers for about 5 s at every exit; the
    tracer's shutdown waits `flush_timeout_s` (0.5 s here) and drops what is left."""
    baseline, traced = seconds_to_exit("plain"), seconds_to_exit("traced")
    assert traced - baseline < 2.0, (baseline, traced)
