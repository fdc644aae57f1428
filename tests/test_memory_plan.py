"""The memory plan (ruler_rl.trainer.memory, issue #12): parameter counts against real models, the H200 run's measured
settings planned as fitting, a 32B colocated run and a 7B run without checkpointing refused with numbers and
changes that do fit, bad input refused, `register` refusing before it loads anything (its own allocator cache not
counted as in use, a dedicated vLLM share of the inference GPU's size, quantised models not planned), `train`
re-planning a larger micro-batch, and the LoRA/AdamW bytes against torch's."""

import re
from pathlib import Path

import pydantic
import pytest

from evals.scale_bench.shapes import SHAPES
from ruler_rl.trainer import LocalBackend, MemoryCheckConfig, MemoryPlanError, ModelConfig, TrainableModel, plan_memory
from ruler_rl.trainer.config import EngineConfig, LoRAConfig, TrainConfig
from ruler_rl.trainer.memory import (
    CUDA_CONTEXT_BYTES,
    GIB,
    activation_bytes,
    lora_parameters,
    memory_in_use,
    model_shape,
    weight_shrinking,
)

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


def test_a_float32_model_plans_four_bytes_per_parameter_on_both_sides():
    bf16, fp32 = scale_run("qwen2.5-7b", 0.45), scale_run("qwen2.5-7b", 0.45, dtype="float32")
    params = bf16.parameters
    assert bf16.rollout["base weights (bfloat16)"] == 2 * params and fp32.rollout["base weights (float32)"] == 4 * params
    assert fp32.vllm_kv_cache_bytes < bf16.vllm_kv_cache_bytes - params  # vLLM's own float32 copy leaves less for the KV cache
    kept = scale_run("qwen2.5-7b", 0.45, dtype="float32",
                     engine=EngineConfig(gpu_memory_utilization=0.45, max_seq_length=8192,
                                         vllm_args={"dtype": "bfloat16"}))
    assert kept.vllm_kv_cache_bytes == bf16.vllm_kv_cache_bytes  # vllm_args' dtype is what vLLM holds


