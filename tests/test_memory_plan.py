"""The memory plan (trainer.memory, issue #12): parameter counts against real models, the H200 run's measured
settings planned as fitting, a 32B colocated run and a 7B run without checkpointing refused with numbers and
changes that do fit, bad input refused, and `register` refusing before it loads anything."""

import re

import pydantic
import pytest

from evals.scale_bench import SHAPES
from trainer import LocalBackend, MemoryCheckConfig, MemoryPlanError, ModelConfig, TrainableModel, plan_memory
from trainer.config import EngineConfig, LoRAConfig, TrainConfig
from trainer.memory import GIB, activation_bytes, lora_parameters, model_shape

H200 = 150_109_880_320  # torch.cuda.mem_get_info()[1] on the H200 (nvidia-smi: 143771 MiB, the report's "143.8 GB")
H100 = 81559 * 2**20  # an 80 GB device as nvidia-smi counts it
LORA16 = LoRAConfig(rank=16, alpha=32.0)  # all seven linear layers, as the scale benchmark
BASE = "local/smollm2-135m-instruct"


def scale_run(shape: str, util: float, *, tokens: int = 16384, device: int = H200, **model) -> object:
    """The scale benchmark's settings: LoRA r16 on all linear layers, vLLM colocated at `util`, ~8k sequences."""
    model.setdefault("engine", EngineConfig(gpu_memory_utilization=util, max_seq_length=8192))
    config = ModelConfig(lora=LORA16, **model)
    return plan_memory(config, SHAPES[shape], device_bytes=device,
                       train=TrainConfig(max_tokens_per_micro_batch=tokens), base=shape)


def gib_numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+\.\d) GiB", text)]


