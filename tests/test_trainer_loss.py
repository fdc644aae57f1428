"""The three losses on hand-computed tensors, their gradients, and micro-batch accumulation in a real
`train_step` on a tiny model."""

import math
import random

import pytest
import torch

from ruler_rl.trainer import packing, training
from ruler_rl.trainer.config import TrainConfig
from ruler_rl.trainer.loss import policy_loss, token_weights
from ruler_rl.trainer.sequences import TrainingSequence
from tests.helpers import tiny_lora_model

RATIOS = torch.tensor([[1.5, 0.5], [1.0, 1.1]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
ADV = torch.tensor([1.0, -1.0])
OLD = torch.zeros(2, 2)


def loss_of(kind, new=None, **kw):
    new = torch.log(RATIOS).clone().requires_grad_(True) if new is None else new
    w = token_weights(MASK, kind, n_seqs=2, total_tokens=3, norm_len=4)
    loss, stats = policy_loss(new, OLD, ADV, w, kind=kind, epsilon=0.2, epsilon_high=0.28, **kw)
    return new, loss, stats


def test_grpo_clips_at_epsilon_and_averages_tokens_then_sequences():
    # seq0 (A=+1): r=1.5 clipped to 1.2 -> -1.2; r=0.5 -> -0.5; seq1 (A=-1): r=1 -> +1; its 2nd token is masked
    new, loss, stats = loss_of("grpo")
    assert loss.item() == pytest.approx(0.25 * (-1.2 - 0.5) + 0.5 * 1.0)
    assert stats["clip_fraction"] == pytest.approx(1 / 3) and stats["tokens"] == 3
    loss.backward()
    # the clipped token gets no gradient; the unclipped one d(-r*A*w)/dlog r = -r*A*w = -0.5*0.25
    assert new.grad[0, 0].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(-0.125)
    assert new.grad[1, 1].item() == 0.0  # masked


def test_dr_grpo_has_no_length_normalisation():
    _, loss, _ = loss_of("dr_grpo")
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.0) / 4 / 2)


def test_dapo_clips_higher_and_averages_over_all_tokens():
    _, loss, stats = loss_of("dapo")
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 1.0) / 3)
    assert stats["clip_fraction"] == pytest.approx(1 / 3)


def test_kl_to_the_reference_is_the_k3_estimator():
    new = torch.log(RATIOS)
    ref = new.clone()
    ref[0, 0] += math.log(2.0)
    _, plain, _ = loss_of("grpo", new=new)
    _, with_kl, stats = loss_of("grpo", new=new, ref_logprobs=ref, kl_coef=0.1)
    k3 = 2.0 - math.log(2.0) - 1
    assert with_kl.item() - plain.item() == pytest.approx(0.1 * 0.25 * k3, rel=1e-5)
    assert stats["kl"] == pytest.approx(k3 / 3, rel=1e-5)


def micro_batch_sequences() -> list[TrainingSequence]:
    """Seven sequences of 18-30 tokens in three groups (one trajectory split in two sequences), trained
    after a 6-token prompt, with sampled logprobs near the tiny model's own (some unknown: NaN)."""
    rng = random.Random(3)
    seqs = []
    for t, (group, length, adv) in enumerate([(0, 18, 1.0), (0, 24, -1.0), (0, 30, 0.5), (1, 20, -0.5),
                                              (1, 26, 0.7), (2, 22, 0.3), (2, 19, -0.3)]):
        trained = [i >= 6 for i in range(length)]
        old = [rng.uniform(-5.5, -3.5) if k and rng.random() < 0.7 else math.nan for k in trained]
        seqs.append(TrainingSequence([rng.randrange(97) for _ in range(length)], trained, old, advantage=adv,
                                     trajectory=min(t, 5), group=group))  # sequences 5 and 6: one trajectory
    return seqs