def test_a_32b_colocated_run_is_refused_with_the_numbers_and_a_utilization_that_fits():
    plan = scale_run("qwen2.5-32b", 0.45)
    assert not plan.fits
    text = plan.message()
    weights = 32_763_876_352 * 2 / GIB  # 65.5 GB, one bf16 copy each side
    assert f"{weights:.1f} GiB" in text and f"{0.45 * H200 / GIB:.1f} GiB" in text  # 61.0 and 62.9
    assert "gpu_memory_utilization 0.45 gives vLLM 62.9 GiB" in text and "does NOT fit" in text
    change, offload = plan.suggestions
    low, high = map(float, re.search(r"between (\d\.\d\d) and (\d\.\d\d)", change).groups())
    assert 0.45 < low <= high < 0.55
    for util in (low, high):  # the window it names does fit; just outside it does not
        assert scale_run("qwen2.5-32b", util).fits
    assert not scale_run("qwen2.5-32b", round(high + 0.01, 2)).fits
    assert not scale_run("qwen2.5-32b", round(low - 0.01, 2)).fits
    # or the trainer's copy leaves the GPU while vLLM serves: a much larger share for vLLM's KV cache
    assert "offload_during_rollouts=True" in offload and f"{weights:.1f} GiB of weights" in offload
    low2, high2 = map(float, re.search(r"between (\d\.\d\d) and (\d\.\d\d)", offload).groups())
    assert low2 == low and high2 > 0.9
    for util in (low2, high2):
        assert scale_run("qwen2.5-32b", util, offload_during_rollouts=True).fits
    assert not scale_run("qwen2.5-32b", round(high2 + 0.01, 2), offload_during_rollouts=True).fits
    planned = scale_run("qwen2.5-32b", 0.85, offload_during_rollouts=True)
    assert not any(k.startswith("base weights") for k in planned.rollout)  # in CPU memory while vLLM serves
    assert planned.training["base weights (bfloat16)"] == 32_763_876_352 * 2  # back for the step
    # ~29 of the 32 concurrent 7.7k-token rollouts, against ~3 with both copies on the GPU
    assert planned.vllm_kv_tokens > 200_000 > 8 * scale_run("qwen2.5-32b", high).vllm_kv_tokens
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
    ({"device_bytes": GIB, "base": 7}, TypeError, "base must be a non-empty str"),
    ({"device_bytes": GIB, "base": " "}, TypeError, "base must be a non-empty str"),
    ({"device_bytes": GIB, "cuda": "yes"}, TypeError, "cuda must be a bool"),
    ({"device_bytes": GIB, "cuda": 1}, TypeError, "cuda must be a bool"),
    ({"device_bytes": GIB, "inference_device_bytes": 0}, ValueError, "inference_device_bytes must be an int >= 1"),
    ({"device_bytes": GIB, "inference_device_bytes": 2.5e9}, ValueError, "inference_device_bytes"),
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

    import ruler_rl.trainer.backend
    import ruler_rl.trainer.memory

    backend = LocalBackend(tmp_path)
    try:
        real_plan = ruler_rl.trainer.memory.plan_memory

        def no_plan(*args, **kwargs):
            raise AssertionError("planned on the CPU without device_gib")

        monkeypatch.setattr(ruler_rl.trainer.memory, "plan_memory", no_plan)
        # (the CPU's checkpointing choice plans a pass against the memory available: a test of its own)
        monkeypatch.setattr(ruler_rl.trainer.backend, "_cpu_checkpointing", lambda *a: None)
        await TrainableModel("default", "p", BASE).register(backend)  # CPU as before: no plan made
        monkeypatch.setattr(ruler_rl.trainer.memory, "plan_memory", real_plan)

        with caplog.at_level("INFO", logger="ruler.trainer"):
            await TrainableModel("roomy", "p", BASE, ModelConfig(memory_check={"device_gib": 64})).register(backend)
        assert "memory plan for" in caplog.text and "of 64.0 GiB" in caplog.text
        roomy = backend._runs["roomy"]
        assert roomy.memory_plan.max_tokens_per_micro_batch == 8192  # what register was told (the default)
        history = roomy.run_dir / "history.jsonl"
        # a step with a larger micro-batch than register planned: re-planned, a warning names both numbers
        caplog.clear()
        await backend.train(TrainableModel("roomy", "p", BASE), [], TrainConfig(max_tokens_per_micro_batch=12288))
        warning = next(r.getMessage() for r in caplog.records if "re-planned" in r.getMessage())
        again = roomy.memory_plan
        assert again.max_tokens_per_micro_batch == 12288 and again.fits
        assert ("TrainConfig.max_tokens_per_micro_batch 12288 is larger than the 8192" in warning
                and "ModelConfig.memory_check.max_tokens_per_micro_batch" in warning
                and f"re-planned activations {again.activations_bytes / GIB:.1f} GiB" in warning)
        rows = history.read_text().splitlines()
        # one that does not fit the device is refused before the step: nothing prepared, trained or logged
        with pytest.raises(MemoryPlanError, match="of 64.0 GiB") as raised:
            await backend.train(TrainableModel("roomy", "p", BASE), [],
                                TrainConfig(max_tokens_per_micro_batch=131072))
        assert raised.value.plan.tokens_per_pass == 131072 and not raised.value.plan.fits
        assert history.read_text().splitlines() == rows
        assert backend.current_step(TrainableModel("roomy", "p", BASE)) == 0
        assert roomy.memory_plan is again
        caplog.clear()
        await backend.train(TrainableModel("roomy", "p", BASE), [], TrainConfig(max_tokens_per_micro_batch=12288))
        assert "re-planned" not in caplog.text  # planned for it already
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


def test_the_micro_batch_advice_names_the_steps_field_and_the_plans_field():
    """Register plans with `memory_check.max_tokens_per_micro_batch` and never sees the steps' TrainConfig, so
    "set max_tokens_per_micro_batch <= N" names both."""
    plan = scale_run("qwen2.5-7b", 0.45, tokens=8192, device=H100, gradient_checkpointing=False)
    smaller = next(s for s in plan.suggestions if "max_tokens_per_micro_batch <=" in s)
    steps = re.search(r"TrainConfig.max_tokens_per_micro_batch <= (\d+) \(the steps' micro-batches\)", smaller)
    n = int(steps.group(1))
    assert f"ModelConfig.memory_check.max_tokens_per_micro_batch <= {n} (what this plan assumes)" in smaller