def test_parameter_counts_are_those_of_the_real_modules():
    """The planner's counts of base and LoRA parameters equal those of the model transformers and peft build."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    qwen_like = {**SHAPES["qwen2.5-7b"], "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_window_layers": 2}
    tied = {**SHAPES["tiny"], "tie_word_embeddings": True}
    for raw in (SHAPES["tiny"], qwen_like, tied):
        config = AutoConfig.for_model(**raw)
        with torch.device("meta"):
            hf = AutoModelForCausalLM.from_config(config)
        assert model_shape(raw).parameters() == sum(p.numel() for p in hf.parameters())
        lora = LoRAConfig(rank=4, target_modules=["q_proj", "v_proj", "down_proj"])
        peft_model = lora.wrap(hf, "test")
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        assert lora_parameters(model_shape(raw), 4, lora.target_modules) == trainable
    # the published sizes of the scale benchmark's shapes
    counts = {name: round(model_shape(SHAPES[name]).parameters() / 1e9, 2)
              for name in ("qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "llama-3.1-8b")}
    assert counts == {"qwen2.5-7b": 7.62, "qwen2.5-14b": 14.77, "qwen2.5-32b": 32.76, "llama-3.1-8b": 8.03}


@pytest.mark.parametrize(("shape", "util", "measured_gib", "kv_gib"), [("qwen2.5-7b", 0.45, 81.1, 46.8),
                                                                       ("qwen2.5-14b", 0.55, 108.1, 47.0)])
def test_the_h200_runs_measured_settings_are_planned_as_fitting(shape, util, measured_gib, kv_gib):
    plan = scale_run(shape, util)
    assert plan.fits and not plan.suggestions, plan.message()
    assert plan.gradient_checkpointing and plan.tokens_per_pass == 16384
    # the rollout phase (vLLM awake beside the trainer) is the run's peak, as measured (NVML, whole device)
    assert abs(plan.rollout_bytes / GIB - measured_gib) < 2.0
    assert plan.training_bytes < plan.rollout_bytes
    assert abs(plan.vllm_kv_cache_bytes / GIB - kv_gib) < 1.0  # vLLM's log: KV cache of its share
    assert "fits" in plan.message() and "does NOT fit" not in plan.message()


# one forward and backward pass on one H200 (torch 2.11, transformers 5.17, peft; random weights, LoRA r16 on all
# linear layers, SDPA with the 4-D mask, chunked logprobs): torch.cuda.max_memory_allocated above the weights, GiB
MEASURED_ACTIVATIONS = {("qwen2.5-7b", 4096, False): 37.12, ("qwen2.5-7b", 8192, False): 75.52,
                        ("qwen2.5-7b", 4096, True): 2.55, ("qwen2.5-7b", 8192, True): 5.16,
                        ("qwen2.5-7b", 16384, True): 10.58, ("qwen2.5-7b", 32768, True): 22.16,
                        ("qwen2.5-14b", 16384, True): 15.19, ("qwen2.5-14b", 4096, False): 65.06}


@pytest.mark.parametrize(("shape", "tokens", "checkpointing"), list(MEASURED_ACTIVATIONS))
def test_the_activation_term_is_at_or_a_little_above_what_an_h200_measured(shape, tokens, checkpointing):
    planned = activation_bytes(model_shape(SHAPES[shape]), tokens, checkpointing=checkpointing,
                               targets=LORA16.target_modules) / GIB
    measured = MEASURED_ACTIVATIONS[shape, tokens, checkpointing]
    assert measured <= planned <= measured * 1.2


def test_a_32b_colocated_run_is_refused_with_the_numbers_and_a_utilization_that_fits():
    plan = scale_run("qwen2.5-32b", 0.45)
    assert not plan.fits
    text = plan.message()
    weights = 32_763_876_352 * 2 / GIB  # 65.5 GB, one bf16 copy each side
    assert f"{weights:.1f} GiB" in text and f"{0.45 * H200 / GIB:.1f} GiB" in text  # 61.0 and 62.9
    assert "gpu_memory_utilization 0.45 gives vLLM 62.9 GiB" in text and "does NOT fit" in text
    (change,) = plan.suggestions
    low, high = map(float, re.search(r"between (\d\.\d\d) and (\d\.\d\d)", change).groups())
    assert 0.45 < low <= high < 0.55
    for util in (low, high):  # the window it names does fit; just outside it does not
        assert scale_run("qwen2.5-32b", util).fits
    assert not scale_run("qwen2.5-32b", round(high + 0.01, 2)).fits
    assert not scale_run("qwen2.5-32b", round(low - 0.01, 2)).fits
    with pytest.raises(MemoryError, match="62.9 GiB") as raised:
        raise MemoryPlanError(plan)
    assert raised.value.plan is plan


def test_the_32b_cannot_fit_two_copies_on_an_80gb_device_and_is_told_to_split_them():
    plan = scale_run("qwen2.5-32b", 0.5, device=H100)
    assert not plan.fits
    assert any("no gpu_memory_utilization fits both" in s and "placement='dedicated'" in s for s in plan.suggestions)


def test_7b_without_checkpointing_at_8k_on_an_80gb_device_is_refused_and_told_to_checkpoint():
    plan = scale_run("qwen2.5-7b", 0.45, tokens=8192, device=H100, gradient_checkpointing=False)
    assert not plan.fits and not plan.gradient_checkpointing
    need = plan.training_bytes / GIB
    assert f"training needs {need:.1f} GiB of 79.6 GiB" in plan.message()
    ckpt = next(s for s in plan.suggestions if "gradient checkpointing" in s)
    before, after, then = gib_numbers(ckpt)[:3]
    assert before == round(plan.activations_full_bytes / GIB, 1) and after < before / 5 and then < 79.6
    assert scale_run("qwen2.5-7b", 0.45, tokens=8192, device=H100, gradient_checkpointing=True).fits
    # the other way out: fewer tokens per pass, and then max_seq_length too (a sequence is never split)
    smaller = next(s for s in plan.suggestions if "max_tokens_per_micro_batch <=" in s)
    tokens = int(re.search(r"max_tokens_per_micro_batch <= (\d+)", smaller).group(1))
    assert "max_seq_length <=" in smaller and tokens < 8192
    def no_checkpointing(n):
        return plan_memory(ModelConfig(lora=LORA16, gradient_checkpointing=False,
                                       engine=EngineConfig(gpu_memory_utilization=0.45, max_seq_length=n)),
                           SHAPES["qwen2.5-7b"], device_bytes=H100, train=TrainConfig(max_tokens_per_micro_batch=n))

    assert no_checkpointing(tokens).fits and not no_checkpointing(tokens + 512).fits


def test_a_sequence_longer_than_the_micro_batch_sets_the_pass_and_the_message_says_so():
    config = ModelConfig(engine=EngineConfig(max_seq_length=131072))
    plan = plan_memory(config, SHAPES["qwen2.5-7b"], device_bytes=H100, train=TrainConfig(max_tokens_per_micro_batch=8192))
    assert plan.tokens_per_pass == 131072 and not plan.fits
    assert "max_seq_length 131072 > max_tokens_per_micro_batch 8192: a sequence cannot be split" in plan.message()
    change = next(s for s in plan.suggestions if "max_tokens_per_micro_batch <=" in s)
    limit = int(re.search(r"max_seq_length <= (\d+)", change).group(1))
    assert plan_memory(ModelConfig(engine=EngineConfig(max_seq_length=limit)), SHAPES["qwen2.5-7b"], device_bytes=H100,
                       train=TrainConfig(max_tokens_per_micro_batch=limit)).fits


def test_sleep_mode_and_placement_decide_what_vllm_holds_while_training():
    asleep = scale_run("qwen2.5-7b", 0.45)
    awake = scale_run("qwen2.5-7b", 0.45, engine=EngineConfig(gpu_memory_utilization=0.45, max_seq_length=8192,
                                                                enable_sleep_mode=False))
    vllm_asleep = asleep.training["vLLM asleep (level 1)"]
    assert GIB <= vllm_asleep < 3 * GIB
    assert awake.training["vLLM awake (no sleep mode)"] == asleep.vllm_share_bytes
    assert awake.training_bytes - asleep.training_bytes == asleep.vllm_share_bytes - vllm_asleep
    tight = scale_run("qwen2.5-7b", 0.7, device=H100, engine=EngineConfig(gpu_memory_utilization=0.7,
                                                                          enable_sleep_mode=False))
    assert not tight.fits and any("enable_sleep_mode" in s for s in tight.suggestions)
    dedicated = scale_run("qwen2.5-7b", 0.9, engine=EngineConfig(engine="vllm", placement="dedicated",
                                                                  inference_gpus=[1], trainer_gpus=[0],
                                                                  gpu_memory_utilization=0.9))
    assert dedicated.fits and not any(k.startswith("vLLM") for k in (*dedicated.rollout, *dedicated.training))
    transformers = plan_memory(ModelConfig(), SHAPES["qwen2.5-7b"], device_bytes=H100, engine="transformers")
    assert transformers.vllm_share_bytes == 0 and transformers.fits


def test_a_tiny_model_fits_and_the_activation_terms_grow_as_stated():
    plan = plan_memory(ModelConfig(), SHAPES["tiny"], device_bytes=2 * GIB, cuda=False)
    assert plan.fits and plan.dtype == "float32" and not plan.gradient_checkpointing and plan.engine == "transformers"
    assert "CUDA context" not in plan.rollout
    shape = model_shape(SHAPES["qwen2.5-7b"])
    kw = {"targets": LORA16.target_modules}
    # with checkpointing the per-layer part is linear in tokens; the 4-D mask's SDPA copy is quadratic
    with_mask = activation_bytes(shape, 8192, checkpointing=False, **kw)
    flash = activation_bytes(shape, 8192, checkpointing=False, attention="flash_attention_2", **kw)
    assert with_mask - flash > shape.layers * 8192**2 * 2  # one additive bf16 mask per layer at least
    assert (activation_bytes(shape, 8192, checkpointing=True, **kw)
            < activation_bytes(shape, 16384, checkpointing=True, **kw)
            < activation_bytes(shape, 8192, checkpointing=False, **kw))
    assert activation_bytes(shape, 4096, checkpointing=False, attention="eager", **kw) > with_mask / 2


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"device_bytes": -1}, ValueError, "device_bytes must be an int >= 1"),
    ({"device_bytes": 0}, ValueError, "device_bytes"),
    ({"device_bytes": True}, ValueError, "device_bytes"),
    ({"device_bytes": 1.5e9}, ValueError, "device_bytes"),
    ({"device_bytes": GIB, "in_use_bytes": -5}, ValueError, "in_use_bytes"),
    ({"device_bytes": GIB, "in_use_bytes": GIB}, ValueError, "below device_bytes"),
    ({"device_bytes": GIB, "margin": 2}, ValueError, "margin"),
    ({"device_bytes": GIB, "attention": "flex"}, ValueError, "attention must be one of"),
    ({"device_bytes": GIB, "engine": "sglang"}, ValueError, "engine must be"),
    ({"device_bytes": GIB, "train": {"max_tokens_per_micro_batch": 8}}, TypeError, "TrainConfig"),
])
def test_bad_arguments_are_refused_clearly(kwargs, error, match):
    with pytest.raises(error, match=match):
        plan_memory(ModelConfig(), SHAPES["tiny"], **kwargs)


@pytest.mark.parametrize(("hf_config", "error", "match"), [
    ({k: v for k, v in SHAPES["tiny"].items() if k != "num_hidden_layers"}, ValueError, "lacks num_hidden_layers"),
    ({"model_type": "llama"}, ValueError, "lacks hidden_size, num_hidden_layers"),
    ({**SHAPES["tiny"], "hidden_size": 0}, ValueError, r"hf_config\['hidden_size'\] must be an int >= 1"),
    ({**SHAPES["tiny"], "vocab_size": "many"}, ValueError, "vocab_size"),
    ({**SHAPES["tiny"], "num_local_experts": 8}, ValueError, "mixture-of-experts"),
    ("config.json", TypeError, "config.json as a dict"),
])
def test_configs_the_planner_cannot_read_are_refused_naming_the_key(hf_config, error, match):
    with pytest.raises(error, match=match):
        plan_memory(ModelConfig(), hf_config, device_bytes=GIB)


def test_model_config_memory_check_field():
    assert ModelConfig(memory_check=False).memory_check == MemoryCheckConfig(enabled=False)
    assert ModelConfig(memory_check=True).memory_check.enabled
    config = ModelConfig(memory_check={"device_gib": 80, "max_tokens_per_micro_batch": 16384})
    assert ModelConfig.model_validate(config.model_dump()) == config
    for bad in ({"device_gib": 0}, {"device_gib": -1}, {"margin": 1.5}, {"max_tokens_per_micro_batch": 8},
                {"unknown": 1}, "yes"):
        with pytest.raises(pydantic.ValidationError):
            ModelConfig(memory_check=bad)
    for name, info in MemoryCheckConfig.model_fields.items():
        assert "Default" in (info.description or ""), name
    # the micro-batch the register-time plan assumes
    hinted = ModelConfig(memory_check={"max_tokens_per_micro_batch": 16384}, engine=EngineConfig(max_seq_length=64))
    assert plan_memory(hinted, SHAPES["tiny"], device_bytes=8 * GIB).tokens_per_pass == 16384
    assert plan_memory(ModelConfig(engine=EngineConfig(max_seq_length=64)), SHAPES["tiny"],
                       device_bytes=8 * GIB).tokens_per_pass == TrainConfig().max_tokens_per_micro_batch


@pytest.mark.slow
async def test_register_plans_before_loading_anything_and_the_check_can_be_skipped(tmp_path, monkeypatch, caplog):
    """On the CPU: no plan by default; with `device_gib` a plan that fits is logged and one that does not is
    refused before the tokenizer or the weights are read; `memory_check=False` skips it."""
    import transformers

    import trainer.memory

    backend = LocalBackend(tmp_path)
    try:
        real_plan = trainer.memory.plan_memory

        def no_plan(*args, **kwargs):
            raise AssertionError("planned on the CPU without device_gib")

        monkeypatch.setattr(trainer.memory, "plan_memory", no_plan)
        await TrainableModel("default", "p", BASE).register(backend)  # CPU as before: no plan made
        monkeypatch.setattr(trainer.memory, "plan_memory", real_plan)

        with caplog.at_level("INFO", logger="ruler.trainer"):
            await TrainableModel("roomy", "p", BASE, ModelConfig(memory_check={"device_gib": 64})).register(backend)
        assert "memory plan for" in caplog.text and "of 64.0 GiB" in caplog.text
        await TrainableModel("skipped", "p", BASE,
                             ModelConfig(memory_check={"enabled": False, "device_gib": 0.3})).register(backend)
        assert {"default", "roomy", "skipped"} <= set(backend._runs)
    except BaseException:
        await backend.close()
        raise
    loaded = []

    def loader(*args, **kwargs):
        loaded.append(args)
        raise AssertionError("loaded before the memory plan refused")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", loader)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loader)
    small = TrainableModel("small", "p", BASE, ModelConfig(memory_check={"device_gib": 0.3}))
    with pytest.raises(MemoryPlanError) as raised:
        await small.register(backend)
    assert loaded == [] and "small" not in backend._runs
    text = str(raised.value)
    assert "of 0.3 GiB" in text and "base weights (float32) 0.5 GiB" in text and "change:" in text
    assert raised.value.plan.device_bytes == int(0.3 * GIB)
    await backend.close()
