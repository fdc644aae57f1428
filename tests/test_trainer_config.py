"""The trainer's configuration: every field documented where it is declared, options that the chosen setting
would ignore refused (TrainConfig) or warned about (EngineConfig), refused assignments leave the object as it was."""

import warnings

import pydantic
import pytest

from ruler_rl.trainer.config import _ENGINE_OWNED_FLAGS, EngineConfig, LoRAConfig, ModelConfig, TrainConfig


@pytest.mark.parametrize("cls", [TrainConfig, ModelConfig, EngineConfig, LoRAConfig])
def test_every_field_is_documented_with_its_default(cls):
    for name, info in cls.model_fields.items():
        text = info.description or ""
        assert len(text) > 40, f"{cls.__name__}.{name} has no real description"
        assert "Default" in text, f"{cls.__name__}.{name} does not state its default"


@pytest.mark.parametrize(("given", "needs"), [
    ({"epsilon_high": 0.3}, "loss='dapo'"),
    ({"loss": "grpo", "epsilon_high": 0.3}, "loss='dapo'"),
    ({"completion_budget": 512}, "loss='dr_grpo'"),
    ({"loss": "dapo", "completion_budget": 512}, "loss='dr_grpo'"),
    ({"sampler_cap": 3.0}, "sampler_correction='tis'"),
    ({"share_prefix": False, "min_shared_prefix": 8}, "share_prefix=True"),
])
def test_an_option_the_chosen_setting_ignores_is_refused(given, needs):
    with pytest.raises(pydantic.ValidationError, match=f"only acts with {needs}"):
        TrainConfig(**given)


def test_options_that_act_are_accepted_and_defaults_never_conflict():
    assert TrainConfig(loss="dapo", epsilon_high=0.3).epsilon_high == 0.3
    assert TrainConfig(loss="dr_grpo", completion_budget=512).completion_budget == 512
    assert TrainConfig(sampler_correction="tis", sampler_cap=3.0).sampler_cap == 3.0
    assert TrainConfig(min_shared_prefix=8).min_shared_prefix == 8
    for loss in ("grpo", "dr_grpo", "dapo"):
        TrainConfig(loss=loss, share_prefix=False)  # defaults of options that do not act are fine
        dumped = TrainConfig(loss=loss).model_dump()  # every field given, at its default: reloads
        assert TrainConfig.model_validate(dumped) == TrainConfig(loss=loss)
    assert TrainConfig(epsilon_high=0.28, sampler_cap=2.0).loss == "grpo"
    assert TrainConfig().scales_advantages() and not TrainConfig(loss="dr_grpo").scales_advantages()
    assert TrainConfig(loss="dr_grpo", scale_advantages=True).scales_advantages()
    with pytest.raises(pydantic.ValidationError, match="epsilon_high .* must be >= epsilon"):
        TrainConfig(loss="dapo", epsilon=0.3)


def test_a_refused_assignment_leaves_the_config_as_it_was():
    cfg = TrainConfig(loss="dapo", epsilon_high=0.3)
    with pytest.raises(pydantic.ValidationError, match="epsilon_high only acts"):
        cfg.loss = "grpo"
    assert cfg.loss == "dapo" and cfg.model_fields_set == {"loss", "epsilon_high"}
    with pytest.raises(pydantic.ValidationError):
        cfg.learning_rate = -1.0
    assert cfg.learning_rate == 5e-5
    cfg.learning_rate = 1e-4
    assert cfg.learning_rate == 1e-4 and "learning_rate" in cfg.model_fields_set
    with pytest.raises(pydantic.ValidationError, match="extra"):
        TrainConfig(micro_batch_size=4)  # micro-batches are by tokens: max_tokens_per_micro_batch


