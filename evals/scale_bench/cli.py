"""The benchmark's command line, `python -m evals.scale_bench PART ...` (the parts: the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import evals.scale_bench as package
from evals.scale_bench.activations import activations
from evals.scale_bench.ours import ours
from evals.scale_bench.pipeline import parse_phases, pipeline
from evals.scale_bench.profile import profile
from evals.scale_bench.raw import raw, raw_server
from evals.scale_bench.report import pipeline_report, report
from evals.scale_bench.shapes import GPU_UTIL, SHAPES, make_model_dir
from evals.scale_bench.sharing import sharing
from evals.scale_bench.trl_grpo import trl


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m evals.scale_bench", description=package.__doc__.splitlines()[0])
    ap.add_argument("part", choices=["model", "ours", "raw", "trl", "report", "pipeline", "pipeline-report",
                                     "activations", "sharing", "profile"])
    ap.add_argument("--shape", default="qwen2.5-7b", choices=sorted(SHAPES))
    ap.add_argument("--out", type=Path, default=Path("out/scale"))
    ap.add_argument("--models", type=Path, default=Path("/tmp/scale-models"))
    ap.add_argument("--dir", type=Path, help="for `model`: the folder to write")
    ap.add_argument("--tokenizer", default=None, help="SmolLM2 folder (default: the GPU kit's or the embedded one)")
    ap.add_argument("--parts", default="prefix,agent")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--gen", type=int, default=256, help="sampled tokens per turn (fixed)")
    ap.add_argument("--prefix-tokens", type=int, default=7500)
    ap.add_argument("--turn-tokens", type=int, default=2250)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--agent-steps", type=int, default=2)
    ap.add_argument("--trl-steps", type=int, default=3)
    ap.add_argument("--trl-workload", default="prefix", choices=["prefix", "agent"], help="trl: the workload")
    ap.add_argument("--trl-per-device", type=int, default=None,
                    help="trl: per_device_train_batch_size (default --group-size); gradient accumulation makes up "
                         "the step's groups x group-size completions")
    ap.add_argument("--micro-tokens", type=int, default=16384, help="TrainConfig.max_tokens_per_micro_batch")
    ap.add_argument("--max-seq", type=int, default=10240)
    ap.add_argument("--util", type=float, default=None, help="vLLM gpu_memory_utilization (default per shape)")
    ap.add_argument("--offload", action="store_true",
                    help="ours: ModelConfig.offload_during_rollouts (the trainer's base weights in CPU memory while "
                         "vLLM serves; give vLLM a larger --util)")
    ap.add_argument("--rollout-reps", type=int, default=3,
                    help="ours, prefix or rollout part: rollouts of the base model before training; raw: its runs")
    ap.add_argument("--budget-s", type=float, default=520)
    ap.add_argument("--reserve-s", type=float, default=40, help="time kept for closing and writing")
    ap.add_argument("--dry-run", action="store_true", help="CPU engine, for checking the script")
    ap.add_argument("--task", default="agent", choices=["agent", "tiny"], help="pipeline: the workload")
    ap.add_argument("--placement", default="colocated", choices=["colocated", "dedicated", "split"],
                    help="pipeline: split = dedicated on one GPU split in two (GPU 0: vLLM --util, the trainer "
                         "--trainer-share)")
    ap.add_argument("--trainer-share", type=float, default=0.5,
                    help="pipeline --placement split: EngineConfig.trainer_memory_share")
    ap.add_argument("--ray-trainer", action="store_true",
                    help="pipeline, dedicated or split: the trainer and the server each in a Ray actor "
                         "(launcher='ray', trainer_launcher='ray'; a local Ray cluster unless RAY_ADDRESS)")
    ap.add_argument("--inference-gpus", type=lambda v: [int(x) for x in v.split(",")], default=[1],
                    help="pipeline, dedicated: vLLM's GPUs, e.g. 1 or 1,2")
    ap.add_argument("--trainer-gpus", type=lambda v: [int(x) for x in v.split(",")], default=[0],
                    help="pipeline, dedicated: the trainer's GPU")
    ap.add_argument("--overlap", action="store_true", help="pipeline: gather step k+1 while step k trains")
    ap.add_argument("--pipeline-steps", type=int, default=6)
    ap.add_argument("--phases", default=None, type=parse_phases,
                    help="pipeline: phases on one registered model, e.g. plain:2,overlap:3 (plain = no overlap); "
                         "default: --pipeline-steps steps, overlapped with --overlap")
    ap.add_argument("--tiny-model", default=None, help="pipeline --task tiny: SmolLM2 folder (default as --tokenizer)")
    ap.add_argument("--tiny-max-tokens", type=int, default=12)
    ap.add_argument("--lr", type=float, default=5e-4, help="pipeline --task tiny: learning rate")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="pipeline: EngineConfig.enforce_eager (no torch.compile or CUDA graphs: vLLM starts ~1 min "
                         "sooner, decodes slower; give it to both sides of a comparison)")
    ap.add_argument("--act-tokens", type=lambda v: [int(x) for x in v.split(",") if x.strip()],
                    default=[4096, 8192, 16384], help="activations: tokens of one micro-batch, e.g. 4096,8192")
    ap.add_argument("--act-checkpointing", type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
                    default=["off", "on"], help="activations, profile: off, on or off,on (gradient checkpointing)")
    ap.add_argument("--prof-sequences", type=lambda v: [int(x) for x in v.split(",") if x.strip()], default=[1, 2],
                    help="profile: the sequences each row of --act-tokens tokens is made of, e.g. 1,2")
    ap.add_argument("--prof-reps", type=int, default=2, help="profile: timed passes after the warm-up")
    ap.add_argument("--lora-autocast", nargs="?", const="on", default="auto",
                    choices=["auto", "off", "on", "alternate"],
                    help="ours, profile: TrainConfig.lora_autocast, the adapters' matmuls in bf16 under autocast; "
                         "auto (default): the trainer's default, on for bf16 models; alternate: ours' train calls "
                         "off, on, off, ... (an A/B within one run), profile both")
    ap.add_argument("--prof-attention", type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
                    default=["mask", "blocks"], help="profile: mask (one 4-D mask per row), blocks (ruler_rl.trainer.attention)")
    ap.add_argument("--prof-prefix", type=int, default=0,
                    help="profile: tokens the sequences of a row share at their start (computed once)")
    ap.add_argument("--batched-tokens", type=int, default=None,
                    help="ours, raw --raw-via server: EngineConfig.max_num_batched_tokens (default: the engine's, "
                         "vLLM's offline value for the GPU)")
    ap.add_argument("--log-stats", action="store_true",
                    help="ours, raw --raw-via server: EngineConfig.log_stats (vLLM's per-step statistics on)")
    ap.add_argument("--raw-via", default="llm", choices=["llm", "server"],
                    help="raw: in-process vllm.LLM, or vLLM's own OpenAI server without our middleware")
    args = ap.parse_args(argv)
    args.util_given = args.util is not None
    if args.util is None:
        args.util = GPU_UTIL[args.shape]
    if args.part == "model":
        print(make_model_dir(args.shape, args.dir or args.models / args.shape, args.tokenizer))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    args.parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if args.part == "report":
        print(report(args.out))
        return
    if args.part == "pipeline-report":
        print(pipeline_report(args.out))
        return
    if args.part == "pipeline":
        if args.phases and args.overlap:
            ap.error("--overlap and --phases: give the overlapped steps as a phase (e.g. --phases overlap:6)")
        if args.ray_trainer and args.placement == "colocated":
            ap.error("--ray-trainer places the trainer beside a dedicated server: --placement dedicated or split")
        if args.placement == "split" and not 0 < args.trainer_share < 1:
            ap.error("--trainer-share is a fraction of the GPU: 0 < share < 1")
        if args.dry_run and args.task == "agent" and args.shape != "tiny":
            raise SystemExit("--dry-run runs on the CPU: use --shape tiny (or --task tiny)")
        result = asyncio.run(pipeline(args))
    elif args.part == "activations":
        if args.dry_run and args.shape != "tiny":
            raise SystemExit("--dry-run runs on the CPU: use --shape tiny")
        result = activations(args)
    elif args.part in ("sharing", "profile"):
        if args.dry_run and args.shape != "tiny":
            raise SystemExit("--dry-run runs on the CPU: use --shape tiny")
        result = sharing(args) if args.part == "sharing" else profile(args)
    else:
        if args.part == "raw" and args.raw_via == "server":
            result = asyncio.run(raw_server(args))
        elif args.part == "raw" and args.dry_run:
            raise SystemExit("raw --dry-run: only with --raw-via server (vllm.LLM needs a GPU)")
        else:
            result = asyncio.run(ours(args)) if args.part == "ours" else raw(args) if args.part == "raw" else trl(args)
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, (list, dict))}, indent=1, default=str))


if __name__ == "__main__":
    main()
