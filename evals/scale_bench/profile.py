"""`profile`: where a training pass's time goes, one causal sequence against packed ones, by kernel kind."""

from __future__ import annotations

import itertools
import json
import random
import statistics
import time

from evals.scale_bench.ours import AUTOCAST_SETTINGS
from evals.scale_bench.passes import bare_model, checkpointing_settings, enable_checkpointing
from evals.scale_bench.shapes import SHAPES
from evals.scale_bench.workloads import Budget

# kernel (GPU) or operator (CPU) names by kind, for the profile part's split of a pass's time
_MATMUL_NAMES = ("gemm", "gemv", "splitkreduce", "nvjet", "cublas", "cutlass", "xmma", "aten::mm", "aten::addmm",
                 "aten::bmm", "aten::matmul", "aten::linear")
_ATTENTION_NAMES = ("flash", "fmha", "attention", "mem_eff", "efficient_attention", "sdpa")


def time_by_kind(events: list[tuple[str, float]]) -> dict:
    """(name, seconds) pairs as seconds per kind: `attention` (a name with flash/fmha/attention/mem_eff/sdpa),
    `matmul` (gemm/gemv/split-K/cuBLAS/cutlass kernels, aten mm/addmm/bmm/matmul/linear), `other` (elementwise,
    reductions, copies, norms, softmax, ...); names matched case-insensitively, attention first (its kernels hold
    'gemm' parts)."""
    kinds = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for name, seconds in events:
        if not isinstance(name, str) or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"events are (name, seconds) pairs, got {(name, seconds)!r}")
        low = name.lower()
        kind = "attention" if any(k in low for k in _ATTENTION_NAMES) else \
            "matmul" if any(k in low for k in _MATMUL_NAMES) else "other"
        kinds[kind] += float(seconds)
    return kinds


