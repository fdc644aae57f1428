"""A scripted OpenAI-compatible judge on loopback, for testing pipelines offline and injecting faults.

    judge = FakeJudge(latency_s=0.05)
    await ruler_score_group(group, "openai/fake-judge", judge.params)

It answers RULER prompts by reading the `<trajectory id="N">` blocks of the user message and scoring
each by a marker in its text (GOOD -> 0.9, OK -> 0.5, BAD -> 0.1, else 0.3). `script` is a list of
fault modes consumed one per request ("ok" when empty); an item that is a dict is sent back as the
assistant message itself (`{"content": ...}` or `{"tool_calls": [...]}`: a scripted agent). `latency_s`
delays every answer. Every request body is recorded. Loopback only.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCK = re.compile(r'<trajectory id="(\d+)">(.*?)</trajectory>', re.S)
MODES = {"ok", "400", "500", "503", "429", "slow", "malformed", "prose", "fenced", "out_of_range_10", "out_of_range_100",
         "negative", "shuffled", "missing_id", "extra_id", "duplicate_id", "string_scores", "nan", "empty", "bare_list"}


def marker_score(text: str) -> float:
    return 0.9 if "GOOD" in text else 0.5 if "OK" in text else 0.1 if "BAD" in text else 0.3


class FakeJudge:
    def __init__(self, slow_seconds: float = 2.0, retry_after: str = "0", latency_s: float = 0.0):
        self.requests: list[dict] = []
        self.times: list[float] = []
        self.script: list[str] = []
        self.slow_seconds = slow_seconds
        self.latency_s = latency_s
        self.drift = 0.0  # the k-th request adds k * drift to every score (a judge whose scale wanders)
        self.first_bonus = 0.0  # added to the score of whichever trajectory is shown first (position bias)
        self.retry_after = retry_after
        self._lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with judge._lock:
                    body["_index"] = len(judge.requests)
                    judge.requests.append(body)
                    judge.times.append(time.monotonic())
                    mode = judge.script.pop(0) if judge.script else "ok"
                if isinstance(mode, dict):  # a scripted assistant message
                    message = {"role": "assistant", "content": None, **mode}
                    return self._send(200, {
                        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                        "model": body.get("model", "fake"),
                        "choices": [{"index": 0, "message": message,
                                     "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}})
                if mode in ("400", "500", "503"):  # the message names the judge's address, as real ones may
                    return self._send(int(mode), {"error": {"message": f"judge exploded at {judge.base}",
                                                            "type": "server_error" if mode != "400" else "bad_request"}})
                if mode == "429":
                    return self._send(429, {"error": {"message": "rate limited", "type": "rate_limit"}},
                                      {"Retry-After": judge.retry_after})
                if mode == "slow":
                    time.sleep(judge.slow_seconds)
                elif judge.latency_s:
                    time.sleep(judge.latency_s)
                content = judge.answer(body, mode)
                self._send(200, {
                    "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "fake"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                })

            def _send(self, code, obj, headers=None):
                data = json.dumps(obj).encode()
                try:
                    self.send_response(code)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def params(self) -> dict:
        return {"api_base": self.base, "api_key": "sk-test"}

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.times.clear()
            self.script = []
            self.drift = 0.0
            self.first_bonus = 0.0

    @staticmethod
    def user_text(body: dict) -> str:
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        return users[-1]["content"] if users else ""

    def answer(self, body: dict, mode: str) -> str:
        blocks = BLOCK.findall(self.user_text(body))
        bump = self.drift * body.get("_index", 0)
        flip = "contrarian" in str(body.get("model", ""))  # a model that ranks everything backwards
        scores = [{"trajectory_id": tid, "explanation": f"{len(text)} chars",
                   "score": round(min(1.0, (1 - marker_score(text) if flip else marker_score(text)) + bump), 6)}
                  for tid, text in blocks]
        if scores and self.first_bonus:
            scores[0]["score"] = round(min(1.0, scores[0]["score"] + self.first_bonus), 6)
        if mode == "malformed":
            return '{"scores": [{"trajectory_id": "1", "expl'
        if mode == "prose":
            return "I think they are all fine."
        if mode == "empty":
            return ""
        if mode == "out_of_range_10":
            for s in scores:
                s["score"] = round(s["score"] * 10, 3)
        if mode == "out_of_range_100":
            for s in scores:
                s["score"] = round(s["score"] * 100, 3)
        if mode == "negative" and scores:
            scores[0]["score"] = -0.5
        if mode == "shuffled":
            scores = scores[::-1]
        if mode == "missing_id" and scores:
            scores = scores[1:]
        if mode == "extra_id":
            scores.append({"trajectory_id": "99", "explanation": "ghost", "score": 0.5})
        if mode == "duplicate_id" and scores:
            scores.append(dict(scores[0]))
        if mode == "string_scores":
            for s in scores:
                s["score"] = "high"
        if mode == "nan" and scores:
            return json.dumps({"scores": scores}).replace(str(scores[0]["score"]), "NaN", 1)
        if mode == "fenced":
            return "Here are the scores:\n```json\n" + json.dumps({"scores": scores}) + "\n```\nThanks."
        if mode == "bare_list":
            return json.dumps(scores)
        return json.dumps({"scores": scores})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SilentJudge:
    """A judge address that accepts connections and never answers (a hung server, a black-holed proxy).

    The socket listens but never accepts: the kernel completes connections and buffers requests, and no
    byte ever comes back. `base` is an OpenAI-style base URL on loopback.
    """

    def __init__(self):
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    @property
    def params(self) -> dict:
        return {"api_base": self.base, "api_key": "sk-test"}

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def free_port() -> int:
    """A free TCP port on loopback."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(db, judge: FakeJudge, env: dict, *extra: str, cwd=None, wait_s: float = 60.0):
    """`ruler serve` in a subprocess against `judge`, on a free loopback port; (process, base URL) once healthy."""
    import subprocess
    import sys

    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ruler.cli", "serve", "--port", str(port), "--db", str(db),
                             "--judge", "openai/fake-judge", "--judge-api-base", judge.base, *extra],
                            env={"OPENAI_API_KEY": "sk-test", **env}, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{base}/healthz", timeout=1)
            return proc, base
        except httpx.TransportError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the service did not start")
