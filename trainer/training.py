"""One GRPO step on LoRA: groups → advantages → served token sequences → chunked logprobs → loss → step.

Where advantages come from: `ruler_rl.group_advantages` on each group's rewards (zero-signal groups dropped).
Sequences are packed into padding-free rows, each group's shared prompt computed once (`trainer/packing.py`).
Log-probabilities are computed from the last hidden state at the positions that predict a trained token,
one chunk at a time under activation checkpointing, so the full [tokens × vocabulary] logits never exist
at once, not even for the backward pass. The reference model for KL is the model with the adapter disabled.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from contextlib import contextmanager, nullcontext

from ruler_rl.advantages import group_advantages, group_has_signal
from ruler_rl.messages import Problem, TrajectoryError
from ruler_rl.trainer.attention import BLOCK_ATTENTION, blocks_forward, use_blocks
from ruler_rl.trainer.config import TrainConfig
from ruler_rl.trainer.loss import policy_loss, token_weights
from ruler_rl.trainer.packing import MASKABLE_ATTENTION, Row, pack
from ruler_rl.trainer.sequences import (
    AbortedTurnError,
    MissingTokenIdsError,
    SequenceReport,
    StalePolicyError,
    TrainingSequence,
    training_sequences,
    trajectory_policy_steps,
)
from ruler_rl.trajectory import TrajectoryGroup, validate_trajectories

log = logging.getLogger("ruler.trainer")


def call_after_step(on_step, row: dict, seqs: list) -> None:
    """Call a step's `on_step(row, sequences)` hook (`LocalBackend.train`, `RayTrainer.train`): the step is taken and
    logged by then, so what the hook raises is logged as a warning, never raised."""
    if on_step is None:
        return
    try:
        on_step(dict(row), list(seqs))
    except Exception as exc:  # noqa: BLE001 - the hook is the caller's: its failure is logged, the step stands
        log.warning("step %s: the after-step hook failed (%s: %s); the step is taken and logged", row.get("step"),
                    type(exc).__name__, exc)



def logit_transform(config):
    """What the model's own forward does to `lm_head`'s output before it becomes logits, for the
    architectures that do something: Gemma-2/3 soft-capping, Cohere's `logit_scale`, Granite's
    `logits_scaling`. None when logits are `lm_head(hidden)` as they are."""
    import torch

    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    divide = getattr(config, "logits_scaling", None)
    if not (cap or scale or divide):
        return None

    def transform(logits):
        if scale:
            logits = logits * scale
        if divide:
            logits = logits / divide
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


def _chunk_logprobs(lm_head, hidden, targets, transform=None):
    import torch

    logits = lm_head(hidden).float()
    if transform is not None:
        logits = transform(logits)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)


@contextmanager
def _probing(model):
    """Eval mode and no grad for a check on `model`, its training mode restored after; yields the deterministic
    token ids the checks use, `ids(n)`: n ids spread over the vocabulary."""
    import torch

    vocab = model.get_output_embeddings().weight.shape[0]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield lambda n: [(t * 7919 + 11) % vocab for t in range(n)]
    finally:
        model.train(was_training)


def verify_logprob_path(model, *, length: int = 24) -> float:
    """Max |our path − the model's own forward| logprob on a fixed input (eval mode, no grad): a row of one
    sequence with its 4-D mask forced (where the model takes one; training gives such a row none), and with block
    attention its one block as well, and chunked logprobs, against the model's full forward with no mask at all
    (its own causal, and sliding-window, masks); the larger deviation of the two.
    The backend uses the chunked path only when this is within tolerance (1e-3 in fp32, 5e-2 in half precision)."""
    with _probing(model) as ids:
        seq = TrainingSequence(ids(length), [False] + [True] * (length - 1), [math.nan] * length)
        row = pack([seq], capacity=length)[0][0]
        masked = attention_takes_masks(model)
        theirs = _row_logprobs(model, row, 7, full_forward=True, masked=False)
        paths = (False, True) if _block_attention(model) else (False,)
        ours = [_row_logprobs(model, row, 7, full_forward=False, masked=masked, force_mask=True, blocks=b)
                for b in paths]
    return max(float((o - theirs).abs().max()) for o in ours)


def verify_packed_rows(model, *, prefix: int = 12, suffix: int = 9) -> float:
    """Max |packed − alone| logprob (eval mode, no grad, the model's full forward both ways): two sequences
    sharing a `prefix`-token prefix and a third sequence packed into one row with its 4-D mask, against each
    sequence run alone with no mask (the model's own masks). 0.0 when the model takes no 4-D mask (rows then
    hold one sequence each). The backend runs it on float32 models and packs rows only when it is within 1e-3;
    otherwise every sequence gets a row of its own. In half precision rounding alone moves a logprob by as much
    as a mask fault would (0.1-0.25 on SmolLM2 in bf16), so the check is not made there: the mask rules
    (`attention_takes_masks`) and the float32 tests stand for it."""
    import torch

    if not attention_takes_masks(model):
        return 0.0
    with _probing(model) as ids:
        tokens = ids(prefix + 3 * suffix)
        parts = [tokens[:prefix] + tokens[prefix:prefix + suffix],
                 tokens[:prefix] + tokens[prefix + suffix:prefix + 2 * suffix], tokens[prefix + 2 * suffix:]]
        seqs = [TrainingSequence(part, [False] * 3 + [True] * (len(part) - 3), [math.nan] * len(part),
                                 group=int(i == 2)) for i, part in enumerate(parts)]
        rows, report = pack(seqs, capacity=len(tokens) + prefix, min_prefix=4)
        if report.rows != 1 or report.shared_groups != 1:
            raise RuntimeError(f"verify_packed_rows packed {report}, not one row with one shared prefix")
        paths = (False, True) if _block_attention(model) else (False,)
        packed = [_row_logprobs(model, rows[0], 64, full_forward=True, masked=True, blocks=b) for b in paths]
        alone = [_row_logprobs(model, pack([seq], capacity=len(seq.token_ids))[0][0], 64, full_forward=True,
                               masked=False) for seq in seqs]
    # each sequence's trained tokens are its tokens 3.. : alone[i][k - 3] is token k's logprob run alone
    reference = torch.stack([alone[i][k - 3] for i, k in zip(rows[0].sequence_of, rows[0].token_index, strict=True)])
    return max(float((p - reference).abs().max()) for p in packed)


def prepare(groups: list[TrajectoryGroup], tokenizer, config: TrainConfig, max_seq_length: int, *,
            chat_template: str | None = None, end_of_turn: list[int] | None = None,
            policy_step: int | None = None):
    """(sequences, stats): the batch a step trains on, and what was skipped and why.

    Raises `TrajectoryError` for malformed trajectories (ruler's one validation, naming group, trajectory
    and field), and `MissingTokenIdsError` (naming the group and trajectory) for a generated turn without
    served token ids, unless `config.allow_off_policy_text`, or when no trajectory with a learning signal holds a
    generated turn at all (every assistant turn a plain message: a rollout that recorded text, not choices).
    With `policy_step` (the step of the policy being trained) every turn of a trained trajectory must have been
    sampled within `config.max_off_policy_steps` steps of it and by no newer step, else `StalePolicyError` naming
    group, trajectory, the offending step and the bound (turns without a label are counted in
    `turns_without_policy_step`); the stats then say `policy_lag_max`, `stale_trajectories` (trained trajectories
    with a turn sampled by an older step) and `stale_turns_uncorrected` (stale turns without sampled logprobs —
    constrained ones, or a server that sent none: their old policy is the trainer's own, so the importance weight
    that corrects the other stale turns is 1 for them). The stats also split the rewards by the policy step that
    sampled each trajectory (its oldest labelled turn; a trajectory with no label counts as `policy_step`'s):
    `reward_by_policy_step` and `rollouts_by_policy_step`, keyed by the step as a string.
    """
    if policy_step is not None and (isinstance(policy_step, bool) or not isinstance(policy_step, int)
                                    or policy_step < 0):
        raise ValueError(f"policy_step must be an int >= 0 or None, got {policy_step!r}")
    lag_max, stale, uncorrected = 0, 0, 0
    by_step: dict[int, list[float]] = {}  # policy step that sampled a trajectory -> its rewards
    skipped: Counter = Counter()
    report = SequenceReport()
    rewards: list[float] = []
    seqs: list[TrainingSequence] = []
    n_trajectories = candidates = 0  # trained; with a learning signal (non-zero advantage)
    for g, group in enumerate(groups):
        if not isinstance(group, TrajectoryGroup):
            raise TypeError(f"group {g} is a {type(group).__name__}, not a TrajectoryGroup")
        try:
            validate_trajectories(group)  # the check every surface runs (ruler_rl.trajectory)
        except TrajectoryError as exc:
            raise TrajectoryError([Problem((), f"group {g}, {exc}")]) from None
        trajs = list(group)
        values = [t.reward for t in trajs]
        if len(trajs) < 2:
            skipped["group with fewer than 2 trajectories"] += 1
            continue
        rewards += values  # finite: validate_trajectories refused NaN/inf above
        for traj in trajs:
            steps = trajectory_policy_steps(traj)
            sampled_by = min(steps) if steps else policy_step
            if sampled_by is not None:
                by_step.setdefault(sampled_by, []).append(traj.reward)
        if not group_has_signal(values):
            skipped["group with all-equal rewards"] += 1
            continue
        advantages = group_advantages(values, scale=config.scales_advantages())
        for t, (traj, adv) in enumerate(zip(trajs, advantages, strict=True)):
            if adv == 0:
                continue
            candidates += 1
            try:
                found = training_sequences(traj, tokenizer, allow_off_policy_text=config.allow_off_policy_text,
                                           report=report, where=f"group {g} trajectory {t}",
                                           chat_template=chat_template, end_of_turn=end_of_turn)
            except AbortedTurnError:
                skipped["trajectory with an aborted turn"] += 1
                continue
            sampled = [seq.policy_step for seq in found if seq.policy_step is not None]
            if policy_step is not None and sampled:
                lag = policy_step - min(sampled)
                newest = max(seq.newest_policy_step for seq in found if seq.newest_policy_step is not None)
                if newest > policy_step:  # any turn, not only the oldest
                    raise StalePolicyError(
                        f"group {g} trajectory {t} has a turn sampled by policy step {newest}, newer than the "
                        f"trainer's step {policy_step}: it comes from another run, a later checkpoint or a step "
                        "that failed and was rolled back (nothing was applied)")
                if lag > config.max_off_policy_steps:
                    raise StalePolicyError(
                        f"group {g} trajectory {t} was sampled by policy step {min(sampled)}; the trainer is at "
                        f"step {policy_step}, {lag} step(s) later, beyond TrainConfig.max_off_policy_steps="
                        f"{config.max_off_policy_steps} (nothing was applied: gather fresh rollouts, or allow "
                        f"more staleness with sampler_correction='tis')")
                lag_max, stale = max(lag_max, lag), stale + (lag > 0)
            kept = []
            for seq in found:
                if len(seq.token_ids) > max_seq_length:
                    seq.token_ids, seq.trained, seq.old_logprobs = (seq.token_ids[:max_seq_length],
                                                                    seq.trained[:max_seq_length],
                                                                    seq.old_logprobs[:max_seq_length])
                    report.truncated += 1
                if not any(seq.trained[1:]):  # the first token is never predicted
                    skipped["sequence without trained tokens within max_seq_length"] += 1
                    continue
                seq.advantage, seq.trajectory, seq.group, seq.position = float(adv), n_trajectories, g, t
                if policy_step is not None:  # stale turns without sampled logprobs that are trained (not cut off)
                    uncorrected += sum(s < policy_step and first < len(seq.token_ids)
                                       for s, first in seq.unweighted_turns)
                kept.append(seq)
            if not found:
                skipped["no generated tokens"] += 1
            if kept:
                n_trajectories += 1
                seqs += kept
    if candidates and skipped["no generated tokens"] == candidates:
        raise MissingTokenIdsError(
            f"none of the {candidates} trajectories with a learning signal holds a generated turn: their assistant "
            "turns are plain messages (dicts), which are context, never trained. Record the Choice the model's "
            "server returned (it carries the prompt and sampled token ids) in messages_and_choices, not a "
            "message rebuilt from its text; nothing was applied")
    mean = sum(rewards) / len(rewards) if rewards else math.nan
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else math.nan
    return seqs, {"groups": len(groups), "trajectories": sum(len(list(g)) for g in groups), "reward_mean": mean,
                  "reward_std": std, "trained_trajectories": n_trajectories, "sequences": len(seqs),
                  "turns": report.turns, "context_breaks": report.context_breaks,
                  "off_policy_turns": report.off_policy_turns,
                  "turns_without_logprobs": report.turns_without_logprobs, "truncated": report.truncated,
                  "turns_without_policy_step": report.turns_without_policy_step, "policy_lag_max": lag_max,
                  "stale_trajectories": stale, "stale_turns_uncorrected": uncorrected,
                  "reward_by_policy_step": {str(k): sum(v) / len(v) for k, v in sorted(by_step.items())},
                  "rollouts_by_policy_step": {str(k): len(v) for k, v in sorted(by_step.items())},
                  "skipped": dict(skipped)}


def _row_logprobs(model, row: Row, chunk_size: int, *, full_forward: bool, masked: bool, force_mask: bool = False,
                  blocks: bool | None = None):
    """log p of each trained token of `row` ([N]), read at the position that predicts it. `masked`: the row's
    4-D mask where it needs one (`Row.needs_mask`; `force_mask`: on a one-sequence row too, for the checks), or
    on a model with `ruler_rl.trainer.attention`'s block attention its blocks instead where their copies take no more
    memory than the mask (`use_blocks`). `blocks` True / False: the blocks / the mask whatever the copies take
    (the checks run both paths on their short rows)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    device = next(model.parameters()).device
    ids = torch.tensor([row.token_ids], device=device)
    mask, spans = None, None
    structured = masked and (force_mask or row.needs_mask())  # one sequence: the model's own causal mask
    if structured and _as_blocks(model, row, blocks=blocks):
        spans = row.spans()  # each block its own SDPA call (ruler_rl.trainer.attention): no [T x T] mask
    elif structured:
        mask = row.attention_mask().to(device)[None, None]
        if _attention_implementation(model) == "eager":  # eager adds the mask to the scores: 0 or -inf-like
            dtype = _base(model).get_input_embeddings().weight.dtype
            cached = getattr(row, "_additive", None)  # a row is run up to three times (old, reference, new)
            if cached is None or cached.dtype != dtype or cached.device != mask.device:
                cached = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask,
                                                                                          torch.finfo(dtype).min)
                row._additive = cached
            mask = cached
    inputs = {"input_ids": ids, "position_ids": torch.tensor([row.position_ids], device=device),
              "attention_mask": mask}
    if spans is not None:
        inputs["ruler_blocks"] = spans
    predict = torch.tensor(row.predict_at, device=device)
    targets = torch.tensor(row.targets, device=device)
    forward_context = blocks_forward() if spans is not None else nullcontext()
    if full_forward:
        with forward_context:
            logits = model(**inputs).logits[0, predict].float()
        return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, lm_head = base.get_decoder(), base.get_output_embeddings()
    transform = logit_transform(base.config)
    with forward_context:
        hidden = body(**inputs).last_hidden_state[0, predict]  # [N, H]: only the positions that predict a token
    parts = []
    for s in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[None, s:s + chunk_size], targets[None, s:s + chunk_size]
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk_logprobs, lm_head, h, t, transform, use_reentrant=False)[0])
        else:
            parts.append(_chunk_logprobs(lm_head, h, t, transform)[0])
    return torch.cat(parts)


