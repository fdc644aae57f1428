"""The middleware LocalBackend installs in vLLM's own OpenAI server, against a scripted upstream that answers
in vLLM's response shape (vLLM itself does not run on this machine; the GPU benchmark runs the real one)."""

import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ruler_rl.trainer.vllm_middleware import TrainingDataMiddleware

seen: list[dict] = []


async def chat(request: Request):
    try:
        body = await request.json()
    except ValueError:
        return JSONResponse({"error": {"message": "bad JSON"}}, status_code=400)
    seen.append(body)
    if body.get("stream"):
        return StreamingResponse(iter([b"data: {}\n\n", b"data: [DONE]\n\n"]), media_type="text/event-stream")
    content = [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []},
               {"token": "b", "logprob": -1.5, "bytes": [98], "top_logprobs": []}] if body.get("logprobs") else None
    choices = [{"index": i, "message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop",
                "logprobs": {"content": content} if content else None,
                "token_ids": [7, 8] if body.get("return_token_ids") else None} for i in range(body.get("n", 1))]
    return JSONResponse({"id": "x", "object": "chat.completion", "model": body["model"], "choices": choices,
                         "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                         "prompt_token_ids": [1, 2, 3] if body.get("return_token_ids") else None})


async def load(request: Request):
    body = await request.json()
    return Response(status_code=404 if body["lora_path"] == "/missing" else 200, content="ok")


async def unload(request: Request):
    body = await request.json()
    return Response(status_code=404 if body.get("lora_path") == "/missing" else 200, content="ok")


@pytest.fixture
def client(monkeypatch):
    monkeypatch.setenv("RULER_SERVED_NAME", "agent")
    app = TrainingDataMiddleware(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                                                   Route("/v1/load_lora_adapter", load, methods=["POST"]),
                                                   Route("/v1/unload_lora_adapter", unload, methods=["POST"])]))
    seen.clear()
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm")


