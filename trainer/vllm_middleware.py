"""ASGI middleware that `LocalBackend` installs in vLLM's own OpenAI server (`--middleware`), so that every
rollout carries what token-exact training needs without the rollout code asking for it.

- `POST /v1/chat/completions`: `return_token_ids` and `logprobs` are switched on (vLLM then answers with
  the response's `prompt_token_ids`, each choice's `token_ids` and the sampled tokens' logprobs); the
  bare served name (`$RULER_SERVED_NAME`) is routed to the latest adapter; and, for a non-streamed answer,
  the response's `prompt_token_ids` are copied into each choice — agent code keeps choices, not responses.
  Logprobs the client did not ask for come as one compact `token_logprobs` list per choice (standard
  `logprobs` stay `null`); asked for, they come as vLLM wrote them. Each choice also gets `policy_step`, the
  step of the adapter the request was routed to (`<name>@<step>`; the bare name before any adapter and
  `<name>@0` are the base model, step 0), which training checks against `TrainConfig.max_off_policy_steps`. `top_logprobs` without `logprobs` is
  refused (400), as vLLM itself would (it only sees the switched-on `logprobs`), and as the CPU server does.
- a request whose sampling is constrained (`response_format` json_schema/json_object/structural tag,
  `structured_outputs` or `guided_*`, `tool_choice` `required` or a named function) gets `constrained: true` on
  each choice: vLLM computes its logprobs after the grammar's mask (a token the grammar forces has logprob 0), so
  they are not the policy's; training then takes the trainer's own logprobs as the old policy for such turns
  (the CPU server's logprobs under a grammar are the policy's: it does not mark them).
- a choice vLLM aborted (`finish_reason: "abort"`: the request was cut off, e.g. by a pause or shutdown that
  aborts in-flight requests) gets `aborted: true`. Clients rewrite the finish reason (litellm maps `abort` to
  `stop`), so training reads this field, which they keep, and never trains such a turn.
- a request with tools is refused (400) when `$RULER_TOOLS_UNSUPPORTED` says the chat template cannot
  render them (vLLM would silently drop them).
- a request with `parallel_tool_calls: false` is sampled under a grammar that allows one call. vLLM 0.24 builds
  the grammar of `tool_choice` `required` in one of two ways, and neither has an upper bound (it keeps only the
  first call afterwards), so a policy could learn to write call after call until `max_tokens` cuts the list and
  the turn cannot be parsed (seen in the ART·E learning runs of 2026-12-05 and 2026-12-07):
  - a structural tag when the tool parser names one (`hermes` does) and `VLLM_ENFORCE_STRICT_TOOL_CALLING` is on
    (vLLM's default): `<tool_call>` blocks repeated; `bound_required_tool_lists` wraps
    `vllm.tool_parsers.structural_tag_registry.get_model_structural_tag` so that, for such a request, every list
    of tags in the tag it builds stops after its first (xgrammar's `stop_after_first`, what vLLM itself sets for
    a named function; for xgrammar's builtin tags of the models vLLM 0.24's parsers name, the same grammar as
    xgrammar's own `parallel_tool_calls=False`; harmony's is left alone);
  - otherwise a JSON list of calls: the wrapper of `vllm.tool_parsers.utils._get_json_schema_from_tools` adds
    `maxItems: 1` (what vLLM's open PR 50502 proposes).
  Both run in vLLM's server process; with another module layout nothing is installed, and a warning says so.
- `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`: passed through; once vLLM has loaded
  `<name>@<step>`, the bare name means that adapter; once it has unloaded the one the bare name means (a step
  rolled back), the bare name means the latest adapter still loaded, or the base model. A request is routed when it arrives: one that arrives while the server sleeps for a
  training step is queued for the adapter that was latest on arrival (its tokens and logprobs are that
  adapter's, so training on it stays exact, one step off-policy). `model.get_inference_name()` names a step.

Nothing else is touched: generation, tool and reasoning parsing, adapters, sleep/wake all stay vLLM's.
This module imports nothing heavy: vLLM's server process imports it by path.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os

try:  # vLLM's server has orjson through its dependencies on most installs; json otherwise
    import orjson

    def _loads(b: bytes):
        return orjson.loads(b)

    def _dumps(obj) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover - depends on the install
    def _loads(b: bytes):
        return json.loads(b)

    def _dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


async def _read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _with_length(headers: list, length: int) -> list:
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    return kept + [(b"content-length", str(length).encode())]


_ONE_CALL = contextvars.ContextVar("ruler_one_tool_call", default=False)  # the request being served asked for one


def bound_required_tool_lists() -> bool:
    """Make vLLM's grammar for tool calls allow one call while the request being served asked for
    `parallel_tool_calls: false` (the middleware marks it per request): the JSON list of `tool_choice="required"`
    gets `maxItems: 1`, and a structural tag's lists of tool tags stop after their first. True when every wrapper
    this vLLM's layout calls for is in place (installed now or before; a vLLM without structural tags needs only
    the first); False when vLLM is not importable here or a function to wrap is missing (with a warning naming it)."""
    try:
        from vllm.tool_parsers import utils
    except ImportError:
        return False

    def bounded_schema(original):
        def bounded(tools):
            schema = original(tools)
            if _ONE_CALL.get() and isinstance(schema, dict) and schema.get("type") == "array":
                schema = {**schema, "maxItems": 1}
            return schema
        return bounded

    def bounded_tag(build):
        def bounded(*args, **kwargs):
            tag = build(*args, **kwargs)
            model = kwargs.get("model", args[0] if args else None)
            # harmony's tag is the whole message stream (analysis, then calls): bounding its lists would forbid
            # a call after an analysis message; no 0.24 tool parser uses it
            if tag is None or not _ONE_CALL.get() or model == "harmony":
                return tag
            return _first_tag_only(tag)
        return bounded

    installed = _wrap_once(utils, "_get_json_schema_from_tools", bounded_schema,
                           "tool_choice='required' with parallel_tool_calls=false samples an unbounded list of calls")
    try:
        from vllm.tool_parsers import structural_tag_registry as registry
    except ImportError:  # a vLLM without structural tags builds only the JSON list above
        return installed
    return _wrap_once(registry, "get_model_structural_tag", bounded_tag, "a tool parser's structural tag with "
                      "parallel_tool_calls=false allows an unbounded run of calls") and installed


def _wrap_once(module, name: str, make, unbounded: str) -> bool:
    """Replace `module.name` by `make(original)` unless an earlier call did; False (with a warning saying what
    stays `unbounded`) when this vLLM has no such function."""
    original = getattr(module, name, None)
    if original is None:
        logging.getLogger("ruler.trainer").warning("this vLLM has no %s.%s: %s (vLLM keeps the first)",
                                                   module.__name__.removeprefix("vllm."), name, unbounded)
        return False
    if not getattr(original, "ruler_bounded", False):
        wrapper = make(original)
        wrapper.ruler_bounded = True
        setattr(module, name, wrapper)
    return True


def _first_tag_only(node):
    """`node` (an xgrammar structural tag or one of its formats, pydantic models) with every list of tags
    (`TagsWithSeparatorFormat`, `TriggeredTagsFormat`: the fields that carry `stop_after_first`) ending after
    its first tag; copies, so vLLM's own objects are not changed."""
    fields = getattr(type(node), "model_fields", None)
    if not fields:
        return node
    update = {}
    if "stop_after_first" in fields and "tags" in fields and node.stop_after_first is not True:
        update["stop_after_first"] = True
    for name in fields:
        value = getattr(node, name)
        if isinstance(value, list):
            items = [_first_tag_only(v) for v in value]
            if any(a is not b for a, b in zip(items, value, strict=True)):
                update[name] = items
        elif getattr(type(value), "model_fields", None):
            inner = _first_tag_only(value)
            if inner is not value:
                update[name] = inner
    return node.model_copy(update=update) if update else node


