"""One GRPO step on LoRA: groups → advantages → sequences → chunked logprobs → loss → optimizer step.

Where advantages come from: `ruler.group_advantages` on each group's rewards (zero-signal groups dropped).
Log-probabilities are computed from the last hidden state one chunk of positions at a time, each chunk
under activation checkpointing, so the full [tokens × vocabulary] logits never exist at once, not even
for the backward pass. The reference model for KL is the same model with the adapter disabled.
"""

from __future__ import annotations

import math
import time
from collections import Counter

from ruler.advantages import group_advantages, group_has_signal
from ruler.trajectory import TrajectoryGroup
from trainer.config import TrainConfig
from trainer.loss import policy_loss, token_weights
from trainer.sequences import Sequence, TokenizeReport, tokenize_trajectory


def _chunk_logprobs(lm_head, hidden, targets):
    import torch

    logits = lm_head(hidden).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


def sequence_logprobs(model, input_ids, attention_mask, chunk_size: int):
    """log p(token_t | tokens_<t) for t = 1..T-1, shape [B, T-1], in chunks of positions."""
    import torch
    from torch.utils.checkpoint import checkpoint

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, lm_head = base.get_decoder(), base.get_output_embeddings()
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
    targets = input_ids[:, 1:]
    parts = []
    for s in range(0, hidden.shape[1], chunk_size):
        h, t = hidden[:, s:s + chunk_size], targets[:, s:s + chunk_size]
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk_logprobs, lm_head, h, t, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(lm_head, h, t))
    return torch.cat(parts, dim=1)


def prepare(groups: list[TrajectoryGroup], tokenizer, config: TrainConfig, max_seq_length: int):
    """(sequences, stats): the batch a step trains on, and what was skipped and why."""
    skipped: Counter = Counter()
    report = TokenizeReport()
    rewards: list[float] = []
    seqs: list[Sequence] = []
    for g, group in enumerate(groups):
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(f"group {g} is a {type(group).__name__}, not a TrajectoryGroup")
        trajs = list(group)
        values = [t.reward for t in trajs]
        if len(trajs) < 2:
            skipped["group with fewer than 2 trajectories"] += 1
            continue
        try:
            has_signal = group_has_signal(values)  # ruler's reward validation: finite numbers only
        except (TypeError, ValueError):
            skipped["group with a NaN/inf/non-numeric reward"] += 1
            continue
        rewards += values
        if not has_signal:
            skipped["group with all-equal rewards"] += 1
            continue
        for traj, adv in zip(trajs, group_advantages(values, scale=config.scales_advantages())):
            if adv == 0:
                continue
            seq = tokenize_trajectory(tokenizer, traj.messages_and_choices, traj.tools, adv,
                                      max_seq_length=max_seq_length, report=report, group=g)
            if seq is not None:
                seqs.append(seq)
    skipped.update(report.skipped)
    mean = sum(rewards) / len(rewards) if rewards else math.nan
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else math.nan
    return seqs, {"groups": len(groups), "trajectories": sum(len(list(g)) for g in groups), "reward_mean": mean,
                  "reward_std": std, "sequences": len(seqs), "truncated": report.truncated,
                  "choices_without_token_ids": report.choices_without_token_ids,
                  "skipped": dict(skipped)}


def _pad(seqs: list[Sequence], device):
    import torch

    width = max(len(s.input_ids) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attn = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width)
    old = torch.full((len(seqs), width), math.nan)
    for i, s in enumerate(seqs):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.mask, dtype=torch.float)
        old[i, :n] = torch.tensor(s.old_logprobs, dtype=torch.float)
    adv = torch.tensor([s.advantage for s in seqs])
    # position t of the logprobs predicts token t+1
    return ids.to(device), attn.to(device), mask[:, 1:].to(device), old[:, 1:].to(device), adv.to(device)


def train_step(model, optimizer, seqs: list[Sequence], config: TrainConfig, *, max_seq_length: int) -> dict:
    """Accumulate the loss over micro-batches, clip, step. Returns the step's training stats."""
    import torch

    started = time.perf_counter()
    device = next(model.parameters()).device
    total_tokens = sum(sum(s.mask[1:]) for s in seqs)
    norm_len = max_seq_length
    model.train()
    stats = Counter()
    loss_sum = 0.0
    for start in range(0, len(seqs), config.micro_batch_size):
        micro = seqs[start:start + config.micro_batch_size]
        ids, attn, mask, old, adv = _pad(micro, device)
        ref = None
        with torch.no_grad():
            if torch.isnan(old[mask > 0]).any():  # no sampled logprobs: the current policy's (ratio 1)
                current = sequence_logprobs(model, ids, attn, config.logprob_chunk_size)
                old = torch.where(torch.isnan(old), current, old)
            if config.kl_coef > 0:
                with model.disable_adapter():
                    ref = sequence_logprobs(model, ids, attn, config.logprob_chunk_size)
        old = torch.nan_to_num(old, nan=0.0)
        new = sequence_logprobs(model, ids, attn, config.logprob_chunk_size)
        weights = token_weights(mask, config.loss, n_seqs=len(seqs), total_tokens=max(1, total_tokens),
                                norm_len=norm_len)
        loss, part = policy_loss(new, old, adv, weights, kind=config.loss, epsilon=config.epsilon,
                                 epsilon_high=config.epsilon_high, ref_logprobs=ref, kl_coef=config.kl_coef)
        loss.backward()
        loss_sum += loss.item()
        for key in ("clip_fraction", "kl", "ratio_mean"):
            stats[key] += part[key] * part["tokens"]
        stats["tokens"] += part["tokens"]
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm).item()
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError("gradient norm is not finite; the step was not applied")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - started
    n = max(1, stats["tokens"])
    advs = [s.advantage for s in seqs]
    return {"loss": loss_sum, "grad_norm": grad_norm, "clip_fraction": stats["clip_fraction"] / n,
            "kl": stats["kl"] / n, "ratio_mean": stats["ratio_mean"] / n, "trained_tokens": int(stats["tokens"]),
            "sequence_tokens": sum(len(s.input_ids) for s in seqs),
            "advantage_mean": sum(advs) / len(advs), "advantage_abs_mean": sum(abs(a) for a in advs) / len(advs),
            "train_s": seconds, "train_tokens_per_s": sum(len(s.input_ids) for s in seqs) / seconds}
