"""What the training-pass parts (`activations`, `sharing`, `profile`) share: the bare model with the benchmark's
LoRA, their options checked, gradient checkpointing switched on, and a fresh CUDA peak before each pass."""

from __future__ import annotations

import time

from evals.scale_bench.shapes import LORA, SHAPES


def bare_model(args, part: str) -> dict:
    """What `activations` and `sharing` measure on: the shape's architecture with random weights (seed 0, SDPA)
    wrapped with the benchmark's LoRA, in bf16 on the GPU (float32 on the CPU with `--dry-run`), in train mode;
    and the fields every such part records. Gradient checkpointing is left to the part."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ruler_rl.trainer.config import LoRAConfig

    cuda = not args.dry_run
    if cuda and not torch.cuda.is_available():
        raise SystemExit(f"{part} measures CUDA memory: run it on a GPU, or --dry-run on the CPU")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    lora = LoRAConfig(rank=LORA["rank"], alpha=LORA["alpha"])
    fields = {"part": part, "shape": args.shape, "device": device, "dtype": str(dtype),
              "lora": {**LORA, "target_modules": lora.target_modules}, "dry_run": args.dry_run,
              "torch": torch.__version__, **({"gpu": torch.cuda.get_device_name(0)} if cuda else {})}
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**SHAPES[args.shape]), dtype=dtype,
                                              attn_implementation="sdpa")
    model = lora.wrap(hf, args.shape)
    model.train()
    fields["build_s"] = time.perf_counter() - started
    return {"cuda": cuda, "lora": lora, "hf": hf, "model": model, "fields": fields}


def checkpointing_settings(args) -> list[str]:
    """`--act-tokens` and `--act-checkpointing` checked (the `activations` and `profile` parts); the settings in
    the order they run, off first."""
    if not args.act_tokens or any(t < 16 for t in args.act_tokens):
        raise SystemExit("--act-tokens: comma-separated token counts, each >= 16")
    if not args.act_checkpointing or not set(args.act_checkpointing) <= {"off", "on"}:
        raise SystemExit("--act-checkpointing: off, on or off,on")
    return sorted(dict.fromkeys(args.act_checkpointing), key=("off", "on").index)


def enable_checkpointing(hf) -> None:
    """Gradient checkpointing on a `bare_model` as the backend has it (non-reentrant), its inputs requiring grad
    (the frozen embeddings' output feeds the checkpointed LoRA layers)."""
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    hf.enable_input_require_grads()


def fresh_peak(cuda: bool) -> int:
    """Before a measured pass: the allocator's cache emptied, the device synchronised and torch's peak reset;
    returns what is allocated now (0 without CUDA)."""
    if not cuda:
        return 0
    import torch

    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


