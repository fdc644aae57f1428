"""Packed rows with shared prefixes give the loss and LoRA gradients of running every sequence alone (fp32,
a tiny random Llama): long, short and no shared prefix, multi-turn trajectories (coinciding early turns
shared), an early outlier, mixed group sizes, every loss, split rows, small logprob chunks, checkpointing,
eager attention (against the model's own unmasked forward); sliding-window models fall back to their own masks;
the fallbacks are taken and counted where they must be."""

import math
import random

import pytest
import torch

from ruler_rl.trainer import training
from ruler_rl.trainer.config import TrainConfig
from ruler_rl.trainer.packing import common_prefix, pack
from ruler_rl.trainer.sequences import TrainingSequence
from tests.helpers import tiny_lora_model


@pytest.fixture(scope="module")
def model():
    return tiny_lora_model()


def seq(tokens, trained_from, *, gaps=(), group, trajectory, advantage, rng):
    trained = [i >= trained_from and i not in gaps for i in range(len(tokens))]
    old = [rng.uniform(-4, -0.5) if t and rng.random() < 0.7 else math.nan for t in trained]
    return TrainingSequence(tokens, trained, old, advantage=advantage, trajectory=trajectory, group=group)


def batch():
    rng = random.Random(1)
    def tok(n):
        return [rng.randrange(97) for _ in range(n)]

    long_prefix, short_prefix = tok(40), tok(6)
    seqs = []
    # group 0: a 40-token shared prompt, three answers; one is multi-turn (a gap of untrained tool output)
    for t, n in enumerate((5, 9, 13)):
        seqs.append(seq(long_prefix + tok(n), 40, gaps={44, 45, 46} if n == 13 else (), group=0, trajectory=t,
                        advantage=(-1.0, 0.2, 0.8)[t], rng=rng))
    # group 1: a prefix too short to share
    for t, n in enumerate((7, 4)):
        seqs.append(seq(short_prefix + tok(n), 6, group=1, trajectory=3 + t, advantage=(1.0, -1.0)[t], rng=rng))
    # group 2: one trajectory whose history was edited: two sequences, same trajectory; a second trajectory
    first = tok(30)
    seqs.append(seq(first + tok(6), 30, group=2, trajectory=5, advantage=0.5, rng=rng))
    seqs.append(seq(tok(20), 12, group=2, trajectory=5, advantage=0.5, rng=rng))
    seqs.append(seq(first + tok(8), 30, group=2, trajectory=6, advantage=-0.5, rng=rng))
    # group 3: no common prefix at all
    seqs.append(seq(tok(15), 5, group=3, trajectory=7, advantage=0.3, rng=rng))
    seqs.append(seq(tok(11), 3, group=3, trajectory=8, advantage=-0.3, rng=rng))
    return seqs


def loss_and_grads(model, seqs, config):
    model.zero_grad(set_to_none=True)
    loss, stats = training.accumulate_loss(model, seqs, config)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss, grads, stats


@pytest.mark.parametrize("kind,kl", [("grpo", 0.0), ("dr_grpo", 0.0), ("dapo", 0.0), ("grpo", 0.1)])
def test_shared_prefixes_and_packing_give_the_one_by_one_loss_and_gradients(model, kind, kl):
    seqs = batch()
    alone = TrainConfig(loss=kind, kl_coef=kl, max_tokens_per_micro_batch=16, share_prefix=False)  # a row each
    packed = TrainConfig(loss=kind, kl_coef=kl, max_tokens_per_micro_batch=4096, min_shared_prefix=20)
    loss_a, grads_a, stats_a = loss_and_grads(model, seqs, alone)
    loss_b, grads_b, stats_b = loss_and_grads(model, seqs, packed)
    assert stats_a["rows"] == len(seqs) and stats_a["forward_tokens"] == stats_a["sequence_tokens"]
    assert stats_b["rows"] == 1 and stats_b["shared_prefix_groups"] == 2 and stats_b["unshared_groups"] == 2
    # group 0 saves 2 x 40 tokens, group 2 saves 30 (its two first-turn sequences share 30 tokens)
    assert stats_b["sequence_tokens"] - stats_b["forward_tokens"] == 2 * 40 + 30
    assert stats_a["trained_tokens"] == stats_b["trained_tokens"] > 0
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) < 1e-5
    assert any(g.abs().max().item() > 1e-4 for g in grads_a.values())  # the comparison is not of zeros


