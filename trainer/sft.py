"""Supervised fine-tuning of a LoRA adapter on chat answers (the student of `ruler distill`).

One code path with GRPO training: examples become `TrainingSequence`s (the prompt rendered with the
tokenizer's chat template and a generation prompt, then the answer's tokens and the end-of-turn token, the
answer's tokens marked trained), are packed by `ruler_rl.trainer.packing.pack` (prompts that begin alike share their
prefix), and log-probabilities come from `ruler_rl.trainer.training._row_logprobs`, the chunked path the GRPO step
uses (the model's full forward where the chunked path was not proven equal, `verify_logprob_path`). The loss
is the mean negative log-likelihood over every trained token of the step's batch; gradients accumulate over
the packed rows into one AdamW step, as in `train_step`.

    model, tokenizer, full_forward = load_student("local/smollm2-135m-instruct", SFTConfig())
    history = train_sft(model, tokenizer, examples, SFTConfig(steps=20), full_forward=full_forward)
    save_adapter(model, tokenizer, "out/judge", meta={"base": "local/smollm2-135m-instruct"})
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pydantic

from ruler_rl.trainer.config import LoRAConfig, TrainConfig
from ruler_rl.trainer.packing import pack
from ruler_rl.trainer.sequences import TrainingSequence, end_of_turn_ids
from ruler_rl.trainer.training import _row_logprobs, attention_takes_masks, verify_logprob_path


@dataclass
class SFTExample:
    """A prompt (chat messages) and the answer the model should give to it."""

    messages: list[dict]
    answer: str

    def __post_init__(self) -> None:
        if not isinstance(self.messages, list) or not self.messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in self.messages):
            raise ValueError("an SFT example's messages must be a non-empty list of {'role', 'content'} dicts "
                             "with text content")
        if not isinstance(self.answer, str) or not self.answer.strip():
            raise ValueError("an SFT example's answer must be non-empty text")


def _from_train_config(name: str):
    """`TrainConfig`'s own declaration of the field `name` (default, bounds, description), for `SFTConfig`."""
    return copy.deepcopy(TrainConfig.model_fields[name])


class SFTConfig(pydantic.BaseModel):
    """How the student is fine-tuned."""

    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)

    steps: int = pydantic.Field(20, ge=1, description="Optimizer steps. Default 20; >= 1.")
    learning_rate: float = pydantic.Field(2e-4, gt=0, description="AdamW learning rate. Default 2e-4; > 0.")
    batch_size: int = pydantic.Field(4, ge=1, description=(
        "Examples per step, drawn in a seeded shuffled order, reshuffled after each pass. Default 4; >= 1."))
    max_seq_length: int = pydantic.Field(2048, ge=16, description=(
        "The most tokens of one example (prompt + answer); a longer example is skipped (counted), never cut, "
        "since a cut answer teaches a wrong format. Default 2048; >= 16."))
    # the same knobs as a GRPO step's, declared once (default, bounds, description) in `TrainConfig`
    max_tokens_per_micro_batch: int = _from_train_config("max_tokens_per_micro_batch")
    logprob_chunk_size: int = _from_train_config("logprob_chunk_size")
    max_grad_norm: float = _from_train_config("max_grad_norm")
    weight_decay: float = _from_train_config("weight_decay")
    seed: int = pydantic.Field(0, description="Seeds the LoRA initialisation and the example order. Default 0.")
    lora: LoRAConfig = pydantic.Field(default_factory=lambda: LoRAConfig(rank=16, alpha=32), description=(
        "The adapter (`ruler_rl.trainer.LoRAConfig`). Default rank 16, alpha 32, Llama-like projections."))


