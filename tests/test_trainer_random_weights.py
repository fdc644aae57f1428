"""LocalBackend(random_weights=True), the benchmarks' and tests' route: a model folder with only config.json and
a tokenizer trains and serves on the CPU (transformers `from_config`), and vLLM's server is told to make its own
weights (`--load-format dummy`)."""

import pytest

from ruler_rl.trainer import EngineConfig, LocalBackend, LoRAConfig, ModelConfig, TrainableModel

pytestmark = pytest.mark.slow


def test_the_model_folder_holds_no_weights_and_its_ids_fit(tiny_dir):
    from transformers import AutoTokenizer

    from evals.scale_bench.shapes import SHAPES, make_model_dir

    assert not list(tiny_dir.glob("*.safetensors")) and (tiny_dir / "config.json").is_file()
    assert len(AutoTokenizer.from_pretrained(tiny_dir)) <= SHAPES["tiny"]["vocab_size"]
    with pytest.raises(ValueError, match="unknown shape"):
        make_model_dir("qwen9-1t", tiny_dir.parent / "x")


async def test_random_weights_build_from_the_config_train_and_serve(tiny_trainable, one_varied_step):
    model, backend = tiny_trainable
    await model.register(backend)
    try:
        base = backend._runs[model.name].peft_model.get_base_model()
        assert base.config.hidden_size == 32 and base.config.num_hidden_layers == 2
        row = await one_varied_step(model)  # served by the CPU server, then trained
        assert row["trained"] and row["step"] == 1 and row["grad_norm"] > 0
    finally:
        await backend.close()


def test_random_weights_start_vllm_with_dummy_weights_and_a_seeded_model(tiny_dir, tmp_path):
    import torch

    def load(random_weights, seed=0, name="v"):
        cfg = ModelConfig(seed=seed, lora=LoRAConfig(rank=8), engine=EngineConfig(engine="vllm",
                                                                                  vllm_args={"swap_space": 1}))
        return LocalBackend(tmp_path, random_weights=random_weights)._load(TrainableModel(name, "p", str(tiny_dir), cfg), tmp_path / name)

    a, b, c = load(True), load(True, name="w"), load(True, seed=1, name="x")
    argv = a.engine.command()
    assert argv[argv.index("--load-format") + 1] == "dummy" and "--swap-space" in argv
    def first(run):
        return run.peft_model.get_base_model().model.layers[0].mlp.up_proj.weight

    assert torch.equal(first(a), first(b)) and not torch.equal(first(a), first(c))  # built from `seed`
    with pytest.raises(OSError):  # without the option, the folder's missing weights are an error
        load(False, name="y")


def test_model_config_dtype_sets_the_trainers_weights_and_vllms_dtype(tiny_dir, tmp_path):
    import torch

    def load(dtype, name, engine="transformers", vllm_args=None):
        cfg = ModelConfig(dtype=dtype, lora=LoRAConfig(rank=4),
                          engine=EngineConfig(engine=engine, vllm_args=vllm_args or {}))
        return LocalBackend(tmp_path, random_weights=True)._load(TrainableModel(name, "p", str(tiny_dir), cfg), tmp_path / name)

    def weight(run):
        return run.peft_model.get_base_model().model.layers[0].mlp.up_proj.weight

    assert weight(load("auto", "a")).dtype == torch.float32  # the CPU's default
    assert weight(load("bfloat16", "b")).dtype == torch.bfloat16
    argv = load("bfloat16", "c", engine="vllm").engine.command()
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    run = load("float32", "d", engine="vllm", vllm_args={"dtype": "bfloat16"})  # vllm_args wins: fp32 beside bf16
    argv = run.engine.command()
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and weight(run).dtype == torch.float32
    assert "--dtype" not in load("auto", "e", engine="vllm").engine.command()
    for dtype, args in (("float32", None), ("auto", {"dtype": "float"})):  # vLLM's LoRA kernels refuse fp32
        with pytest.raises(ValueError, match="LoRA adapters in bfloat16/float16 only"):
            load(dtype, "f", engine="vllm", vllm_args=args)
    with pytest.raises(ValueError):
        ModelConfig(dtype="float8")

