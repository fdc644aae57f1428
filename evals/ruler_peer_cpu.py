"""CPU time per group, ours vs ART, on the ruler-peer corpus: everything but the judge's answer.

Runs inside one implementation's Python (like run_peer.py) and prints JSON: for each group and each of
three repeats (a fresh question each time, so no cache hit), the CPU seconds (`time.process_time` of
this process only; the scripted judge answers from a child process) of one `ruler_score_group` call,
after one warm-up call that pays litellm's first-call set-up.

    PY evals/ruler_peer_cpu.py art|ours     (PY: a python with that implementation; run by ruler_peer_bench)
"""

import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("RULER_CACHE_DIR", tempfile.mkdtemp())


def serve(q):
    from fakejudge import FakeJudge  # from the bench folder on PYTHONPATH

    judge = FakeJudge()
    q.put(judge.base)
    while True:
        time.sleep(3600)


async def main(impl: str) -> None:
    if impl == "art":
        import art
        from art.rewards import ruler_score_group

        T, G = art.Trajectory, art.TrajectoryGroup
    else:
        from ruler_rl import Trajectory as T
        from ruler_rl import TrajectoryGroup as G
        from ruler_rl import ruler_score_group
    groups = json.load(open(os.environ["RULER_PEER_GROUPS"]))
    q = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=serve, args=(q,), daemon=True)
    proc.start()
    params = {"api_base": q.get(timeout=60), "api_key": "sk-test"}
    await ruler_score_group(G([T(messages_and_choices=m, reward=0.0) for m in groups[0]]), "openai/fake-judge",
                            extra_litellm_params=dict(params))  # warm-up: first-call set-up of litellm
    rows = []
    for rep in range(3):
        for gi, msgs in enumerate(groups):
            msgs = [[dict(m) for m in t] for t in msgs]
            for t in msgs:  # a fresh question each time: no cache hit for ours
                t[1] = dict(t[1], content=t[1]["content"] + f" [cpu {rep}]")
            group = G([T(messages_and_choices=m, reward=0.0) for m in msgs])
            c = time.process_time()
            await ruler_score_group(group, "openai/fake-judge", extra_litellm_params=dict(params))
            rows.append({"group": gi, "rep": rep, "cpu_s": time.process_time() - c})
    proc.terminate()
    print(json.dumps({"impl": impl, "rows": rows}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
