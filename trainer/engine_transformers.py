"""The transformers engine: generation on CPU or GPU with the very model being trained (peft LoRA on top
of the base), for development and CI. No adapter swapping is needed: the served weights are the trained
ones. Generation and training take turns under one lock, so a request that arrives during a training
step waits for it instead of being cut short."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" or "length"
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # per token, when asked for


class TransformersEngine:
    name = "transformers"

    def __init__(self, model, tokenizer, lock: threading.Lock | None = None, *, stop_token_ids: list[int]):
        if not stop_token_ids:
            raise ValueError("the engine needs the model's end-of-turn token ids")
        self.model = model
        self.tokenizer = tokenizer
        self.lock = lock or threading.Lock()
        self.stop_token_ids = list(stop_token_ids)

    async def start(self) -> None:
        return None

    async def generate(self, prompt_ids: list[int], *, n: int = 1, max_tokens: int = 256, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None, top_logprobs: int = 0) -> list[Sample]:
        return await asyncio.to_thread(self._generate, prompt_ids, n, max_tokens, temperature, top_p, seed,
                                       top_logprobs)

    def _generate(self, prompt_ids, n, max_tokens, temperature, top_p, seed, top_logprobs) -> list[Sample]:
        import torch

        eos = self.stop_token_ids
        device = next(self.model.parameters()).device
        inputs = torch.tensor([prompt_ids], device=device)
        kwargs = {"max_new_tokens": max_tokens, "num_return_sequences": n, "eos_token_id": eos,
                  "pad_token_id": eos[0], "return_dict_in_generate": True, "output_logits": True}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=None)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with self.lock, torch.inference_mode():
            was_training = self.model.training
            self.model.eval()
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), **kwargs)
            if was_training:
                self.model.train()
        new = out.sequences[:, len(prompt_ids):]
        # the policy's own (temperature-1) logprobs, as vLLM reports raw logprobs
        logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # [n, T, V]
        lps = logprobs.gather(-1, new[:, :, None]).squeeze(-1)
        top = logprobs.topk(top_logprobs, dim=-1) if top_logprobs else None
        samples = []
        for r, (row, lp) in enumerate(zip(new.tolist(), lps.tolist())):
            end = next((i + 1 for i, t in enumerate(row) if t in eos), None)
            cut = end or len(row)
            tops = [list(zip(top.indices[r, i].tolist(), top.values[r, i].tolist())) for i in range(cut)] \
                if top is not None else []
            samples.append(Sample(row[:cut], lp[:cut], "stop" if end else "length", tops))
        return samples

    async def load_adapter(self, step: int, path) -> None:
        return None  # the served weights are the trained ones already

    async def sleep(self) -> None:
        return None

    async def wake(self) -> None:
        return None

    async def close(self) -> None:
        return None
