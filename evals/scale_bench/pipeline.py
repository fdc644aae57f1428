"""`pipeline` (issues #13 and #35): steps of the agent or the tiny task through `ruler_rl.trainer.pipeline`, colocated,
dedicated or on one GPU split in two, plain or overlapped, with each phase's GPU use and hidden rollout time."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

from evals.scale_bench.shapes import LORA, default_tokenizer_dir, make_model_dir
from evals.scale_bench.workloads import agent_rollouts, rewarded_groups, word_ids


class GpuUsage:
    """Mean utilization (%) and peak used memory (GiB) of each listed GPU over the block (NVML, every 100 ms);
    nothing without NVML (a CPU check of the script)."""

    def __init__(self, gpus: list[int]):
        self.gpus, self.samples, self.peak = gpus, {g: [] for g in gpus}, {g: 0 for g in gpus}
        self.thread = None

    def __enter__(self):
        try:
            from evals.trainer_gpu_bench import _nvml

            nvml = _nvml()
            nvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no GPU tooling here
            return self
        self.handles = {g: nvml.nvmlDeviceGetHandleByIndex(g) for g in self.gpus}
        self.stop = False

        def poll():
            while not self.stop:
                for g, h in self.handles.items():
                    self.samples[g].append(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                    self.peak[g] = max(self.peak[g], nvml.nvmlDeviceGetMemoryInfo(h).used)
                time.sleep(0.1)

        self.thread = threading.Thread(target=poll, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.thread is not None:
            self.stop = True
            self.thread.join()

    def summary(self) -> dict:
        return {str(g): {"util_mean_pct": statistics.mean(v) if v else None, "peak_gib": self.peak[g] / 2**30}
                for g, v in self.samples.items()}


class TimedTrain:
    """The model as `train_pipelined` sees it (`get_step`, `train`), each `train` call's (start, end) kept."""

    def __init__(self, model):
        self.model, self.spans = model, []

    async def get_step(self) -> int:
        return await self.model.get_step()

    async def train(self, groups, config):
        t0 = time.perf_counter()
        row = await self.model.train(groups, config)
        self.spans.append((t0, time.perf_counter()))
        return row


def hidden_rollout(gathers: list[tuple[float, float]], trains: list[tuple[float, float]]) -> dict:
    """How much of the rollouts ran while a step trained: the seconds of each gather inside any train call's
    span, summed (`rollout_hidden_s`), against all the gathers' seconds (`rollout_total_s`), and their ratio
    (`rollout_hidden_frac`: 0 in the plain loop, up to 1 when every rollout after the first is hidden)."""
    total = sum(b - a for a, b in gathers)
    hidden = sum(max(0.0, min(b, tb) - max(a, ta)) for a, b in gathers for ta, tb in trains)
    return {"rollout_total_s": total, "rollout_hidden_s": hidden,
            "rollout_hidden_frac": hidden / total if total > 0 else None}


def step_means(rows: list[dict]) -> dict:
    """Means over a phase's trained steps: the adapter hand-over (`adapter_swap_s`: the checkpoint's load into the
    server), vLLM's sleep + wake, and the policy lag of the trained rollouts."""
    def mean(key):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return statistics.mean(values) if values else None

    return {"adapter_swap_s_mean": mean("adapter_swap_s"), "sleep_wake_s_mean": mean("sleep_wake_s"),
            "policy_lag_mean": mean("policy_lag_max"), "policy_lag_max": max(
                (r["policy_lag_max"] for r in rows if isinstance(r.get("policy_lag_max"), int)), default=None)}


def where(backend, model) -> dict:
    """Where the run's two sides are: with the trainer placed by Ray, the actors' pids, nodes and GPUs."""
    remote = backend._remote.get(model.name)
    if remote is None:
        return {"trainer_pid": os.getpid()}
    info = dict(remote.info)
    server = info.pop("server", {})
    return {"trainer": {k: info.get(k) for k in ("actor_pid", "node_id", "cuda_visible_devices", "device")},
            "server": {k: server.get(k) for k in ("actor_pid", "node_id", "cuda_visible_devices", "base_url")},
            "driver_pid": os.getpid()}