async def test_every_completion_carries_what_training_needs_and_the_bare_name_follows_the_adapters(client):
    async with client:
        msgs = [{"role": "user", "content": "hi"}]
        r = (await client.post("/v1/chat/completions", json={"model": "agent", "messages": msgs, "n": 2,
                                                              "top_logprobs": None})).json()
        assert seen[-1]["return_token_ids"] is True and seen[-1]["logprobs"] is True and seen[-1]["model"] == "agent"
        assert seen[-1]["top_logprobs"] == 0  # vLLM computes logprobs only when top_logprobs is a number
        for c in r["choices"]:  # prompt ids on each choice; logprobs not asked for: one compact list
            assert c["prompt_token_ids"] == [1, 2, 3] and c["token_ids"] == [7, 8]
            assert c["token_logprobs"] == [-0.5, -1.5] and c["logprobs"] is None
        asked = (await client.post("/v1/chat/completions", json={"model": "agent", "messages": msgs,
                                                                  "logprobs": True})).json()["choices"][0]
        assert asked["logprobs"]["content"][1]["logprob"] == -1.5 and "token_logprobs" not in asked
        # top_logprobs without logprobs: refused as vLLM (and the CPU server) refuse it, never reaching vLLM
        before = len(seen)
        tops = await client.post("/v1/chat/completions", json={"model": "agent", "messages": msgs, "top_logprobs": 2})
        assert tops.status_code == 400 and "needs logprobs" in tops.json()["error"]["message"]
        assert len(seen) == before
        await client.post("/v1/chat/completions", json={"model": "agent", "messages": msgs, "logprobs": True,
                                                         "top_logprobs": 2})
        assert len(seen) == before + 1 and seen[-1]["top_logprobs"] == 2
        # a failed adapter load changes nothing; a loaded one becomes what the bare name means
        assert (await client.post("/v1/load_lora_adapter", json={"lora_name": "agent@1",
                                                                  "lora_path": "/missing"})).status_code == 404
        await client.post("/v1/chat/completions", json={"model": "agent", "messages": msgs})
        assert seen[-1]["model"] == "agent"
        assert (await client.post("/v1/load_lora_adapter", json={"lora_name": "agent@1",
                                                                  "lora_path": "/ckpt/0001"})).status_code == 200
        await client.post("/v1/chat/completions", json={"model": "agent", "messages": msgs})
        assert seen[-1]["model"] == "agent@1"
        await client.post("/v1/chat/completions", json={"model": "agent@0", "messages": msgs})
        assert seen[-1]["model"] == "agent@0"  # an explicit step is left alone
        # streamed answers pass through untouched (token ids still switched on)
        s = await client.post("/v1/chat/completions", json={"model": "agent", "messages": msgs, "stream": True})
        assert s.text.endswith("data: [DONE]\n\n") and seen[-1]["return_token_ids"] is True
        # a body that is not JSON reaches vLLM as it was, for vLLM's own error
        bad = await client.post("/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
        assert bad.status_code >= 400


async def test_requests_with_tools_are_refused_when_the_template_cannot_render_them(client, monkeypatch):
    monkeypatch.setenv("RULER_TOOLS_UNSUPPORTED", "1")
    app = TrainingDataMiddleware(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as http:
        r = await http.post("/v1/chat/completions", json={"model": "agent", "messages": [], "tools": [{"x": 1}]})
        assert r.status_code == 400 and "cannot render tools" in json.loads(r.text)["error"]["message"]
        ok = await http.post("/v1/chat/completions", json={"model": "agent", "messages": []})
        assert ok.status_code == 200


async def test_every_choice_says_which_policy_step_sampled_it(client):
    """The step of the adapter the request was routed to: the base model (step 0) before any adapter, then
    the latest adapter for the bare name, the named step for `<name>@<step>`; nothing for other names."""
    async with client:
        msgs = [{"role": "user", "content": "hi"}]

        async def steps(model, n=2):
            r = await client.post("/v1/chat/completions", json={"model": model, "messages": msgs, "n": n})
            return [c.get("policy_step") for c in r.json()["choices"]]

        assert await steps("agent") == [0, 0]
        assert await steps("agent@0") == [0, 0]
        await client.post("/v1/load_lora_adapter", json={"lora_name": "agent@3", "lora_path": "/ckpt/0003"})
        assert await steps("agent") == [3, 3]
        assert await steps("agent@2", n=1) == [2]
        assert await steps("other-model", n=1) == [None]
        await client.post("/v1/load_lora_adapter", json={"lora_name": "agent@4", "lora_path": "/missing"})
        assert await steps("agent", n=1) == [3]  # a failed load changes nothing


async def test_unloading_the_adapter_the_bare_name_means_falls_back_to_the_one_before(client):
    """A step rolled back after its adapter reached vLLM: once it is unloaded, the bare name means the adapter
    loaded before it, and the base model (step 0) once none is left; a failed unload changes nothing."""
    async with client:
        msgs = [{"role": "user", "content": "hi"}]

        async def bare():
            r = await client.post("/v1/chat/completions", json={"model": "agent", "messages": msgs})
            return seen[-1]["model"], r.json()["choices"][0]["policy_step"]

        for step in (1, 2):
            await client.post("/v1/load_lora_adapter", json={"lora_name": f"agent@{step}", "lora_path": f"/c/{step}"})
        assert await bare() == ("agent@2", 2)
        await client.post("/v1/unload_lora_adapter", json={"lora_name": "agent@2"})
        assert await bare() == ("agent@1", 1)
        await client.post("/v1/unload_lora_adapter", json={"lora_name": "agent@1", "lora_path": "/missing"})
        assert await bare() == ("agent@1", 1)  # vLLM refused (404 here): still loaded
        await client.post("/v1/unload_lora_adapter", json={"lora_name": "agent@1"})
        assert await bare() == ("agent", 0)


async def test_choices_sampled_under_a_grammar_are_marked_constrained_and_train_on_the_trainers_logprobs(client):
    """vLLM computes logprobs after the grammar's mask: the choices of a constrained request say so, and the
    trainer reads no sampled logprobs from them (it takes its own before the update)."""
    from openai.types.chat.chat_completion import Choice

    from ruler_rl.trainer.sequences import served_turn

    msgs = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    cases = [({}, False), ({"response_format": {"type": "text"}}, False), ({"response_format": schema}, True),
             ({"response_format": {"type": "json_object"}}, True), ({"structured_outputs": {"regex": "a+"}}, True),
             ({"guided_json": {"type": "object"}}, True), ({"tools": tools, "tool_choice": "auto"}, False),
             ({"tools": tools, "tool_choice": "required"}, True),
             ({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "f"}}}, True)]
    async with client:
        for extra, marked in cases:
            r = await client.post("/v1/chat/completions", json={"model": "agent", "messages": msgs, **extra})
            (raw,) = r.json()["choices"]
            assert raw.get("constrained", False) is marked, extra
            turn = served_turn(Choice.model_validate(raw))
            assert turn.completion == [7, 8] and (turn.logprobs is None) is marked, extra