def test_memory_in_use_leaves_out_this_processs_context_and_allocator_cache():
    # a process that trained before: 30 GiB reserved by its allocator, 20 GiB of it still allocated (a model)
    free, total = 50 * GIB, 140 * GIB
    assert memory_in_use(free, total, 30 * GIB, 20 * GIB) == 140 * GIB - 50 * GIB - CUDA_CONTEXT_BYTES - 10 * GIB
    assert memory_in_use(free, total) == 89 * GIB  # nothing cached: all but the context is someone else's
    assert memory_in_use(total, total) == 0  # never below 0
    for args, match in (((-1, total), "free"), ((free, total, GIB, 2 * GIB), "allocated"),
                        ((total + 1, total), "must not exceed total"), ((free, total, True), "reserved")):
        with pytest.raises(ValueError, match=match):
            memory_in_use(*args)


def _fake_cuda(monkeypatch, totals: dict[int, int], free: dict[int, int], reserved: int, allocated: int) -> None:
    """CUDA's memory queries as a process that already holds `reserved` bytes in its allocator would see them."""
    import torch

    def index(dev):
        return dev if isinstance(dev, int) else (torch.device(dev).index or 0)

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (free[index(dev)], totals[index(dev)]))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: allocated)


def test_register_does_not_count_its_own_allocator_cache_as_used_by_others(monkeypatch):
    """A process that trained before holds cached blocks; the register-time plan must not refuse a run that fits
    because of them (it did: total - free - 1 GiB counted the cache as other processes' memory)."""
    from transformers import AutoConfig

    from ruler_rl.trainer.backend import _check_memory, resolve_base_model

    base = resolve_base_model(BASE)
    hf = AutoConfig.from_pretrained(base).to_dict()
    cfg = ModelConfig(memory_check={"max_tokens_per_micro_batch": 1024})
    need = max(plan_memory(cfg, hf, device_bytes=64 * GIB, engine="transformers").rollout_bytes,
               plan_memory(cfg, hf, device_bytes=64 * GIB, engine="transformers").training_bytes)
    total, cache = need + GIB, 3 * GIB
    assert not plan_memory(cfg, hf, device_bytes=total, engine="transformers", in_use_bytes=cache).fits  # the old sum
    _fake_cuda(monkeypatch, {0: total}, {0: total - CUDA_CONTEXT_BYTES - cache}, reserved=cache, allocated=0)
    plan, _ = _check_memory(cfg, base, "transformers", "cuda")
    assert plan.fits and plan.rollout["in use by other processes"] == 0 and plan.device_bytes == total
    # another process's 3 GiB (nothing cached here) is still counted, and refused
    _fake_cuda(monkeypatch, {0: total}, {0: total - CUDA_CONTEXT_BYTES - cache}, reserved=0, allocated=0)
    with pytest.raises(MemoryPlanError, match="in use by other processes 3.0 GiB"):
        _check_memory(cfg, base, "transformers", "cuda")


def test_a_dedicated_vllm_share_is_of_the_inference_gpus_own_size(monkeypatch):
    from ruler_rl.trainer.backend import _check_memory, resolve_base_model

    dedicated = EngineConfig(engine="vllm", placement="dedicated", inference_gpus=[1], trainer_gpus=[0],
                             gpu_memory_utilization=0.9, max_seq_length=8192)
    plan = plan_memory(ModelConfig(lora=LORA16, engine=dedicated), SHAPES["qwen2.5-7b"], device_bytes=H200,
                       inference_device_bytes=H100)
    assert plan.vllm_share_bytes == int(0.9 * H100) and plan.fits
    # the 32B's weights fit an H200 beside the trainer's, not a 40 GB inference GPU: no max_model_len advice then
    a100 = 40960 * 2**20
    big = plan_memory(ModelConfig(lora=LORA16, engine=dedicated), SHAPES["qwen2.5-32b"], device_bytes=H200,
                      inference_device_bytes=a100)
    assert not big.fits and big.vllm_share_bytes == int(0.9 * a100)
    (change,) = big.suggestions
    assert "do not fit one inference GPU of 40.0 GiB" in change and "max_model_len" not in change
    assert "inference_parallel='tensor'" in change
    assert plan_memory(ModelConfig(lora=LORA16, engine=dedicated), SHAPES["qwen2.5-32b"], device_bytes=a100,
                       inference_device_bytes=H200).vllm_share_bytes == int(0.9 * H200)
    # the weights fit, one long sequence's KV cache beside them does not: a smaller max_model_len helps then
    long = dedicated.model_copy(update={"max_model_len": 262144})
    kv = plan_memory(ModelConfig(lora=LORA16, engine=long), SHAPES["qwen2.5-7b"], device_bytes=H200,
                     inference_device_bytes=24 * GIB)
    (change,) = kv.suggestions
    assert not kv.fits and "a smaller EngineConfig.max_model_len" in change and "262144-token" in change
    # register asks CUDA for the first inference GPU's size (the trainer's GPU is larger here)
    _fake_cuda(monkeypatch, {0: H200, 1: H100}, {0: H200 - CUDA_CONTEXT_BYTES, 1: H100}, reserved=0, allocated=0)
    cfg = ModelConfig(lora=LoRAConfig(rank=8), engine=dedicated.model_copy(update={"gpu_memory_utilization": 0.8}))
    plan, _ = _check_memory(cfg, resolve_base_model(BASE), "vllm", "cuda:0")
    assert plan.device_bytes == H200 and plan.vllm_share_bytes == int(0.8 * H100)