def test_vllm_only_options_warn_under_the_transformers_engine():
    with pytest.warns(UserWarning, match="gpu_memory_utilization, keep_adapters only act"):
        EngineConfig(engine="transformers", gpu_memory_utilization=0.3, keep_adapters=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EngineConfig(engine="vllm", gpu_memory_utilization=0.3)
        EngineConfig(engine="auto", gpu_memory_utilization=0.3)  # may resolve to vLLM
        EngineConfig(engine="transformers", max_seq_length=512)
        EngineConfig.model_validate(EngineConfig(engine="transformers").model_dump())


def test_vllm_args_may_not_set_what_the_engine_sets_itself(tmp_path):
    for key, where in (("max-model-len", "max_model_len"), ("--port", "free port"), ("enable_lora", "always on")):
        with pytest.raises(pydantic.ValidationError, match=where):
            EngineConfig(vllm_args={key: 1})
    assert EngineConfig(vllm_args={"swap_space": 8}).vllm_args == {"swap_space": 8}
    # every flag the vLLM engine writes is one the check knows about
    from ruler_rl.trainer.vllm_server import VLLMServer

    server = VLLMServer("some/model", EngineConfig(enforce_eager=True), served_name="m", lora_rank=8,
                        log_dir=tmp_path, chat_template_file=tmp_path / "t.jinja", tool_parser="hermes",
                        reasoning_parser="qwen3", port=8000)
    flags = {a[2:].replace("-", "_") for a in server.command() if a.startswith("--")}
    assert flags and flags <= set(_ENGINE_OWNED_FLAGS), flags - set(_ENGINE_OWNED_FLAGS)


def test_placement_is_configuration_and_bad_placements_are_refused_clearly():
    dedicated = EngineConfig(engine="vllm", placement="dedicated", inference_gpus=[1, 2], trainer_gpus=[0],
                             inference_parallel="data")
    assert (dedicated.inference_gpus, dedicated.trainer_gpus) == ([1, 2], [0])
    assert EngineConfig(engine="transformers", placement="dedicated").inference_gpus == []  # the CPU child form
    assert EngineConfig.model_validate(dedicated.model_dump()) == dedicated
    for given, error in (
            ({"engine": "vllm", "placement": "dedicated", "inference_gpus": [0, 1], "trainer_gpus": [1]},
             r"GPU\(s\) \[1\] are in both inference_gpus and trainer_gpus"),
            ({"engine": "vllm", "placement": "dedicated", "inference_gpus": [1]}, "needs both inference_gpus and"),
            ({"engine": "vllm", "placement": "dedicated"}, "needs both inference_gpus and trainer_gpus"),
            ({"engine": "transformers", "placement": "dedicated", "inference_gpus": [1], "trainer_gpus": [0]},
             "needs the vLLM engine"),
            ({"placement": "dedicated", "trainer_gpus": [0]}, "give both inference_gpus and trainer_gpus, or neither"),
            ({"inference_gpus": [1], "trainer_gpus": [0]}, "only act with placement='dedicated'"),
            ({"placement": "dedicated", "inference_gpus": [1, 1], "trainer_gpus": [0]}, "listed twice"),
            ({"placement": "dedicated", "inference_gpus": [-1], "trainer_gpus": [0]}, "ints >= 0"),
            ({"placement": "split"}, "colocated"),
            ({"vllm_args": {"tensor_parallel_size": 2}}, "inference_gpus with inference_parallel='tensor'")):
        with pytest.raises(pydantic.ValidationError, match=error):
            EngineConfig(**given)


def test_training_on_stale_rollouts_needs_the_sampler_correction():
    with pytest.raises(pydantic.ValidationError, match="max_off_policy_steps=1 .* set sampler_correction='tis'"):
        TrainConfig(max_off_policy_steps=1)
    with pytest.raises(pydantic.ValidationError):
        TrainConfig(max_off_policy_steps=-1)
    assert TrainConfig(max_off_policy_steps=1, sampler_correction="tis").max_off_policy_steps == 1
    assert TrainConfig().max_off_policy_steps == 0


def test_one_gpu_split_in_two_needs_both_shares_given_and_within_the_gpu():
    split = {"engine": "vllm", "placement": "dedicated", "inference_gpus": [0], "trainer_gpus": [0]}
    cfg = EngineConfig(**split, gpu_memory_utilization=0.45, trainer_memory_share=0.5)
    assert cfg.shares_gpu and EngineConfig.model_validate(cfg.model_dump()) == cfg
    assert EngineConfig(**split, gpu_memory_utilization=0.5, trainer_memory_share=0.5).shares_gpu  # exactly all
    assert not EngineConfig(engine="vllm", placement="dedicated", inference_gpus=[1], trainer_gpus=[0]).shares_gpu
    for given in ({}, {"trainer_memory_share": 0.5}, {"gpu_memory_utilization": 0.4}):
        with pytest.raises(pydantic.ValidationError, match=r"one GPU split in two \(inference_gpus == trainer_gpus "
                                                           r"== \[0\]\) needs both memory shares given"):
            EngineConfig(**split, **given)
    with pytest.raises(pydantic.ValidationError, match="gpu_memory_utilization 0.6 \\+ trainer_memory_share 0.5 = "
                                                       "1.1 is more than the whole GPU"):
        EngineConfig(**split, gpu_memory_utilization=0.6, trainer_memory_share=0.5)
    for bad in ({"inference_gpus": [0, 1], "trainer_gpus": [0]}, {"inference_gpus": [0, 1], "trainer_gpus": [0, 1]}):
        with pytest.raises(pydantic.ValidationError, match="dedicated devices are disjoint, or exactly one GPU is "
                                                           "split in two"):
            EngineConfig(engine="vllm", placement="dedicated", gpu_memory_utilization=0.4, trainer_memory_share=0.5,
                         **bad)
    with pytest.raises(pydantic.ValidationError, match="trainer_memory_share only acts when inference and trainer "
                                                       "share one GPU"):
        EngineConfig(engine="vllm", placement="dedicated", inference_gpus=[1], trainer_gpus=[0],
                     trainer_memory_share=0.5)
    with pytest.raises(pydantic.ValidationError, match="trainer_memory_share only acts with placement='dedicated'"):
        EngineConfig(trainer_memory_share=0.5)
    for share in (0, 1, 1.5):
        with pytest.raises(pydantic.ValidationError, match="trainer_memory_share"):
            EngineConfig(**split, gpu_memory_utilization=0.4, trainer_memory_share=share)
    with pytest.raises(pydantic.ValidationError, match="GPU lists need|needs the vLLM engine"):
        EngineConfig(**{**split, "engine": "transformers"}, trainer_memory_share=0.5)
    # a refused assignment leaves the shares as they were
    with pytest.raises(pydantic.ValidationError, match="more than the whole GPU"):
        cfg.trainer_memory_share = 0.9
    assert cfg.trainer_memory_share == 0.5


def test_one_gpu_split_in_two_is_refused_at_register_without_a_gpu(tmp_path):
    """On a machine without CUDA the shared placement fails at register naming the missing GPU (vLLM needs one);
    the placement's own rules are checked before anything loads."""
    import asyncio

    from ruler_rl.trainer import LocalBackend, ModelConfig, TrainableModel

    cfg = ModelConfig(engine=EngineConfig(engine="vllm", placement="dedicated", inference_gpus=[0], trainer_gpus=[0],
                                          gpu_memory_utilization=0.45, trainer_memory_share=0.5))
    model = TrainableModel("split", "p", "local/smollm2-135m-instruct", cfg)
    with pytest.raises(ValueError, match="needs the vLLM engine|no CUDA GPU is visible"):
        asyncio.run(model.register(LocalBackend(tmp_path)))


def test_random_weights_is_no_field_of_the_training_configuration():
    """Benchmarks and tests build random weights through `LocalBackend(random_weights=True)`; a ModelConfig
    asking for them is refused naming the field."""
    assert "random_weights" not in ModelConfig.model_fields
    with pytest.raises(pydantic.ValidationError, match="random_weights\n  Extra inputs are not permitted"):
        ModelConfig(random_weights=True)
