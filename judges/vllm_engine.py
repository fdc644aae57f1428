"""An in-process vLLM engine as a litellm model string: `vllm-engine/<model path or name>`.

For users with a GPU who want a fast local judge without running a server: the first call starts a
vLLM `AsyncLLM` engine for that model (continuous batching, so concurrent RULER calls share the GPU);
a `json_schema` response format becomes vLLM structured output. vLLM is optional (the `gpu` extra)
and imported only here. Engine arguments come from `$RULER_VLLM_ENGINE_ARGS` (JSON, e.g.
`{"gpu_memory_utilization": 0.5, "max_model_len": 8192}`); unless they name `structured_outputs_config`,
the engine writes schema-bound JSON on one line (`COMPACT_JSON`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import litellm
from litellm import CustomLLM
from litellm.types.utils import ModelResponse

from ruler_rl.judges.extras import require
from ruler_rl.judges.local_provider import VLLM_ENGINE_PROVIDER as PROVIDER
from ruler_rl.judges.local_provider import schema_from_response_format
from ruler_rl.judges.vllm_settings import COMPACT_JSON


def engine_args(environ: dict | None = None) -> dict:
    """The `AsyncEngineArgs` keywords of the in-process judge engine: `$RULER_VLLM_ENGINE_ARGS` (a JSON object),
    with `structured_outputs_config` set to `COMPACT_JSON` unless given there. A value that is not a JSON object
    is a `ValueError` naming the variable."""
    text = (os.environ if environ is None else environ).get("RULER_VLLM_ENGINE_ARGS") or "{}"
    try:
        extra = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"$RULER_VLLM_ENGINE_ARGS is not JSON ({exc}): {text[:80]!r}") from None
    if not isinstance(extra, dict):
        raise ValueError(f"$RULER_VLLM_ENGINE_ARGS must be a JSON object of engine arguments, got {text[:80]!r}")
    extra.setdefault("structured_outputs_config", dict(COMPACT_JSON))
    return extra


class VLLMEngineLLM(CustomLLM):
    def __init__(self):
        super().__init__()
        self._engines: dict[str, tuple] = {}
        self._lock = asyncio.Lock()

    async def _engine(self, model: str):
        async with self._lock:
            if model not in self._engines:
                from ruler_rl.judges.checkpoint import check_checkpoint

                extra = engine_args()
                # vLLM would serve a missing tensor uninitialized; on this thread, as the engine's start below
                check_checkpoint(model, extra.get("load_format"))
                require("gpu", f"the judge {PROVIDER}/{model}")
                from vllm import AsyncEngineArgs
                from vllm.config import StructuredOutputsConfig
                from vllm.v1.engine.async_llm import AsyncLLM

                if isinstance(extra["structured_outputs_config"], dict):  # AsyncEngineArgs takes only the object
                    extra["structured_outputs_config"] = StructuredOutputsConfig(**extra["structured_outputs_config"])
                engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **extra))
                tokenizer = await engine.get_tokenizer() if asyncio.iscoroutinefunction(engine.get_tokenizer) \
                    else engine.get_tokenizer()
                self._engines[model] = (engine, tokenizer)
            return self._engines[model]

    async def acompletion(self, model, messages, api_base, custom_prompt_dict, model_response, print_verbose,
                          encoding, api_key, logging_obj, optional_params, *args, **kwargs) -> ModelResponse:
        name = model.split("/", 1)[-1] if model.startswith(PROVIDER + "/") else model
        engine, tokenizer = await self._engine(name)  # first: without vLLM it names the extra to install
        from vllm import SamplingParams

        params = dict(optional_params or {})
        prompt = tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m.get("content") or ""} for m in messages],
            add_generation_prompt=True, tokenize=False)
        sp_kwargs = {"max_tokens": int(params.get("max_tokens") or 1024),
                     "temperature": float(params.get("temperature") or 0.0)}
        schema = schema_from_response_format(params.get("response_format"))
        if schema is not None:
            try:
                from vllm.sampling_params import StructuredOutputsParams

                sp_kwargs["structured_outputs"] = StructuredOutputsParams(json=schema)
            except ImportError:  # vLLM before 0.10.2
                from vllm.sampling_params import GuidedDecodingParams

                sp_kwargs["guided_decoding"] = GuidedDecodingParams(json=schema)
        final = None
        async for out in engine.generate(prompt, SamplingParams(**sp_kwargs), request_id=uuid.uuid4().hex):
            final = out
        completion = final.outputs[0]
        n_prompt, n_out = len(final.prompt_token_ids or []), len(completion.token_ids)
        return ModelResponse(
            id=f"vllm-{uuid.uuid4().hex[:12]}", created=int(time.time()), model=f"{PROVIDER}/{name}",
            choices=[{"index": 0, "finish_reason": completion.finish_reason or "stop",
                      "message": {"role": "assistant", "content": completion.text}}],
            usage={"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        )


_handler = VLLMEngineLLM()


def register_vllm_engine_provider() -> None:
    """Register `vllm-engine/...` with litellm (idempotent; vLLM itself is imported on first use)."""
    if not any(item.get("provider") == PROVIDER for item in litellm.custom_provider_map):
        litellm.custom_provider_map = [*litellm.custom_provider_map, {"provider": PROVIDER, "custom_handler": _handler}]
    litellm.utils.custom_llm_setup()
