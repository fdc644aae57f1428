"""Block attention (`ruler_rl.trainer.attention`): packed rows run as one SDPA call per block give the loss and LoRA
gradients of every sequence run alone (fp32, tiny random Llama and Qwen2, with and without checkpointing) while
no [T x T] mask is built; a row whose prefix copies would outgrow its mask keeps the mask; the model's own
forwards (padding masks, generation) are transformers' SDPA unchanged; a broken block layout is caught by the
register-time packed-row check."""

import random

import pydantic
import pytest
import torch

from ruler_rl.trainer import attention, training
from ruler_rl.trainer.config import ModelConfig, TrainConfig
from ruler_rl.trainer.packing import Row, pack
from ruler_rl.trainer.sequences import TrainingSequence
from tests.helpers import tiny_lora_model
from tests.test_trainer_packing import batch, coinciding_turns, loss_and_grads, no_mask_reference, tiny


def blocks_model(config_class=None, **extra):
    if config_class is None:
        model = tiny_lora_model()
    else:
        model = tiny(config_class, attn_implementation="sdpa", **extra)
    assert attention.enable(model)
    assert training._attention_implementation(model) == attention.BLOCK_ATTENTION
    return model


def no_mask_built(monkeypatch):
    def refuse(self):
        raise AssertionError("a 4-D mask was built for a block row")
    monkeypatch.setattr(Row, "attention_mask", refuse)


def spy_blocks(monkeypatch) -> list:
    """Count the attention calls that got blocks (the registered function is looked up by name per forward)."""
    from transformers import AttentionInterface

    seen = []
    real = attention._attention_forward

    def spy(*args, ruler_blocks=None, **kwargs):
        if ruler_blocks is not None:
            assert args[4] is None, "transformers built a mask for a block row"  # (module, q, k, v, mask)
            seen.append(ruler_blocks)
        return real(*args, ruler_blocks=ruler_blocks, **kwargs)

    AttentionInterface.register(attention.BLOCK_ATTENTION, spy)
    monkeypatch.setattr(attention, "_attention_forward", spy)
    return seen


@pytest.fixture(autouse=True)
def registered_again():
    yield
    attention.register()  # a spy registered by a test is replaced by the real function


@pytest.mark.parametrize("which,checkpointing", [("llama", False), ("llama", True), ("qwen2", False)])
def test_block_rows_give_the_one_by_one_loss_and_gradients_without_a_mask(which, checkpointing, monkeypatch):
    from transformers import Qwen2Config

    model = blocks_model() if which == "llama" else blocks_model(Qwen2Config)
    seqs = batch() + [TrainingSequence(s.token_ids, s.trained, s.old_logprobs, advantage=s.advantage,
                                       trajectory=9 + s.trajectory, group=4) for s in coinciding_turns(random.Random(5))]
    reference = no_mask_reference(model, seqs, monkeypatch, TrainConfig(max_tokens_per_micro_batch=16))
    base = model.get_base_model()
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        with monkeypatch.context() as m:
            no_mask_built(m)
            seen = spy_blocks(m)
            loss, grads, stats = loss_and_grads(model, seqs, TrainConfig(max_tokens_per_micro_batch=4096,
                                                                         min_shared_prefix=8))
    finally:
        base.gradient_checkpointing_disable()
    assert stats["rows"] == stats["block_rows"] == 1 and stats["forward_tokens"] < stats["sequence_tokens"]
    layers = base.config.num_hidden_layers
    # every layer got the row's blocks: in the no-grad pass for the logprobs the batch lacks, the training pass
    # and, when checkpointing, its recomputation; suffixes among them
    assert len(seen) == layers * (3 if checkpointing else 2) and all(s == seen[0] for s in seen)
    assert any(p_start >= 0 for _, _, p_start, _ in seen[0]) and sum(p < 0 for _, _, p, _ in seen[0]) > 1
    assert loss == pytest.approx(reference[0], abs=1e-5)
    assert max((reference[1][n] - grads[n]).abs().max().item() for n in grads) < 1e-5
    assert any(g.abs().max().item() > 1e-4 for g in grads.values())


def test_spans_name_each_blocks_tokens_and_its_parents():
    row = Row()
    a = row.add_block([1, 2, 3], 0)
    row.add_block([4, 5], 3, a)
    row.add_block([6], 3, a)
    row.add_block([7, 8, 9, 10], 0)
    assert row.spans() == [(0, 3, -1, -1), (3, 5, 0, 3), (5, 6, 0, 3), (6, 10, -1, -1)]
    assert row.block_copy_tokens() == 6