class TrainingDataMiddleware:
    def __init__(self, app):
        self.app = app
        self.bounded_tool_lists = bound_required_tool_lists()
        self.served = os.environ.get("RULER_SERVED_NAME", "")
        self.loaded: list[str] = []  # our adapters vLLM holds, oldest first; the last is the bare name's
        self.tools_unsupported = os.environ.get("RULER_TOOLS_UNSUPPORTED") == "1"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        if scope["path"] == "/v1/chat/completions":
            return await self._chat(scope, receive, send)
        if scope["path"] in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            return await self._adapter(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _chat(self, scope, receive, send):
        raw = await _read_body(receive)
        try:
            body = _loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):  # vLLM answers malformed requests itself
            return await self.app(scope, _replay(raw, receive), send)
        if self.tools_unsupported and body.get("tools"):
            return await _reject(send, 400, "this model's chat template cannot render tools; give one that can "
                                            "(EngineConfig.chat_template)")
        if self.loaded and body.get("model") == self.served:
            body["model"] = self.loaded[-1]
        body["return_token_ids"] = True
        asked = bool(body.get("logprobs"))
        tops = body.get("top_logprobs")
        if not asked and isinstance(tops, int) and not isinstance(tops, bool) and tops != 0:
            # vLLM refuses top_logprobs without logprobs, but only sees the logprobs switched on below
            return await _reject(send, 400, "top_logprobs needs logprobs: true (alternatives come inside "
                                            "standard logprobs)")
        if not asked:
            body["logprobs"] = True
        if body.get("top_logprobs") is None:  # vLLM builds logprobs only when top_logprobs is a number
            body["top_logprobs"] = 0
        raw = _dumps(body)
        scope = {**scope, "headers": _with_length(scope["headers"], len(raw))}
        mark = _ONE_CALL.set(body.get("parallel_tool_calls") is False)  # read where vLLM builds the grammar
        try:
            if body.get("stream"):
                return await self.app(scope, _replay(raw, receive), send)
            return await self.app(scope, _replay(raw, receive), _TrainingFields(
                send, compact_logprobs=not asked, policy_step=self._step(body.get("model")),
                constrained=constrained(body)))
        finally:
            _ONE_CALL.reset(mark)

    def _step(self, model) -> int | None:
        """The policy step a request routed to `model` is sampled by: `<served>@<k>` is step k, the bare served
        name (no adapter loaded yet) the base model, step 0; None for a name that is not ours."""
        if not self.served or not isinstance(model, str):
            return None
        if model == self.served:
            return 0
        base, _, step = model.rpartition("@")
        return int(step) if base == self.served and step.isdigit() else None

    async def _adapter(self, scope, receive, send):
        raw = await _read_body(receive)
        status = {}

        async def watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        await self.app(scope, _replay(raw, receive), watch)
        try:
            name = _loads(raw).get("lora_name", "")
        except (ValueError, AttributeError):
            return
        if status.get("code") != 200 or not isinstance(name, str) or not name.startswith(f"{self.served}@"):
            return
        if name in self.loaded:
            self.loaded.remove(name)
        if scope["path"] == "/v1/load_lora_adapter":
            self.loaded.append(name)


