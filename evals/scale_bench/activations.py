"""`activations`: one training pass's peak activation memory, measured, beside the memory planner's figure."""

from __future__ import annotations

import json
import random
import time

from evals.scale_bench.passes import bare_model, checkpointing_settings, enable_checkpointing, fresh_peak
from evals.scale_bench.shapes import SHAPES
from evals.scale_bench.workloads import Budget


def activations(args) -> dict:
    """One training pass's peak activation memory per (tokens, checkpointing), measured and planned."""
    import torch

    from ruler_rl.trainer.config import TrainConfig
    from ruler_rl.trainer.memory import GIB, activation_bytes, model_shape
    from ruler_rl.trainer.sequences import TrainingSequence
    from ruler_rl.trainer.training import accumulate_loss

    settings = checkpointing_settings(args)
    built = bare_model(args, "activations")
    cuda, lora, hf, model = built["cuda"], built["lora"], built["hf"], built["model"]
    budget = Budget(args.budget_s - args.reserve_s)
    shape = model_shape(SHAPES[args.shape])
    path = args.out / f"activations-{args.shape}.json"
    result: dict = {**built["fields"], "runs": [], "errors": []}
    rng = random.Random(0)
    for ckpt in settings:  # off first
        if ckpt == "on":
            enable_checkpointing(hf)
        for tokens in sorted(args.act_tokens):
            planned = activation_bytes(shape, tokens, checkpointing=ckpt == "on", targets=lora.target_modules,
                                       dtype_bytes=2 if cuda else 4)
            run = {"tokens": tokens, "checkpointing": ckpt == "on", "planned_gib": planned / GIB}
            if budget.left() <= 0:
                result["errors"].append(f"{tokens} tokens, checkpointing {ckpt}: not started, --budget-s spent")
                break
            seq = TrainingSequence(token_ids=[rng.randrange(shape.vocab) for _ in range(tokens)],
                                   trained=[False] + [True] * (tokens - 1), old_logprobs=[0.0] * tokens,
                                   advantage=1.0)
            config = TrainConfig(max_tokens_per_micro_batch=tokens, share_prefix=False)
            before = fresh_peak(cuda)
            started = time.perf_counter()
            try:
                _, stats = accumulate_loss(model, [seq], config)
                run.update(rows=stats["rows"], trained_tokens=stats["trained_tokens"])
                if not any(p.grad is not None for p in model.parameters() if p.requires_grad):
                    raise RuntimeError("the pass left no LoRA gradient")
                if cuda:
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated() - before
                    run.update(measured_gib=peak / GIB, planned_over_measured=planned / peak,
                               reserved_gib=torch.cuda.max_memory_reserved() / GIB)
            except torch.OutOfMemoryError as exc:
                result["errors"].append(f"{tokens} tokens, checkpointing {ckpt}: out of memory ({exc})"[:500])
                break
            finally:
                model.zero_grad(set_to_none=True)
            run["s"] = time.perf_counter() - started
            result["runs"].append(run)
            path.write_text(json.dumps(result, indent=1))
            print(json.dumps(run), flush=True)
    path.write_text(json.dumps(result, indent=1))
    return result


