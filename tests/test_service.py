"""The judging service over real HTTP on loopback (uvicorn), with a real SQLite file and the scripted judge."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.client import AsyncRulerClient, RulerClient, RulerServiceError
from ruler_rl.service.app import ServiceConfig, create_app
from ruler_rl.service.store import Store
from ruler_rl.testing import free_port, start_service
from tests.helpers import convo

ROOT = Path(__file__).resolve().parents[1]


class Running:
    def __init__(self, cfg: ServiceConfig):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)
        self.base = f"http://127.0.0.1:{self.port}"
        self.store = Store(cfg.db_path)
        self.key, self.key_id = self.store.create_key("tests")

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=20)


def group(*answers):
    return TrajectoryGroup([Trajectory(messages_and_choices=convo(a)) for a in answers])


@pytest.fixture
def service(tmp_path, judge):
    made = []

    def make(**overrides):
        cfg = ServiceConfig(db_path=str(tmp_path / f"svc{len(made)}.db"), judge_model="openai/fake-judge",
                            judge_params=judge.params, cache=False, **overrides)
        made.append(Running(cfg))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def test_auth_matrix_and_open_health(service):
    s = service()
    body = {"trajectories": [{"messages_and_choices": convo("GOOD")}, {"messages_and_choices": convo("BAD")}]}
    assert httpx.get(f"{s.base}/healthz").status_code == 200
    assert httpx.post(f"{s.base}/v1/score", json=body).status_code == 401
    assert httpx.post(f"{s.base}/v1/score", json=body, headers={"Authorization": "Bearer rk_forged"}).status_code == 401
    ok = httpx.post(f"{s.base}/v1/score", json=body, headers={"Authorization": f"Bearer {s.key}"}, timeout=30)
    assert ok.status_code == 200 and [x["score"] for x in ok.json()["scores"]] == [0.9, 0.1]
    s.store.revoke_key(s.key_id)
    assert httpx.post(f"{s.base}/v1/score", json=body, headers={"Authorization": f"Bearer {s.key}"}).status_code == 401
    assert "ruler_requests_total" in httpx.get(f"{s.base}/metrics").text


def test_client_round_trip_matches_ruler_score_group_shape(service, judge):
    s = service()
    with RulerClient(s.base, s.key) as client:
        scored = client.score_group(group("GOOD a", "BAD b", "OK c"))
    assert [t.reward for t in scored] == [0.9, 0.1, 0.5]
    t = scored.trajectories[0]
    assert t.metrics["ruler_score"] == 0.9 and "independent_reward" in t.metrics
    assert any(x.startswith("RULER explanation: ") for x in t.logs)


async def test_async_client(service):
    s = service()
    async with AsyncRulerClient(s.base, s.key) as client:
        scored = await client.score_group(group("BAD a", "GOOD b"))
    assert [t.reward for t in scored] == [0.1, 0.9]


@pytest.mark.parametrize("body,status,field", [
    (b"{not json", 422, None),
    ({"trajectories": "nope"}, 422, "trajectories"),
    ({"trajectories": [{"messages_and_choices": convo("a")}], "surprise": 1}, 422, "surprise"),
    ({"trajectories": []}, 422, "trajectories"),
    ({"trajectories": [{"messages_and_choices": convo("x" * 5000)}] * 2}, 422, "content"),
    ({"trajectories": [{"messages_and_choices": convo("a")}] * 9}, 422, "trajectories"),
    ({"trajectories": [{"messages_and_choices": convo("a")}] * 2, "num_permutations": 0}, 422, "num_permutations"),
])
def test_bad_input_gets_a_clear_status_and_the_service_keeps_serving(service, body, status, field):
    s = service(max_trajectories=8, max_message_chars=4000)
    headers = {"Authorization": f"Bearer {s.key}", "content-type": "application/json"}
    r = httpx.post(f"{s.base}/v1/score", content=body if isinstance(body, bytes) else json.dumps(body),
                   headers=headers, timeout=30)
    assert r.status_code == status
    if field:
        assert field in json.dumps(r.json()["detail"])
    assert httpx.get(f"{s.base}/healthz").status_code == 200


def test_body_too_large_is_413(service):
    s = service(max_body_bytes=10_000)
    body = {"trajectories": [{"messages_and_choices": convo("x" * 20_000)}] * 2}
    r = httpx.post(f"{s.base}/v1/score", json=body, headers={"Authorization": f"Bearer {s.key}"})
    assert r.status_code == 413


def test_sql_looking_strings_are_just_text(service):
    s = service()
    evil = "GOOD'); DROP TABLE api_keys; --"
    with RulerClient(s.base, s.key) as client:
        scored = client.score_group(group(evil, "BAD"))
    assert scored.trajectories[0].reward == 0.9 and s.store.list_keys()


def test_rate_limit_answers_429_with_retry_after(service):
    s = service(rate_per_minute=2)
    headers = {"Authorization": f"Bearer {s.key}"}
    body = {"trajectories": [{"messages_and_choices": convo("GOOD")}, {"messages_and_choices": convo("BAD")}]}
    codes = [httpx.post(f"{s.base}/v1/score", json=body, headers=headers, timeout=30) for _ in range(3)]
    assert [r.status_code for r in codes] == [200, 200, 429]
    assert int(codes[-1].headers["retry-after"]) >= 1


def test_idempotency_key_returns_the_first_answer_without_a_second_bill(service, judge):
    s = service()
    headers = {"Authorization": f"Bearer {s.key}", "Idempotency-Key": "abc-1"}
    body = {"trajectories": [{"messages_and_choices": convo("GOOD")}, {"messages_and_choices": convo("BAD")}]}
    first = httpx.post(f"{s.base}/v1/score", json=body, headers=headers, timeout=30)
    second = httpx.post(f"{s.base}/v1/score", json=body, headers=headers, timeout=30)
    assert first.json() == second.json() and len(judge.requests) == 1
    other = dict(body, rubric="efficiency")
    assert httpx.post(f"{s.base}/v1/score", json=other, headers=headers).status_code == 422


def test_jobs_run_in_the_background_and_report_results(service):
    s = service()
    with RulerClient(s.base, s.key) as client:
        job_id = client.submit_job([group("GOOD a", f"BAD {i}") for i in range(5)])
        state = client.wait_job(job_id, poll_s=0.1, timeout_s=60)
        assert state["status"] == "done" and state["done"] == 5
        assert all(r["status"] == "done" and r["result"]["scores"][0]["score"] == 0.9 for r in state["results"])
        with pytest.raises(RulerServiceError) as info:
            client.job("no-such-job")
        assert info.value.status == 404
    r = httpx.delete(f"{s.base}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {s.key}"})
    assert r.status_code == 200 and r.json()["cancelled"] is False


@pytest.mark.slow  # ~20 s of waiting on a hung judge
def test_a_hanging_judge_becomes_an_error_result_not_a_stuck_job(service, judge):
    judge.slow_seconds = 3
    try:
        s = service(judge_timeout_s=1.0)
        judge.script = ["slow"] * 10
        with RulerClient(s.base, s.key, attempts=1) as client:
            with pytest.raises(RulerServiceError) as info:
                client.score_group(group("GOOD", "BAD"))
            assert info.value.status == 504
            job_id = client.submit_job([group("GOOD", "BAD")])
            state = client.wait_job(job_id, poll_s=0.2, timeout_s=30)
        assert state["status"] == "done" and state["results"][0]["status"] == "error"
        assert "timeout" in state["results"][0]["error"]
    finally:
        judge.slow_seconds = 2.0


@pytest.mark.slow
def test_kill_9_during_a_job_then_restart_loses_nothing(tmp_path, judge):
    db = tmp_path / "svc.db"
    key, _ = Store(db).create_key("kill-test")
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "RULER_CACHE_DIR": str(tmp_path / "cache")}

    def start():
        return start_service(db, judge, env, "--worker-concurrency", "2", cwd=ROOT)

    judge.slow_seconds = 0.3
    judge.script = ["slow"] * 1000
    try:
        proc, base = start()
        client = RulerClient(base, key)
        job_id = client.submit_job([group("GOOD", f"BAD {i}") for i in range(40)])
        while client.job(job_id)["done"] < 5:
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, base = start()
        state = RulerClient(base, key).wait_job(job_id, poll_s=0.2, timeout_s=120)
        proc.terminate()
        proc.wait(timeout=30)
    finally:
        judge.slow_seconds = 2.0
    assert state["status"] == "done"
    assert all(r["status"] == "done" and r["result"]["scores"][0]["score"] == 0.9 for r in state["results"])
    with Store(db).connect() as conn:
        attempts = [row[0] for row in conn.execute("SELECT attempts FROM job_groups WHERE job_id = ?", (job_id,))]
    assert len(attempts) == 40 and max(attempts) <= 2  # only groups in flight at the kill were judged twice


def test_slow_loris_body_gets_408_and_the_service_keeps_serving(service):
    import socket

    s = service(body_timeout_s=1.0)
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + s.key.encode() + b"\r\nContent-Length: 500\r\n\r\n{\"traj")
        started = time.time()
        answer = sock.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 408") and time.time() - started < 8
    assert httpx.get(f"{s.base}/healthz").status_code == 200


def test_client_retries_429_and_503_honouring_retry_after():
    """A scripted server on loopback answers 429, then 503, then a real scored group."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answered = group("GOOD", "BAD")
    answered.trajectories[0].reward = 0.9
    replies = [(429, {"detail": "slow down"}), (503, {"detail": "judge busy"}),
               (200, {"group": answered.model_dump(mode="json")})]
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            seen.append(time.monotonic())
            code, body = replies[len(seen) - 1]
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            if code != 200:
                self.send_header("Retry-After", "1")
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with RulerClient(f"http://127.0.0.1:{server.server_address[1]}", "rk_x") as client:
            scored = client.score_group(group("GOOD", "BAD"))
    finally:
        server.shutdown()
    assert len(seen) == 3 and seen[1] - seen[0] >= 0.9 and seen[2] - seen[1] >= 0.9
    assert scored.trajectories[0].reward == 0.9