def test_a_row_whose_copies_outgrow_its_mask_keeps_the_mask(monkeypatch):
    model = blocks_model()
    rng = random.Random(3)
    prefix = [rng.randrange(97) for _ in range(60)]
    # eight one-token suffixes of a 60-token prefix: 8 x 60 copied tokens x 2 x width 32 > 68 x 68 mask cells
    seqs = [TrainingSequence(prefix + [rng.randrange(97)], [False] * 60 + [True], [-1.0] * 61, advantage=1.0,
                             trajectory=i, group=0) for i in range(8)]
    rows, _ = pack(seqs, capacity=4096, min_prefix=8)
    assert len(rows) == 1 and not attention.use_blocks(rows[0], training._q_width(model))
    built = []
    real = Row.attention_mask
    monkeypatch.setattr(Row, "attention_mask", lambda self: built.append(1) or real(self))
    reference = no_mask_reference(model, seqs, monkeypatch, TrainConfig(max_tokens_per_micro_batch=70))
    loss, grads, stats = loss_and_grads(model, seqs, TrainConfig(max_tokens_per_micro_batch=4096,
                                                                 min_shared_prefix=8))
    assert built and stats["block_rows"] == 0 and loss == pytest.approx(reference[0], abs=1e-5)
    assert max((reference[1][n] - grads[n]).abs().max().item() for n in grads) < 1e-5


def test_use_blocks_checks_its_width():
    row = Row()
    row.add_block([1, 2], 0)
    with pytest.raises(ValueError, match="q_width"):
        attention.use_blocks(row, 0)
    with pytest.raises(ValueError, match="q_width"):
        attention.use_blocks(row, True)


def test_the_models_own_forwards_stay_transformers_sdpa():
    plain = tiny_lora_model()
    switched = tiny_lora_model()
    assert attention.enable(switched)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 11, 12, 13, 14]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])  # left padding: the padding mask must apply
    with torch.no_grad():
        a = plain(input_ids=ids, attention_mask=mask).logits
        b = switched(input_ids=ids, attention_mask=mask).logits
        gen_a = plain.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
        gen_b = switched.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    assert torch.allclose(a[mask.bool()], b[mask.bool()], atol=1e-6)
    assert torch.equal(gen_a, gen_b)


def test_eager_models_are_left_as_they_are():
    from transformers import LlamaConfig

    eager = tiny(LlamaConfig, attn_implementation="eager")
    assert not attention.enable(eager)
    assert training._attention_implementation(eager) == "eager"


def test_the_packed_row_check_passes_blocks_and_catches_a_broken_layout(monkeypatch):
    model = blocks_model()
    seen = spy_blocks(monkeypatch)
    assert training.verify_packed_rows(model) < 1e-5
    assert seen and any(p >= 0 for _, _, p, _ in seen[0])  # the check ran the block path, suffixes included
    real = Row.spans
    monkeypatch.setattr(Row, "spans", lambda self: [(s, e, -1, -1) for s, e, *_ in real(self)])  # prefixes lost
    assert training.verify_packed_rows(model) > 1e-2


def test_a_layer_that_loses_the_blocks_is_an_error_not_a_wrong_attention(monkeypatch):
    from transformers import AttentionInterface

    model = blocks_model()
    real = attention._attention_forward
    AttentionInterface.register(attention.BLOCK_ATTENTION,
                                lambda *a, ruler_blocks=None, **k: real(*a, **k))  # drops the kwarg
    seqs = batch()
    with pytest.raises(RuntimeError, match="without the row's blocks"):
        loss_and_grads(model, seqs, TrainConfig(max_tokens_per_micro_batch=4096, min_shared_prefix=20))
    attention.register()
    # and the context is left as it was: a plain padded forward in this thread gets its padding mask again
    plain = tiny_lora_model()
    ids = torch.tensor([[0, 0, 11, 12, 13, 14]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        a, b = (m(input_ids=ids, attention_mask=mask).logits[0, 2:] for m in (plain, model))
    assert torch.allclose(a, b, atol=1e-6)


def test_arguments_the_blocks_would_ignore_are_refused():
    model = blocks_model()
    layer = model.get_base_model().model.layers[0].self_attn
    q = torch.zeros(1, 4, 3, 8)
    kv = torch.zeros(1, 2, 3, 8)
    for extra, name in (({"softcap": 30.0}, "softcap"), ({"sliding_window": 4}, "sliding_window")):
        with pytest.raises(ValueError, match=name):
            attention._attention_forward(layer, q, kv, kv, None, ruler_blocks=[(0, 3, -1, -1)], **extra)
    with pytest.raises(ValueError, match="attention_mask"):
        attention._attention_forward(layer, q, kv, kv, torch.ones(1, 1, 3, 3, dtype=torch.bool),
                                     ruler_blocks=[(0, 3, -1, -1)])


def test_the_register_check_also_runs_the_mask_path_on_a_block_model(monkeypatch):
    model = blocks_model()
    assert training.verify_packed_rows(model) < 1e-5
    real = Row.attention_mask
    monkeypatch.setattr(Row, "attention_mask", lambda self: real(self) | True)  # a mask that hides nothing
    assert training.verify_packed_rows(model) > 1e-2


def test_block_attention_is_on_by_default_and_the_switch_is_validated():
    assert ModelConfig().block_attention is True
    assert ModelConfig(block_attention=False).block_attention is False
    with pytest.raises(pydantic.ValidationError, match="block_attention"):
        ModelConfig(block_attention="maybe")
