"""The transformers engine: generation on CPU or GPU with the very model being trained (peft LoRA on top
of the base), for development and CI. No adapter swapping is needed: the served weights are the trained
ones. Generation and training take turns under one lock."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" or "length"


class TransformersEngine:
    name = "transformers"

    def __init__(self, model, tokenizer, lock: threading.Lock | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.lock = lock or threading.Lock()

    async def start(self) -> None:
        return None

    async def generate(self, prompt_ids: list[int], *, n: int = 1, max_tokens: int = 256, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None,
                       stop_token_ids: list[int] | None = None) -> list[Sample]:
        return await asyncio.to_thread(self._generate, prompt_ids, n, max_tokens, temperature, top_p, seed,
                                       stop_token_ids)

    def _generate(self, prompt_ids, n, max_tokens, temperature, top_p, seed, stop_token_ids) -> list[Sample]:
        import torch

        eos = [self.tokenizer.eos_token_id, *(stop_token_ids or [])]
        device = next(self.model.parameters()).device
        inputs = torch.tensor([prompt_ids], device=device)
        kwargs = {"max_new_tokens": max_tokens, "num_return_sequences": n, "eos_token_id": eos,
                  "pad_token_id": self.tokenizer.eos_token_id, "return_dict_in_generate": True,
                  "output_logits": True}
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
        # the policy's own (temperature-1) logprob of each sampled token, as vLLM reports raw logprobs
        logits = torch.stack(out.logits, dim=1).float()  # [n, T, V]
        lps = torch.log_softmax(logits, dim=-1).gather(-1, new[:, :, None]).squeeze(-1)
        samples = []
        for row, lp in zip(new.tolist(), lps.tolist()):
            end = next((i + 1 for i, t in enumerate(row) if t in eos), None)
            samples.append(Sample(row[:end], lp[:end], "stop") if end else Sample(row, lp, "length"))
        return samples

    async def load_adapter(self, step: int, path) -> None:
        return None  # the served weights are the trained ones already

    async def sleep(self) -> None:
        return None

    async def wake(self) -> None:
        return None

    async def close(self) -> None:
        return None
