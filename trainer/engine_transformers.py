"""The transformers engine (a `ruler_rl.trainer.engine.GeneratingEngine`): generation on CPU or GPU with the very model
being trained (peft LoRA on top of the base), for development and CI. No adapter swapping is needed: the
served weights are the trained ones. Generation and training take turns under one lock, so a request that
arrives during a training step waits for it instead of being cut short; there is nothing to put to sleep.

What is sampled is what is reported: the model's `generation_config.json` takes no part in sampling (as vLLM's
`--generation-config vllm`), so its repetition penalty, n-gram bans, suppressed tokens, minimum lengths or default
top-k/top-p (Qwen2.5-Instruct ships `repetition_penalty` 1.05) never reshape the distribution the reported
logprobs come from. At temperature 1 and top_p 1 (the trainer's rollouts, `litellm_completion_params`) the
tokens are drawn from exactly the distribution whose logprobs each choice carries; another temperature or top_p
samples the tempered / nucleus distribution while the logprobs stay the policy's own temperature-1 ones, as
vLLM reports them by default (its `raw_logprobs` mode)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from ruler_rl.trainer.engine import Sample


def _hf_models(model) -> list:
    """`model` and, under peft, the transformers model it wraps: the objects whose `generation_config`
    `generate()` reads (peft's `generate` copies its own onto the wrapped model's first)."""
    found = [model]
    inner = model.get_base_model() if hasattr(model, "get_base_model") else None
    if inner is not None and inner is not model:
        found.append(inner)
    return found


def _neutral_generation_config(model, stop_token_ids: list[int]):
    """A `GenerationConfig` with nothing but the model's special token ids: every logits processor and warper
    off (transformers fills what a config leaves unset from its own neutral defaults, and top-k, its one
    non-neutral default, is given as None with each call)."""
    from transformers import GenerationConfig

    own = getattr(_hf_models(model)[-1], "generation_config", None)
    ids = {k: getattr(own, k, None) for k in ("bos_token_id", "decoder_start_token_id")}
    return GenerationConfig(**{k: v for k, v in ids.items() if v is not None}, eos_token_id=list(stop_token_ids),
                            pad_token_id=stop_token_ids[0])


class _generation_config:
    """Within the block, `generate()` reads `config` instead of the model's own `generation_config` (restored
    after): the engine's calls sample under nothing but the arguments they pass."""

    def __init__(self, model, config):
        self.models, self.config, self.saved = _hf_models(model), config, []

    def __enter__(self):
        self.saved = [(m, m.__dict__.get("generation_config", _MISSING)) for m in self.models]
        for m in self.models:
            m.generation_config = self.config
        return self

    def __exit__(self, *exc):
        for m, value in self.saved:
            if value is _MISSING:
                m.__dict__.pop("generation_config", None)
            else:
                m.generation_config = value
        return False


_MISSING = object()


class TransformersEngine:
    """Generates with `model` (a causal LM, usually the peft model being trained) under `lock`, stopping at any
    of `stop_token_ids` (the model's end-of-turn ids). Served over HTTP by the backend's CPU server."""

    name = "transformers"
    base_url = None      # no server of its own: `trainer/server.py` answers for it
    can_sleep = False    # training waits for the lock instead

    def __init__(self, model, tokenizer, lock: threading.Lock | None = None, *, stop_token_ids: list[int]):
        if not stop_token_ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_token_ids):
            raise ValueError(f"the engine needs the model's end-of-turn token ids (ints), got {stop_token_ids!r}")
        if not hasattr(model, "generate"):
            raise TypeError(f"model must be a transformers model with generate(), got {type(model).__name__}")
        self.model = model
        self.tokenizer = tokenizer
        self.lock = lock or threading.Lock()
        self.stop_token_ids = list(stop_token_ids)
        self.policy_step = 0  # changed with the weights, under `lock` (ruler_rl.trainer.engine.GeneratingEngine)
        self._neutral = _neutral_generation_config(model, self.stop_token_ids)

    async def start(self) -> None:
        return None

    async def generate(self, prompt_ids: list[int], *, n: int = 1, max_tokens: int = 256, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None, top_logprobs: int = 0,
                       grammar=None) -> list[Sample]:
        """`n` samples of `prompt_ids` (temperature 0: greedy), each with its tokens' temperature-1 logprobs.
        `grammar` (an `xgrammar.Grammar`) constrains what is sampled; the logprobs stay the policy's own,
        taken before the constraint."""
        if not prompt_ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt_ids):
            raise ValueError("prompt_ids must be a non-empty list of token ids")
        if n < 1 or max_tokens < 1 or temperature < 0 or not 0 < top_p <= 1 or top_logprobs < 0:
            raise ValueError(f"need n >= 1, max_tokens >= 1, temperature >= 0, 0 < top_p <= 1, top_logprobs >= 0; "
                             f"got n={n}, max_tokens={max_tokens}, temperature={temperature}, top_p={top_p}, "
                             f"top_logprobs={top_logprobs}")
        return await asyncio.to_thread(self._generate, prompt_ids, n, max_tokens, temperature, top_p, seed,
                                       top_logprobs, grammar)

    def _logits_processor(self, grammar):
        import xgrammar as xgr

        if getattr(self, "_grammar_compiler", None) is None:
            vocab = int(self.model.get_output_embeddings().weight.shape[0])
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=vocab,
                                                      stop_token_ids=self.stop_token_ids)
            self._grammar_compiler = xgr.GrammarCompiler(info)
        return xgr.contrib.hf.LogitsProcessor(self._grammar_compiler.compile_grammar(grammar))

    def _generate(self, prompt_ids, n, max_tokens, temperature, top_p, seed, top_logprobs,
                  grammar=None) -> list[Sample]:
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
        if grammar is not None:
            kwargs["logits_processor"] = [self._logits_processor(grammar)]
        with self.lock, torch.inference_mode(), _generation_config(self.model, self._neutral):
            was_training = self.model.training
            self.model.eval()
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), **kwargs)
            policy_step = self.policy_step
            if was_training:
                self.model.train()
        new = out.sequences[:, len(prompt_ids):]
        # the policy's own (temperature-1) logprobs, as vLLM reports raw logprobs
        logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # [n, T, V]
        lps = logprobs.gather(-1, new[:, :, None]).squeeze(-1)
        top = logprobs.topk(top_logprobs, dim=-1) if top_logprobs else None
        samples = []
        for r, (row, lp) in enumerate(zip(new.tolist(), lps.tolist(), strict=True)):
            end = next((i + 1 for i, t in enumerate(row) if t in eos), None)
            cut = end or len(row)
            tops = [list(zip(top.indices[r, i].tolist(), top.values[r, i].tolist(), strict=True)) for i in range(cut)] \
                if top is not None else []
            samples.append(Sample(row[:cut], lp[:cut], "stop" if end else "length", tops, policy_step))
        return samples

    async def load_adapter(self, step: int, path: Path) -> None:
        return None  # the served weights are the trained ones already

    async def unload_adapter(self, step: int) -> None:
        return None  # a rolled-back step restores the trained weights themselves

    async def sleep(self) -> None:
        return None

    async def wake(self) -> None:
        return None

    async def close(self) -> None:
        return None