def profile(args) -> dict:
    """Where one training pass's time goes (#12): for each `--act-tokens` T, `--prof-sequences` k and
    `--act-checkpointing` setting, one row of T random tokens made of k sequences of T/k tokens (k = 1: one causal
    sequence, no mask; k > 1: packed, per `--prof-attention` with the trainer's 4-D block mask or as one SDPA call
    per block, `ruler_rl.trainer.attention`; with `--prof-prefix` P the k sequences share their first P tokens, computed
    once, and the rest is split among them) through the trainer's `accumulate_loss`
    (forward and backward, LoRA r16 on all seven linear layers, chunked logprobs; no optimizer step). A warm-up
    pass, then `--prof-reps` timed passes (median seconds, tokens/s), then one pass under torch.profiler: the
    device time by kind (`time_by_kind`: matrix multiplies, attention, the rest), what the device was busy for
    against the pass's wall time, and the 15 kernels with the most device time. `profile-<shape>.json`. With
    `--dry-run` (the tiny shape, fp32 on the CPU) the operators' CPU self time stands in for kernels: a check of
    the script, no measurement."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from ruler_rl.trainer import attention as block_attention
    from ruler_rl.trainer.config import TrainConfig
    from ruler_rl.trainer.memory import model_shape
    from ruler_rl.trainer.sequences import TrainingSequence
    from ruler_rl.trainer.training import accumulate_loss

    settings = checkpointing_settings(args)
    if not args.prof_sequences or any(k < 1 for k in args.prof_sequences) or args.prof_reps < 1:
        raise SystemExit("--prof-sequences: comma-separated counts >= 1; --prof-reps >= 1")
    if not args.prof_attention or not set(args.prof_attention) <= {"mask", "blocks"}:
        raise SystemExit("--prof-attention: mask, blocks or mask,blocks")
    if args.prof_prefix < 0:
        raise SystemExit("--prof-prefix: tokens >= 0")
    modes = sorted(dict.fromkeys(args.prof_attention), key=("mask", "blocks").index)
    built = bare_model(args, "profile")
    cuda, hf, model = built["cuda"], built["hf"], built["model"]
    shape = model_shape(SHAPES[args.shape])
    budget = Budget(args.budget_s - args.reserve_s)
    path = args.out / f"profile-{args.shape}.json"
    result: dict = {**built["fields"], "runs": [], "errors": []}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def one_pass(seqs, config) -> tuple[float, dict]:
        t0 = time.perf_counter()
        try:
            loss, stats = accumulate_loss(model, seqs, config)
            stats = {**stats, "loss": loss}
            if cuda:
                torch.cuda.synchronize()
        finally:
            model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, stats

    checkpointed = False
    counts = sorted(dict.fromkeys(args.prof_sequences))
    autocasts = [False, True] if args.lora_autocast == "alternate" else [AUTOCAST_SETTINGS[args.lora_autocast]]
    for ckpt, tokens, k, mode, autocast in itertools.product(settings, sorted(args.act_tokens), counts, modes,
                                                             autocasts):
        if budget.left() <= 0:
            result["errors"].append(f"{tokens} tokens x {k} ({mode}), checkpointing {ckpt} and after: not started, "
                                    "budget")
            break
        if ckpt == "on" and not checkpointed:  # the settings run off first
            enable_checkpointing(hf)
            checkpointed = True
        if k == 1 and mode == "blocks":  # one sequence: no mask either way (the model's own causal kernel)
            continue
        if mode == "blocks":
            block_attention.enable(hf)
        else:
            hf.set_attn_implementation("sdpa")
        shared = args.prof_prefix if k > 1 else 0
        each = (tokens - shared) // k  # a row: the shared prefix once, then k suffixes
        if each < 2:
            result["errors"].append(f"{tokens} tokens cannot be a {shared}-token prefix and {k} sequences of 2+")
            continue
        rng = random.Random(f"{tokens} {k}")  # the same tokens for the mask and the blocks: the same loss
        prefix = [rng.randrange(shape.vocab) for _ in range(shared)]
        seqs = [TrainingSequence(token_ids=prefix + [rng.randrange(shape.vocab) for _ in range(each)],
                                 trained=[False] + [True] * (shared + each - 1), old_logprobs=[0.0] * (shared + each),
                                 advantage=1.0, trajectory=j, group=0 if shared else j, position=0)
                 for j in range(k)]
        config = TrainConfig(max_tokens_per_micro_batch=shared + each * k, share_prefix=bool(shared),
                             lora_autocast=autocast,
                             **({"min_shared_prefix": min(shared, 32)} if shared else {}))
        run = {"tokens": shared + each * k, "sequences": k, "shared_prefix": shared, "attention": mode,
               "checkpointing": ckpt == "on", "lora_autocast_setting": autocast}
        try:
            run["warmup_s"], stats = one_pass(seqs, config)
            times = [one_pass(seqs, config)[0] for _ in range(args.prof_reps)]
            with torch_profile(activities=activities) as prof:
                profiled, _ = one_pass(seqs, config)
        except torch.OutOfMemoryError as exc:
            result["errors"].append(f"{tokens} x {k}, checkpointing {ckpt}: out of memory ({exc})"[:500])
            continue
        # rows_as_blocks: what the trainer gave each row (blocks only where their copies fit the mask's memory)
        run.update(rows=stats["rows"], rows_as_blocks=stats["block_rows"], forward_tokens=stats["forward_tokens"],
                   loss=stats["loss"], lora_autocast=stats["lora_autocast"])
        events = []
        for e in prof.key_averages():
            if cuda:  # kernels: the device's own time; operators' rows would count it twice
                device = getattr(e, "self_device_time_total", None)
                if device is None:
                    device = getattr(e, "self_cuda_time_total", 0.0)
                if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and device > 0:
                    events.append((e.key, device / 1e6, e.count))
            elif e.key.startswith("aten::") and e.self_cpu_time_total > 0:
                events.append((e.key, e.self_cpu_time_total / 1e6, e.count))
        busy = sum(sec for _, sec, _ in events)
        run.update(s=statistics.median(times), s_runs=times, tokens_per_s=run["tokens"] / statistics.median(times),
                   profiled_s=profiled, device_busy_s=busy, busy_fraction=busy / profiled if profiled else None,
                   by_kind_s=time_by_kind([(n, sec) for n, sec, _ in events]),
                   top=[{"name": n[:120], "s": sec, "calls": c}
                        for n, sec, c in sorted(events, key=lambda x: -x[1])[:15]])
        result["runs"].append(run)
        path.write_text(json.dumps(result, indent=1))
        print(json.dumps({kk: v for kk, v in run.items() if kk != "top"}), flush=True)
    path.write_text(json.dumps(result, indent=1))
    return result


