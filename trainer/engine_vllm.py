"""The vLLM engine (GPU): an in-process `AsyncLLM` with LoRA enabled. After each training step the new
adapter is swapped in as a `LoRARequest` named `<model>@<step>`; while the trainer runs, the engine sleeps
(weights offloaded, KV cache freed) so both fit on one GPU. vLLM is imported only here, only when used."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from trainer.config import EngineConfig
from trainer.engine_transformers import Sample


def vllm_available() -> bool:
    try:
        import torch
        import vllm  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


class VLLMEngine:
    name = "vllm"

    def __init__(self, base_model: str, config: EngineConfig, *, lora_rank: int, served_name: str):
        self.base_model, self.config, self.lora_rank, self.served_name = base_model, config, lora_rank, served_name
        self.engine = None
        self.lora = None  # the LoRARequest of the latest adapter; None serves the base model (step 0)
        self.timings: dict[str, list[float]] = {"sleep_s": [], "wake_s": [], "adapter_swap_s": []}

    async def start(self) -> None:
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise RuntimeError("the vLLM engine needs vLLM: pip install 'ruler-rl[gpu]'") from exc
        c = self.config
        args = AsyncEngineArgs(
            model=self.base_model, enable_lora=True, max_lora_rank=max(8, self.lora_rank), max_loras=2,
            gpu_memory_utilization=c.gpu_memory_utilization, max_model_len=c.max_model_len or c.max_seq_length,
            enforce_eager=c.enforce_eager, enable_sleep_mode=c.enable_sleep_mode, max_num_seqs=c.max_num_seqs,
            **c.vllm_args)
        self.engine = AsyncLLM.from_engine_args(args)

    async def generate(self, prompt_ids: list[int], *, n: int = 1, max_tokens: int = 256, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None,
                       stop_token_ids: list[int] | None = None) -> list[Sample]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        # FINAL_ONLY: one output per request, not a cumulative copy (logprobs included) at every engine step
        params = SamplingParams(n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                logprobs=0, stop_token_ids=stop_token_ids or None,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), params,
                                              request_id=uuid.uuid4().hex, lora_request=self.lora):
            final = out
        samples = []
        for o in final.outputs:
            lps = [next(iter(d.values())).logprob if len(d) == 1 else d[t].logprob
                   for t, d in zip(o.token_ids, o.logprobs or [])]
            samples.append(Sample(list(o.token_ids), lps, "length" if o.finish_reason == "length" else "stop"))
        return samples

    async def load_adapter(self, step: int, path: str | Path) -> None:
        """Serve the adapter saved at `path` from now on (the hot swap)."""
        from vllm.lora.request import LoRARequest

        started = time.perf_counter()
        request = LoRARequest(f"{self.served_name}@{step}", step, str(path))
        await self.engine.add_lora(request)
        old, self.lora = self.lora, request
        if old is not None:
            await self.engine.remove_lora(old.lora_int_id)
        self.timings["adapter_swap_s"].append(time.perf_counter() - started)

    async def sleep(self) -> None:
        if self.config.enable_sleep_mode:
            started = time.perf_counter()
            await self.engine.reset_prefix_cache()
            await self.engine.sleep(level=1)
            self.timings["sleep_s"].append(time.perf_counter() - started)

    async def wake(self) -> None:
        if self.config.enable_sleep_mode:
            started = time.perf_counter()
            await self.engine.wake_up()
            self.timings["wake_s"].append(time.perf_counter() - started)

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