def test_a_judge_config_error_is_the_clients_fault_on_score_and_in_a_job(service, judge):
    """A judge that refuses the request (HTTP 400: JudgeConfigError) is classified once for both paths: 422 on
    /v1/score, and in a job the group ends `error` at its first attempt (never put back for a retry) with the
    same public message; both count as `bad_request` in the metrics, never as `judge`."""
    judge.script = ["400"] * 10
    s = service(judge_retries=0, max_group_attempts=3, group_retry_s=0.1)
    said = "the judge refused the request or is misconfigured (details in the service's log)"
    headers = {"Authorization": f"Bearer {s.key}"}
    body = {"trajectories": [{"messages_and_choices": convo("GOOD")}, {"messages_and_choices": convo("BAD")}]}
    r = httpx.post(f"{s.base}/v1/score", json=body, headers=headers, timeout=30)
    assert r.status_code == 422 and r.json() == {"detail": said}
    with RulerClient(s.base, s.key) as client:
        state = client.wait_job(client.submit_job([group("GOOD", "BAD")]), poll_s=0.1, timeout_s=30)
    assert state["status"] == "done"
    assert state["results"] == [{"index": 0, "status": "error", "attempts": 1, "result": None,
                                 "error": f"JudgeConfigError: {said}"}]
    assert len(judge.requests) == 2  # one call for /v1/score, one for the job's group: no retry
    metrics = httpx.get(f"{s.base}/metrics").text
    assert 'ruler_errors_total{kind="bad_request"} 2.0' in metrics and 'kind="judge"' not in metrics


