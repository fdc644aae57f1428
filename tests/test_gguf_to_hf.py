"""evals.gguf_to_hf: a GGUF checkpoint as a plain Hugging Face folder that vLLM loads as any other.

On 2026-12-07 the SmolLM2 folder it wrote held its tied embedding only as `lm_head.weight`; vLLM skips that
name when the config ties the embeddings, so the served model had no input embedding and answered nothing
readable. These tests convert the real embedded GGUF and check the names and the values."""

from __future__ import annotations

import pytest

from evals.gguf_to_hf import convert, main
from ruler_rl.judges.embedded import gguf_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    return convert(gguf_path(), out, dtype="float32")


def test_every_tensor_under_its_checkpoint_name(converted):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    with safe_open(str(converted / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        embedding = f.get_tensor("model.embed_tokens.weight") if "model.embed_tokens.weight" in keys else None
    # the input embedding under its own name (what vLLM's Llama loader reads when the embeddings are tied)
    assert embedding is not None, sorted(k for k in keys if "embed" in k or "lm_head" in k)
    assert "lm_head.weight" not in keys  # tied: written once
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    assert model.config.tie_word_embeddings is True
    assert keys == {name for name, _ in model.named_parameters()}  # each parameter once, under its first name


def test_values_are_the_gguf_models(converted):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    quantized = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(converted)
    ids = tok("Which response follows the instruction better?", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        a, b = quantized(ids).logits, plain(ids).logits
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    # transformers would tie a lm_head-only file back together; a loader that reads the embedding's own name
    # (vLLM's) needs it in the file
    from safetensors import safe_open

    with safe_open(str(converted / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), quantized.get_input_embeddings().weight)


def test_the_folder_is_readable_by_others_as_the_umask_allows(converted):
    import os
    import stat

    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(converted.stat().st_mode) == 0o777 & ~umask
    for f in converted.iterdir():  # safetensors writes 0600 whatever the umask
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f.name


def test_refuses_what_it_cannot_convert_and_keeps_what_is_there(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):
        convert(not_gguf, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        convert(tmp_path / "missing.gguf", tmp_path / "out")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an empty folder"):
        convert(gguf_path(), taken)
    assert [p.name for p in taken.iterdir()] == ["notes.txt"] and (taken / "notes.txt").read_text() == "mine"
    for dtype in ("float7", "int8"):
        with pytest.raises(ValueError, match="unknown torch dtype"):
            convert(gguf_path(), tmp_path / "out2", dtype=dtype)
    assert not (tmp_path / "out2").exists()
    assert main([str(not_gguf), str(tmp_path / "out3")]) == 2