def one_step(kind: str, max_tokens: int) -> tuple[dict, dict]:
    """`train_step` with plain SGD at lr 1 and no clipping, on a fresh tiny model: (stats, parameter change),
    the change being minus the accumulated gradient."""
    model = tiny_lora_model(seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    config = TrainConfig(loss=kind, max_tokens_per_micro_batch=max_tokens, share_prefix=False, max_grad_norm=1e9)
    stats = training.train_step(model, optimizer, micro_batch_sequences(), config)
    return stats, {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}


def test_a_non_finite_gradient_is_refused_saying_whether_the_forward_was_already_wrong():
    """Seed 2 of 2026-12-07's ART·E run met a non-finite gradient norm at step 6 with nothing to say where it came
    from: the refusal names the summed loss (non-finite: the forward pass already was) and the batch's size."""
    model = tiny_lora_model(seed=0)
    lora = next(p for n, p in model.named_parameters() if "lora_A" in n)
    with torch.no_grad():
        lora[0, 0] = float("nan")
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    seqs = micro_batch_sequences()
    with pytest.raises(FloatingPointError, match=rf"summed loss nan, {len(seqs)} sequences, the longest \d+ tokens"):
        training.train_step(model, optimizer, seqs, TrainConfig(share_prefix=False))
    after = dict(model.named_parameters())
    assert all(torch.equal(before[n], after[n].detach()) for n in before if not before[n].isnan().any())


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "dapo"])
def test_micro_batches_add_up_to_the_full_batch_in_a_real_train_step(kind):
    # 16 tokens per micro-batch: every sequence in a row (a micro-batch) of its own; 64: two or three a row;
    # 8192: the whole batch at once
    one, one_delta = one_step(kind, 16)
    few, few_delta = one_step(kind, 64)
    full, full_delta = one_step(kind, 8192)
    assert (one["rows"], full["rows"]) == (7, 1) and 1 < few["rows"] < 7
    assert one["trained_tokens"] == few["trained_tokens"] == full["trained_tokens"] == 159 - 7 * 6  # all but the prompts
    for stats, delta in ((one, one_delta), (few, few_delta)):
        assert stats["loss"] == pytest.approx(full["loss"], abs=1e-5)
        assert stats["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-4)
        assert max((delta[n] - full_delta[n]).abs().max().item() for n in full_delta) < 1e-5
    assert max(d.abs().max().item() for d in full_delta.values()) > 1e-3  # the step moved the adapter
    assert full["grad_norm"] > 1e-3


def test_a_step_says_which_logprob_path_it_trained_on_and_both_give_the_same_loss(monkeypatch):
    model = tiny_lora_model(seed=0)
    config = TrainConfig(max_tokens_per_micro_batch=8192, share_prefix=False)
    chunks = []  # the chunked path's calls: the stat must name the path that ran
    chunk_logprobs = training._chunk_logprobs
    monkeypatch.setattr(training, "_chunk_logprobs", lambda *a: chunks.append(1) or chunk_logprobs(*a))
    loss_chunked, chunked = training.accumulate_loss(model, micro_batch_sequences(), config)
    ran_chunked = len(chunks)
    model.zero_grad(set_to_none=True)
    loss_full, full = training.accumulate_loss(model, micro_batch_sequences(), config, full_forward=True)
    assert ran_chunked > 0 and len(chunks) == ran_chunked  # the full forward computed no chunk
    assert (chunked["full_forward"], full["full_forward"]) == (False, True)
    assert loss_full == pytest.approx(loss_chunked, abs=1e-5) and loss_chunked != 0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="loss must be"):
        token_weights(MASK, "ppo", n_seqs=2, total_tokens=3)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(torch.zeros(2, 2), OLD, torch.zeros(3), MASK, kind="grpo")
    with pytest.raises(ValueError, match="shapes"):
        policy_loss(torch.zeros(2, 3), OLD, ADV, MASK, kind="grpo")


