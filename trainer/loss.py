"""The policy-gradient losses, on per-token log-probabilities.

Every loss is a weighted sum of per-token PPO-clip terms; the variants differ in the clip range and in the
token weights, which `token_weights` computes over the *whole* batch so that gradient accumulation over
micro-batches adds up to exactly the full-batch loss:

    grpo     w = mask / (len_i * n)          each trajectory counts once, its tokens averaged
    dr_grpo  w = mask / (norm_len * n)       no length normalisation (constant norm_len)
    dapo     w = mask / total_tokens         token-level mean; clip range 1-eps .. 1+eps_high

n is the number of trajectories in the batch and len_i the trained tokens of row i's trajectory (a
multi-turn trajectory may span several sequences: `row_tokens` gives each row its trajectory's count).

Per token:  -w_s * min(r * A, clip(r, 1-eps, 1+eps') * A) + kl_coef * KL,   r = exp(new - old),
w_s = 1, or with a sampler correction the truncated importance weight min(exp(old_trainer - sampled), C),
KL is the k3 estimator exp(ref - new) - (ref - new) - 1 (zero when no reference is given).
"""

from __future__ import annotations

import torch

from trainer.config import LossKind

KINDS = ("grpo", "dr_grpo", "dapo")


def token_weights(mask: torch.Tensor, kind: LossKind, *, n_seqs: int, total_tokens: int,
                  norm_len: int | None = None, row_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token weights for `mask` [B, T] (1 = a generated token trained on). `n_seqs`: trajectories in
    the batch; `row_tokens` [B]: the trained tokens of each row's trajectory (default: the row's own)."""
    if kind not in KINDS:
        raise ValueError(f"loss must be one of {KINDS}, got {kind!r}")
    if n_seqs < 1 or total_tokens < 1:
        raise ValueError("a batch needs at least one sequence and one trained token")
    mask = mask.float()
    if kind == "grpo":
        per_row = mask.sum(dim=1) if row_tokens is None else row_tokens.to(mask.dtype)
        return mask / per_row[:, None].clamp(min=1) / n_seqs
    if kind == "dr_grpo":
        return mask / float(norm_len or mask.shape[1]) / n_seqs
    return mask / total_tokens


def policy_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                weights: torch.Tensor, *, kind: LossKind, epsilon: float = 0.2, epsilon_high: float = 0.28,
                ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                sampler_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """(loss, stats) for logprobs [B, T], advantages [B] and token weights [B, T] from `token_weights`.

    `sampler_weights` [B, T]: truncated importance weights min(pi_trainer_old / pi_sampler, C) for tokens that
    another engine sampled (vLLM's kernels differ from the trainer's); they scale the clipped policy term,
    not the KL term (as TRL's vLLM importance-sampling correction)."""
    if kind not in KINDS:
        raise ValueError(f"loss must be one of {KINDS}, got {kind!r}")
    if new_logprobs.shape != old_logprobs.shape or new_logprobs.shape != weights.shape:
        raise ValueError(f"shapes differ: new {tuple(new_logprobs.shape)}, old {tuple(old_logprobs.shape)}, "
                         f"weights {tuple(weights.shape)}")
    if advantages.shape != new_logprobs.shape[:1]:
        raise ValueError(f"advantages must be [batch]={tuple(new_logprobs.shape[:1])}, got {tuple(advantages.shape)}")
    high = epsilon_high if kind == "dapo" else epsilon
    adv = advantages.to(new_logprobs.dtype)[:, None]
    ratio = torch.exp(new_logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if sampler_weights is not None:
        per_token = per_token * sampler_weights.to(per_token.dtype)
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None:
        delta = ref_logprobs - new_logprobs
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_coef * kl
    loss = (per_token * weights).sum()
    trained = weights > 0
    n = trained.sum().clamp(min=1)
    with torch.no_grad():
        stats = {"clip_fraction": ((clipped < unclipped) & trained).sum().item() / n.item(),
                 "kl": (kl * trained).sum().item() / n.item(),
                 "ratio_mean": (ratio * trained).sum().item() / n.item(),
                 "ratio_dev_mean": ((ratio - 1).abs() * trained).sum().item() / n.item(),
                 "ratio_dev_max": float(((ratio - 1).abs() * trained).max().item()) if trained.any() else 0.0,
                 "tokens": int(trained.sum().item())}
    return loss, stats
