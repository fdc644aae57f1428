"""The recording HTTP clients against a policy server on loopback (fast, no model): transport options reach
the connection pool, what cannot be recorded is refused or warned about, recording never fails the agent's
call, choices without served token ids stay context, messages match whole (images too), the recorded
trajectory is validated, a history-trimming agent's additional histories are judged by RULER, and the
framework helpers' HTTP clients can be closed."""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import openai
import pytest

from ruler_rl import TrajectoryGroup, ruler_score_group
from ruler_rl.trainer import record_trajectory
from ruler_rl.trainer.record import (
    RecordingError,
    RecordingWarning,
    aclose_recording,
    agents_sdk_model,
    langchain_chat_model,
    litellm_client,
    recording_async_http_client,
    recording_http_client,
)


class PolicyServer:
    """Answers every POST with a chat completion whose choice carries served token ids; `answers` (consumed one
    per request) may replace the answer's text, the whole choice (`{"choice": {...}}`), or the whole raw body
    (`{"raw": b"..."}`). Every request (path, body) is kept in `requests`."""

    def __init__(self):
        self.requests: list[tuple[str, dict]] = []
        self.answers: list = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                server.requests.append((self.path, body))
                answer = server.answers.pop(0) if server.answers else f"answer {len(server.requests)}"
                if isinstance(answer, dict) and "raw" in answer:
                    data = answer["raw"]
                else:
                    choice = answer["choice"] if isinstance(answer, dict) else {
                        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer},
                        "prompt_token_ids": [1, 2, 3], "token_ids": [4, 5], "token_logprobs": [-0.1, -0.2]}
                    data = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "policy",
                                       "choices": [choice]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def policy():
    server = PolicyServer()
    yield server
    server.close()


@pytest.fixture
async def client(policy):
    c = openai.AsyncOpenAI(base_url=policy.base, api_key="x", max_retries=0, http_client=recording_async_http_client())
    yield c
    await c.close()


def ask(client, *messages, **kw):
    msgs = [{"role": "user", "content": m} if isinstance(m, str) else m for m in messages]
    return client.chat.completions.create(model="policy", messages=msgs, **kw)


def test_transport_options_reach_the_inner_connection_pool(monkeypatch):
    default = recording_async_http_client()
    pool = default._transport.inner._pool
    assert (pool._max_connections, pool._max_keepalive_connections) == (1000, 100)  # openai's defaults
    sync = recording_http_client(limits=httpx.Limits(max_connections=7, max_keepalive_connections=3), verify=False)
    pool = sync._transport.inner._pool
    assert (pool._max_connections, pool._max_keepalive_connections) == (7, 3)
    assert pool._ssl_context.verify_mode == ssl.CERT_NONE
    proxied = recording_async_http_client(proxy="http://127.0.0.1:9")
    (mounted,) = proxied._mounts.values()
    assert type(mounted).__name__ == "AsyncRecordingTransport" and mounted.inner._pool._max_connections == 1000
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    from_env = recording_async_http_client()
    assert from_env._mounts and all(type(t).__name__ == "AsyncRecordingTransport" for t in from_env._mounts.values())
    with pytest.raises(ValueError, match="limits would be ignored"):
        recording_async_http_client(httpx.AsyncHTTPTransport(), limits=httpx.Limits(max_connections=5))
    handler = litellm_client()
    assert handler.client._transport.inner._pool._max_connections == 1000


async def test_responses_and_legacy_completions_are_refused_inside_a_recording(policy, client):
    async with record_trajectory() as traj:
        with pytest.raises(openai.BadRequestError, match=r"records chat completions only.*Responses API"):
            await client.responses.create(model="policy", input="hi")
        with pytest.raises(openai.BadRequestError, match=r"legacy completions"):
            await client.completions.create(model="policy", prompt="hi")
        await ask(client, "recorded")
    assert [path for path, _ in policy.requests] == ["/v1/chat/completions"]
    assert len(traj.messages_and_choices) == 2
    await client.completions.create(model="policy", prompt="outside")  # outside a recording: passed through
    assert policy.requests[-1][0] == "/v1/completions"


async def test_unusable_answers_are_logged_and_an_empty_block_warns(policy, caplog):
    http = recording_async_http_client()
    policy.answers = [{"raw": b"not json"}, {"raw": b'{"choices": []}'}]
    with caplog.at_level(logging.WARNING, logger="ruler_rl.trainer.record"), pytest.warns(RecordingWarning,
                                                                                 match="recorded no chat"):
        async with record_trajectory() as traj:
            for _ in range(2):
                r = await http.post(f"{policy.base}/chat/completions", json={"model": "m", "messages": [
                    {"role": "user", "content": "hi"}]})
                assert r.status_code == 200
    await http.aclose()
    assert traj.messages_and_choices == []
    notes = [r.getMessage() for r in caplog.records]
    assert any("not a JSON object" in n for n in notes) and any("usable" in n for n in notes)


async def test_an_aborted_choice_is_recorded_without_failing_the_agents_call(policy, client):
    policy.answers = [{"choice": {"index": 0, "finish_reason": "abort", "message": {
        "role": "assistant", "content": "cut"}, "prompt_token_ids": [1, 2], "token_ids": [3]}}]
    async with record_trajectory() as traj:
        reply = await ask(client, "go")
    assert reply.choices[0].message.content == "cut"
    choice = traj.messages_and_choices[1]
    assert choice.finish_reason == "abort" and choice.message.content == "cut"
    assert choice.model_extra["token_ids"] == [3] and choice.model_extra["prompt_token_ids"] == [1, 2]


