"""`sharing`: the prefix workload's training part alone (no vLLM), with and without prefix sharing."""

from __future__ import annotations

import json
import math
import random
import time

from evals.scale_bench.passes import bare_model, enable_checkpointing, fresh_peak
from evals.scale_bench.shapes import SHAPES
from evals.scale_bench.workloads import Budget


def sharing(args) -> dict:
    """#18's training part alone, without vLLM: `--groups` x `--group-size` sequences, each group one
    `--prefix-tokens` random prompt plus `--gen` trained tokens per sequence, through `accumulate_loss` (forward
    and backward, gradient checkpointing as the trainer sets it for >= 1B on a GPU) with `share_prefix` True,
    False, True. Per call: seconds, torch's peak allocated in this process above what was allocated before it
    (`torch.cuda.max_memory_allocated`), rows, sequence and forward tokens, the loss. No optimizer step (it
    touches only the LoRA parameters)."""
    import torch

    from ruler_rl.trainer.config import TrainConfig
    from ruler_rl.trainer.memory import GIB, default_checkpointing, model_shape
    from ruler_rl.trainer.sequences import TrainingSequence
    from ruler_rl.trainer.training import accumulate_loss

    if min(args.groups, args.group_size, args.prefix_tokens, args.gen) < 1:
        raise SystemExit("--groups, --group-size, --prefix-tokens and --gen must be >= 1")
    built = bare_model(args, "sharing")
    cuda, hf, model = built["cuda"], built["hf"], built["model"]
    checkpointing = default_checkpointing(sum(p.numel() for p in hf.parameters()), cuda)  # as the backend does
    if checkpointing:
        enable_checkpointing(hf)
    budget = Budget(args.budget_s - args.reserve_s)
    shape = model_shape(SHAPES[args.shape])
    path = args.out / f"sharing-{args.shape}.json"
    result: dict = {**built["fields"], "groups": args.groups, "group_size": args.group_size,
                    "prefix_tokens": args.prefix_tokens, "gen": args.gen, "micro_tokens": args.micro_tokens,
                    "gradient_checkpointing": checkpointing, "calls": [], "errors": []}
    rng = random.Random(0)
    old = -math.log(shape.vocab)  # about what a random model gives: ratios near 1
    seqs = []
    for g in range(args.groups):
        prompt = [rng.randrange(shape.vocab) for _ in range(args.prefix_tokens)]
        for j in range(args.group_size):
            ids = prompt + [rng.randrange(shape.vocab) for _ in range(args.gen)]
            seqs.append(TrainingSequence(token_ids=ids, trained=[False] * args.prefix_tokens + [True] * args.gen,
                                         old_logprobs=[old] * len(ids), advantage=float(j % 3 - 1),
                                         trajectory=g * args.group_size + j, group=g, position=j))
    for share in (True, False, True):
        if budget.left() <= 0:
            result["errors"].append(f"share_prefix={share}: not started, --budget-s spent")
            break
        config = TrainConfig(max_tokens_per_micro_batch=args.micro_tokens, share_prefix=share)
        before = fresh_peak(cuda)
        t0 = time.perf_counter()
        call = {"share_prefix": share}
        try:
            loss, stats = accumulate_loss(model, seqs, config)
            if cuda:
                torch.cuda.synchronize()
                call.update(peak_gib=(torch.cuda.max_memory_allocated() - before) / GIB,
                            resident_gib=before / GIB)
            call.update(s=time.perf_counter() - t0, loss=loss,
                        **{k: stats[k] for k in ("rows", "sequence_tokens", "forward_tokens", "trained_tokens",
                                                 "shared_prefix_groups", "unshared_groups")})
        except torch.OutOfMemoryError as exc:
            call["error"] = f"out of memory ({exc})"[:500]
        finally:
            model.zero_grad(set_to_none=True)
        result["calls"].append(call)
        path.write_text(json.dumps(result, indent=1))
        print(json.dumps(call), flush=True)
    done = [c for c in result["calls"] if "error" not in c]
    share = [c for c in done if c["share_prefix"]]
    plain = [c for c in done if not c["share_prefix"]]
    if share and plain:
        result["ratio_s"] = min(c["s"] for c in share) / plain[0]["s"]
        if cuda:
            result["ratio_peak"] = max(c["peak_gib"] for c in share) / plain[0]["peak_gib"]
    path.write_text(json.dumps(result, indent=1))
    return result


