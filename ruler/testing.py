"""A scripted OpenAI-compatible judge on loopback, for testing pipelines offline and injecting faults.

    judge = FakeJudge(latency_s=0.05)
    await ruler_score_group(group, "openai/fake-judge", judge.params)

It answers RULER prompts by reading the `<trajectory id="N">` blocks of the user message and scoring
each by a marker in its text (GOOD -> 0.9, OK -> 0.5, BAD -> 0.1, else 0.3). `script` is a list of
fault modes (`MODES`) consumed one per request ("ok" when empty); an item that is a dict is sent back as the
assistant message itself (`{"content": ...}` or `{"tool_calls": [...]}`: a scripted agent). An unknown mode
is refused with a `ValueError` when the script is set. `latency_s` delays every answer. Every request body
is recorded (`requests`, with arrival times in `times`); `reset()` forgets them and restores every setting
to what the constructor was given. Loopback only.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCK = re.compile(r'<trajectory id="(\d+)">(.*?)</trajectory>', re.S)
MODES = {"ok", "400", "500", "503", "429", "slow", "malformed", "prose", "fenced", "out_of_range_10", "out_of_range_100",
         "negative", "shuffled", "missing_id", "extra_id", "duplicate_id", "string_scores", "nan", "empty", "bare_list",
         "cut_off"}


def marker_score(text: str) -> float:
    return 0.9 if "GOOD" in text else 0.5 if "OK" in text else 0.1 if "BAD" in text else 0.3


def _check_seconds(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _check_script_item(i: int, item) -> str | dict:
    if isinstance(item, dict):
        if not ({"content", "tool_calls"} & item.keys()):
            raise ValueError(f"script[{i}]: a scripted assistant message needs 'content' or 'tool_calls', "
                             f"got keys {sorted(item)}")
        return item
    if isinstance(item, str) and item in MODES:
        return item
    raise ValueError(f"script[{i}]: unknown fault mode {item!r}; the modes are {sorted(MODES)} "
                     "(or a dict: an assistant message to send back)")


class FakeJudge:
    """The scripted judge server (see the module docstring). Settings tests may change: `script`,
    `slow_seconds` (how long "slow" sleeps), `retry_after` (the 429's Retry-After header), `latency_s`,
    `drift` (the k-th request adds k * drift to every score: a judge whose scale wanders) and `first_bonus`
    (added to the score of whichever trajectory is shown first: a position bias)."""

    def __init__(self, slow_seconds: float = 2.0, retry_after: str = "0", latency_s: float = 0.0):
        if not isinstance(retry_after, str):
            raise TypeError(f"retry_after must be the header's text (e.g. \"1\"), got {retry_after!r}")
        self._defaults = {"slow_seconds": _check_seconds("slow_seconds", slow_seconds),
                          "latency_s": _check_seconds("latency_s", latency_s), "retry_after": retry_after,
                          "drift": 0.0, "first_bonus": 0.0}
        self.requests: list[dict] = []
        self.times: list[float] = []
        self._script: list[str | dict] = []
        self._lock = threading.Lock()
        for name, value in self._defaults.items():
            setattr(self, name, value)
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
                    mode = judge._script.pop(0) if judge._script else "ok"
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
                cut = mode == "cut_off"  # stopped by max_tokens, as vLLM reports it
                self._send(200, {
                    "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "fake"),
                    "choices": [{"index": 0, "finish_reason": "length" if cut else "stop",
                                 "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 4096 if cut else 20,
                              "total_tokens": 4196 if cut else 120},
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

    @property
    def script(self) -> tuple:
        """The fault modes (and scripted messages) not yet consumed, in order; set it to a new list."""
        with self._lock:
            return tuple(self._script)

    @script.setter
    def script(self, items) -> None:
        if isinstance(items, (str, dict)) or not hasattr(items, "__iter__"):
            raise TypeError(f"script must be a list of fault modes or messages, got {items!r}")
        checked = [_check_script_item(i, item) for i, item in enumerate(items)]
        with self._lock:
            self._script = checked

    def reset(self) -> None:
        """Forget the recorded requests and the script; restore every setting to the constructor's."""
        with self._lock:
            self.requests.clear()
            self.times.clear()
            self._script = []
            for name, value in self._defaults.items():
                setattr(self, name, value)

    @staticmethod
    def user_text(body: dict) -> str:
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        return users[-1]["content"] if users else ""

    def answer(self, body: dict, mode: str) -> str:
        """The assistant text the judge sends back for `body` under fault `mode` (one of `MODES`)."""
        if mode not in MODES:
            raise ValueError(f"unknown fault mode {mode!r}; the modes are {sorted(MODES)}")
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
        if mode == "cut_off":  # a grammar with free whitespace, written until the token limit
            return '{\n  "scores": [' + "\n" * 200
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
    proc = subprocess.Popen([sys.executable, "-m", "ruler_rl", "serve", "--port", str(port), "--db", str(db),
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
