"""The judge meta-evaluation at GPU speed: SmolLM2 served by vLLM, judged through the same `ruler()` path.

With `--engine server` (default) it starts `vllm serve` on loopback and judges through `hosted_vllm/<name>`
(real HTTP); with `--engine in-process` it uses the `vllm-engine/<path>` litellm provider (an AsyncLLM in
this process). It runs `evals.judge_meta.evaluate` over every dataset with k=1 and k=3 and writes
summary.csv, detail.csv and run.json (pairs/s, start-up time) to --out.

    python evals/gpu_judge_meta.py --model /tmp/models/SmolLM2-135M-Instruct --out $OUT [--limit N]
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
    from evals.judge_meta import DATASETS, evaluate

    started = time.perf_counter()
    summary, detail = asyncio.run(evaluate(
        DATASETS, judge, params=params, ks=(1, 3), limit=args.limit, concurrency=args.concurrency,
        progress=False, max_prompt_tokens=7000))
    wall = time.perf_counter() - started
    summary.to_csv(args.out / "summary.csv", index=False)
    detail.to_csv(args.out / "detail.csv", index=False)
    (args.out / "run.json").write_text(json.dumps({"judge": judge, "vllm_ready_s": ready_s, "eval_wall_s": wall}))
    print(summary.to_string())
    print(f"judge {judge}: vLLM ready in {ready_s:.0f} s; evaluation wall {wall:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--engine", choices=["server", "in-process"], default="server")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RULER_CACHE_DIR", str(args.out / "judge-cache"))
    if args.engine == "in-process":
        os.environ.setdefault("RULER_VLLM_ENGINE_ARGS", json.dumps({"gpu_memory_utilization": 0.5,
                                                                     "max_model_len": 8192}))
        return run_eval(args, f"vllm-engine/{args.model}", None, 0.0)
    base = f"http://127.0.0.1:{args.port}/v1"
    log = open(args.out / "vllm.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
                             "--served-model-name", "smollm2", "--port", str(args.port), "--max-model-len", "8192",
                             "--gpu-memory-utilization", "0.5"], stdout=log, stderr=subprocess.STDOUT)
    try:
        run_eval(args, "hosted_vllm/smollm2", {"api_base": base, "api_key": "none"}, wait_ready(base, proc))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
