"""Model folders as vLLM, transformers and peft load them: GGUF weights turned into one
(`dequantize_gguf`), and a check that a folder's checkpoint holds every parameter of its architecture
(`missing_parameters`, `check_checkpoint`).

The check exists because vLLM does not make it: vLLM 0.24's loader counts every parameter of a layer that has a
quantization method, the unquantized default included, as loaded whether or not the checkpoint held it, so a
folder without its embedding serves garbage without a warning (SmolLM2 written with its tied embedding named
only `lm_head.weight`, which vLLM skips when the embeddings are tied: 2026-12-07).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class CheckpointError(ValueError):
    """A model folder whose checkpoint lacks parameters its architecture has."""


def dequantize_gguf(gguf: str | os.PathLike, target: str | os.PathLike, dtype: str = "float32") -> Path:
    """De-quantize the GGUF checkpoint `gguf` into a plain Hugging Face folder at `target` (config, safetensors,
    generation config, tokenizer), written atomically: a temporary folder beside `target`, renamed onto it, so a
    failure leaves no half-written model (`target` must not exist or be empty). The weights are rebuilt in a plain
    model (`from_config`) and written by `save_pretrained`, so the folder names every tensor as a Hugging Face
    checkpoint does: a tied output embedding (SmolLM2's `lm_head.weight`) appears once, as the input embedding.
    vLLM, transformers and peft load it as any other checkpoint. Returns `target`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, target = Path(gguf), Path(target)
    if not gguf.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf}")
    with open(gguf, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{gguf} is not a GGUF file (its first bytes are not 'GGUF')")
    torch_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype!r}")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists and is not an empty folder; give a new or empty one")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch_dtype)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    plain.load_state_dict(quantized.state_dict())
    del quantized
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: keep theirs
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def missing_parameters(folder: str | os.PathLike) -> list[str]:
    """The parameters of `folder`'s architecture (its `config.json`, built on the meta device: no memory) that its
    safetensors files do not hold, each under the name `named_parameters` gives it (a tied output embedding counts
    once, under the input embedding's name, as `save_pretrained` writes it). Empty when nothing is missing, and
    when there is nothing this check can read: no `config.json` (a hub id, an adapter folder), no `*.safetensors`
    (a `.bin` checkpoint), or checkpoint names that share fewer than half of the architecture's (another naming
    scheme, which the loaders map themselves)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    if not folder.is_dir() or not (folder / "config.json").is_file():
        return []
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return []
    held: set[str] = set()
    for f in files:
        with safe_open(str(f), "pt") as h:
            held.update(h.keys())
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = {name for name, _ in model.named_parameters()}
    if len(expected & held) * 2 < len(expected):
        return []
    return sorted(expected - held)


def check_checkpoint(folder: str | os.PathLike) -> None:
    """Raise `CheckpointError` naming what `folder`'s checkpoint lacks (`missing_parameters`); call it before a
    server that would not notice (vLLM) loads the folder."""
    missing = missing_parameters(folder)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise CheckpointError(
            f"{folder}: the checkpoint lacks {len(missing)} parameter(s) of its architecture ({shown}); vLLM would "
            "serve them uninitialized without a warning. Write the folder with save_pretrained (or "
            "ruler_rl.judges.checkpoint.dequantize_gguf for a GGUF file)"
        )
