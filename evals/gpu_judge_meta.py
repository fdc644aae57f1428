"""The judge meta-evaluation at GPU speed: SmolLM2 served by vLLM, judged through the same `ruler()` path.

With `--engine server` (default) it starts `vllm serve` on loopback and judges through `hosted_vllm/<name>`
(real HTTP); with `--engine in-process` it uses the `vllm-engine/<path>` litellm provider (an AsyncLLM in
this process). It runs `evals.judge_meta.evaluate` over every dataset (or those of `--datasets`, built-in names
and JSONL files of your own labels, in that order; `--by FIELD` breaks a file down by one of its fields) with k=1
and k=3 and writes
summary.csv, detail.csv and run.json (pairs/s, start-up time, when each dataset began) to --out after each
dataset; the judge cache (every judgment, with its prompt: `ruler distill --teacher` reads it) is OUT/judge-cache. Before that, on the
same server: with `--injection-groups N`, `evals.judge_injection` over N groups (injection.json); then with
`--answer-accuracy`, ART·E's labelled answer pairs graded with it as the correctness judge
(`evals.art_e.answer_accuracy`, answer-accuracy.json). A follow-up that fails makes the script exit non-zero.

    python evals/gpu_judge_meta.py --model /tmp/models/SmolLM2-135M-Instruct --out $OUT [--limit N]
    python evals/gpu_judge_meta.py --model /tmp/models/qwen15 --out $OUT --enforce-eager --answer-accuracy \\
        --injection-groups 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 300) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/models", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter() - started
        except OSError:
            time.sleep(1)
    raise SystemExit("vLLM did not become ready in time")


def run_eval(args, judge: str, params: dict | None, ready_s: float) -> None:
    """The judge meta-evaluation, one dataset at a time in one event loop (the in-process engine and litellm's
    clients stay bound to it): summary.csv, detail.csv and run.json are rewritten after each dataset, so a run cut
    short (a device call's time limit) keeps every dataset it finished."""
    import pandas as pd

    from evals.judge_meta import DATASETS, evaluate

    started, summaries, details, stages = time.perf_counter(), [], [], []

    async def each_dataset() -> None:
        for dataset in args.datasets:  # in the order given
            # when each dataset's judgments began (UTC): `ruler distill --since` selects one set's judgments from the
            # judge cache by it (the sets run one after another)
            stages.append({"dataset": dataset, "started": datetime.now(UTC).isoformat()})
            by = args.by if dataset not in DATASETS else None  # a field of a user's file, not of a built-in set
            summary, detail = await evaluate([dataset], judge, params=params, ks=(1, 3), limit=args.limit,
                                             concurrency=args.concurrency, progress=False, max_prompt_tokens=7000,
                                             by=by)
            summaries.append(summary)
            details.append(detail)
            pd.concat(summaries, ignore_index=True).to_csv(args.out / "summary.csv", index=False)
            pd.concat(details, ignore_index=True).to_csv(args.out / "detail.csv", index=False)
            (args.out / "run.json").write_text(json.dumps({
                "judge": judge, "vllm_ready_s": ready_s, "eval_wall_s": time.perf_counter() - started,
                "datasets_done": len(summaries), "stages": stages}))
            print(summary.to_string(), flush=True)

    asyncio.run(each_dataset())
    print(f"judge {judge}: vLLM ready in {ready_s:.0f} s; evaluation wall {time.perf_counter() - started:.0f} s")


def follow_up(args, what: str, module: str, *argv: str) -> int:
    """Run `python -m module argv` against the server (its output in OUT/what.log); its exit status."""
    with open(args.out / f"{what}.log", "w") as log:
        rc = subprocess.run([sys.executable, "-m", module, *argv], stdout=log, stderr=subprocess.STDOUT,
                            check=False).returncode
    print(f"{what}: exit {rc}, see {args.out / f'{what}.log'}")
    return rc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (argparse's exit 2 with a message on a bad combination)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--datasets", nargs="+", default=None, help="built-in set names and/or JSONL files of labelled "
                    "pairs or groups (`ruler eval judge --dataset`'s format), judged in this order (default: every "
                    "built-in set)")
    ap.add_argument("--by", default=None, help="with a JSONL file among --datasets: one more summary row per value "
                    "of this field of its rows")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--engine", choices=["server", "in-process"], default="server")
    ap.add_argument("--served-name", default=None, help="the name vLLM serves the model under (default: the "
                    "model folder's name)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs or torch.compile (a faster start)")
    ap.add_argument("--answer-accuracy", action="store_true", help="--engine server: then grade ART·E's labelled "
                    "answer pairs with the same server as the correctness judge")
    ap.add_argument("--injection-groups", type=int, default=0, help="--engine server: then the prompt-injection "
                    "check (evals.judge_injection) over this many groups")
    args = ap.parse_args(argv)
    if args.injection_groups < 0 or (args.limit is not None and args.limit < 1) or args.concurrency < 1:
        ap.error("--injection-groups must be >= 0, --limit and --concurrency >= 1")
    from evals.judge_meta import DATASETS

    args.datasets = args.datasets or list(DATASETS)
    unknown = [d for d in args.datasets if d not in DATASETS and not Path(d).is_file()]
    if unknown:
        ap.error(f"--datasets: {unknown[0]!r} is neither a built-in set ({', '.join(DATASETS)}) nor a file")
    if len(set(args.datasets)) < len(args.datasets):
        ap.error("--datasets names a set twice")
    if args.by is not None and all(d in DATASETS for d in args.datasets):
        ap.error("--by reads a field of your own JSONL file: give one in --datasets")
    if not 0 < args.gpu_memory_utilization <= 1:
        ap.error("--gpu-memory-utilization must be in (0, 1]")
    if args.engine == "in-process" and (args.answer_accuracy or args.injection_groups or args.enforce_eager):
        ap.error("--answer-accuracy, --injection-groups and --enforce-eager need --engine server")
    return args


def server_command(args: argparse.Namespace, name: str) -> list[str]:
    """vLLM's OpenAI server for the judge `args.model` served as `name`. Its scores are sampled as one-line JSON
    (`COMPACT_JSON`), as the library's vLLM engines do: on 2026-12-07 this server under vLLM 0.24's default grammar
    let Qwen2.5-Coder-1.5B write whitespace until the token limit (5 answers rejected, and requests running for over
    a minute at the end of each stage, which waits for its slowest judgment)."""
    from ruler_rl.judges.vllm_settings import COMPACT_JSON

    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
            "--served-model-name", name, "--port", str(args.port), "--max-model-len", "8192",
            "--gpu-memory-utilization", str(args.gpu_memory_utilization),
            "--structured-outputs-config", json.dumps(COMPACT_JSON)] + (["--enforce-eager"] if args.enforce_eager
                                                                         else [])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    name = args.served_name or Path(args.model.rstrip("/")).name
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RULER_CACHE_DIR", str(args.out / "judge-cache"))
    from ruler_rl.judges.checkpoint import check_checkpoint

    if args.engine == "in-process":
        engine_args = {"gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": 8192}
        os.environ.setdefault("RULER_VLLM_ENGINE_ARGS", json.dumps(engine_args))
        from ruler_rl.judges.vllm_engine import engine_args as in_process_args

        # first, not at the first judgment: inside litellm the refusal would be retried as a failed call
        check_checkpoint(args.model, in_process_args().get("load_format"))
        return run_eval(args, f"vllm-engine/{args.model}", None, 0.0)
    check_checkpoint(args.model)  # vLLM would serve a tensor the folder lacks uninitialized, without a warning
    base = f"http://127.0.0.1:{args.port}/v1"
    failed = 0
    with open(args.out / "vllm.log", "w") as log:
        proc = subprocess.Popen(server_command(args, name), stdout=log, stderr=subprocess.STDOUT)
        try:
            ready, judge = wait_ready(base, proc), f"hosted_vllm/{name}"
            common = ["--concurrency", str(args.concurrency)]
            # the short checks first (#36's injection, #33's correctness judge), the meta-evaluation (saved per
            # dataset) last, so that a call cut at its time limit loses the least
            if args.injection_groups:
                failed += follow_up(args, "injection", "evals.judge_injection", "--judge", judge, "--api-base",
                                    base, "--groups", str(args.injection_groups), "--out", str(args.out),
                                    *common) != 0
            if args.answer_accuracy:
                failed += follow_up(args, "answer-accuracy", "evals.art_e.answer_accuracy", "--judge", judge,
                                    "--judge-api-base", base, "--out", str(args.out / "answer-accuracy.json"),
                                    *common) != 0
            run_eval(args, judge, {"api_base": base, "api_key": "none"}, ready)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    if failed:
        raise SystemExit(f"{failed} of the follow-up evaluations failed (see their logs in {args.out})")


if __name__ == "__main__":
    main()