async def test_an_aborted_turn_is_never_trained_even_after_litellm_rewrites_its_finish_reason(monkeypatch):
    """vLLM answers an aborted request with `finish_reason: "abort"`; litellm turns that into `stop`. The
    middleware marks the choice `aborted`, which survives litellm (real HTTP on loopback, real litellm), and
    training refuses the turn whichever way the choice reaches the trajectory."""
    import litellm

    from ruler_rl import Trajectory, TrajectoryGroup
    from ruler_rl.trainer import TrainConfig
    from ruler_rl.trainer.sequences import AbortedTurnError, training_sequences
    from ruler_rl.trainer.server import BackgroundServer
    from ruler_rl.trainer.training import prepare
    from ruler_rl.trajectory import convert_litellm_choice_to_openai

    async def cut_short(request: Request):
        response = await chat(request)
        body = json.loads(response.body)
        body["choices"][0]["finish_reason"] = "abort"
        return JSONResponse(body)

    monkeypatch.setenv("RULER_SERVED_NAME", "agent")
    app = TrainingDataMiddleware(Starlette(routes=[Route("/v1/chat/completions", cut_short, methods=["POST"])]))
    server = BackgroundServer(app, "127.0.0.1")
    await server.start()
    try:
        msgs = [{"role": "user", "content": "hi"}]
        reply = await litellm.acompletion(model="hosted_vllm/agent", api_base=server.url, api_key="x",
                                          messages=msgs, n=2)
    finally:
        await server.stop()
    first, second = reply.choices
    assert first.finish_reason == "stop" and second.finish_reason == "stop"  # litellm's rewrite of "abort"
    for kept in (first, convert_litellm_choice_to_openai(first)):
        with pytest.raises(AbortedTurnError, match=r"messages_and_choices\[1\] was aborted"):
            training_sequences(Trajectory(messages_and_choices=[*msgs, kept]))
    (seq,) = training_sequences(Trajectory(messages_and_choices=[*msgs, second]))  # the finished one trains
    assert sum(seq.trained) == 2
    group = TrajectoryGroup([Trajectory(messages_and_choices=[*msgs, c], reward=r)
                             for c, r in ((first, 0.0), (second, 1.0), (second, 3.0))])
    seqs, stats = prepare([group], None, TrainConfig(), 512)
    assert stats["skipped"] == {"trajectory with an aborted turn": 1} and len(seqs) == 2


async def test_required_tool_lists_are_bounded_to_one_call_when_the_request_asks_for_one(monkeypatch):
    """vLLM 0.24 builds the grammar of tool_choice="required" in vllm.tool_parsers.utils (a list of calls, no
    upper bound) while it serves the request, for a parser without a structural tag or with
    VLLM_ENFORCE_STRICT_TOOL_CALLING off (the structural tag: the next test); here a module of that name and layout stands in for it (vLLM does
    not install on this machine), and the route builds the grammar as vLLM's does, inside the request."""
    import sys
    import types

    utils = types.ModuleType("vllm.tool_parsers.utils")
    utils._get_json_schema_from_tools = lambda tools: {"type": "array", "minItems": 1,
                                                       "items": {"anyOf": [{"name": t} for t in tools]}}
    utils.get_json_schema_from_tools = lambda choice, tools: (utils._get_json_schema_from_tools(tools)
                                                              if choice == "required" else None)
    pkg = types.ModuleType("vllm.tool_parsers")
    pkg.utils = utils
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.tool_parsers", pkg)
    monkeypatch.setitem(sys.modules, "vllm.tool_parsers.utils", utils)
    grammars = []

    async def chat_building_the_grammar(request: Request):
        body = await request.json()
        grammars.append(utils.get_json_schema_from_tools(body.get("tool_choice"), body.get("tools")))
        return await chat(request)

    app = TrainingDataMiddleware(Starlette(routes=[Route("/v1/chat/completions", chat_building_the_grammar,
                                                         methods=["POST"])]))
    assert app.bounded_tool_lists and TrainingDataMiddleware(app.app).bounded_tool_lists  # installed once
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as c:
        for parallel in (False, True, None):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": ["search", "answer"],
                    "tool_choice": "required", **({} if parallel is None else {"parallel_tool_calls": parallel})}
            assert (await c.post("/v1/chat/completions", json=body)).status_code == 200
    assert [g.get("maxItems") for g in grammars] == [1, None, None]
    assert grammars[0]["minItems"] == 1 and grammars[0]["items"] == grammars[1]["items"]
    assert utils.get_json_schema_from_tools("required", ["x"]).get("maxItems") is None  # outside a request


