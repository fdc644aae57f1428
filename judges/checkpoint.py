"""Model folders as vLLM, transformers and peft load them: GGUF weights turned into one
(`dequantize_gguf`), and a check that a folder's checkpoint holds every parameter of its architecture
(`missing_parameters`, `check_checkpoint`).

The check exists because vLLM does not make it: vLLM 0.24's loader counts every parameter of a layer that has a
quantization method, the unquantized default included, as loaded whether or not the checkpoint held it, so a
folder without its embedding serves garbage without a warning (SmolLM2 written with its tied embedding named
only `lm_head.weight`, which vLLM skips when the embeddings are tied: 2026-12-07).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A model folder whose checkpoint lacks parameters its architecture has."""


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def dequantize_gguf(gguf: str | os.PathLike, target: str | os.PathLike, dtype: str = "float32") -> Path:
    """De-quantize the GGUF checkpoint `gguf` into a plain Hugging Face folder at `target` (config, safetensors,
    generation config, tokenizer), written atomically: a temporary folder beside `target`, renamed onto it, so a
    failure leaves no half-written model (`target` must not exist or be empty). The weights are rebuilt in a plain
    model (`from_config`) and written by `save_pretrained`, so the folder names every tensor as a Hugging Face
    checkpoint does: a tied output embedding (SmolLM2's `lm_head.weight`) appears once, as the input embedding.
    vLLM, transformers and peft load it as any other checkpoint, readable by other users as the umask allows.
    Returns `target`; when another process wrote a model there first, its folder is kept and returned. `dtype`:
    float32, bfloat16 or float16."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, target = Path(gguf), Path(target)
    if not gguf.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf}")
    with open(gguf, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{gguf} is not a GGUF file (its first bytes are not 'GGUF')")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unknown torch dtype {dtype!r}: give float32, bfloat16 or float16")
    torch_dtype = getattr(torch, dtype)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists and is not an empty folder; give a new or empty one")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch_dtype)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):  # no second random copy: the dequantized tensors are taken over as they are
        plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    plain.load_state_dict(quantized.state_dict(), assign=True)
    plain.tie_weights()
    del quantized
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # mkdtemp's 0700 folder and safetensors' 0600 files would hide the model from a server running as another user
        umask = _umask()
        os.chmod(tmp, 0o777 & ~umask)
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~umask)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: keep theirs
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


CHECKED_LOAD_FORMATS = (None, "auto", "safetensors", "fastsafetensors")
"""vLLM load formats that read a folder's `*.safetensors` under the checkpoint's names: the only ones checked."""


def _held_names(folder: Path) -> set[str]:
    """The tensor names `folder`'s checkpoint holds: its index's `weight_map` when it has one (the files vLLM reads
    too), else every `*.safetensors` file's."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    held: set[str] = set()
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            held.update(h.keys())
    return held


def missing_parameters(folder: str | os.PathLike) -> list[str]:
    """The parameters of `folder`'s architecture that its safetensors checkpoint does not hold, each under the name
    `named_parameters` gives it (a tied output embedding counts once, under the input embedding's name, as
    `save_pretrained` writes it). The architecture is the class `config.json`'s `architectures` names, built on
    the meta device (no memory); the checkpoint's names go through transformers' own loading renames first (fused
    MoE experts, multimodal prefixes), and in a quantized checkpoint (`quantization_config`) a module's tensors
    under any name (`qweight`, `weight_packed`, ...) count for its weight.

    A guard, never a gate: empty when nothing is missing and whenever there is nothing it can compare: not a
    folder or no `config.json` (a hub id, an adapter folder), no `*.safetensors`, remote code (`auto_map`: never
    run here), an architecture transformers lacks, names sharing fewer than half of the architecture's (another
    naming scheme), or any failure of the check itself (logged as a warning)."""
    folder = Path(folder)
    if not folder.is_dir() or not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        return []
    try:
        if "auto_map" in json.loads((folder / "config.json").read_text()):
            return []
        import torch
        import transformers

        held = _held_names(folder)
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        arch = (getattr(config, "architectures", None) or [None])[0]
        cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
        if cls is None:
            return []
        with torch.device("meta"):  # float32, torch's default: building under the config's dtype would set the
            model = cls._from_config(config, dtype=torch.float32)  # process-wide default dtype for the while
        try:  # transformers' checkpoint -> module renaming, as from_pretrained applies it (semi-internal API)
            from transformers.conversion_mapping import get_model_conversion_mapping
            from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

            mapping = get_model_conversion_mapping(model)
            renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
            converters = [m for m in mapping if isinstance(m, WeightConverter)]
            state = model.state_dict()
            held = {rename_source_key(k, renamings, converters, model.base_model_prefix, state)[0] for k in held}
        except Exception:  # a transformers without this API: the names as they are
            pass
        expected = {name for name, _ in model.named_parameters()}
        covered = expected & held
        if getattr(config, "quantization_config", None):  # a module held under any tensor names covers its own
            modules = {k.rsplit(".", 1)[0] for k in held}
            covered |= {n for n in expected if n.rsplit(".", 1)[0] in modules}
        if len(covered) * 2 < len(expected):
            return []
        return sorted(expected - covered)
    except Exception as exc:
        log.warning("checkpoint check of %s skipped: %s: %s", folder, type(exc).__name__, exc)
        return []


def check_checkpoint(folder: str | os.PathLike, load_format: str | None = None) -> None:
    """Raise `CheckpointError` naming what `folder`'s checkpoint lacks (`missing_parameters`); call it before a
    server that would not notice (vLLM) loads the folder with `load_format` (vLLM's; only the formats that read the
    checkpoint's own names, `CHECKED_LOAD_FORMATS`, are checked: `dummy` needs no checkpoint)."""
    if load_format not in CHECKED_LOAD_FORMATS:
        return
    missing = missing_parameters(folder)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise CheckpointError(
            f"{folder}: the checkpoint lacks {len(missing)} parameter(s) of its architecture ({shown}); vLLM would "
            "serve them uninitialized without a warning. Write the folder with save_pretrained (or "
            "ruler_rl.judges.checkpoint.dequantize_gguf for a GGUF file)"
        )