def test_openapi_documents_every_json_answer(service):
    """Each route's answer has a named schema; a score row is `ScoreRow` (the CLI's and the library's rows)."""
    spec = httpx.get(f"{service().base}/openapi.json").json()

    def answer(path: str, method: str, status: str) -> str:
        return spec["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]["$ref"]

    assert answer("/v1/score", "post", "200").endswith("/ScoreResponse")
    assert answer("/v1/jobs", "post", "202").endswith("/JobCreated")
    assert answer("/v1/jobs/{job_id}", "get", "200").endswith("/JobStatus")
    assert answer("/v1/jobs/{job_id}", "delete", "200").endswith("/Cancelled")
    assert answer("/healthz", "get", "200").endswith("/Health") and answer("/healthz", "get", "503").endswith("/Health")
    schemas = spec["components"]["schemas"]
    assert schemas["ScoreResponse"]["properties"]["scores"]["items"]["$ref"].endswith("/ScoreRow")
    assert set(schemas["ScoreRow"]["properties"]) == {"trajectory_id", "score", "advantage", "explanation"}
    assert schemas["JobStatus"]["properties"]["results"]["items"]["$ref"].endswith("/GroupResult")


def test_a_bug_is_not_blamed_on_the_client_and_notes_are_answered(service, judge, monkeypatch):
    """A ValueError or TypeError from a bug while judging is `internal` (500, no detail), not the client's 422;
    a judged group's notes come back as a field."""
    s = service()
    headers = {"Authorization": f"Bearer {s.key}"}
    one = {"trajectories": [{"messages_and_choices": convo("GOOD")}]}
    r = httpx.post(f"{s.base}/v1/score", json=one, headers=headers, timeout=30)
    assert r.status_code == 200
    assert r.json()["notes"] == ["single trajectory: scored on its own, without relative grounding"]

    async def broken(*args, **kwargs):
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr("ruler_rl.service.judging.ruler_score_group", broken)
    body = {"trajectories": [{"messages_and_choices": convo("GOOD")}, {"messages_and_choices": convo("BAD")}]}
    r = httpx.post(f"{s.base}/v1/score", json=body, headers=headers, timeout=30)
    assert r.status_code == 500 and r.json() == {"detail": "internal error"}
    assert 'ruler_errors_total{kind="internal"} 1.0' in httpx.get(f"{s.base}/metrics").text