def sft_sequence(tokenizer, example: SFTExample, *, end_of_turn: list[int] | None = None) -> TrainingSequence:
    """The example as one sequence: prompt tokens (chat template, generation prompt) untrained, then the
    answer's tokens and the first end-of-turn id trained."""
    if not isinstance(example, SFTExample):
        raise TypeError(f"expected an SFTExample, got {type(example).__name__}")
    prompt = tokenizer.apply_chat_template(example.messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"]
    ends = list(end_of_turn or end_of_turn_ids(tokenizer))
    if not ends:
        raise ValueError("the tokenizer names no end-of-turn token (eos_token_id)")
    answer = tokenizer(example.answer, add_special_tokens=False)["input_ids"] + [ends[0]]
    ids = list(prompt) + answer
    trained = [False] * len(prompt) + [True] * len(answer)
    return TrainingSequence(ids, trained, [math.nan] * len(ids))


def load_student(base: str, config: SFTConfig):
    """(peft model, tokenizer, full_forward): `base` (the embedded model's name, a folder or a hub id) with a
    fresh LoRA adapter (B = 0, so it answers exactly as the base until trained), fp32 on a CPU and bf16 on a
    GPU; `full_forward` says whether logprobs must use the model's own forward (`verify_logprob_path`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ruler_rl.trainer.backend import resolve_base_model

    if not isinstance(config, SFTConfig):
        raise TypeError("config must be a ruler_rl.trainer.sft.SFTConfig")
    path = resolve_base_model(base)
    cuda = torch.cuda.is_available()
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if cuda else torch.float32)
    hf.to("cuda" if cuda else "cpu")
    model = config.lora.wrap(hf, base)
    deviation = verify_logprob_path(model)
    full_forward = deviation > (1e-3 if hf.dtype == torch.float32 else 5e-2)
    return model, tokenizer, full_forward


def sft_backward(model, seqs: list[TrainingSequence], config: SFTConfig, *, full_forward: bool = False) -> dict:
    """Pack `seqs`, run each row forward and backward with the loss -sum(log p(trained token)) / N over the
    batch's N trained tokens, leaving the gradients on the parameters. Returns loss, tokens, rows."""

    if not seqs:
        raise ValueError("an SFT step needs at least one sequence")
    masked = attention_takes_masks(model)
    for i, s in enumerate(seqs):
        s.group, s.trajectory = 0, i  # one group: prompts that begin alike (system prompt, rubric) share it
    rows, packed = pack(seqs, capacity=config.max_tokens_per_micro_batch, share_prefix=True, min_prefix=32,
                        maskable=masked)
    total = sum(len(r.targets) for r in rows)
    if total == 0:
        raise ValueError("the batch has no trained token")
    loss_sum = 0.0
    for row in rows:
        if not row.targets:
            continue
        logp = _row_logprobs(model, row, config.logprob_chunk_size, full_forward=full_forward, masked=masked)
        loss = -logp.sum() / total
        loss.backward()
        loss_sum += loss.item()
    return {"loss": loss_sum, "trained_tokens": total, "sequence_tokens": packed.sequence_tokens,
            "forward_tokens": packed.forward_tokens, "rows": packed.rows}


def train_sft(model, tokenizer, examples: list[SFTExample], config: SFTConfig, *, full_forward: bool = False,
              on_step=None) -> list[dict]:
    """`config.steps` AdamW steps on `examples` (batches of `config.batch_size` in a seeded order) of the
    model's trainable (LoRA) parameters; one stats dict per step (`on_step(row)` is called with each)."""
    import torch

    if not isinstance(config, SFTConfig):
        raise TypeError("config must be a ruler_rl.trainer.sft.SFTConfig")
    if not examples:
        raise ValueError("no examples to train on")
    ends = end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
    seqs, too_long = [], 0
    for ex in examples:
        seq = sft_sequence(tokenizer, ex, end_of_turn=ends)
        if len(seq.token_ids) > config.max_seq_length:
            too_long += 1
            continue
        seqs.append(seq)
    if not seqs:
        raise ValueError(f"every example is longer than max_seq_length={config.max_seq_length} tokens")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (load it with load_student)")
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    rng = random.Random(config.seed)
    order: list[int] = []
    history = []
    model.train()
    for step in range(1, config.steps + 1):
        batch = []
        while len(batch) < min(config.batch_size, len(seqs)):
            if not order:
                order = rng.sample(range(len(seqs)), len(seqs))
            batch.append(order.pop())
        started = time.perf_counter()
        chosen = [TrainingSequence(list(seqs[i].token_ids), list(seqs[i].trained), list(seqs[i].old_logprobs))
                  for i in batch]
        stats = sft_backward(model, chosen, config, full_forward=full_forward)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm).item()
        if not math.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"step {step}: gradient norm is not finite; the step was not applied")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        row = {"step": step, **stats, "grad_norm": grad_norm, "skipped_too_long": too_long,
               "train_s": time.perf_counter() - started}
        history.append(row)
        if on_step is not None:
            on_step(row)
    model.eval()
    return history


def _replace_folder(out: str | os.PathLike, fill, meta: dict | None) -> Path:
    """Write the folder `out` whole: `fill(tmp)` and `meta` (as `ruler_judge.json`) into a folder beside it, then
    renamed into place (an `out` already there is replaced)."""
    from ruler_rl.judges.embedded import JUDGE_META

    out = Path(out).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    fill(tmp)
    (tmp / JUDGE_META).write_text(json.dumps(meta or {}, indent=1, default=str))
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def save_adapter(model, tokenizer, out: str | os.PathLike, meta: dict | None = None) -> Path:
    """Write the adapter, the tokenizer and `meta` (as `ruler_judge.json`) to the folder `out`, replacing
    it whole (written beside it, then renamed): a folder `local/<out>` loads as a judge."""

    def fill(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))

    return _replace_folder(out, fill, meta)


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def save_checkpoint_as_judge(checkpoint: str | os.PathLike, tokenizer, out: str | os.PathLike,
                             meta: dict | None = None) -> Path:
    """A trainer checkpoint folder (`ruler_rl.trainer.checkpoints`, a plain peft adapter) as the judge folder `out`: its
    adapter files, the tokenizer and `meta`, replacing `out` whole as `save_adapter` does (the optimizer
    state is left out)."""
    src = Path(checkpoint).expanduser()
    missing = [f for f in ADAPTER_FILES if not (src / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{src} is not an adapter checkpoint: {', '.join(missing)} missing")

    def fill(tmp: Path) -> None:
        for f in ADAPTER_FILES:
            shutil.copy2(src / f, tmp / f)
        tokenizer.save_pretrained(str(tmp))

    return _replace_folder(out, fill, meta)