async def pipeline(args) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from tiny_task import messages, questions_for_step, reward
    from transformers import AutoTokenizer

    from ruler_rl import Trajectory, TrajectoryGroup
    from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
    from ruler_rl.trainer.config import LoRAConfig
    from ruler_rl.trainer.pipeline import train_pipelined

    split = args.placement == "split"  # dedicated on one GPU split in two (EngineConfig.shares_gpu)
    dedicated = args.placement == "dedicated" or split
    phases = args.phases or [("overlap" if args.overlap else "plain", args.pipeline_steps)]
    kinds = "-".join(dict.fromkeys(kind for kind, _ in phases))
    label = f"pipeline-{args.task}-{args.placement}{'-ray' if args.ray_trainer else ''}-{kinds}"
    out_json = args.out / f"{label}.json"
    engine = "transformers" if args.dry_run else "vllm"
    gpus = {} if args.dry_run or not dedicated else (
        {"inference_gpus": [0], "trainer_gpus": [0], "trainer_memory_share": args.trainer_share} if split
        else {"inference_gpus": args.inference_gpus, "trainer_gpus": args.trainer_gpus})
    if args.ray_trainer:  # item 2 of #35: the trainer and the server each in a Ray actor
        gpus.update(launcher="ray", trainer_launcher="ray")
    if args.task == "tiny":
        base, random_weights, max_seq = args.tiny_model or default_tokenizer_dir(), False, 256
        lora, util = LoRAConfig(rank=8, alpha=16.0), args.util if args.util_given else 0.3
    else:
        base, random_weights, max_seq = str(make_model_dir(args.shape, args.models / args.shape, args.tokenizer)), \
            True, args.max_seq
        lora, util = LoRAConfig(rank=LORA["rank"], alpha=LORA["alpha"]), args.util
    if dedicated and not split and not args.dry_run:
        util = max(util, 0.85)  # the inference GPUs are vLLM's alone
    cfg = ModelConfig(lora=lora, seed=0, engine=EngineConfig(
        engine=engine, placement="dedicated" if dedicated else "colocated", max_seq_length=max_seq,
        max_num_seqs=64, **({} if args.dry_run else {"gpu_memory_utilization": util,
                                                    "enforce_eager": args.enforce_eager}), **gpus))
    def train_config(kind: str) -> TrainConfig:
        return TrainConfig(learning_rate=args.lr if args.task == "tiny" else 1e-5,
                           max_tokens_per_micro_batch=args.micro_tokens,
                           **({"max_off_policy_steps": 1, "sampler_correction": "tis"} if kind == "overlap" else {}))

    result: dict = {"label": label, "task": args.task, "shape": args.shape if args.task == "agent" else "smollm2-135m",
                    "placement": args.placement, "enforce_eager": args.enforce_eager, "phases": phases, "gpus": gpus,
                    "dry_run": args.dry_run,
                    "steps": [], "phase_summary": [], "errors": []}

    def save():
        out_json.write_text(json.dumps(result, indent=1, default=str))

    tok = AutoTokenizer.from_pretrained(base)
    words = word_ids(tok)
    rng = random.Random(0)
    fixed = {} if args.dry_run else {"min_tokens": args.gen, "ignore_eos": True, "allowed_token_ids": words}
    watched = sorted(set(args.inference_gpus + args.trainer_gpus)) if dedicated and not split else [0]
    model = TrainableModel(label.replace("pipeline-", "p-"), "bench", base, cfg)
    backend = LocalBackend(args.out / "runs", random_weights=random_weights)
    started = time.perf_counter()
    await model.register(backend)
    result["register_s"] = time.perf_counter() - started
    result["where"] = where(backend, model)
    client = model.openai_client(timeout=1200)
    rollout_s: list[float] = []  # per gather, in order: train_pipelined trains on them in that order
    gathers: list[tuple[float, float]] = []  # each gather's (start, end), this process's clock
    timed = TimedTrain(model)  # each model.train call's (start, end)

    async def gather(step: int) -> list:
        t0 = time.perf_counter()
        if args.task == "tiny":
            async def group(i, question, answer):
                prompt = messages(question)
                r = await client.chat.completions.create(model=model.name, messages=prompt, n=args.group_size,
                                                         max_tokens=args.tiny_max_tokens, temperature=1.0,
                                                         seed=step * 100 + i)
                return TrajectoryGroup([Trajectory(messages_and_choices=[*prompt, c],
                                                   reward=reward(c.message.content, answer)) for c in r.choices])

            groups = await asyncio.gather(*(group(i, q, a) for i, (q, a) in
                                            enumerate(questions_for_step(step, args.groups))))
        else:
            async def ask(msgs):
                return await client.chat.completions.create(model=model.name, messages=msgs, max_tokens=args.gen,
                                                            temperature=1.0, extra_body=fixed)

            groups = rewarded_groups(await agent_rollouts(ask, tok, words, args, rng), args.group_size)
        rollout_s.append(time.perf_counter() - t0)
        gathers.append((t0, time.perf_counter()))
        return groups

    last_end = time.perf_counter()
    phase = {"kind": phases[0][0], "index": 0}

    def on_step(row, groups):
        nonlocal last_end
        now = time.perf_counter()
        keep = {k: v for k, v in row.items() if not isinstance(v, dict)}
        index = len(result["steps"])
        keep.update(wall_step_s=now - last_end, gather_s=rollout_s[index], phase=phase["kind"],
                    phase_index=phase["index"], train_call_s=timed.spans[index][1] - timed.spans[index][0])
        keep["gather_index"] = index
        last_end = now
        result["steps"].append(keep)
        save()
        print(f"{label} step {row['step']}: {keep['wall_step_s']:.1f}s reward {row.get('reward_mean', 0):.3f} "
              f"lag {row.get('policy_lag_max')}", flush=True)

    try:
        for index, (kind, steps) in enumerate(phases):
            phase.update(kind=kind, index=index)
            first = len(result["steps"])
            first_gather = len(gathers)
            t0 = time.perf_counter()
            last_end = t0
            with GpuUsage(watched) as usage:
                await train_pipelined(timed, gather, steps=steps, config=train_config(kind), on_step=on_step)
            rows = result["steps"][first:]
            # a phase gathers once per step (train_pipelined starts no gather after its last step): the gathers that
            # fed this phase's steps, and how much of each ran while a step trained (hidden)
            hidden = hidden_rollout(gathers[first_gather:first_gather + len(rows)], timed.spans[first:])
            # a phase's first step gathers without overlap (and the run's first warms up): steady = the rest
            steady = [r["wall_step_s"] for r in rows[1:]]
            result["phase_summary"].append({
                "kind": kind, "steps": len(rows), "wall_s": time.perf_counter() - t0,
                "first_step_s": rows[0]["wall_step_s"] if rows else None,
                "steady_step_s": statistics.mean(steady) if steady else None,
                "train_s_mean": statistics.mean(r.get("step_s", 0.0) for r in rows) if rows else None,
                "gather_s_mean": statistics.mean(r["gather_s"] for r in rows) if rows else None,
                "reward_last": rows[-1].get("reward_mean") if rows else None, "gpu": usage.summary(),
                **hidden, **step_means(rows)})
            save()
    except Exception as exc:  # noqa: BLE001 - recorded, the server still closed
        result["errors"].append(traceback.format_exc()[-2000:])
        print(f"error: {exc!r}", flush=True)
    finally:
        await backend.close()
    steady = [r["wall_step_s"] for r in result["steps"][1:]]  # the first includes warm-up
    result["steady_step_s"] = statistics.mean(steady) if steady else None
    result["reward_last"] = result["steps"][-1].get("reward_mean") if result["steps"] else None
    save()
    return result




def parse_phases(value: str) -> list[tuple[str, int]]:
    """`plain:2,overlap:3` -> [("plain", 2), ("overlap", 3)]; argparse's error otherwise."""
    phases = []
    for part in value.split(","):
        kind, _, steps = part.strip().partition(":")
        if kind not in ("plain", "overlap") or not steps.isdigit() or int(steps) < 1:
            raise argparse.ArgumentTypeError(f"{part!r}: each phase is KIND:STEPS with KIND plain or overlap and "
                                             "STEPS >= 1, e.g. plain:2,overlap:3")
        phases.append((kind, int(steps)))
    return phases