def test_quantised_or_offloaded_models_are_not_planned_and_register_goes_on(tmp_path, caplog):
    import json
    import shutil

    from ruler_rl.trainer.backend import _check_memory, resolve_base_model

    awq = {**SHAPES["qwen2.5-32b"], "quantization_config": {"quant_method": "awq", "bits": 4}}
    with pytest.raises(ValueError, match=r"quantization_config \(awq\)"):
        plan_memory(ModelConfig(), awq, device_bytes=H100)
    for args, named in (({"quantization": "fp8"}, "vllm_args['quantization']='fp8'"),
                        ({"cpu-offload-gb": 40}, "vllm_args['cpu-offload-gb']=40")):
        cfg = ModelConfig(engine=EngineConfig(vllm_args=args))
        assert named in weight_shrinking(cfg, SHAPES["qwen2.5-32b"])
        with pytest.raises(ValueError, match=re.escape(named)):
            plan_memory(cfg, SHAPES["qwen2.5-32b"], device_bytes=H100)
    assert weight_shrinking(ModelConfig(engine=EngineConfig(vllm_args={"cpu_offload_gb": 0})), SHAPES["tiny"]) is None
    assert weight_shrinking(ModelConfig(), SHAPES["qwen2.5-32b"]) is None
    # at register: a warning and no plan, where the same device refuses the unquantised model
    base = resolve_base_model(BASE)
    small = {"device_gib": 0.3}
    with pytest.raises(MemoryPlanError):
        _check_memory(ModelConfig(memory_check=small), base, "vllm", "cpu")
    with caplog.at_level("WARNING", logger="ruler.trainer"):
        quantised = ModelConfig(memory_check=small, engine=EngineConfig(vllm_args={"quantization": "awq"}))
        assert _check_memory(quantised, base, "vllm", "cpu") == (None, None)
        copy = tmp_path / "quantised"
        copy.mkdir()
        config = json.loads((Path(base) / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq",
                                                                                         "bits": 4}}))
        assert _check_memory(ModelConfig(memory_check=small), str(copy), "vllm", "cpu") == (None, None)
    assert "vllm_args['quantization']='awq'" in caplog.text and "quantization_config (gptq)" in caplog.text
    assert caplog.text.count("registering without one") == 2
    shutil.rmtree(copy)


