"""The three losses on hand-computed tensors, their gradients, and micro-batch accumulation."""

import math

import pytest
import torch

from trainer.loss import policy_loss, token_weights

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


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "dapo"])
def test_micro_batches_add_up_to_the_full_batch(kind):
    torch.manual_seed(0)
    new, old = torch.randn(6, 5) * 0.1 - 2, torch.randn(6, 5) * 0.1 - 2
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1
    adv = torch.randn(6)
    w = token_weights(mask, kind, n_seqs=6, total_tokens=int(mask.sum()), norm_len=5)
    full, _ = policy_loss(new, old, adv, w, kind=kind)
    parts = sum(policy_loss(new[i:i + 2], old[i:i + 2], adv[i:i + 2], w[i:i + 2], kind=kind)[0] for i in (0, 2, 4))
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="loss must be"):
        token_weights(MASK, "ppo", n_seqs=2, total_tokens=3)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(torch.zeros(2, 2), OLD, torch.zeros(3), MASK, kind="grpo")
    with pytest.raises(ValueError, match="shapes"):
        policy_loss(torch.zeros(2, 3), OLD, ADV, MASK, kind="grpo")
