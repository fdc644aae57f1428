"""`ours`: the trainer's own loop on a shape with random weights (vLLM with dummy weights serving, LocalBackend
training): the prefix workload's rollouts and train calls with and without prefix sharing, and agent steps."""

from __future__ import annotations

import asyncio
import json
import random
import time
import traceback

from evals.scale_bench.shapes import LORA, SHAPES, make_model_dir, param_count
from evals.scale_bench.workloads import (
    Budget,
    agent_rollouts,
    prefix_prompts,
    rewarded_groups,
    varied_rewards,
    word_ids,
)
from evals.trainer_gpu_bench import PeakMemory


async def measured_train(model, groups, config) -> dict:
    """`model.train(groups, config)`'s row with the memory of the call: the device's rise and absolute peak
    (NVML; vLLM sleeps meanwhile) and this process's torch peak; an exception (an OOM is a result) as
    `{"error": ...}`."""
    try:
        with PeakMemory() as mem:
            row = await model.train(groups, config)
    except Exception as exc:  # noqa: BLE001 - an OOM is a result
        return {"error": f"{type(exc).__name__}: {exc}"[:600]}
    row.update(peak_gpu_gib_during=mem.gib, peak_gpu_gib_device_during=mem.peak / 2**30,
               trainer_peak_allocated_gib=mem.torch_gib)
    return row


AUTOCAST_SETTINGS = {"auto": None, "on": True, "off": False}


def autocast_at(args, call: int) -> bool | None:
    """`TrainConfig.lora_autocast` of ours' train call number `call` (from 0) under `--lora-autocast`: auto is
    the trainer's default (None: on for the bf16 models of a GPU run), alternate is off, on, off, ... so that one
    run holds both. Rows record this as `lora_autocast_setting` and the trainer's own stat (whether it ran) as
    `lora_autocast`."""
    if args.lora_autocast == "alternate":
        return call % 2 == 1
    return AUTOCAST_SETTINGS[args.lora_autocast]


def vllm_fields(args) -> dict:
    """The `EngineConfig` fields `--batched-tokens` and `--log-stats` set (none given: the engine's defaults)."""
    fields: dict = {"log_stats": args.log_stats}
    if args.batched_tokens:
        fields["max_num_batched_tokens"] = args.batched_tokens
    return fields