async def test_choices_without_served_token_ids_are_kept_as_context_and_warned_once(policy, client):
    plain = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "from an API"}}
    policy.answers = [{"choice": plain}, {"choice": plain}, "trained"]
    with pytest.warns(RecordingWarning, match="no served token ids") as caught:
        async with record_trajectory() as traj:
            await ask(client, "first")
            await ask(client, "first", {"role": "assistant", "content": "from an API"}, "second")
            await ask(client, "first", {"role": "assistant", "content": "from an API"}, "second",
                      {"role": "assistant", "content": "from an API"}, "third")
    assert sum("no served token ids" in str(w.message) for w in caught) == 1
    items = traj.messages_and_choices
    assert not traj.additional_histories and len(items) == 6
    assert items[1] == {"role": "assistant", "content": "from an API"} and isinstance(items[3], dict)
    assert items[5].model_extra["token_ids"] == [4, 5]  # the served one stays a trainable Choice


async def test_messages_are_matched_whole_so_a_different_image_starts_another_history(policy, client):
    def image(url):
        return {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                            {"type": "image_url", "image_url": {"url": url}}]}

    async with record_trajectory() as traj:
        await ask(client, image("http://img/a.png"))
        await ask(client, image("http://img/a.png"), {"role": "assistant", "content": "answer 1"}, "more")
        # the same text and the same reply after another image: not the recorded conversation
        await ask(client, image("http://img/b.png"), {"role": "assistant", "content": "answer 1"}, "more",
                  {"role": "assistant", "content": "answer 2"}, "and?")
    assert len(traj.messages_and_choices) == 4
    (other,) = traj.additional_histories
    assert other.messages_and_choices[0]["content"][1]["image_url"]["url"] == "http://img/b.png"
    assert len(other.messages_and_choices) == 6


async def test_an_invalid_recorded_trajectory_is_a_clear_error_at_block_exit(policy, client):
    with pytest.raises(RecordingError, match="not a valid trajectory.*role"):
        async with record_trajectory():
            await ask(client, {"role": "narrator", "content": "once upon a time"})
    with pytest.raises(ZeroDivisionError):  # the block's own exception is never replaced
        async with record_trajectory():
            await ask(client, {"role": "narrator", "content": "x"})
            raise ZeroDivisionError("the agent broke")


async def test_a_history_trimming_agent_is_recorded_and_every_conversation_is_judged(policy, client, judge):
    system = {"role": "system", "content": "You answer questions about the inbox."}

    async def agent(verdict: str):
        """Asks, then trims its history to a summary and asks again: the second request starts a history."""
        async with record_trajectory() as traj:
            first = await ask(client, system, "When is the budget meeting?")
            await ask(client, system, "When is the budget meeting?",
                      {"role": "assistant", "content": first.choices[0].message.content}, "Are you sure?")
            await ask(client, system, f"Summary so far: meeting Thursday. Now {verdict}")
        return traj

    policy.answers = ["Thursday", "yes", "SIDE-ANSWER GOOD", "Thursday", "yes", "SIDE-ANSWER"]
    group = TrajectoryGroup([await agent("confirm it"), await agent("check again")])
    assert [len(t.additional_histories) for t in group.trajectories] == [1, 1]
    scored = await ruler_score_group(group, "openai/fake-judge", judge.params)
    (request,) = judge.requests
    user = request["messages"][1]["content"]
    first, second = user.split('<trajectory id="2">')
    assert first.count("<conversation n=\"2\"") == 1 and "confirm it" in first and "SIDE-ANSWER GOOD" in first
    assert "check again" in second and "GOOD" not in second
    # the judge (GOOD -> 0.9, else 0.3) saw trajectory 1's further conversation
    assert [t.metrics["ruler_score"] for t in scored.trajectories] == [pytest.approx(0.9), pytest.approx(0.3)]


async def test_framework_helpers_http_clients_are_closed_by_aclose_recording():
    model = SimpleNamespace(inference_base_url="http://127.0.0.1:9/v1", inference_api_key="k",
                            get_inference_name=lambda step: "m@0")
    chat = langchain_chat_model(model)
    await aclose_recording(chat)
    assert chat.http_async_client.is_closed and chat.http_client.is_closed
    sdk = agents_sdk_model(model)
    await aclose_recording(sdk)
    assert sdk._client._client.is_closed
    handler = litellm_client()
    await aclose_recording(handler)
    assert handler.client.is_closed
    with pytest.raises(TypeError, match="aclose_recording closes"):
        await aclose_recording(object())


def test_each_framework_helper_checks_only_its_own_packages(monkeypatch):
    import importlib.util

    from ruler_rl.judges.extras import MissingExtraError, require

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "langgraph" else real(name, *a))
    model = SimpleNamespace(inference_base_url="http://127.0.0.1:9/v1", inference_api_key="k",
                            get_inference_name=lambda step: "m@0")
    with pytest.raises(MissingExtraError, match=r"'agents' extra \(langgraph not installed\)"):
        langchain_chat_model(model)
    assert agents_sdk_model(model) is not None  # the Agents SDK does not need langgraph
    require("agents", "x", modules=["agents"])
    with pytest.raises(MissingExtraError):
        require("agents", "x")
    with pytest.raises(ValueError, match="not among the modules"):
        require("agents", "x", modules=["torch"])
    with pytest.raises(ValueError, match="non-empty list"):
        require("agents", "x", modules="agents")