def test_rows_respect_the_token_budget_and_split_big_groups(model):
    seqs = batch()
    rows, report = pack(seqs, capacity=60, min_prefix=20)
    assert all(len(r) <= 60 for r in rows)
    trained = sorted((i, k) for r in rows for i, k in zip(r.sequence_of, r.token_index))
    assert trained == sorted((i, k) for i, s in enumerate(seqs) for k in range(1, len(s.token_ids)) if s.trained[k])
    # group 0's tree (40 + 13 + 9 + 5 tokens) is over 60: split in two trees, each with the prefix; so
    # the rows hold 8 blocks without a parent: 5 unshared sequences, group 2's prefix, group 0's prefix twice
    assert sum(r.parents.count(-1) for r in rows) == 8 and report.shared_groups == 2
    with pytest.raises(ValueError):
        pack(seqs, capacity=0)


def test_the_fallbacks_are_taken_and_counted(model, monkeypatch):
    seqs = batch()
    # an attention implementation that takes no mask: a row per sequence, the same loss
    loss_a, grads_a, _ = loss_and_grads(model, seqs, TrainConfig(max_tokens_per_micro_batch=16, share_prefix=False))
    monkeypatch.setattr(training, "attention_takes_masks", lambda m: False)
    loss_b, grads_b, stats = loss_and_grads(model, seqs, TrainConfig())
    assert stats["unmaskable_fallback"] == len(seqs) and stats["rows"] == len(seqs)
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) < 1e-5
    # a prefix below the minimum is not shared, and counted
    _, report = pack(seqs, capacity=4096, min_prefix=41)
    assert report.shared_groups == 0 and report.no_shared_prefix == 4
    # the shared prefix runs through trained tokens too (coinciding turns are shared)
    a = TrainingSequence([1, 2, 3, 4], [False, False, True, True], [math.nan] * 4)
    b = TrainingSequence([1, 2, 3, 5], [False, False, False, True], [math.nan] * 4)
    assert common_prefix([a, b]) == 3


@pytest.mark.parametrize("budget", [50, None])
def test_dr_grpo_divides_each_trajectorys_token_sum_by_the_completion_budget(model, budget):
    """At ratio 1 (no sampled logprobs), dr_grpo's loss is -sum_i A_i * tokens_i / (budget * n)."""
    seqs = [TrainingSequence(s.token_ids, s.trained, [math.nan] * len(s.token_ids), advantage=s.advantage,
                             trajectory=s.trajectory, group=s.group) for s in batch()]
    tokens: dict[int, int] = {}
    for s in seqs:
        tokens[s.trajectory] = tokens.get(s.trajectory, 0) + sum(s.trained[1:])
    adv = {s.trajectory: s.advantage for s in seqs}
    constant = budget or max(tokens.values())  # None: the longest trajectory's trained tokens
    expected = -sum(adv[t] * n for t, n in tokens.items()) / (constant * len(tokens))
    loss, _, _ = loss_and_grads(model, seqs, TrainConfig(loss="dr_grpo", completion_budget=budget))
    assert loss == pytest.approx(expected, abs=1e-6)


def test_truncated_importance_sampling_weights_the_policy_term_by_the_sampler_mismatch(model):
    """With sampler_correction="tis" and no update yet, the PPO ratio is 1 against the trainer's own logprobs
    and each token's term is -A * min(exp(trainer - sampler), cap): a hand computation (dapo: one mean)."""
    seqs = batch()
    currents = []
    with torch.no_grad():
        for s in seqs:
            rows, _ = pack([s], capacity=10_000)
            currents.append(training._row_logprobs(model, rows[0], 64, full_forward=False, masked=True))
    shifted, expected, n, truncated = [], 0.0, 0, 0
    for s, cur in zip(seqs, currents):
        old = [math.nan] * len(s.token_ids)
        for j, k in enumerate(k for k in range(1, len(s.token_ids)) if s.trained[k]):
            delta = (-1.0, 0.5)[j % 2]  # the sampler gave these tokens exp(1)x less / exp(0.5)x more mass
            old[k] = float(cur[j]) + delta
            expected += -s.advantage * min(math.exp(-delta), 2.0)
            n += 1
            truncated += math.exp(-delta) > 2.0
        shifted.append(TrainingSequence(s.token_ids, s.trained, old, advantage=s.advantage,
                                        trajectory=s.trajectory, group=s.group))
    loss, _, stats = loss_and_grads(model, shifted, TrainConfig(loss="dapo", sampler_correction="tis", sampler_cap=2.0))
    assert loss == pytest.approx(expected / n, abs=1e-5)
    assert stats["sampler_truncated"] == truncated > 0
    assert stats["ratio_dev_max"] < 1e-4  # the PPO ratio is taken against the trainer itself
    plain, _, _ = loss_and_grads(model, shifted, TrainConfig(loss="dapo"))
    assert plain != pytest.approx(loss, abs=1e-3)  # without the correction the sampled logprobs are the old policy


