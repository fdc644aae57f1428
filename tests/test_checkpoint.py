"""ruler_rl.judges.checkpoint: a model folder whose checkpoint lacks a parameter is refused before vLLM, which
would serve it uninitialized without a warning, loads it (what happened to SmolLM2 on 2026-12-07)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from ruler_rl.judges.checkpoint import CheckpointError, check_checkpoint, missing_parameters

pytest.importorskip("transformers")


def _tiny_llama(folder, tie: bool = True):
    """A real (tiny, random) Llama written by save_pretrained: the names every loader expects."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tie)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def _rename(folder, mapping):
    """Rewrite folder's checkpoint with each key renamed by `mapping` (a function)."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    save_file({mapping(k): v for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


@pytest.fixture
def good(tmp_path):
    return _tiny_llama(tmp_path / "good")


@pytest.fixture
def embedding_as_lm_head(tmp_path):
    """The 2026-12-07 folder: the tied embedding written only as lm_head.weight."""
    folder = _tiny_llama(tmp_path / "bad")
    _rename(folder, lambda k: "lm_head.weight" if k == "model.embed_tokens.weight" else k)
    return folder


def test_a_complete_checkpoint_passes(good, tmp_path):
    assert missing_parameters(good) == []
    check_checkpoint(good)
    untied = _tiny_llama(tmp_path / "untied", tie=False)  # both embeddings, both held
    assert missing_parameters(untied) == []


def test_the_tied_embedding_under_the_output_name_is_refused(embedding_as_lm_head):
    assert missing_parameters(embedding_as_lm_head) == ["model.embed_tokens.weight"]
    with pytest.raises(CheckpointError, match=r"lacks 1 parameter\(s\).*model\.embed_tokens\.weight"):
        check_checkpoint(embedding_as_lm_head)


def test_a_dropped_layer_is_named(good):
    _rename(good, lambda k: "dropped" if k == "model.layers.1.post_attention_layernorm.weight" else k)
    assert missing_parameters(good) == ["model.layers.1.post_attention_layernorm.weight"]


def test_what_it_cannot_read_is_not_refused(good, tmp_path):
    assert missing_parameters("some-org/some-model") == []  # a hub id: not a folder
    assert missing_parameters(tmp_path) == []  # no config.json
    (good / "model.safetensors").rename(good / "model.bin.away")
    assert missing_parameters(good) == []  # no safetensors
    other = _tiny_llama(tmp_path / "other")
    _rename(other, lambda k: "transformer." + k)  # another naming scheme, which loaders map themselves
    assert missing_parameters(other) == []


def test_valid_folders_of_other_shapes_pass(tmp_path):
    """What the check must not refuse: a MoE written by save_pretrained (per-expert names on disk, fused experts
    in transformers' modules), a classification head without lm_head, an architecture transformers does not
    know, remote code (never run, never prompted for)."""
    import json

    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification, MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    moe = tmp_path / "moe"
    MixtralForCausalLM(MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2)).save_pretrained(moe)
    assert missing_parameters(moe) == []
    classifier = tmp_path / "classifier"
    LlamaForSequenceClassification(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                               num_labels=1, tie_word_embeddings=False)).save_pretrained(classifier)
    assert missing_parameters(classifier) == []
    for name, change in (("unknown", {"model_type": "no_such_model", "architectures": ["NoSuchModelForCausalLM"]}),
                         ("remote", {"auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"},
                                     "model_type": "x_custom", "architectures": ["XForCausalLM"]})):
        folder = _tiny_llama(tmp_path / name)
        _rename(folder, lambda k: "lm_head.weight" if k == "model.embed_tokens.weight" else k)  # broken, too
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        assert missing_parameters(folder) == []  # nothing to compare with: not refused, and no exception
        check_checkpoint(folder)


def test_a_quantized_checkpoint_counts_a_modules_packed_tensors_and_still_names_a_missing_one(tmp_path):
    """GPTQ-style: each linear's weight held as qweight/scales, the embedding and norms as they are."""
    import json

    def gptq_style(folder, drop=()):
        _rename(folder, lambda k: k.replace("proj.weight", "proj.qweight"))
        from safetensors.torch import load_file, save_file

        tensors = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if k not in drop}
        tensors.update({k.replace("qweight", "scales"): v[:1].clone() for k, v in tensors.items() if k.endswith("qweight")})
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 16}
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    assert missing_parameters(gptq_style(_tiny_llama(tmp_path / "q"))) == []
    broken = gptq_style(_tiny_llama(tmp_path / "q-broken"), drop=("model.embed_tokens.weight",))
    assert missing_parameters(broken) == ["model.embed_tokens.weight"]


def test_load_formats_that_do_not_read_the_checkpoint_are_not_checked(embedding_as_lm_head):
    check_checkpoint(embedding_as_lm_head, "dummy")
    for load_format in (None, "auto", "safetensors"):
        with pytest.raises(CheckpointError):
            check_checkpoint(embedding_as_lm_head, load_format)


def test_the_trainers_vllm_server_refuses_it_before_starting(embedding_as_lm_head, tmp_path):
    from ruler_rl.trainer.config import EngineConfig
    from ruler_rl.trainer.vllm_server import VLLMServer

    def server(**vllm_args):
        return VLLMServer(str(embedding_as_lm_head), EngineConfig(vllm_args=vllm_args), served_name="m",
                          lora_rank=8, log_dir=tmp_path / "logs", chat_template_file=None, tool_parser="hermes",
                          reasoning_parser=None)

    s = server()
    with pytest.raises(CheckpointError, match="model.embed_tokens.weight"):
        asyncio.run(s.start())
    assert s.proc is None  # nothing started
    if importlib.util.find_spec("vllm") is None:  # vLLM's own random weights need no checkpoint: not checked
        for key in ("load_format", "--load-format"):
            with pytest.raises(RuntimeError, match="needs vLLM"):
                asyncio.run(server(**{key: "dummy"}).start())


def test_the_in_process_judge_and_the_distill_bench_refuse_it(embedding_as_lm_head, tmp_path):
    from evals.distill_bench import _vllm_server
    from ruler_rl.judges.vllm_engine import VLLMEngineLLM

    with pytest.raises(CheckpointError, match="model.embed_tokens.weight"):
        asyncio.run(VLLMEngineLLM()._engine(str(embedding_as_lm_head)))
    bench = _vllm_server(str(embedding_as_lm_head), tmp_path / "logs", 0, 8, 0.3, 60.0, True)
    with pytest.raises(CheckpointError, match="model.embed_tokens.weight"):
        asyncio.run(bench.start())
    assert bench.proc is None


def test_gpu_judge_meta_refuses_it_before_starting(embedding_as_lm_head, tmp_path):
    from evals.gpu_judge_meta import main

    with pytest.raises(CheckpointError, match="model.embed_tokens.weight"):
        main(["--model", str(embedding_as_lm_head), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "vllm.log").exists()
    with pytest.raises(CheckpointError, match="model.embed_tokens.weight"):  # before any judgment, not inside one
        main(["--model", str(embedding_as_lm_head), "--out", str(tmp_path / "out2"), "--engine", "in-process"])