async def _reject(send, status: int, message: str) -> None:
    raw = _dumps({"error": {"message": message, "type": "invalid_request_error", "code": status}})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw, "more_body": False})


def _replay(raw: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


_CONSTRAINING_FORMATS = ("json_schema", "json_object", "structural_tag", "grammar", "regex", "choice")
_CONSTRAINING_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                        "guided_whitespace_pattern")


def constrained(body: dict) -> bool:
    """Whether a chat-completion request samples under a grammar (vLLM's structured outputs): a constraining
    `response_format`, `structured_outputs`/`guided_*` fields, or `tool_choice` `required` or a named function."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in _CONSTRAINING_FORMATS:
        return True
    if any(body.get(key) not in (None, False, "", {}) for key in _CONSTRAINING_FIELDS):
        return True
    choice = body.get("tool_choice")
    return bool(body.get("tools")) and (choice == "required" or isinstance(choice, dict))


class _TrainingFields:
    """A `send` that buffers a JSON chat completion, copies its `prompt_token_ids` into each choice and, when
    the client did not ask for logprobs, hands them over as one compact `token_logprobs` list per choice
    instead of an object per token (a fraction of the bytes for clients to parse)."""

    def __init__(self, send, *, compact_logprobs: bool, policy_step: int | None = None, constrained: bool = False):
        self.send = send
        self.compact = compact_logprobs
        self.policy_step = policy_step
        self.constrained = constrained
        self.start = None
        self.chunks: list[bytes] = []
        self.passthrough = False

    async def __call__(self, message):
        if self.passthrough:
            return await self.send(message)
        if message["type"] == "http.response.start":
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            if message["status"] != 200 or not ctype.startswith(b"application/json"):
                self.passthrough = True
                return await self.send(message)
            self.start = message
            return None
        if message["type"] != "http.response.body":
            return await self.send(message)
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return None
        raw = b"".join(self.chunks)
        try:
            body = _loads(raw)
            ids = body.get("prompt_token_ids")
            for choice in body.get("choices", []):
                if ids is not None:
                    choice["prompt_token_ids"] = ids
                if self.policy_step is not None:
                    choice["policy_step"] = self.policy_step
                if self.constrained:
                    choice["constrained"] = True
                if choice.get("finish_reason") == "abort":
                    choice["aborted"] = True
                content = (choice.get("logprobs") or {}).get("content")
                if self.compact and content is not None:
                    choice["token_logprobs"] = [entry["logprob"] for entry in content]
                    choice["logprobs"] = None
            raw = _dumps(body)
        except (ValueError, AttributeError, TypeError):
            pass  # not what we expected: hand it on untouched
        await self.send({**self.start, "headers": _with_length(self.start.get("headers", []), len(raw))})
        await self.send({"type": "http.response.body", "body": raw, "more_body": False})