def coinciding_turns(rng):
    """A group whose trajectories share their prompt AND a first assistant turn and tool result (trained tokens
    in the common prefix), then diverge; one trajectory repeats another exactly (an empty suffix); one more
    diverges right after the prompt (an outlier that would shrink the whole group's common prefix)."""
    def tok(n):
        return [rng.randrange(97) for _ in range(n)]

    prompt, turn, tool = tok(12), tok(8), tok(10)
    first = prompt + turn + tool  # 30 tokens: 12 untrained, 8 trained, 10 untrained
    trained_first = [False] * 12 + [True] * 8 + [False] * 10
    seqs = []
    for t, n in enumerate((6, 9, 9)):
        ending = tok(n) if t < 2 else seqs[1].token_ids[30:]  # trajectory 2 = trajectory 1, token for token
        tokens = first + ending
        trained = trained_first + [True] * n
        old = [rng.uniform(-4, -0.5) if f and rng.random() < 0.7 else math.nan for f in trained]
        seqs.append(TrainingSequence(tokens, trained, old, advantage=(-1.0, 0.4, 0.6)[t], trajectory=t, group=0))
    outlier = prompt + tok(14)
    seqs.append(TrainingSequence(outlier, [False] * 12 + [True] * 14, [math.nan] * 26, advantage=0.7, trajectory=3,
                                 group=0))
    return seqs


def test_coinciding_early_turns_are_shared_and_an_outlier_does_not_shrink_the_group(model):
    seqs = coinciding_turns(random.Random(3))
    rows, report = pack(seqs, capacity=4096, min_prefix=8)
    # the three that coincide share all 30 tokens of prompt, turn and tool result (2 x 30 saved), the outlier
    # runs alone: better than the prompt's 12 shared by all four (3 x 12) or trajectories 1 and 2 alone sharing
    # their 39 identical tokens (1 x 39; one level of sharing, no nested prefixes)
    assert report.shared_groups == 1 and report.rows == 1
    assert report.sequence_tokens - report.forward_tokens == 2 * 30 > max(3 * 12, 39)
    assert report.saving == pytest.approx(1 - report.forward_tokens / report.sequence_tokens)
    trained = sorted((i, k) for r in rows for i, k in zip(r.sequence_of, r.token_index))
    assert trained == sorted((i, k) for i, s in enumerate(seqs) for k in range(1, len(s.token_ids)) if s.trained[k])
    for kind in ("grpo", "dr_grpo", "dapo"):
        alone = TrainConfig(loss=kind, max_tokens_per_micro_batch=16, share_prefix=False)
        shared = TrainConfig(loss=kind, max_tokens_per_micro_batch=4096, min_shared_prefix=8)
        loss_a, grads_a, _ = loss_and_grads(model, seqs, alone)
        loss_b, grads_b, stats = loss_and_grads(model, seqs, shared)
        assert stats["forward_tokens"] == report.forward_tokens and stats["shared_prefix_saving"] == report.saving
        assert loss_b == pytest.approx(loss_a, abs=1e-5)
        assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) < 1e-5


@pytest.mark.parametrize("budget,chunk,checkpointing", [(60, 3, False), (4096, 5, True)])
def test_split_rows_small_logprob_chunks_and_checkpointing_keep_the_one_by_one_result(model, budget, chunk,
                                                                                       checkpointing):
    seqs = batch() + [TrainingSequence(s.token_ids, s.trained, s.old_logprobs, advantage=s.advantage,
                                       trajectory=9 + s.trajectory, group=4) for s in coinciding_turns(random.Random(5))]
    base = model.get_base_model()
    loss_a, grads_a, _ = loss_and_grads(model, seqs, TrainConfig(max_tokens_per_micro_batch=16, share_prefix=False))
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        loss_b, grads_b, stats = loss_and_grads(model, seqs, TrainConfig(
            max_tokens_per_micro_batch=budget, logprob_chunk_size=chunk, min_shared_prefix=8))
    finally:
        base.gradient_checkpointing_disable()
    assert stats["rows"] > (1 if budget == 60 else 0) and stats["forward_tokens"] < stats["sequence_tokens"]
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) < 1e-5


def tiny(config_class, **extra):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    cfg = config_class(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=512, **extra)
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_config(cfg).float()
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    return peft


