"""Makes the embedded model a litellm model string: `local/smollm2-135m-instruct`, and any small model in a
folder too: `local/<folder>` (a transformers model folder, or a LoRA adapter folder such as `ruler distill`
writes; `ruler_rl.judges.embedded.load_local_model`), with the same constrained decoding.

`register_local_provider()` adds a litellm `CustomLLM` under the provider name `local`, so every code
path that takes a litellm `judge_model` (RULER, panels, the answer-correctness judge, ...) accepts the
embedded model too. A `response_format` of type `json_schema` is honoured by constrained decoding.
Registering imports nothing heavy; calling a `local/...` model without the `embedded` extra (torch,
transformers, xgrammar, ...) raises `MissingExtraError` naming the `pip install` to run.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import litellm
from litellm import CustomLLM
from litellm.types.utils import ModelResponse

from ruler_rl.judges.embedded import EMBEDDED_MODEL_NAME, folder_identity, is_adapter, load_local_model, local_model_dir
from ruler_rl.judges.errors import JudgeConfigError
from ruler_rl.judges.extras import require
from ruler_rl.judges.names import EMBEDDED_JUDGE, LOCAL_PROVIDER, VLLM_ENGINE_PROVIDER  # noqa: F401  (importable here too)

LOCAL_MODELS = {EMBEDDED_MODEL_NAME}


REAL_JUDGE_HINT = ("or use a real judge instead: any litellm model string as the judge model (--judge MODEL or "
                   "$RULER_JUDGE_MODEL on the command line, e.g. openai/gpt-4.1-mini with OPENAI_API_KEY set)")


def check_local_model(model: str) -> None:
    """Check a judge of the providers ruler registers itself before litellm is called (litellm would wrap an
    error raised inside the provider): JudgeConfigError for `local/<name>` naming neither an embedded model
    nor a model or adapter folder, MissingExtraError (a JudgeConfigError) for `local/...` without the
    `embedded` extra (an adapter folder also needs `train`, for peft) and for `vllm-engine/...` without the
    `gpu` extra. Other model strings pass."""
    provider, _, name = model.partition("/")
    if provider == VLLM_ENGINE_PROVIDER:
        require("gpu", f"the judge {model}")
        return
    if provider != LOCAL_PROVIDER:
        return
    if name not in LOCAL_MODELS:
        try:
            path = local_model_dir(name)
        except JudgeConfigError as exc:
            raise JudgeConfigError(f"{exc}; embedded models: {sorted(LOCAL_MODELS)}") from None
        require("embedded", f"the local judge {model}", REAL_JUDGE_HINT)
        if is_adapter(path):
            require("train", f"the LoRA adapter judge {model} (peft)")
        return
    require("embedded", f"the embedded judge {model}", REAL_JUDGE_HINT)


def model_identity(model: str) -> str:
    """What the judge cache calls a `local/...` model: the string itself for an embedded model; for a folder,
    `local/<resolved folder>#<hash of its config and weights>`, so an adapter retrained in place, or another
    model in the same folder, gets a cache namespace of its own. Other model strings are returned as they are."""
    provider, _, name = model.partition("/")
    if provider != LOCAL_PROVIDER or name in LOCAL_MODELS:
        return model
    path = local_model_dir(name)
    return f"{LOCAL_PROVIDER}/{path}#{folder_identity(path)}"


def schema_from_response_format(response_format) -> dict | None:
    if not response_format:
        return None
    if isinstance(response_format, dict):
        if response_format.get("type") == "json_schema":
            spec = response_format.get("json_schema") or {}
            return spec.get("schema") or spec.get("json_schema")
        if response_format.get("type") == "json_object":
            return {"type": "object"}
        return None
    if hasattr(response_format, "model_json_schema"):  # a pydantic class, as ART passes
        return response_format.model_json_schema()
    return None


class EmbeddedLLM(CustomLLM):
    """litellm handler that answers chat completions with the embedded model."""

    def _complete(self, model: str, messages: list, optional_params: dict,
                  stop: threading.Event | None = None) -> ModelResponse:
        name = model.split("/", 1)[-1] if model.startswith(f"{LOCAL_PROVIDER}/") else model
        check_local_model(f"{LOCAL_PROVIDER}/{name}")
        params = dict(optional_params or {})
        schema = schema_from_response_format(params.get("response_format"))
        max_tokens = params.get("max_tokens") or params.get("max_completion_tokens") or 1024
        gen = load_local_model(name).generate(
            [{"role": m["role"], "content": m.get("content") or ""} for m in messages],
            json_schema=schema,
            max_new_tokens=int(max_tokens),
            temperature=float(params.get("temperature") or 0.0),
            seed=int(params.get("seed") or 0),
            stop=stop,
        )
        return ModelResponse(
            id=f"local-{uuid.uuid4().hex[:12]}",
            created=int(time.time()),
            model=f"{LOCAL_PROVIDER}/{name}",
            choices=[{"index": 0, "finish_reason": gen.finish_reason,
                      "message": {"role": "assistant", "content": gen.text}}],
            usage={"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
                   "total_tokens": gen.prompt_tokens + gen.completion_tokens},
        )

    def completion(self, model, messages, api_base, custom_prompt_dict, model_response, print_verbose,
                   encoding, api_key, logging_obj, optional_params, *args, **kwargs) -> ModelResponse:
        return self._complete(model, messages, optional_params)

    async def acompletion(self, model, messages, api_base, custom_prompt_dict, model_response, print_verbose,
                          encoding, api_key, logging_obj, optional_params, *args, **kwargs) -> ModelResponse:
        # generation is CPU-bound: keep the event loop free for other groups and HTTP traffic. A thread cannot
        # be cancelled, so when the awaiting task is (a cancelled job, a timeout) the generation is told to
        # stop: before its next token, or before it starts if it is still waiting for the model.
        stop = threading.Event()
        try:
            return await asyncio.to_thread(self._complete, model, messages, optional_params, stop)
        finally:
            stop.set()


_handler = EmbeddedLLM()


def register_local_provider() -> None:
    """Register `local/...` with litellm (idempotent)."""
    if not any(item.get("provider") == LOCAL_PROVIDER for item in litellm.custom_provider_map):
        litellm.custom_provider_map = [
            *litellm.custom_provider_map,
            {"provider": LOCAL_PROVIDER, "custom_handler": _handler},
        ]
    litellm.utils.custom_llm_setup()