async def ours(args) -> dict:
    from transformers import AutoTokenizer

    from ruler_rl import Trajectory, TrajectoryGroup
    from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
    from ruler_rl.trainer.config import LoRAConfig

    budget = Budget(args.budget_s)
    model_dir = make_model_dir(args.shape, args.models / args.shape, args.tokenizer)
    tok = AutoTokenizer.from_pretrained(model_dir)
    words = word_ids(tok)
    rng = random.Random(0)
    out_json = args.out / f"ours-{args.shape}{'-offload' if args.offload else ''}.json"
    result: dict = {"shape": args.shape, "config": SHAPES[args.shape], "params": param_count(SHAPES[args.shape]),
                    "lora": LORA, "gpu_memory_utilization": args.util, "allowed_words": len(words),
                    "offload_during_rollouts": args.offload, "lora_autocast": args.lora_autocast,
                    "max_num_batched_tokens": args.batched_tokens, "log_stats": args.log_stats,
                    "dry_run": args.dry_run, "errors": []}

    def save():
        out_json.write_text(json.dumps(result, indent=1, default=str))

    engine = "transformers" if args.dry_run else "vllm"
    cfg = ModelConfig(lora=LoRAConfig(rank=LORA["rank"], alpha=LORA["alpha"]), seed=0,
                      offload_during_rollouts=args.offload,
                      engine=EngineConfig(engine=engine, max_seq_length=args.max_seq, gpu_memory_utilization=args.util,
                                          max_num_seqs=64, **vllm_fields(args)))
    fixed = {"min_tokens": args.gen, "ignore_eos": True, "allowed_token_ids": words}
    if args.dry_run:  # the CPU server takes neither allowed_token_ids nor ignore_eos
        fixed = {}
    with PeakMemory() as mem:
        model = TrainableModel("scale", "bench", str(model_dir), cfg)
        backend = LocalBackend(args.out / "runs", random_weights=True)
        started = time.perf_counter()
        await model.register(backend)
        result["register_s"] = time.perf_counter() - started
        save()
        client = model.openai_client(timeout=1200)

        async def turn(messages, n=1):
            return await client.chat.completions.create(model=model.name, messages=messages, n=n,
                                                        max_tokens=args.gen, temperature=1.0, extra_body=fixed)

        try:
            # --- #18: the shared-prefix workload, trained with and without sharing
            if "prefix" in args.parts or "rollout" in args.parts:  # `rollout`: the base-model rollouts only
                prompts = prefix_prompts(tok, words, args, rng)
                part: dict = {}

                async def rollout(key: str = "rollout_s") -> list:
                    """The groups' rollouts by the current policy, timed under `key` (each train call gets fresh
                    ones: the trainer refuses rollouts of an older policy step)."""
                    t0 = time.perf_counter()
                    replies = await asyncio.gather(*(turn(p, n=args.group_size) for p in prompts))
                    dt = time.perf_counter() - t0
                    gen = sum(r.usage.completion_tokens for r in replies)
                    part.setdefault(key, []).append(dt)
                    part.setdefault(key.replace("_s", "_tokens_per_s"), []).append(gen / dt)
                    part["prompt_tokens"] = [r.usage.prompt_tokens for r in replies]
                    part["sampled_tokens"] = gen
                    return [TrajectoryGroup([Trajectory(messages_and_choices=[*p, c], reward=w)
                                             for c, w in zip(r.choices, varied_rewards(len(r.choices)), strict=True)])
                            for p, r in zip(prompts, replies, strict=True)]

                for _ in range(args.rollout_reps):  # the base model (no adapter yet), as `raw` serves it; the first
                    await rollout()                 # includes warm-up (the prompts' first prefill, CUDA graphs)
                result["prefix"] = part
                save()
                for share in (True, False, True) if "prefix" in args.parts else ():
                    if budget.left() < args.reserve_s:
                        result["errors"].append(f"prefix share={share}: skipped, budget")
                        break
                    groups = await rollout("rollout_adapter_s")  # served with the latest adapter
                    key = "share" if share else "no_share"
                    autocast = autocast_at(args, len(part.get("share", [])) + len(part.get("no_share", [])))
                    row = await measured_train(model, groups, TrainConfig(
                        learning_rate=1e-5, share_prefix=share, max_tokens_per_micro_batch=args.micro_tokens,
                        lora_autocast=autocast))
                    row["lora_autocast_setting"] = autocast
                    part.setdefault(key, []).append({k: v for k, v in row.items() if not isinstance(v, dict)})
                    save()
                    print(f"prefix share={share}: {json.dumps(part[key][-1], default=str)[:600]}", flush=True)

            # --- #12: agent-shaped multi-turn steps
            if "agent" in args.parts:
                agent: dict = {"steps": []}
                result["agent"] = agent
                for step in range(args.agent_steps):
                    if budget.left() < args.reserve_s + 30:
                        result["errors"].append(f"agent step {step}: skipped, budget")
                        break
                    t0 = time.perf_counter()
                    trajs = await agent_rollouts(turn, tok, words, args, rng)
                    rollout_s = time.perf_counter() - t0
                    groups = rewarded_groups(trajs, args.group_size)
                    sampled = sum(len(c.model_extra["token_ids"]) for items in trajs for c in items
                                  if not isinstance(c, dict))
                    row = await measured_train(model, groups, TrainConfig(
                        learning_rate=1e-5, max_tokens_per_micro_batch=args.micro_tokens,
                        lora_autocast=autocast_at(args, step)))
                    row = {k: v for k, v in row.items() if not isinstance(v, dict)}
                    row.update(lora_autocast_setting=autocast_at(args, step), wall_s=time.perf_counter() - t0, rollout_wall_s=rollout_s, sampled_tokens=sampled,
                               rollout_tokens_per_s=sampled / rollout_s)
                    agent["steps"].append(row)
                    save()
                    print(f"agent step {step}: {json.dumps(row, default=str)[:800]}", flush=True)
                    if "error" in row:
                        break
        except Exception as exc:  # noqa: BLE001 - recorded, the server still closed
            result["errors"].append(traceback.format_exc()[-2000:])
            print(f"error: {exc!r}", flush=True)
        finally:
            await backend.close()
    result["peak_gpu_gib"] = mem.gib
    result["peak_gpu_gib_device"] = mem.peak / 2**30
    save()
    return result