def no_mask_reference(model, seqs, monkeypatch, config):
    """The loss and gradients with no 4-D mask at all: one sequence per row, the model's own masks."""
    with monkeypatch.context() as m:
        m.setattr(training, "attention_takes_masks", lambda _: False)
        return loss_and_grads(model, seqs, config)


def test_eager_attention_gets_an_additive_mask_and_matches_the_models_own_forward(monkeypatch):
    from transformers import LlamaConfig

    eager = tiny(LlamaConfig, attn_implementation="eager")
    assert training.attention_takes_masks(eager)
    assert training.verify_logprob_path(eager) < 1e-5  # against the model's own forward, no mask
    seqs = batch()
    loss_a, grads_a, _ = no_mask_reference(eager, seqs, monkeypatch, TrainConfig())
    loss_b, grads_b, stats = loss_and_grads(eager, seqs, TrainConfig(min_shared_prefix=20))
    assert stats["rows"] == 1 and stats["shared_prefix_groups"] == 2 and stats["unmaskable_fallback"] == 0
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) < 1e-5


def test_sliding_window_models_fall_back_to_their_own_masks_and_it_is_counted(monkeypatch):
    from transformers import LlamaConfig, Qwen2Config

    windowed = tiny(Qwen2Config, attn_implementation="sdpa", use_sliding_window=True, sliding_window=8,
                    max_window_layers=0)
    assert training.windowed_attention(windowed.get_base_model().config) == "layer types ['sliding_attention']"
    assert not training.attention_takes_masks(windowed)
    seqs = batch()
    # a 4-D mask would let every token see past the 8-token window: the logprobs differ from the model's own
    row = pack(seqs[:1], capacity=4096)[0][0]
    inputs = {"input_ids": torch.tensor([row.token_ids]), "position_ids": torch.tensor([row.position_ids])}
    with torch.no_grad():
        forced = windowed(**inputs, attention_mask=row.attention_mask()[None, None]).logits
        own = windowed(**inputs).logits
    assert (forced - own).abs().max().item() > 1e-3
    loss_a, grads_a, _ = no_mask_reference(windowed, seqs, monkeypatch, TrainConfig())
    loss_b, grads_b, stats = loss_and_grads(windowed, seqs, TrainConfig(min_shared_prefix=20))
    assert stats["unmaskable_fallback"] == len(seqs) and stats["rows"] == len(seqs)
    assert stats["forward_tokens"] == stats["sequence_tokens"] and stats["shared_prefix_saving"] == 0
    assert loss_b == pytest.approx(loss_a, abs=1e-6)
    assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) < 1e-6
    # the decision on other configs: Qwen2 with its window off and Llama take masks; flash attention does not
    plain_qwen = Qwen2Config(num_hidden_layers=2)
    assert training.windowed_attention(plain_qwen) is None
    assert training.windowed_attention(LlamaConfig(num_hidden_layers=2)) is None

    class Holder:
        def __init__(self, config):
            self.config = config

    flash = LlamaConfig(num_hidden_layers=2)
    flash._attn_implementation = "flash_attention_2"
    assert not training.attention_takes_masks(Holder(flash))
    sdpa = LlamaConfig(num_hidden_layers=2)
    sdpa._attn_implementation = "sdpa"
    assert training.attention_takes_masks(Holder(sdpa))


def test_pack_refuses_a_minimum_prefix_below_one_token():
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="min_prefix"):
            pack(batch(), capacity=100, min_prefix=bad)


def test_the_packed_row_check_catches_a_broken_mask_and_training_can_do_without_masks(model, monkeypatch):
    """`verify_packed_rows` compares a row with a shared prefix against each sequence's own unmasked forward:
    ~0 on the tiny model, large when the mask lets suffixes see each other; `masks=False` then trains one
    sequence per row (counted) with the one-by-one result."""
    from ruler_rl.trainer.packing import Row

    assert training.verify_packed_rows(model) < 1e-5
    real = Row.attention_mask

    def leaky(row):  # plain causal over the whole row: every suffix sees the suffixes before it
        mask = real(row)
        return torch.ones_like(mask).tril()

    with monkeypatch.context() as m:
        m.setattr(Row, "attention_mask", leaky)
        assert training.verify_packed_rows(model) > 1e-3
    seqs = batch()
    loss_a, grads_a, _ = loss_and_grads(model, seqs, TrainConfig(max_tokens_per_micro_batch=16, share_prefix=False))
    model.zero_grad(set_to_none=True)
    loss_b, stats = training.accumulate_loss(model, seqs, TrainConfig(min_shared_prefix=20), masks=False)
    grads_b = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert stats["unmaskable_fallback"] == len(seqs) and stats["shared_prefix_groups"] == 0
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) < 1e-5


