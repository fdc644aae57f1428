"""record_trajectory end to end on CPU: a LangGraph ReAct agent and an OpenAI Agents SDK agent, unchanged, each
making two tool calls against the CPU server with the real SmolLM2-135M; their recorded trajectories carry every
turn's served token ids, the tool results, and train one step. Concurrent recordings stay apart; a rollout that
raises is counted by gather_trajectory_groups; streaming and a missing framework give clear errors.

SmolLM2-135M rarely calls a tool on its own, so a test transport under the recording client sets `tool_choice`
to a named function for the first two requests of a conversation (the server then constrains decoding to a
valid call) and to `none` afterwards: the model still samples every token, the agent code is untouched."""

import asyncio
import json
import re
from types import SimpleNamespace

import httpx
import openai
import pytest

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.judges.extras import MissingExtraError, pip_command
from ruler_rl.trainer import (
    LocalBackend,
    TooManyExceptions,
    TrainableModel,
    gather_trajectory_groups,
    record_trajectory,
)
from ruler_rl.trainer.record import (
    RecordingWarning,
    agents_sdk_model,
    langchain_chat_model,
    litellm_client,
    recording_http_client,
)
from ruler_rl.trainer.sequences import trained_spans, training_sequences

pytestmark = pytest.mark.slow
BASE = "local/smollm2-135m-instruct"
CALLS = ("get_weather", "get_time")
QUESTION = "What is the weather and the local time in Paris? Use the tools."


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny and 21 C in {city}"


def get_time(city: str) -> str:
    """The local time in a city."""
    return f"it is 14:05 in {city}"


class ForceTwoCalls(httpx.AsyncBaseTransport):
    """Rewrites each chat request's `tool_choice`: the next of CALLS while fewer than two tool results are in
    the conversation, then `none` with a short answer."""

    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content)
            done = sum(m.get("role") == "tool" for m in body["messages"])
            if body.get("tools") and done < len(CALLS):
                body.update(tool_choice={"type": "function", "function": {"name": CALLS[done]}}, max_tokens=40)
            else:
                body.update(tool_choice="none", max_tokens=8)
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            request = httpx.Request(request.method, request.url, headers=headers, content=json.dumps(body).encode())
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def langgraph_rollout(model) -> Trajectory:
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    agent = create_react_agent(langchain_chat_model(model, transport=ForceTwoCalls()),
                               [tool(get_weather), tool(get_time)])
    async with record_trajectory() as traj:
        result = await agent.ainvoke({"messages": [("user", QUESTION)]})
    traj.metadata["final"] = result["messages"][-1].content
    return traj


async def agents_sdk_rollout(model) -> Trajectory:
    from agents import Agent, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    agent = Agent(name="assistant", instructions="Answer with the tools.",
                  tools=[function_tool(get_weather), function_tool(get_time)],
                  model=agents_sdk_model(model, transport=ForceTwoCalls()))
    async with record_trajectory() as traj:
        result = await Runner.run(agent, QUESTION)
    traj.metadata["final"] = str(result.final_output)
    return traj


@pytest.fixture(scope="module")
async def agents(tmp_path_factory):
    model = TrainableModel("rec", "p", BASE)
    backend = LocalBackend(tmp_path_factory.mktemp("record"))
    await model.register(backend)
    try:
        yield SimpleNamespace(model=model, langgraph=await langgraph_rollout(model),
                              agents_sdk=await agents_sdk_rollout(model))
    finally:
        await backend.close()


def check_two_tool_calls(traj: Trajectory) -> None:
    items = traj.messages_and_choices
    choices = [m for m in items if not isinstance(m, dict)]
    assert len(choices) == 3 and not traj.additional_histories
    assert [c.message.tool_calls[0].function.name for c in choices[:2]] == list(CALLS)
    assert json.loads(choices[0].message.tool_calls[0].function.arguments).keys() == {"city"}
    assert not choices[2].message.tool_calls
    tools = [m for m in items if isinstance(m, dict) and m["role"] == "tool"]
    assert [t["content"].split(" in ")[0] for t in tools] == ["sunny and 21 C", "it is 14:05"]
    assert tools[0]["tool_call_id"] == choices[0].message.tool_calls[0].id
    assert any(isinstance(m, dict) and m["role"] == "user" and m["content"] == QUESTION for m in items)
    assert {t["function"]["name"] for t in traj.tools} == set(CALLS)
    # every turn is trained on exactly the tokens the server saw and sampled
    spans = trained_spans(training_sequences(traj))
    assert len(spans) == 3
    for (context, ids, lps), choice in zip(spans, choices):
        assert context == choice.model_extra["prompt_token_ids"] and ids == choice.model_extra["token_ids"]
        assert lps == pytest.approx(choice.model_extra["token_logprobs"])


async def test_a_langgraph_agent_is_recorded_with_every_turn_and_its_token_ids(agents):
    check_two_tool_calls(agents.langgraph)


async def test_an_agents_sdk_agent_is_recorded_with_every_turn_and_its_token_ids(agents):
    check_two_tool_calls(agents.agents_sdk)


async def test_recorded_agents_train_one_step(agents):
    group = TrajectoryGroup([agents.langgraph.model_copy(update={"reward": 1.0}),
                             agents.agents_sdk.model_copy(update={"reward": 0.0})])
    row = await agents.model.train([group])
    sampled = sum(len(c.model_extra["token_ids"]) for t in group for c in t.messages_and_choices
                  if not isinstance(c, dict))
    assert row["trained"] and row["step"] == 1 and row["trained_tokens"] == sampled


