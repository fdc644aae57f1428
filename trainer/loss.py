"""The policy-gradient losses, on per-token log-probabilities.

Every loss is a weighted sum of per-token PPO-clip terms; the variants differ in the clip range, in the token
weights (how per-token terms become one number), and by default in the advantages. `token_weights` computes
the weights over the *whole* batch, so gradient accumulation over micro-batches adds up to exactly the
full-batch loss: a micro-batch's loss is the sum of its tokens' weighted terms, never a mean of its own.

Notation: a batch holds n trajectories (those with a trained token and a non-zero advantage); trajectory i
has L_i trained tokens (a multi-turn trajectory may span several sequences: `row_tokens` gives each row its
trajectory's count), N = sum_i L_i; A_i is its advantage, r_it = exp(new_it - old_it) the ratio of token t.

    term_it = -w_s * min(r_it * A_i, clip(r_it, 1 - eps, 1 + eps') * A_i) + kl_coef * KL_it

grpo
    loss = 1/n * sum_i (1/L_i * sum_t term_it);  w = mask / (L_i * n);  eps' = eps.
    Each trajectory counts once whatever its length: a token of a short answer weighs more than one of a
    long answer. Advantages: (reward - group mean) / (group std + 1e-6) by default.
dr_grpo  ("GRPO done right", Liu et al. 2025)
    loss = 1/n * sum_i (1/B * sum_t term_it);  w = mask / (B * n);  eps' = eps.
    B is one constant for the whole batch (`TrainConfig.completion_budget`; default the largest L_i in the
    batch), so every token weighs the same and no per-answer length normalisation biases the update by
    answer length. Advantages are not divided by the group std unless `scale_advantages=True`.
dapo  (Yu et al. 2025; a token-level mean over the whole batch)
    loss = 1/N * sum_i sum_t term_it;  w = mask / N;  eps' = epsilon_high (clip-higher, >= eps).
    Every trained token of the batch weighs the same; the higher upper clip lets unlikely tokens with a
    positive advantage gain probability faster. Advantages as grpo's.

w_s = 1, or with `TrainConfig.sampler_correction="tis"` the truncated importance weight
min(exp(old_trainer - sampled), C) (old is then the trainer's own logprob before the update).
KL is the k3 estimator exp(ref - new) - (ref - new) - 1 to the reference policy (zero when none is given).
Only the clipped policy term is scaled by w_s; both terms are weighted by w.
"""

from __future__ import annotations

import torch

from ruler_rl.trainer.config import LossKind

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