def test_identical_and_nested_sequences_share_with_empty_suffixes(model):
    """Two identical trajectories (the whole sequence shared: both suffix blocks empty), and with them one that is
    a strict prefix of theirs (the shared prefix is all of it: its suffix block empty); every trained token is
    still read once per sequence, with the one-by-one loss and gradients."""
    rng = random.Random(7)
    tokens = [rng.randrange(97) for _ in range(40)]
    twins = [TrainingSequence(list(tokens), [False] * 10 + [True] * 30, [math.nan] * 40, advantage=a, trajectory=t,
                              group=0) for t, a in enumerate((0.5, -0.5))]
    nested = TrainingSequence(tokens[:25], [False] * 10 + [True] * 15, [math.nan] * 25, advantage=0.9, trajectory=2,
                              group=0)
    # (sequences, forward tokens): the twins once; with the nested one, 25 shared by three (2 x 25 saved) beats
    # the twins' 40 shared by two
    for seqs, forward in ((twins, 40), (twins + [nested], 25 + 15 + 15)):
        _, report = pack(seqs, capacity=4096, min_prefix=8)
        assert report.forward_tokens == forward and report.shared_groups == 1 and report.rows == 1
        loss_a, grads_a, _ = loss_and_grads(model, seqs, TrainConfig(max_tokens_per_micro_batch=16,
                                                                     share_prefix=False))
        loss_b, grads_b, stats = loss_and_grads(model, seqs, TrainConfig(min_shared_prefix=8))
        assert stats["forward_tokens"] == forward and stats["trained_tokens"] == sum(sum(q.trained) for q in seqs)
        assert loss_b == pytest.approx(loss_a, abs=1e-5)
        assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) < 1e-5


def test_a_shared_unit_split_into_single_sequences_shares_nothing_and_is_not_counted():
    rng = random.Random(9)
    head = [rng.randrange(97) for _ in range(30)]
    seqs = [TrainingSequence(head + [rng.randrange(97) for _ in range(20)], [False] * 30 + [True] * 20,
                             [math.nan] * 50, group=0) for _ in range(3)]
    _, report = pack(seqs, capacity=60, min_prefix=8)  # 30 + 20 + 20 > 60: one sequence per part
    assert report.shared_groups == 0 and report.no_shared_prefix == 1
    assert report.forward_tokens == report.sequence_tokens == 150
    _, roomy = pack(seqs, capacity=70, min_prefix=8)  # 30 + 2 x 20 fits: two share, the third alone
    assert roomy.shared_groups == 1 and roomy.forward_tokens == 150 - 30


def test_a_row_of_one_sequence_gets_no_mask_and_packed_rows_keep_theirs(model, monkeypatch):
    """One-sequence rows run on the model's own causal mask (SDPA's causal kernels); rows with several blocks
    build their 4-D mask; both give the reference loss and gradients."""
    from ruler_rl.trainer.packing import Row

    built = {}  # row -> its blocks, for each row whose mask was built (a row runs up to three times)
    original = Row.attention_mask

    def spy(self):
        built[id(self)] = len(self.parents)
        return original(self)

    monkeypatch.setattr(Row, "attention_mask", spy)
    seqs = batch()
    loss_a, grads_a, _ = no_mask_reference(model, seqs, monkeypatch, TrainConfig())
    assert built == {}  # the reference: every sequence alone, and never a mask
    longest = max(len(s.token_ids) for s in seqs)
    loss_b, grads_b, stats = loss_and_grads(model, seqs, TrainConfig(max_tokens_per_micro_batch=longest,
                                                                     share_prefix=False))
    assert stats["rows"] > 1
    packed_rows = len(built)
    assert 0 < packed_rows < stats["rows"]  # rows holding one sequence built no mask; the others did
    assert all(blocks > 1 for blocks in built.values())
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    assert max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a) < 1e-5
    row = pack([seqs[0]], capacity=len(seqs[0].token_ids))[0][0]
    assert not row.needs_mask()


def test_the_register_check_still_runs_the_mask_path_on_a_one_sequence_row(model, monkeypatch):
    """`verify_logprob_path` forces the 4-D mask that training leaves off one-sequence rows: a broken mask (here
    every token sees every other) is caught."""
    from ruler_rl.trainer.packing import Row

    assert training.verify_logprob_path(model) < 1e-5
    monkeypatch.setattr(Row, "attention_mask", lambda self: torch.ones(len(self), len(self), dtype=torch.bool))
    assert training.verify_logprob_path(model) > 1e-3