async def ask(client, text: str, **kw):
    return await client.chat.completions.create(model="rec", messages=[{"role": "user", "content": text}],
                                                **{"max_tokens": 3, **kw})


async def test_concurrent_recordings_in_tasks_and_threads_stay_apart(agents):
    client = agents.model.openai_client()

    async def task(text: str) -> Trajectory:
        async with record_trajectory() as traj:
            await ask(client, text)
            await asyncio.sleep(0)
            await ask(client, text + " again")
        return traj

    def thread(text: str) -> Trajectory:
        sync = openai.OpenAI(base_url=agents.model.inference_base_url, api_key="x", http_client=recording_http_client())
        with record_trajectory() as traj:
            sync.chat.completions.create(model="rec", messages=[{"role": "user", "content": text}], max_tokens=3)
        return traj

    async def via_litellm(text: str) -> Trajectory:
        import litellm

        async with record_trajectory() as traj:
            await litellm.acompletion(messages=[{"role": "user", "content": text}], max_tokens=3,
                                      client=litellm_client(), **agents.model.litellm_completion_params())
        return traj

    a, b, c, d, e = await asyncio.gather(task("alpha"), task("beta"), asyncio.to_thread(thread, "gamma"),
                                         asyncio.to_thread(thread, "delta"), via_litellm("epsilon"))
    (seq,) = training_sequences(e)  # litellm's completion is recorded with its served token ids
    assert e.messages_and_choices[0]["content"] == "epsilon" and sum(seq.trained) == len(
        e.messages_and_choices[1].model_extra["token_ids"]) > 0
    for traj, text in ((a, "alpha"), (b, "beta")):
        # two unrelated requests: the second starts an additional history
        assert traj.messages_and_choices[0]["content"] == text and len(traj.messages_and_choices) == 2
        (extra,) = traj.additional_histories
        assert extra.messages_and_choices[0]["content"] == text + " again"
    for traj, text in ((c, "gamma"), (d, "delta")):
        assert [m["content"] for m in traj.messages_and_choices[:1]] == [text] and not traj.additional_histories
    # outside a recording nothing is recorded anywhere
    await ask(client, "outside")
    assert all("outside" not in str(t.messages()) for t in (a, b, c, d, e))


async def test_a_rollout_that_raises_mid_way_is_counted_by_gather(agents):
    client = agents.model.openai_client()

    @record_trajectory(metadata={"kind": "ok"})
    async def good():
        await ask(client, "fine")
        return 1.0

    @record_trajectory()
    async def bad():
        await ask(client, "this one breaks")
        raise RuntimeError("tool server went away")

    ok = await good()
    assert ok.reward == 1.0 and ok.metadata["kind"] == "ok" and ok.messages_and_choices[0]["content"] == "fine"
    (group,) = await gather_trajectory_groups([TrajectoryGroup([good(), bad()])], max_exceptions=1,
                                              pbar_desc=None)
    assert len(group) == 1 and len(group.exceptions) == 1
    assert "RuntimeError" in group.exceptions[0].type and "went away" in group.exceptions[0].message
    with pytest.raises(TooManyExceptions):
        await gather_trajectory_groups([TrajectoryGroup([bad()])], pbar_desc=None)


async def test_a_streamed_completion_is_refused_while_recording(agents):
    with pytest.warns(RecordingWarning, match="recorded no chat completion"):
        async with record_trajectory() as traj:
            with pytest.raises(openai.BadRequestError, match="disable streaming"):
                await ask(agents.model.openai_client(), "hi", stream=True)
    assert traj.messages_and_choices == []


def test_a_missing_framework_package_is_a_clear_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "langgraph" else real(name, *a))
    model = SimpleNamespace(inference_base_url="http://x/v1", inference_api_key="k", get_inference_name=lambda s: "m")
    needs = r"'agents' extra \(langgraph not installed\): " + re.escape(pip_command("agents"))
    with pytest.raises(MissingExtraError, match=needs):
        langchain_chat_model(model)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "agents" else real(name, *a))
    needs = r"'agents' extra \(agents not installed\): " + re.escape(pip_command("agents"))
    with pytest.raises(MissingExtraError, match=needs):
        agents_sdk_model(model)


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="ruler_rl.Trajectory"):
        record_trajectory({"messages": []})
    with pytest.raises(TypeError, match="TrainableModel"):
        agents_sdk_model("gpt-4o")
    rec = record_trajectory()
    with rec, pytest.raises(RuntimeError, match="already recording"):
        rec.__enter__()

    @record_trajectory()
    def returns_text():
        return "done"

    with pytest.raises(TypeError, match="returns a reward"):
        returns_text()


async def test_the_cpu_server_forces_a_valid_tool_call_for_required_and_named_tool_choice(agents):
    from langchain_core.utils.function_calling import convert_to_openai_tool

    tools = [convert_to_openai_tool(get_weather), convert_to_openai_tool(get_time)]
    client = agents.model.openai_client()
    reply = await ask(client, "hello", tools=tools, tool_choice="required", max_tokens=40)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name in CALLS and isinstance(json.loads(call.function.arguments)["city"], str)
    assert reply.choices[0].finish_reason == "tool_calls"
    for bad, message in (({"type": "function", "function": {"name": "nope"}}, "not among the tools"),
                         ("sometimes", "tool_choice must be")):
        with pytest.raises(openai.BadRequestError, match=message):
            await ask(client, "hello", tools=tools, tool_choice=bad)
    broken = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "nonsense"}}}}}
    with pytest.raises(openai.BadRequestError, match="not a usable JSON schema"):
        await ask(client, "hello", tools=[broken], tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        await ask(client, "hello", tool_choice="required")
