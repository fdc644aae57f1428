"""Load and crash test of the judging service, on loopback only, bounded in count and time.

Against a scripted judge with a fixed latency it measures: the service's p50/p99 overhead over a direct
`ruler_score_group` call, groups/s at 1, 8 and 64 concurrent clients, the service's memory (peak RSS),
and then kills the service with SIGKILL in the middle of a 200-group job, restarts it, and counts
results lost (must be 0) and groups judged twice.

    .venv/bin/python evals/service_load.py [--latency 0.05] [--requests 64] [--group-size 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from ruler_rl import Trajectory, TrajectoryGroup, ruler_score_group
from ruler_rl.client import RulerClient
from ruler_rl.service.store import Store
from ruler_rl.testing import FakeJudge, start_service

ROOT = Path(__file__).resolve().parents[1]
SERVE_ARGS = ("--rate-per-minute", "100000", "--max-inflight-per-key", "256", "--worker-concurrency", "16")


def make_group(i: int, size: int) -> TrajectoryGroup:
    system = {"role": "system", "content": "You are an email agent. Answer from the inbox."}
    user = {"role": "user", "content": f"Question {i}: when is the budget meeting?"}
    marks = ["GOOD", "OK", "BAD"]
    return TrajectoryGroup([Trajectory(messages_and_choices=[system, user, {
        "role": "assistant", "content": f"{marks[k % 3]} answer {k} " + "detail " * 40}]) for k in range(size)])


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.05, help="the scripted judge's answer time (s)")
    ap.add_argument("--requests", type=int, default=64, help="requests per measurement (bounded)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--job-groups", type=int, default=200)
    args = ap.parse_args()
    judge = FakeJudge(latency_s=args.latency)
    tmp = Path(tempfile.mkdtemp(prefix="ruler-load-"))
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "RULER_CACHE_DIR": str(tmp / "cache-service")}
    os.environ["RULER_CACHE_DIR"] = str(tmp / "cache-direct")
    n = args.requests

    direct = []
    for i in range(n):
        t = time.perf_counter()
        await ruler_score_group(make_group(i, args.group_size), "openai/fake-judge", judge.params, cache=False)
        direct.append(time.perf_counter() - t)

    db = tmp / "service.db"
    key, _ = Store(db).create_key("load")
    proc, base = start_service(db, judge, env, *SERVE_ARGS, cwd=ROOT)
    headers = {"Authorization": f"Bearer {key}"}
    try:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as http:
            def body(i):
                g = make_group(i, args.group_size)
                return {"trajectories": [t.model_dump(mode="json") for t in g.trajectories],
                        "rubric": f"default\n(run {i} {time.time()})"}  # distinct rubric text: no cache hits

            via = []
            for i in range(n):
                t = time.perf_counter()
                r = await http.post("/v1/score", json=body(i))
                r.raise_for_status()
                via.append(time.perf_counter() - t)
            throughput = {}
            for conc in (1, 8, 64):
                sem = asyncio.Semaphore(conc)

                async def one(i, sem=sem):
                    async with sem:
                        (await http.post("/v1/score", json=body(10_000 + i))).raise_for_status()

                t = time.perf_counter()
                await asyncio.gather(*(one(i) for i in range(max(n, conc * 2))))
                throughput[conc] = max(n, conc * 2) / (time.perf_counter() - t)
        rss = peak_rss_mb(proc.pid)

        client = RulerClient(base, key)
        job = client.submit_job([make_group(20_000 + i, args.group_size) for i in range(args.job_groups)])
        while client.job(job)["done"] < args.job_groups // 4:
            time.sleep(0.05)
        done_before = client.job(job)["done"]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, base = start_service(db, judge, env, *SERVE_ARGS, cwd=ROOT)
        state = RulerClient(base, key).wait_job(job, poll_s=0.2, timeout_s=600)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with Store(db).connect() as conn:
        attempts = [r[0] for r in conn.execute("SELECT attempts FROM job_groups WHERE job_id = ?", (job,))]
    lost = sum(r["status"] != "done" for r in state["results"])
    print(f"scripted judge latency {args.latency * 1000:.0f} ms, groups of {args.group_size}, {n} requests each")
    print(f"direct ruler_score_group: p50 {pct(direct, 50) * 1000:.1f} ms, p99 {pct(direct, 99) * 1000:.1f} ms")
    print(f"through the service:      p50 {pct(via, 50) * 1000:.1f} ms, p99 {pct(via, 99) * 1000:.1f} ms")
    print(f"service overhead:         p50 {(pct(via, 50) - pct(direct, 50)) * 1000:.1f} ms, "
          f"p99 {(pct(via, 99) - pct(direct, 99)) * 1000:.1f} ms (mean {statistics.fmean(via) * 1000:.1f} vs "
          f"{statistics.fmean(direct) * 1000:.1f} ms)")
    print("groups/s by concurrent clients: " + ", ".join(f"{c}: {v:.1f}" for c, v in throughput.items()))
    print(f"service peak RSS: {rss:.0f} MB")
    print(f"kill -9 after {done_before}/{args.job_groups} groups, restart: job {state['status']}, "
          f"results lost {lost}, groups judged twice {sum(a > 1 for a in attempts)}")
    judge.close()


if __name__ == "__main__":
    asyncio.run(main())
