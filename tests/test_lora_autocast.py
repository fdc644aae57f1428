"""`TrainConfig.lora_autocast` on the CPU (torch's CPU autocast, bf16): the adapters get the model's bf16
activations instead of float32 copies, their weights and gradients stay float32, the loss and gradients agree
with peft's float32 path to bf16 precision, peft's casting is back on afterwards, a float32 model is
unchanged, and the default (None) is on for a bfloat16 model only."""

import pytest
import torch

from ruler_rl.trainer import training
from ruler_rl.trainer.config import TrainConfig
from tests.helpers import tiny_lora_model
from tests.test_trainer_packing import batch


def bf16_model():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      attn_implementation="sdpa")
    base = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    return model


def run(model, config):
    seen = []
    hooks = [m.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
             for name, m in model.named_modules() if name.endswith("lora_A.default")]
    try:
        model.zero_grad(set_to_none=True)
        loss, stats = training.accumulate_loss(model, batch(), config)
    finally:
        for h in hooks:
            h.remove()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert stats["lora_autocast"] == (bool(seen) and set(seen) == {torch.bfloat16})  # the stat says what ran
    return loss, grads, seen


@pytest.mark.parametrize("checkpointing,extra", [(False, {}),
                                                  (True, {"kl_coef": 0.1, "sampler_correction": "tis"})])
def test_autocast_feeds_the_adapters_bf16_and_keeps_their_weights_and_gradients_float32(checkpointing, extra):
    model = bf16_model()
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)  # peft upcasts
    if checkpointing:  # the recomputation in the backward pass must see the bf16 inputs too
        model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.get_base_model().enable_input_require_grads()
    loss_a, grads_a, seen_a = run(model, TrainConfig(max_tokens_per_micro_batch=4096, lora_autocast=False, **extra))
    loss_b, grads_b, seen_b = run(model, TrainConfig(max_tokens_per_micro_batch=4096, lora_autocast=True, **extra))
    assert seen_a and set(seen_a) == {torch.float32}  # peft's default: each adapted input copied to float32
    assert seen_b and set(seen_b) == {torch.bfloat16}  # autocast: the activations as they are
    assert all(g.dtype == torch.float32 for g in grads_b.values())
    assert loss_b == pytest.approx(loss_a, abs=2e-2) and loss_a != 0
    for name in grads_a:  # the same direction to bf16 precision
        a, b = grads_a[name].flatten(), grads_b[name].flatten()
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.98, name
    # peft's casting is back afterwards: a plain bf16 forward outside autocast still runs
    assert all(getattr(m, "cast_input_dtype_enabled", True) for m in model.modules())
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3]]))


def test_a_float32_model_is_unchanged():
    model = tiny_lora_model()
    loss_a, grads_a, _ = run(model, TrainConfig(max_tokens_per_micro_batch=4096))
    loss_b, grads_b, seen = run(model, TrainConfig(max_tokens_per_micro_batch=4096, lora_autocast=True))
    assert loss_a == loss_b and set(seen) == {torch.float32}
    assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


def test_the_default_is_on_for_a_bfloat16_model_only():
    model = bf16_model()
    loss_on, grads_on, _ = run(model, TrainConfig(max_tokens_per_micro_batch=4096, lora_autocast=True))
    loss_default, grads_default, seen_default = run(model, TrainConfig(max_tokens_per_micro_batch=4096))
    assert set(seen_default) == {torch.bfloat16} and loss_default == loss_on
    assert all(torch.equal(grads_on[n], grads_default[n]) for n in grads_on)
    fp32 = tiny_lora_model()
    assert set(run(fp32, TrainConfig(max_tokens_per_micro_batch=4096))[2]) == {torch.float32}


def test_a_float16_model_is_refused_when_asked_for_and_left_alone_by_default():
    model = bf16_model().to(torch.float16)
    with pytest.raises(ValueError, match="bfloat16 model"):
        run(model, TrainConfig(max_tokens_per_micro_batch=4096, lora_autocast=True))
    _, _, seen = run(model, TrainConfig(max_tokens_per_micro_batch=4096))  # as peft has it, no error
    assert set(seen) == {torch.float16}  # `.to` made the adapters float16 too: no autocast, no cast


def test_the_switch_is_validated():
    with pytest.raises(ValueError, match="lora_autocast"):
        TrainConfig(lora_autocast="maybe")
    with pytest.raises(ValueError, match="True, False or None"), training.lora_autocast(bf16_model(), "yes"):
        pass