@contextmanager
def lora_autocast(model, enabled: bool | None):
    """`TrainConfig.lora_autocast`: around a batch's forward and backward passes, the adapters get the model's
    bfloat16 activations as they are (peft's cast of each adapted layer's input to the adapters' float32
    disabled) and the forwards run under `torch.autocast` in that dtype (`autocast_forward`), so the LoRA matmuls
    run in it while the weights and gradients stay float32. Yields that dtype, or None where nothing changes: a
    model that is not bfloat16, or `enabled` False. `enabled` None: on for a bfloat16 model. True on a float16
    model is refused (no gradient scaler)."""
    import torch

    if enabled not in (True, False, None):
        raise ValueError(f"lora_autocast takes True, False or None (on for a bfloat16 model), not {enabled!r}")
    dtype = _base(model).get_input_embeddings().weight.dtype
    if enabled and dtype == torch.float16:  # fp16 gradients of these small per-token losses underflow unscaled
        raise ValueError("lora_autocast=True takes a bfloat16 model: under float16 autocast the adapters' gradients "
                         "would need a gradient scaler, which this trainer has not (leave it None for float16)")
    if enabled is False or dtype != torch.bfloat16:
        yield None
        return
    from peft.helpers import disable_input_dtype_casting

    with disable_input_dtype_casting(model):  # also during the backward pass's recomputation
        yield dtype