def test_the_lora_terms_equal_a_real_adamw_state_after_one_step():
    """The plan's LoRA parameters + AdamW state + gradients (fp32) against what torch holds after one step of a
    tiny peft-wrapped model on the CPU."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    lora = LoRAConfig(rank=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj"])
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**SHAPES["tiny"]), dtype=torch.float32)
    model = lora.wrap(hf, "tiny")
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    ids = torch.randint(0, SHAPES["tiny"]["vocab_size"], (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()

    def nbytes(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    params = nbytes(trainable)
    grads = nbytes(p.grad for p in trainable)
    state = nbytes(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    plan = plan_memory(ModelConfig(lora=lora), SHAPES["tiny"], device_bytes=GIB, cuda=False)
    assert plan.training["LoRA parameters + AdamW state (fp32)"] == plan.rollout["LoRA parameters + AdamW state (fp32)"]
    planned = plan.training["LoRA parameters + AdamW state (fp32)"] + plan.training["LoRA gradients (fp32)"]
    assert plan.training["LoRA gradients (fp32)"] == grads
    # AdamW's per-parameter `step` counters are the only bytes the plan leaves out: 4 bytes per tensor
    assert 0 <= params + grads + state - planned <= 8 * len(trainable) < 4096


def test_the_host_must_hold_the_weight_copies_the_run_keeps_in_cpu_memory():
    """vLLM's weights while it sleeps at level 1, and with offload_during_rollouts the trainer's pinned copy: at
    32B 2 x 61.0 GiB, more than a 128 GiB host (120 GiB available) can give; refused with the numbers."""
    weights = 32_763_876_352 * 2
    offload = ModelConfig(lora=LORA16, offload_during_rollouts=True,
                          engine=EngineConfig(gpu_memory_utilization=0.85, max_seq_length=8192))
    plan = plan_memory(offload, SHAPES["qwen2.5-32b"], device_bytes=H200, host_bytes=120 * GIB,
                       train=TrainConfig(max_tokens_per_micro_batch=16384))
    assert plan.host == {"vLLM's weights while asleep (level 1)": weights,
                         "the trainer's base weights (bfloat16, offload_during_rollouts)": weights}
    assert not plan.fits and plan.host_bytes == 120 * GIB
    problem = next(p for p in plan.problems if p.startswith("CPU memory"))
    assert gib_numbers(problem) == [122.1, 61.0, 61.0, 120.0]
    assert any("offload_during_rollouts=False" in s and "61.0 GiB" in s for s in plan.suggestions)
    assert "  CPU memory 122.1 GiB = " in plan.message() and "does NOT fit" in plan.message()
    roomy = plan_memory(offload, SHAPES["qwen2.5-32b"], device_bytes=H200, host_bytes=123 * GIB,
                        train=TrainConfig(max_tokens_per_micro_batch=16384))
    assert roomy.fits and "CPU memory 122.1 GiB of 123.0 GiB available" in roomy.summary()
    unchecked = plan_memory(offload, SHAPES["qwen2.5-32b"], device_bytes=H200,
                            train=TrainConfig(max_tokens_per_micro_batch=16384))
    assert unchecked.fits and unchecked.host_bytes == 0 and sum(unchecked.host.values()) == 2 * weights

    # without offloading, only vLLM's sleeping copy; without sleep mode or vLLM, nothing on the host
    seven = scale_run("qwen2.5-7b", 0.45)
    assert list(seven.host.values()) == [7_615_616_512 * 2]
    small_host = plan_memory(ModelConfig(lora=LORA16, engine=EngineConfig(gpu_memory_utilization=0.45,
                                                                          max_seq_length=8192)),
                             SHAPES["qwen2.5-7b"], device_bytes=H200, host_bytes=10 * GIB,
                             train=TrainConfig(max_tokens_per_micro_batch=16384))
    assert not small_host.fits and any("enable_sleep_mode=False" in s for s in small_host.suggestions)
    awake = EngineConfig(gpu_memory_utilization=0.45, max_seq_length=8192, enable_sleep_mode=False)
    assert plan_memory(ModelConfig(lora=LORA16, engine=awake), SHAPES["qwen2.5-7b"], device_bytes=H200,
                       host_bytes=GIB).host == {}
    assert plan_memory(ModelConfig(), SHAPES["tiny"], device_bytes=8 * GIB, cuda=False, host_bytes=GIB).host == {}
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="host_bytes"):
            plan_memory(ModelConfig(), SHAPES["tiny"], device_bytes=8 * GIB, host_bytes=bad)


@pytest.mark.slow
async def test_register_checks_the_host_before_loading_anything(tmp_path, monkeypatch):
    """`memory_check.host_gib` (else what psutil reports available) bounds the host copies: vLLM's sleeping copy
    of SmolLM2 (0.25 GiB in bf16) does not fit 0.1 GiB, and register refuses before reading the tokenizer."""
    import transformers

    loaded = []

    def loader(*args, **kwargs):
        loaded.append(args)
        raise AssertionError("loaded before the memory plan refused")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", loader)
    backend = LocalBackend(tmp_path)
    try:
        model = TrainableModel("hosted", "p", BASE, ModelConfig(engine=EngineConfig(engine="vllm"),
                                                                memory_check={"device_gib": 64, "host_gib": 0.1}))
        with pytest.raises(MemoryPlanError, match=r"CPU memory: .* more than the 0\.1 GiB available") as raised:
            await model.register(backend)
        assert loaded == [] and raised.value.plan.host_bytes == int(0.1 * GIB)
    finally:
        await backend.close()
    with pytest.raises(pydantic.ValidationError, match="host_gib"):
        MemoryCheckConfig(host_gib=0)


def split_gpu(util: float, share: float) -> EngineConfig:
    """A dedicated vLLM placement on one GPU split in two (EngineConfig.shares_gpu)."""
    return EngineConfig(engine="vllm", placement="dedicated", inference_gpus=[0], trainer_gpus=[0],
                        gpu_memory_utilization=util, trainer_memory_share=share, max_seq_length=8192)


def test_one_gpu_split_in_two_plans_each_side_against_its_own_share():
    plan = plan_memory(ModelConfig(lora=LORA16, engine=split_gpu(0.45, 0.5)), SHAPES["qwen2.5-7b"],
                       device_bytes=H200, train=TrainConfig(max_tokens_per_micro_batch=16384))
    # vLLM's share of the whole GPU, the trainer's phases against its own half, no vLLM term in them (never asleep)
    assert plan.fits and plan.vllm_share_bytes == int(0.45 * H200) and plan.device_bytes == int(0.5 * H200)
    assert not any(k.startswith("vLLM") for k in (*plan.rollout, *plan.training))
    assert plan.training_bytes < plan.device_bytes
    # the same run with the trainer given 15 %: training does not fit its share, whatever the GPU has free
    small = plan_memory(ModelConfig(lora=LORA16, engine=split_gpu(0.8, 0.15)), SHAPES["qwen2.5-7b"],
                        device_bytes=H200, train=TrainConfig(max_tokens_per_micro_batch=16384))
    assert not small.fits and small.device_bytes == int(0.15 * H200)
    assert any("training needs" in p and "(the trainer's share: trainer_memory_share 0.15 of the 139.8 GiB GPU)" in p
               for p in small.problems)
    assert any("TrainConfig.max_tokens_per_micro_batch <=" in s for s in small.suggestions)
    # too small even for the weights: raise the share
    tiny = plan_memory(ModelConfig(lora=LORA16, engine=split_gpu(0.9, 0.05)), SHAPES["qwen2.5-7b"],
                       device_bytes=H200)
    assert not tiny.fits and any("raise trainer_memory_share" in s for s in tiny.suggestions)
    # memory other processes hold counts beside both shares, not inside the trainer's
    used = plan_memory(ModelConfig(lora=LORA16, engine=split_gpu(0.45, 0.5)), SHAPES["qwen2.5-7b"],
                       device_bytes=H200, in_use_bytes=20 * GIB, train=TrainConfig(max_tokens_per_micro_batch=16384))
    assert used.rollout["in use by other processes"] == 0 and not used.fits
    (problem,) = used.problems
    assert "vLLM's share 62.9 GiB (gpu_memory_utilization 0.45) + the trainer's 69.9 GiB (trainer_memory_share " \
           "0.5) + 20.0 GiB other processes already use exceed the 139.8 GiB GPU" in problem
    assert plan_memory(ModelConfig(lora=LORA16, engine=split_gpu(0.45, 0.5)), SHAPES["qwen2.5-7b"],
                       device_bytes=H200, in_use_bytes=5 * GIB,
                       train=TrainConfig(max_tokens_per_micro_batch=16384)).fits


def _golden_cases() -> dict[str, tuple[str, ModelConfig, dict]]:
    """name -> (shape, ModelConfig, plan_memory's other arguments): colocated and split runs of the Qwen2.5 shapes
    that fit and that do not, each branch of the advice (utilisation window, offload, dedicated, sleep mode,
    checkpointing, micro-batch search, host memory, a split GPU), other engines and attention kernels."""
    mbt = TrainConfig(max_tokens_per_micro_batch=16384)
    seq8k = {"max_seq_length": 8192}

    def colocated(util: float, **kw) -> EngineConfig:
        return EngineConfig(gpu_memory_utilization=util, **{**seq8k, **kw})

    def dedicated(util: float, inference: list[int], **kw) -> EngineConfig:
        return EngineConfig(engine="vllm", placement="dedicated", inference_gpus=inference, trainer_gpus=[0],
                            gpu_memory_utilization=util, **{**seq8k, **kw})

    return {
        "7b colocated H200": ("qwen2.5-7b", ModelConfig(lora=LORA16, engine=colocated(0.45)),
                              {"device_bytes": H200, "train": mbt, "host_bytes": 200 * GIB}),
        "14b colocated H200": ("qwen2.5-14b", ModelConfig(lora=LORA16, engine=colocated(0.55)),
                               {"device_bytes": H200, "train": mbt, "in_use_bytes": 3 * GIB}),
        "32b colocated H200 refused": ("qwen2.5-32b", ModelConfig(lora=LORA16, engine=colocated(0.45)),
                                       {"device_bytes": H200, "train": mbt}),
        "32b colocated H100 two copies": ("qwen2.5-32b", ModelConfig(lora=LORA16, engine=colocated(0.5)),
                                          {"device_bytes": H100, "train": mbt}),
        "32b offloaded H200 host short": ("qwen2.5-32b", ModelConfig(lora=LORA16, offload_during_rollouts=True,
                                                                     engine=colocated(0.85)),
                                          {"device_bytes": H200, "train": mbt, "host_bytes": 100 * GIB}),
        "14b colocated host short": ("qwen2.5-14b", ModelConfig(lora=LORA16, engine=colocated(0.55)),
                                     {"device_bytes": H200, "train": mbt, "host_bytes": 20 * GIB}),
        "7b H100 no checkpointing": ("qwen2.5-7b", ModelConfig(lora=LORA16, gradient_checkpointing=False,
                                                               engine=colocated(0.45)),
                                     {"device_bytes": H100, "train": TrainConfig(max_tokens_per_micro_batch=8192)}),
        "7b H100 awake": ("qwen2.5-7b", ModelConfig(lora=LORA16, engine=colocated(0.7, enable_sleep_mode=False)),
                          {"device_bytes": H100, "train": mbt}),
        "7b long sequences": ("qwen2.5-7b", ModelConfig(engine=EngineConfig(max_seq_length=131072)),
                              {"device_bytes": H100, "train": TrainConfig(max_tokens_per_micro_batch=8192)}),
        "7b split fits": ("qwen2.5-7b", ModelConfig(lora=LORA16, engine=dedicated(0.45, [0], trainer_memory_share=0.5)),
                          {"device_bytes": H200, "train": mbt}),
        "7b split trainer short": ("qwen2.5-7b", ModelConfig(lora=LORA16,
                                                             engine=dedicated(0.8, [0], trainer_memory_share=0.15)),
                                   {"device_bytes": H200, "train": mbt}),
        "7b split weights short": ("qwen2.5-7b", ModelConfig(lora=LORA16,
                                                             engine=dedicated(0.9, [0], trainer_memory_share=0.05)),
                                   {"device_bytes": H200}),
        "7b split in use": ("qwen2.5-7b", ModelConfig(lora=LORA16, engine=dedicated(0.45, [0], trainer_memory_share=0.5)),
                            {"device_bytes": H200, "train": mbt, "in_use_bytes": 20 * GIB}),
        "32b dedicated tensor": ("qwen2.5-32b", ModelConfig(lora=LORA16, engine=dedicated(
            0.9, [1, 2], inference_parallel="tensor")), {"device_bytes": H200, "inference_device_bytes": H100}),
        "32b dedicated one H100": ("qwen2.5-32b", ModelConfig(lora=LORA16, engine=dedicated(0.9, [1])),
                                   {"device_bytes": H200, "inference_device_bytes": H100}),
        "32b dedicated one 40 GiB GPU": ("qwen2.5-32b", ModelConfig(lora=LORA16, engine=dedicated(0.95, [1])),
                                         {"device_bytes": H200, "inference_device_bytes": 40 * GIB}),
        "14b dedicated low share": ("qwen2.5-14b", ModelConfig(lora=LORA16, engine=dedicated(0.3, [1])),
                                    {"device_bytes": H100, "train": mbt}),
        "14b dedicated long context": ("qwen2.5-14b", ModelConfig(lora=LORA16, engine=dedicated(
            0.95, [1], max_model_len=1_000_000)), {"device_bytes": H100, "inference_device_bytes": 40 * GIB}),
        "32b dedicated trainer short": ("qwen2.5-32b", ModelConfig(lora=LORA16, engine=dedicated(0.9, [1])),
                                        {"device_bytes": 40 * GIB, "train": mbt}),
        "14b dedicated no pass fits": ("qwen2.5-14b", ModelConfig(lora=LORA16, engine=dedicated(0.9, [1])),
                                       {"device_bytes": 34 * GIB, "train": mbt}),
        "7b transformers eager": ("qwen2.5-7b", ModelConfig(engine=EngineConfig(engine="transformers")),
                                  {"device_bytes": H100, "attention": "eager", "margin": 0.2}),
        "7b flash attention": ("qwen2.5-7b", ModelConfig(lora=LORA16, engine=colocated(0.45)),
                               {"device_bytes": H100, "train": mbt, "attention": "flash_attention_2"}),
        "7b float32 beside bf16 vLLM": ("qwen2.5-7b", ModelConfig(lora=LORA16, dtype="float32", engine=colocated(
            0.45, vllm_args={"dtype": "bfloat16"})), {"device_bytes": H200, "train": mbt}),
        "tiny on the CPU": ("tiny", ModelConfig(), {"device_bytes": 2 * GIB, "cuda": False}),
    }


def test_plan_memory_gives_the_pinned_plans():
    """Every field of each case's plan (terms, numbers, problems and advice) as the planner gave them when this
    test was written (tests/memory_plan_golden.json): a change to the planner's results shows here."""
    import dataclasses
    import json

    golden = json.loads((Path(__file__).parent / "memory_plan_golden.json").read_text())
    cases = _golden_cases()
    assert sorted(golden) == sorted(cases)
    for name, (shape, config, kwargs) in cases.items():
        plan = plan_memory(config, SHAPES[shape], base=shape, **kwargs)
        assert dataclasses.asdict(plan) == golden[name], name


def test_on_the_cpu_checkpointing_turns_on_when_a_pass_would_not_fit_the_memory_available(caplog):
    """2026-12-07: `ruler distill --method grpo` on SmolLM2-135M (the default 8,192-token passes, no
    checkpointing on the CPU) was killed by the kernel at 24 GB. `gradient_checkpointing=None` on the CPU now
    means: on when the plan of one pass without it does not fit the memory available; a setting is kept."""
    from ruler_rl.trainer.backend import _cpu_checkpointing, resolve_base_model

    base = resolve_base_model(BASE)
    tight, roomy = {"host_gib": 4}, {"host_gib": 64}
    with caplog.at_level("WARNING", logger="ruler.trainer"):
        assert _cpu_checkpointing(ModelConfig(memory_check=tight), base, "transformers", "cpu") is True
    said = next(r.getMessage() for r in caplog.records if "gradient checkpointing on" in r.getMessage())
    assert "passes of up to 8192 tokens" in said and "more than the 3.2 GiB kept for them (80% of the 4.0 GiB" in said
    assert _cpu_checkpointing(ModelConfig(memory_check=roomy), base, "transformers", "cpu") is None
    # the plan is of the passes the run was told of: 2,048 tokens without checkpointing are planned at ~4.6 GiB,
    # 8,192 at ~22 GiB; a fifth of what is available is kept out (5.5 GiB: 4.4 for the pass, 6.5: 5.2)
    assert _cpu_checkpointing(ModelConfig(memory_check={"host_gib": 10}), base, "transformers", "cpu") is True
    for gib, on in ((5.5, True), (6.5, None)):
        short = ModelConfig(memory_check={"host_gib": gib, "max_tokens_per_micro_batch": 2048})
        assert _cpu_checkpointing(short, base, "transformers", "cpu") is on
    # with device_gib (what _check_memory then plans the CPU against), no more than it: 8 GiB of 64 available
    assert _cpu_checkpointing(ModelConfig(memory_check={**roomy, "device_gib": 8}), base, "transformers",
                              "cpu") is True
    for kept in (ModelConfig(memory_check=tight, gradient_checkpointing=False),
                 ModelConfig(memory_check=tight, gradient_checkpointing=True),
                 ModelConfig(memory_check={**tight, "enabled": False})):
        assert _cpu_checkpointing(kept, base, "transformers", "cpu") is None
    assert _cpu_checkpointing(ModelConfig(memory_check=tight), base, "transformers", "cuda:0") is None


@pytest.mark.slow
async def test_register_on_the_cpu_loads_the_model_with_checkpointing_when_memory_is_short(tmp_path):
    backend = LocalBackend(tmp_path)
    try:
        await TrainableModel("short", "p", BASE, ModelConfig(memory_check={"host_gib": 4})).register(backend)
        await TrainableModel("roomy", "p", BASE, ModelConfig(memory_check={"host_gib": 64})).register(backend)
        assert backend._runs["short"].peft_model.base_model.model.is_gradient_checkpointing
        assert not backend._runs["roomy"].peft_model.base_model.model.is_gradient_checkpointing
        assert backend._runs["short"].memory_plan is None  # the CPU is still not planned (nor refused)
    finally:
        await backend.close()
