"""ModelConfig.offload_during_rollouts (ruler_rl.trainer.offload, issue #12): the trainer's frozen base weights go to CPU
memory while vLLM serves and come back for each step. The moves keep every parameter's identity (the optimizer
and peft hold them) and leave LoRA where it is; a step moves them back and off again; a configuration where
nothing would free the GPU for them is refused before anything loads. On this CPU machine the "device" is the
CPU itself, so these check the bookkeeping and the step's wiring, not a transfer's speed."""

import pytest
import torch

from ruler_rl.trainer import EngineConfig, LocalBackend, LoRAConfig, ModelConfig, TrainableModel
from ruler_rl.trainer.offload import WeightOffload

pytestmark = pytest.mark.slow


def test_the_frozen_weights_move_and_come_back_as_the_same_parameters(tiny_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_dir))
    model = LoRAConfig(rank=4).wrap(hf, str(tiny_dir))
    frozen = [p for p in model.parameters() if not p.requires_grad]
    lora = [p for p in model.parameters() if p.requires_grad]
    values = [p.detach().clone() for p in frozen]
    lora_storage = [p.data_ptr() for p in lora]
    off = WeightOffload(model)
    assert len(off.params) == len(frozen) and all(a is b for a, b in zip(off.params, frozen))
    assert off.bytes == sum(p.numel() * p.element_size() for p in frozen) > 0
    before = [p.data_ptr() for p in frozen]
    assert off.to_cpu() >= 0 and not off.on_device
    assert all(a != b for a, b in zip(before, [p.data_ptr() for p in frozen]))  # now in the CPU buffers
    assert off.to_cpu() == 0.0 and len(off.seconds) == 1  # already there: nothing moved
    off.to_device()
    assert off.on_device and len(off.seconds) == 2
    again = [p for p in model.parameters() if not p.requires_grad]
    assert len(again) == len(frozen) and all(a is b for a, b in zip(again, frozen))  # the same Parameter objects
    assert all(torch.equal(p, v) for p, v in zip(frozen, values))
    assert [p.data_ptr() for p in lora] == lora_storage  # LoRA never moved
    with pytest.raises(TypeError):
        WeightOffload("model")
    with pytest.raises(ValueError, match="no frozen parameters"):
        WeightOffload(torch.nn.Linear(2, 2))


async def test_a_step_brings_the_weights_back_and_sends_them_off_again(tiny_trainable, one_varied_step):
    model, backend = tiny_trainable
    await model.register(backend)
    try:
        run = backend._runs[model.name]
        run.offload = WeightOffload(run.peft_model)  # the vLLM engine's arrangement, on the CPU engine
        run.offload.to_cpu()
        moves = []
        for name in ("to_device", "to_cpu"):
            method = getattr(run.offload, name)
            setattr(run.offload, name, lambda method=method, name=name: (moves.append(name), method())[1])
        row = await one_varied_step(model)
        assert row["trained"] and row["grad_norm"] > 0 and row["offload_s"] >= 0
        assert moves == ["to_device", "to_cpu"] and not run.offload.on_device  # back, trained, off again
    finally:
        await backend.close()


@pytest.mark.parametrize("engine", [
    EngineConfig(engine="transformers"),                                      # no vLLM to give the memory to
    EngineConfig(engine="vllm", placement="dedicated", inference_gpus=[1], trainer_gpus=[0]),
    EngineConfig(engine="vllm", enable_sleep_mode=False),                     # vLLM would keep its share
])
def test_offloading_is_refused_where_nothing_frees_the_gpu_for_the_weights(tiny_dir, tmp_path, engine):
    cfg = ModelConfig(offload_during_rollouts=True, engine=engine)
    with pytest.raises(ValueError, match="offload_during_rollouts .* needs the vLLM engine"):
        LocalBackend(tmp_path, random_weights=True)._load(TrainableModel("x", "p", str(tiny_dir), cfg), tmp_path / "x")


def test_a_colocated_sleeping_vllm_run_loads_with_its_weights_offloaded(tiny_dir, tmp_path):
    cfg = ModelConfig(offload_during_rollouts=True, lora=LoRAConfig(rank=4), engine=EngineConfig(engine="vllm"))
    run = LocalBackend(tmp_path, random_weights=True)._load(TrainableModel("v", "p", str(tiny_dir), cfg), tmp_path / "v")
    # off before vLLM's server starts (register starts it after _load): its start-up sees the freed memory
    assert run.offload is not None and not run.offload.on_device and len(run.offload.seconds) == 1
    moved = {id(p) for p in run.offload.params}
    assert all(p.requires_grad for p in run.peft_model.parameters() if id(p) not in moved)