def autocast_forward(model, dtype):
    """The autocast context of one forward under `lora_autocast` (`dtype` what it yielded; None: no autocast).
    Gradient checkpointing recomputes under the autocast state it recorded."""
    import torch

    if dtype is None:
        return nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype)


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _attention_implementation(model) -> str:
    return getattr(_base(model).config, "_attn_implementation", None) or "eager"


def _block_attention(model) -> bool:
    """Whether `model` runs `ruler_rl.trainer.attention`'s block attention (`ModelConfig.block_attention`)."""
    return _attention_implementation(model) == BLOCK_ATTENTION


def _as_blocks(model, row: Row, *, blocks: bool | None = None) -> bool:
    """Whether a row given its structure (more than one block, or forced) runs as blocks rather than with its
    4-D mask: on a block-attention model, where the copies take no more memory than the mask (`use_blocks`);
    `blocks` True / False decides instead."""
    return _block_attention(model) and (blocks if blocks is not None else use_blocks(row, _q_width(model)))


def _q_width(model) -> int:
    """The query heads' width (heads x head dim) of `model`'s attention: what a block row's key copies hold."""
    text = _base(model).config
    text = text.get_text_config() if hasattr(text, "get_text_config") else text
    heads = text.num_attention_heads
    return heads * (getattr(text, "head_dim", None) or text.hidden_size // heads)


def windowed_attention(config) -> str | None:
    """Why a 4-D mask cannot stand in for this model's own masks, or None: some layers attend within a sliding
    window or in chunks (transformers builds those masks itself; a given 4-D mask replaces them)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        return f"layer types {sorted(set(types))}"
    window = getattr(text, "sliding_window", None)
    if window and getattr(text, "use_sliding_window", True) and not types:
        return f"sliding_window {window}"
    if getattr(text, "attention_chunk_size", None):
        return f"attention_chunk_size {text.attention_chunk_size}"
    return None


def attention_takes_masks(model) -> bool:
    """Whether packed rows (a 4-D mask) are exact for `model`: SDPA and eager attention, on models without
    sliding-window or chunked layers; otherwise each sequence gets a row of its own with the model's own masks."""
    return (_attention_implementation(model) in MASKABLE_ATTENTION
            and windowed_attention(_base(model).config) is None)


def _row_loss(model, row: Row, seqs: list[TrainingSequence], config: TrainConfig, half, *, per_traj: Counter,
              n_traj: int, total_tokens: int, budget: int, full_forward: bool, masked: bool, stats: Counter) -> dict:
    """One row's forward passes (old and reference logprobs where needed, no grad; then the current ones),
    its loss and its backward pass; adds the row's stats to `stats`. `half`: `lora_autocast`'s dtype or None."""
    import torch

    device = next(model.parameters()).device
    old = torch.tensor([seqs[i].old_logprobs[k] for i, k in zip(row.sequence_of, row.token_index, strict=True)],
                       device=device, dtype=torch.float32)
    adv = torch.tensor([seqs[i].advantage for i in row.sequence_of], device=device)
    traj_tokens = torch.tensor([per_traj[seqs[i].trajectory] for i in row.sequence_of], device=device)
    ref = sampler = None
    with torch.no_grad():
        if torch.isnan(old).any() or config.sampler_correction == "tis":
            with autocast_forward(model, half):
                current = _row_logprobs(model, row, config.logprob_chunk_size, full_forward=full_forward,
                                        masked=masked)
            if config.sampler_correction == "tis":  # ratio against the trainer; sampler mismatch weighted
                sampled = torch.where(torch.isnan(old), current, old)
                sampler = torch.clamp(torch.exp(current - sampled), max=config.sampler_cap)[:, None]
                stats["sampler_weight"] += sampler.sum().item()
                stats["sampler_truncated"] += (torch.exp(current - sampled) > config.sampler_cap).sum().item()
                old = current
            else:  # no sampled logprobs: the current policy's (ratio 1)
                old = torch.where(torch.isnan(old), current, old)
        if config.kl_coef > 0:
            with model.disable_adapter(), autocast_forward(model, half):
                ref = _row_logprobs(model, row, config.logprob_chunk_size, full_forward=full_forward,
                                    masked=masked)[:, None]
    with autocast_forward(model, half):
        new = _row_logprobs(model, row, config.logprob_chunk_size, full_forward=full_forward, masked=masked)
    # each trained token as a row of one: the weights of `token_weights`, per trajectory
    ones = torch.ones(len(row.targets), 1, device=device)
    weights = token_weights(ones, config.loss, n_seqs=n_traj, total_tokens=max(1, total_tokens),
                            norm_len=budget, row_tokens=traj_tokens)
    loss, part = policy_loss(new[:, None], old[:, None], adv, weights, kind=config.loss, epsilon=config.epsilon,
                             epsilon_high=config.epsilon_high, ref_logprobs=ref, kl_coef=config.kl_coef,
                             sampler_weights=sampler)
    loss.backward()
    for key in ("clip_fraction", "kl", "ratio_mean", "ratio_dev_mean"):
        stats[key] += part[key] * part["tokens"]
    stats["tokens"] += part["tokens"]
    return {"loss": loss.item(), "ratio_dev_max": part["ratio_dev_max"]}


def accumulate_loss(model, seqs: list[TrainingSequence], config: TrainConfig, *,
                    full_forward: bool = False, masks: bool = True) -> tuple[float, dict]:
    """Pack `seqs` into rows (`ruler_rl.trainer.packing`), run each row forward and backward, and return the summed
    loss and the stats; gradients are left on the parameters (no optimizer step). `masks=False` gives every
    sequence a row of its own whatever the model takes (the backend's choice when `verify_packed_rows` failed).

    Losses normalise per trajectory (a trajectory split into several sequences still counts once): the
    `grpo` mean is over all of a trajectory's trained tokens; the batch has `n` trajectories."""
    masked = masks and attention_takes_masks(model)
    rows, packed = pack(seqs, capacity=config.max_tokens_per_micro_batch, share_prefix=config.share_prefix,
                        min_prefix=config.min_shared_prefix, maskable=masked)
    per_traj: Counter = Counter()
    for row in rows:
        for i in row.sequence_of:
            per_traj[seqs[i].trajectory] += 1
    total_tokens, n_traj = sum(per_traj.values()), len(per_traj)
    budget = config.completion_budget or max(per_traj.values(), default=1)  # dr_grpo's constant
    block_rows = sum(masked and r.needs_mask() and _as_blocks(model, r) for r in rows)
    stats: Counter = Counter()
    ratio_dev_max, loss_sum = 0.0, 0.0
    with lora_autocast(model, config.lora_autocast) as half:
        for row in rows:
            if not row.targets:
                continue
            part = _row_loss(model, row, seqs, config, half, per_traj=per_traj, n_traj=n_traj,
                             total_tokens=total_tokens, budget=budget, full_forward=full_forward, masked=masked,
                             stats=stats)
            loss_sum += part["loss"]
            ratio_dev_max = max(ratio_dev_max, part["ratio_dev_max"])
    n = max(1, stats["tokens"])
    return loss_sum, {"clip_fraction": stats["clip_fraction"] / n, "kl": stats["kl"] / n,
                      "ratio_mean": stats["ratio_mean"] / n, "ratio_dev_mean": stats["ratio_dev_mean"] / n,
                      "ratio_dev_max": ratio_dev_max, "trained_tokens": int(stats["tokens"]),
                      **({"sampler_weight_mean": stats["sampler_weight"] / n,
                          "sampler_truncated": int(stats["sampler_truncated"])}
                         if config.sampler_correction == "tis" else {}),
                      "sequence_tokens": packed.sequence_tokens, "forward_tokens": packed.forward_tokens,
                      "shared_prefix_saving": packed.saving,
                      "rows": packed.rows, "block_rows": block_rows, "shared_prefix_groups": packed.shared_groups,
                      "unshared_groups": packed.no_shared_prefix, "unmaskable_fallback": packed.unmaskable_fallback,
                      "lora_autocast": half is not None, "full_forward": full_forward}


def train_step(model, optimizer, seqs: list[TrainingSequence], config: TrainConfig, *,
               full_forward: bool = False, masks: bool = True, before_update=None) -> dict:
    """`accumulate_loss` over packed rows, clip, step. Returns the step's training stats. `before_update()`, when
    given, is called right before the optimizer changes the weights (nothing before it has: a failure earlier
    leaves them as they were)."""
    import torch

    started = time.perf_counter()
    model.train()
    optimizer.zero_grad(set_to_none=True)  # nothing a failed earlier call left behind is added to this step
    loss_sum, stats = accumulate_loss(model, seqs, config, full_forward=full_forward, masks=masks)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm).item()
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        longest = max((len(s.token_ids) for s in seqs), default=0)
        # what was already wrong in the forward pass (a non-finite loss) or only in the backward (a finite one)
        raise FloatingPointError(f"gradient norm is not finite; the step was not applied (summed loss {loss_sum:.6g}, "
                                 f"{len(seqs)} sequences, the longest {longest} tokens)")
    if before_update is not None:
        before_update()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - started
    advs = [s.advantage for s in seqs]
    return {"loss": loss_sum, "grad_norm": grad_norm, **stats,
            "advantage_mean": sum(advs) / len(advs), "advantage_abs_mean": sum(abs(a) for a in advs) / len(advs),
            "train_s": seconds, "train_tokens_per_s": stats["sequence_tokens"] / seconds}