def test_the_decoupled_objective_clips_against_the_proximal_policy_and_weights_by_the_truncated_behaviour_ratio():
    """Hand-computed: new/proximal ratios 1.5 (clipped to 1.2) and 0.9 (A=+1, one trajectory of two tokens,
    grpo); the proximal policy gives the tokens 3x and 0.8x the probability the stale behaviour policy gave
    them: importance weights min(3, C=2) = 2 and 0.8."""
    new = torch.log(torch.tensor([[1.5, 0.9]]))
    proximal = torch.zeros(1, 2)
    behaviour = torch.tensor([[-math.log(3.0), math.log(1.25)]])
    weights = torch.clamp(torch.exp(proximal - behaviour), max=2.0)
    w = token_weights(torch.ones(1, 2), "grpo", n_seqs=1, total_tokens=2)
    loss, _ = policy_loss(new, proximal, torch.tensor([1.0]), w, kind="grpo", epsilon=0.2, sampler_weights=weights)
    assert loss.item() == pytest.approx(0.5 * (-2.0 * 1.2 - 0.8 * 0.9))


def test_a_step_on_one_step_stale_rollouts_is_the_truncated_importance_weighted_objective():
    """Rollouts sampled by policy k (their logprobs recorded), the adapter then updated to k+1, and the batch
    trained at k+1 with sampler_correction="tis": the loss is sum_i 1/(n L_i) sum_t -min(pi_k+1/pi_k, C) A_i
    (the PPO ratio against the proximal policy k+1 is 1 before the update), and the gradients are those of
    that objective computed by hand from the model's own full forward."""
    model = tiny_lora_model(seed=0)
    seqs = micro_batch_sequences()

    def logprobs(seq, *, grad=False, full=False):
        rows, _ = packing.pack([seq], capacity=10_000)
        with torch.set_grad_enabled(grad):
            return training._row_logprobs(model, rows[0], 64, full_forward=full, masked=True)

    model.eval()
    sampled = [logprobs(s).tolist() for s in seqs]  # what policy k sampled the tokens with
    stale = []
    for s, lps in zip(seqs, sampled):
        old = [math.nan] * len(s.token_ids)
        for j, k in enumerate(k for k in range(1, len(s.token_ids)) if s.trained[k]):
            old[k] = lps[j]
        stale.append(TrainingSequence(s.token_ids, s.trained, old, advantage=s.advantage, trajectory=s.trajectory,
                                      group=s.group))
    # policy k -> k+1: a step on other data moves the adapter
    sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=2.0)
    training.train_step(model, sgd, micro_batch_sequences(), TrainConfig(share_prefix=False, max_grad_norm=1e9))
    cap = 1.01
    tokens: dict[int, int] = {}
    for s in seqs:
        tokens[s.trajectory] = tokens.get(s.trajectory, 0) + sum(s.trained[1:])
    n = len(tokens)
    # by hand: the proximal policy's logprobs from the full forward, the truncated weights, the objective
    model.zero_grad(set_to_none=True)
    expected, truncated, moved = 0.0, 0, 0.0
    for s, lps in zip(seqs, sampled):
        current = logprobs(s, grad=True, full=True)
        ratio_to_sampler = torch.exp(current.detach() - torch.tensor(lps))
        w = torch.clamp(ratio_to_sampler, max=cap)
        truncated += int((ratio_to_sampler > cap).sum())
        moved = max(moved, float((ratio_to_sampler - 1).abs().max()))
        coeff = -w * s.advantage / (tokens[s.trajectory] * n)
        term = (coeff * torch.exp(current - current.detach())).sum()  # value sum(coeff); gradient the PPO term's
        term.backward()
        expected += term.item()
    hand_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    config = TrainConfig(loss="grpo", share_prefix=False, max_off_policy_steps=1, sampler_correction="tis",
                         sampler_cap=cap)
    model.train()
    loss, stats = training.accumulate_loss(model, stale, config)
    assert moved > 1e-3 and truncated > 0  # the step moved the policy; some weights hit the cap
    assert loss == pytest.approx(expected, abs=1e-5)
    assert stats["sampler_truncated"] == truncated and stats["ratio_dev_max"] < 1e-4
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.allclose(p.grad, hand_grads[name], atol=1e-6, rtol=1e-4), name
    # without the correction the stale logprobs would be the old policy: a different objective
    model.zero_grad(set_to_none=True)
    plain, _ = training.accumulate_loss(model, stale, TrainConfig(loss="grpo", share_prefix=False))
    assert plain != pytest.approx(loss, abs=1e-4)