async def test_a_tool_parsers_structural_tag_allows_one_call_when_the_request_asks_for_one(monkeypatch):
    """vLLM 0.24's default for a parser with a structural tag (hermes, Qwen's): tool_choice="required" is sampled
    under `<tool_call>` tags repeated without bound (the ART·E runs of 2026-12-07 wrote 2-37 calls a turn until
    max_tokens cut them). A module of vLLM's name and layout stands in for its registry, building the tag as vLLM's
    hermes builder does, with xgrammar's real classes; xgrammar compiles each tag the route built and says which
    outputs the grammar accepts: one call, and not two, only when the request asked for one."""
    import sys
    import types

    import xgrammar
    from xgrammar.structural_tag import (
        ConstStringFormat,
        JSONSchemaFormat,
        SequenceFormat,
        StructuralTag,
        TagFormat,
        TagsWithSeparatorFormat,
        TriggeredTagsFormat,
    )
    from xgrammar.testing import _is_grammar_accept_string

    def tags(tools):
        return [TagFormat(begin=f'<tool_call>\n{{"name": "{name}", "arguments": ',
                          content=JSONSchemaFormat(json_schema={"type": "object", "properties": {"q": {"type": "string"}},
                                                                "required": ["q"]}),
                          end="}\n</tool_call>") for name in tools]

    made = {}

    def get_model_structural_tag(model, tools, tool_choice, reasoning):  # vLLM 0.24's, for hermes
        key = (model, tuple(tools), tool_choice, reasoning)
        if key not in made:  # one object per kind of request, so a bound written into it would show
            if tool_choice == "auto":
                tail = TriggeredTagsFormat(triggers=["<tool_call>"], tags=tags(tools))
            else:
                tail = TagsWithSeparatorFormat(tags=tags(tools), separator="", at_least_one=True)
            made[key] = StructuralTag(format=SequenceFormat(elements=[ConstStringFormat(value="<think></think>"),
                                                                      tail]) if reasoning else tail)
        return made[key]

    registry = types.ModuleType("vllm.tool_parsers.structural_tag_registry")
    registry.get_model_structural_tag = get_model_structural_tag
    utils = types.ModuleType("vllm.tool_parsers.utils")
    utils._get_json_schema_from_tools = lambda tools: {"type": "array", "minItems": 1}
    pkg = types.ModuleType("vllm.tool_parsers")
    pkg.utils, pkg.structural_tag_registry = utils, registry
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.tool_parsers", pkg)
    monkeypatch.setitem(sys.modules, "vllm.tool_parsers.utils", utils)
    monkeypatch.setitem(sys.modules, "vllm.tool_parsers.structural_tag_registry", registry)
    built = []

    async def chat_building_the_tag(request: Request):
        body = await request.json()
        # vLLM imports the builder from the registry module when it builds a request's tag
        from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag as build

        built.append(build(model=body.get("parser", "hermes"), tools=body["tools"], tool_choice=body["tool_choice"],
                           reasoning=body.get("reasoning", False)))  # by keyword, as vLLM calls it
        return await chat(request)

    app = TrainingDataMiddleware(Starlette(routes=[Route("/v1/chat/completions", chat_building_the_tag,
                                                         methods=["POST"])]))
    assert app.bounded_tool_lists
    # (tool_choice, parallel_tool_calls, reasoning prefix, the parser's tag model)
    cases = [("required", False, False, "hermes"), ("required", True, False, "hermes"),
             ("required", None, False, "hermes"), ("required", False, True, "hermes"), ("auto", False, False, "hermes"),
             ("auto", None, False, "hermes"), ("required", False, False, "harmony")]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vllm") as c:
        for choice, parallel, reasoning, parser in cases:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": ["search", "answer"],
                    "tool_choice": choice, "reasoning": reasoning, "parser": parser,
                    **({} if parallel is None else {"parallel_tool_calls": parallel})}
            assert (await c.post("/v1/chat/completions", json=body)).status_code == 200
    one = '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
    two = one + one.replace("search", "answer")
    accepts = []
    for (_, _, reasoning, _), tag in zip(cases, built, strict=True):
        grammar = xgrammar.Grammar.from_structural_tag(tag)
        think = "<think></think>" if reasoning else ""
        accepts.append((_is_grammar_accept_string(grammar, think + one), _is_grammar_accept_string(grammar, think + two)))
    # the last: harmony's tag is the whole message stream, left as vLLM builds it (here a stand-in of the same shape)
    assert accepts == [(True, False), (True, True), (True, True), (True, False), (True, False), (True, True),
                       (True, True)]
    # bounded on a copy: the objects vLLM built (the stand-in hands out the same one each time) are unchanged
    lists = [tag.format.elements[-1] if reasoning else tag.format for (_, _, _, reasoning), tag in made.items()]
    assert len(lists) == 4 and not any(t.stop_after_first for t in lists), made


def test_without_vllm_nothing_is_bounded(monkeypatch):
    import sys

    from ruler_rl.trainer.vllm_middleware import bound_required_tool_lists

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    assert bound_required_tool_lists() is False
