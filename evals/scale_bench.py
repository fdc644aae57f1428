"""Scale benchmark on one GPU (issues #12 and #18): real architectures with random weights.

    python evals/scale_bench.py model  --shape qwen2.5-7b --dir MODELS             # config.json + tokenizer
    python evals/scale_bench.py ours   --shape qwen2.5-7b --out DIR --parts prefix,agent
    python evals/scale_bench.py raw    --shape qwen2.5-7b --out DIR                # raw vllm.LLM, after `ours`
    python evals/scale_bench.py raw    --shape qwen2.5-7b --out DIR --raw-via server  # vLLM's server, no middleware
    python evals/scale_bench.py trl    --shape qwen2.5-7b --out DIR                # TRL GRPOTrainer, prefix workload
    python evals/scale_bench.py report --out DIR                                   # the tables from the JSON files
    python evals/scale_bench.py ours --shape tiny --dry-run --out DIR             # CPU check of the script
    # issue #13, two GPUs: (a) colocated, (b) dedicated, (c) dedicated with one step of overlap
    python evals/scale_bench.py pipeline --task agent --shape qwen2.5-7b --out DIR --placement colocated
    python evals/scale_bench.py pipeline --task agent --shape qwen2.5-7b --out DIR --placement dedicated
    python evals/scale_bench.py pipeline --task agent --shape qwen2.5-7b --out DIR --placement dedicated --overlap
    python evals/scale_bench.py pipeline --task agent --shape qwen2.5-7b --out DIR --placement dedicated --phases plain:2,overlap:3
    python evals/scale_bench.py pipeline --task tiny --out DIR --placement dedicated --overlap    # SmolLM2, reward
    python evals/scale_bench.py pipeline --task tiny --dry-run --out DIR --placement dedicated --overlap  # CPU
    # issue #35, one GPU split in two (vLLM --util, the trainer --trainer-share of GPU 0), against colocated
    python evals/scale_bench.py pipeline --task tiny --out DIR --placement split --util 0.3 --trainer-share 0.5 --phases overlap:20
    python evals/scale_bench.py pipeline --task tiny --out DIR --placement split --ray-trainer --phases overlap:5  # Ray actors
    python evals/scale_bench.py pipeline-report --out DIR           # the pipeline runs' tables and reward curves
    # the memory planner's calibration (trainer/memory.py): one pass's peak, planned against measured
    python evals/scale_bench.py activations --shape qwen2.5-7b --out DIR --act-tokens 4096,8192,16384,32768
    python evals/scale_bench.py activations --shape tiny --dry-run --out DIR                     # CPU check
    # where a training pass's time goes: one causal sequence against packed ones, checkpointing off/on
    python evals/scale_bench.py profile --shape qwen2.5-7b --out DIR --act-tokens 8192,16384 --prof-sequences 1,2

A model folder holds the shape's `config.json` (numbers of the public Hugging Face configs, `SHAPES`),
SmolLM2-135M-Instruct's tokenizer (49,152 ids, all inside each shape's vocabulary) and a
`generation_config.json`; no weights. The trainer builds it with `LocalBackend(random_weights=True)`
(transformers `from_config`, bf16, on the GPU) and vLLM's server starts with `--load-format dummy`.
The policy is noise, so every request fixes its work: `min_tokens` = `max_tokens` with `ignore_eos`, and
sampling is restricted (`allowed_token_ids`) to SmolLM2 tokens that are one whole word with a leading space,
so that sampled text renders back to the same ids in the next turn (multi-turn sequences stay whole) and
no id falls outside the tokenizer.

Workloads:
- `prefix` (#18): 4 groups x 8 rollouts, a ~7.5k-token prompt per group (the same for the 8), 256 sampled
  tokens; one rollout, then the same groups trained with `share_prefix=True` and with `False`.
- `agent` (#12): 32 rollouts (4 groups x 8), 3 turns: ~2.25k-token prompt, 256 sampled, a ~2.25k-token
  tool result (different per rollout), 256 sampled, another, 256 sampled: ~7.6k-token sequences;
  `--agent-steps` steps (rollout, train with sharing, sleep/wake, adapter load).
- `pipeline` (#13): `--pipeline-steps` steps of `--task agent` (the agent workload above, random weights) or
  `--task tiny` (`examples/tiny_task.py` on SmolLM2, real weights: reward) through `trainer.pipeline`, with
  `--placement colocated` (one GPU, sleep/wake) or `dedicated` (vLLM on `--inference-gpus`, the trainer on
  `--trainer-gpus`), and `--overlap` (`max_off_policy_steps=1`: step k+1's rollouts gathered while step k
  trains), or `--phases plain:N,overlap:M` (one registered model: N steps without overlap, then M with).
  Per step: seconds between step ends, rollout and train seconds, reward, policy lag, its phase; per phase
  (`phase_summary`): wall seconds, first and steady step seconds, each GPU's mean utilization (NVML, every
  100 ms) and peak memory. `pipeline-<task>-<placement>-<plain|overlap|plain-overlap>.json`.
  `--placement split` (#35): dedicated on GPU 0 split in two (`inference_gpus == trainer_gpus == [0]`, vLLM's
  `--util`, the trainer's `--trainer-share`); `--ray-trainer`: the trainer and the server each in a Ray actor
  (label `...-<placement>-ray-...`). Per phase also: the rollout seconds that ran while a step trained
  (`rollout_hidden_s`, of `rollout_total_s`), the adapter hand-over (`adapter_swap_s_mean`), sleep + wake and
  the policy lag. `pipeline-report` prints every `pipeline-*.json` of `--out` as tables.
- `activations` (#12): the memory plan's activations term against a measurement. The trainer's own forward and
  backward pass (`trainer.training.accumulate_loss`: packing, the 4-D mask, chunked logprobs; no optimizer
  step) over one sequence of each `--act-tokens` length (one micro-batch of that many tokens), without and with
  gradient checkpointing (`--act-checkpointing`), on the shape with random bf16 weights and LoRA r16 on all
  seven linear layers: `torch.cuda.max_memory_allocated` above what was allocated before the pass, beside the
  planner's `activation_bytes`. `activations-<shape>.json`; a length that runs out of memory is recorded as an
  error and longer ones are skipped. `--dry-run`: the tiny shape in fp32 on the CPU, no measurement.
- `profile` (#12): where a training pass's time goes: rows of `--act-tokens` tokens made of `--prof-sequences`
  sequences (1: one causal sequence, no mask; 2+: packed, with the 4-D mask or as blocks, `--prof-attention`;
  `--prof-prefix`: a shared prefix), checkpointing per `--act-checkpointing`;
  seconds per pass and torch.profiler's device time by kind (matrix multiplies, attention, the rest).
  `profile-<shape>.json`.
- `raw --raw-via server` (#12): the prefix workload's rollouts through vLLM's own OpenAI server started with
  ours' flags but without the training middleware, plain and with what the middleware switches on (token ids,
  logprobs): beside `ours --parts rollout` and `raw`, where ours' rollout overhead over vLLM goes.
  `raw-server-<shape>.json`.
Every part writes its JSON as it goes (`ours-<shape>.json`), and stops starting new work after `--budget-s`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from evals.trainer_gpu_bench import PeakMemory, step_clock

_QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
         "attention_dropout": 0.0, "initializer_range": 0.02, "max_position_embeddings": 32768,
         "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "sliding_window": 131072, "use_sliding_window": False,
         "tie_word_embeddings": False, "vocab_size": 152064, "use_cache": True}
# The public config.json of each model (Hugging Face hub, *-Instruct): what sets memory and compute.
SHAPES: dict[str, dict] = {
    "qwen2.5-7b": {**_QWEN, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "max_window_layers": 28},
    "qwen2.5-14b": {**_QWEN, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48,
                    "num_attention_heads": 40, "num_key_value_heads": 8, "max_window_layers": 48},
    "qwen2.5-32b": {**_QWEN, "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
                    "num_attention_heads": 40, "num_key_value_heads": 8, "max_window_layers": 64},
    "llama-3.1-8b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                     "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rope_theta": 500000.0,
                     "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                     "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "attention_bias": False,
                     "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
                     "pretraining_tp": 1, "use_cache": True},
    # a CPU check of this script (not a real model)
    "tiny": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 32,
             "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 49152, "max_position_embeddings": 16384, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
             "tie_word_embeddings": False},
}
# per shape: vLLM's share of the GPU (the trainer's bf16 copy sits beside it)
GPU_UTIL = {"qwen2.5-7b": 0.45, "llama-3.1-8b": 0.45, "qwen2.5-14b": 0.55, "qwen2.5-32b": 0.5, "tiny": 0.2}
LORA = {"rank": 16, "alpha": 32.0}
SMOLLM2_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "chat_template.jinja")


def default_tokenizer_dir() -> str:
    gpu = Path("/tmp/models/SmolLM2-135M-Instruct")
    if gpu.is_dir():
        return str(gpu)
    from judges.embedded import embedded_model_path

    return str(embedded_model_path())


def make_model_dir(shape: str, directory: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
    """A folder with `shape`'s config.json, SmolLM2's tokenizer files and a generation_config.json (no
    weights): what `LocalBackend(random_weights=True)` and vLLM's `--load-format dummy` start from."""
    import shutil

    from transformers import AutoTokenizer

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    out = Path(directory)
    src = Path(tokenizer_dir or default_tokenizer_dir())
    if not src.is_dir():
        raise FileNotFoundError(f"tokenizer folder {src} does not exist")
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(src)
    if len(tok) > SHAPES[shape]["vocab_size"]:
        raise ValueError(f"the tokenizer's {len(tok)} ids do not fit {shape}'s vocabulary")
    for name in SMOLLM2_TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    (out / "config.json").write_text(json.dumps({**SHAPES[shape], **ids, "torch_dtype": "bfloat16"}, indent=1))
    (out / "generation_config.json").write_text(json.dumps({**ids, "do_sample": True}, indent=1))
    return out


def word_ids(tokenizer) -> list[int]:
    """Ids of single tokens that are one lowercase word with a leading space ('Ġword'): a run of them decodes
    to text that tokenizes back to the same ids."""
    vocab = tokenizer.get_vocab()
    return sorted(i for t, i in vocab.items() if t.startswith("Ġ") and t[1:].isalpha() and t[1:].islower()
                  and 3 <= len(t) <= 9)


def synthetic_text(tokenizer, words: list[int], n_tokens: int, rng: random.Random) -> str:
    """Text of about `n_tokens` tokens (random words of the vocabulary)."""
    return tokenizer.decode([rng.choice(words) for _ in range(n_tokens)]).strip()


def param_count(config: dict) -> int:
    h, i, L, v = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], config["vocab_size"]
    head = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head
    attn = h * h * 2 + h * kv * 2 + (h + 2 * kv if config["model_type"] == "qwen2" else 0)
    per_layer = attn + 3 * h * i + 2 * h
    return L * per_layer + v * h * (1 if config.get("tie_word_embeddings") else 2) + h


class Budget:
    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


# --------------------------------------------------------------------------------------------- ours


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

    from ruler import Trajectory, TrajectoryGroup
    from trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
    from trainer.config import LoRAConfig

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

        def rewards(n):
            return [float(i % 3) for i in range(n)]  # varying: every trajectory has a non-zero advantage

        try:
            # --- #18: the shared-prefix workload, trained with and without sharing
            if "prefix" in args.parts or "rollout" in args.parts:  # `rollout`: the base-model rollouts only
                prompts = [[{"role": "user", "content": synthetic_text(tok, words, args.prefix_tokens, rng)}]
                           for _ in range(args.groups)]
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
                                             for c, w in zip(r.choices, rewards(len(r.choices)))])
                            for p, r in zip(prompts, replies)]

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
                    firsts = [synthetic_text(tok, words, args.turn_tokens, rng) for _ in range(args.groups)]

                    async def rollout_history(first):
                        items: list = [{"role": "user", "content": first}]
                        for k in range(args.turns):
                            history = [it if isinstance(it, dict) else
                                       {"role": "assistant", "content": it.message.content} for it in items]
                            r = await turn(history)
                            items.append(r.choices[0])
                            if k < args.turns - 1:
                                items.append({"role": "user", "content": "Tool result: " +
                                              synthetic_text(tok, words, args.turn_tokens, rng)})
                        return items

                    trajs = await asyncio.gather(*(rollout_history(firsts[g]) for g in range(args.groups)
                                                   for _ in range(args.group_size)))
                    rollout_s = time.perf_counter() - t0
                    groups = [TrajectoryGroup([Trajectory(messages_and_choices=items, reward=w) for items, w in
                                               zip(trajs[g * args.group_size:(g + 1) * args.group_size],
                                                   rewards(args.group_size))]) for g in range(args.groups)]
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


# --------------------------------------------------------------------------------------------- pipeline (#13)


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
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from tiny_task import messages, questions_for_step, reward
    from transformers import AutoTokenizer

    from ruler import Trajectory, TrajectoryGroup
    from trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
    from trainer.config import LoRAConfig
    from trainer.pipeline import train_pipelined

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
        max_num_seqs=64, **({} if args.dry_run else {"gpu_memory_utilization": util}), **gpus))
    def train_config(kind: str) -> TrainConfig:
        return TrainConfig(learning_rate=args.lr if args.task == "tiny" else 1e-5,
                           max_tokens_per_micro_batch=args.micro_tokens,
                           **({"max_off_policy_steps": 1, "sampler_correction": "tis"} if kind == "overlap" else {}))

    result: dict = {"label": label, "task": args.task, "shape": args.shape if args.task == "agent" else "smollm2-135m",
                    "placement": args.placement, "phases": phases, "gpus": gpus, "dry_run": args.dry_run,
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
            async def history(first):
                items: list = [{"role": "user", "content": first}]
                for k in range(args.turns):
                    msgs = [it if isinstance(it, dict) else {"role": "assistant", "content": it.message.content}
                            for it in items]
                    r = await client.chat.completions.create(model=model.name, messages=msgs, max_tokens=args.gen,
                                                             temperature=1.0, extra_body=fixed)
                    items.append(r.choices[0])
                    if k < args.turns - 1:
                        items.append({"role": "user", "content": "Tool result: " +
                                      synthetic_text(tok, words, args.turn_tokens, rng)})
                return items

            firsts = [synthetic_text(tok, words, args.turn_tokens, rng) for _ in range(args.groups)]
            trajs = await asyncio.gather(*(history(firsts[g]) for g in range(args.groups)
                                           for _ in range(args.group_size)))
            groups = [TrajectoryGroup([Trajectory(messages_and_choices=items, reward=float(i % 3)) for i, items in
                                       enumerate(trajs[g * args.group_size:(g + 1) * args.group_size])])
                      for g in range(args.groups)]
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
            # a phase gathers steps + 1 times when it overlaps (the last gather of the loop is for no step): count
            # the gathers that fed a step, and how much of each ran while a step trained (hidden)
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


# --------------------------------------------------------------------------------------------- raw vLLM


def raw(args) -> dict:
    """In-process vllm.LLM.generate on the same shape (dummy weights), the same prefix-workload prompt
    lengths, n and fixed sampling; to run after `ours` has closed its server."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model_dir = make_model_dir(args.shape, args.models / args.shape, args.tokenizer)
    tok = AutoTokenizer.from_pretrained(model_dir)
    words = word_ids(tok)
    rng = random.Random(0)
    result: dict = {"shape": args.shape}
    started = time.perf_counter()
    llm = LLM(model=str(model_dir), load_format="dummy", gpu_memory_utilization=args.util, max_model_len=args.max_seq,
              enable_lora=True, max_lora_rank=LORA["rank"], max_num_seqs=64, seed=0)
    result["start_s"] = time.perf_counter() - started
    prompts = [tok.apply_chat_template([{"role": "user", "content": synthetic_text(tok, words, args.prefix_tokens, rng)}],
                                       add_generation_prompt=True, tokenize=True) for _ in range(args.groups)]
    prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p for p in prompts]
    params = SamplingParams(n=args.group_size, max_tokens=args.gen, min_tokens=args.gen, ignore_eos=True,
                            temperature=1.0, logprobs=0, allowed_token_ids=words)
    runs = []
    for _ in range(args.rollout_reps):
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        dt = time.perf_counter() - t0
        runs.append({"s": dt, "tokens_per_s": sum(len(o.token_ids) for r in outs for o in r.outputs) / dt})
    result.update(prompt_tokens=[len(p) for p in prompts], runs=runs)
    (args.out / f"raw-{args.shape}.json").write_text(json.dumps(result, indent=1))
    return result


def plain_vllm_server(model_dir: Path, args, log_dir: Path):
    """vLLM's OpenAI server started as `ours` starts it (`trainer.vllm_server.VLLMServer`: the same flags, dummy
    weights, LoRA, sleep mode, tool parser, the chat template `trainer.chat.pick_chat_template` picks for the
    tokenizer) but without the training middleware: `raw --raw-via server`."""
    from transformers import AutoTokenizer

    from trainer.chat import pick_chat_template
    from trainer.config import EngineConfig
    from trainer.vllm_server import VLLMServer

    template, tools_ok = pick_chat_template(AutoTokenizer.from_pretrained(model_dir))
    template_file = None
    if template is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        template_file = log_dir / "chat_template.jinja"
        template_file.write_text(template)

    class PlainVLLMServer(VLLMServer):
        name = "vllm-plain"

        def command(self) -> list[str]:
            argv = super().command()
            at = argv.index("--middleware")
            return argv[:at] + argv[at + 2:]

        def environment(self, base=None):
            env = super().environment(base)
            env.pop("RULER_SERVED_NAME", None)
            return env

    config = EngineConfig(engine="vllm", max_seq_length=args.max_seq, gpu_memory_utilization=args.util,
                          max_num_seqs=64, vllm_args={"load_format": "dummy", "seed": 0}, **vllm_fields(args))
    return PlainVLLMServer(str(model_dir), config, served_name="raw", lora_rank=LORA["rank"], log_dir=log_dir,
                           chat_template_file=template_file, tool_parser="hermes", reasoning_parser=None,
                           tools_ok=tools_ok)


REQUEST_KINDS = {  # what a rollout request asks of vLLM's own server, without our middleware
    "plain": {},
    "as_middleware": {"return_token_ids": True, "logprobs": True, "top_logprobs": 0},  # what the middleware adds
}


async def timed_rollout(client, model: str, prompts: list[list[dict]], args, extra: dict) -> dict:
    """One run of the prefix workload's rollout (all prompts at once, n = --group-size, --gen tokens each): its
    seconds, sampled tokens per second and prompt tokens."""
    t0 = time.perf_counter()
    replies = await asyncio.gather(*(client.chat.completions.create(
        model=model, messages=p, n=args.group_size, max_tokens=args.gen, temperature=1.0, extra_body=extra)
        for p in prompts))
    dt = time.perf_counter() - t0
    return {"s": dt, "tokens_per_s": sum(r.usage.completion_tokens for r in replies) / dt,
            "prompt_tokens": [r.usage.prompt_tokens for r in replies]}


async def raw_server(args) -> dict:
    """The prefix workload's rollouts (as `ours --parts rollout` sends them) through vLLM's own OpenAI server
    without our middleware (`plain_vllm_server`), once per `REQUEST_KINDS` entry, alternating run by run:
    with `ours` and `raw` (in-process `vllm.LLM`) it splits ours' overhead over raw vLLM into the OpenAI
    server, the token ids and logprobs vLLM builds, and the middleware with the client's parse.
    `raw-server-<shape>.json`. `--dry-run`: the trainer's CPU server of a tiny random model stands in for vLLM's
    (a check of the script: that server is ours, middleware-like fields included)."""
    from openai import AsyncOpenAI
    from transformers import AutoTokenizer

    model_dir = make_model_dir(args.shape, args.models / args.shape, args.tokenizer)
    tok = AutoTokenizer.from_pretrained(model_dir)
    words = word_ids(tok)
    rng = random.Random(0)  # the prompts of `ours` and `raw`
    prompts = [[{"role": "user", "content": synthetic_text(tok, words, args.prefix_tokens, rng)}]
               for _ in range(args.groups)]
    fixed = {} if args.dry_run else {"min_tokens": args.gen, "ignore_eos": True, "allowed_token_ids": words}
    result: dict = {"shape": args.shape, "dry_run": args.dry_run, "kinds": {k: [] for k in REQUEST_KINDS},
                    "errors": []}
    path = args.out / f"raw-server-{args.shape}.json"

    def save():
        path.write_text(json.dumps(result, indent=1))

    started = time.perf_counter()
    if args.dry_run:
        from trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel
        from trainer.config import LoRAConfig

        model = TrainableModel("raw", "bench", str(model_dir), ModelConfig(
            lora=LoRAConfig(rank=LORA["rank"], alpha=LORA["alpha"]), seed=0,
            engine=EngineConfig(engine="transformers", max_seq_length=args.max_seq)))
        backend = LocalBackend(args.out / "runs", random_weights=True)
        await model.register(backend)
        base_url, name, close = model.inference_base_url, model.name, backend.close
    else:
        server = plain_vllm_server(model_dir, args, args.out / "runs")
        await server.start()
        base_url, name, close = server.base_url, server.served_name, server.close
    result["start_s"] = time.perf_counter() - started
    save()
    failed: set[str] = set()
    try:
        client = AsyncOpenAI(base_url=base_url, api_key="bench", timeout=1200)
        for rep in range(args.rollout_reps + 1):  # the first round warms up (the prompts' prefix cache): not kept
            for kind, extra in REQUEST_KINDS.items():
                if kind in failed:
                    continue
                try:
                    run = await timed_rollout(client, name, prompts, args, {**fixed, **extra})
                except Exception as exc:  # noqa: BLE001 - one kind refused (or timed out) leaves the other
                    failed.add(kind)
                    result["errors"].append(f"{kind}: {type(exc).__name__}: {exc}"[:600])
                    continue
                if rep:
                    result["kinds"][kind].append(run)
                save()
    finally:
        await close()
    save()
    return result


# --------------------------------------------------------------------------------------------- TRL


def trl(args) -> dict:
    """TRL's GRPOTrainer (vLLM colocate with sleep mode, LoRA r=16 on all linear layers, gradient
    checkpointing) on `--trl-workload`:

    - `prefix` (#18): 4 prompts x 8 generations of exactly `--gen` tokens a step;
    - `agent` (#12): the agent workload of `ours`: 4 prompts of ~`--turn-tokens` x 8 rollouts of `--turns` turns,
      each turn exactly `--gen` sampled tokens and, between turns, a ~`--turn-tokens` "tool result" user message.
      Through TRL's `rollout_func` (its way to multi-turn rollouts): each turn is one call of TRL's own
      `trainer.vllm_generation.generate` on all 32 contexts (which wakes the sleeping engine, syncs the weights
      and sleeps it again, as TRL's own tool loop does); the completion is the turns' sampled tokens with the
      tool messages between them, the tool tokens masked out of the loss by `env_mask` and given logprob 0.
      `max_completion_length` is one turn's `--gen` (TRL's generate helper uses it as each call's max_tokens), so
      TRL's `dr_grpo` divides by it while `--turns` x `--gen` tokens train: its loss is that many times larger
      than its normalisation intends (timing and memory are not affected). TRL's defaults stay as a user gets
      them, in both workloads: its vLLM importance-sampling correction runs one more no-grad forward of the batch.

    The random model is built with `from_config` on the GPU and handed to the trainer as an object; TRL's
    vLLM engine starts with dummy weights (vllm.LLM is patched to add load_format="dummy", the one change)
    and receives the trainer's weights through TRL's own weight sync before generating. `--dry-run` (CPU, the
    tiny shape, agent workload only): TRL generates with transformers instead of vLLM (`use_vllm=False`) and
    the rollout function samples each turn with the trainer's model, to check the plumbing."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    import dataclasses

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trainer.config import LLAMA_LIKE_TARGETS

    agent = args.trl_workload == "agent"
    if args.dry_run and not agent:
        raise SystemExit("trl --dry-run checks the agent workload's rollout function: use --trl-workload agent")
    if not args.dry_run:
        import vllm

        original_init = vllm.LLM.__init__

        def dummy_init(self, *a, **kw):
            kw.setdefault("load_format", "dummy")
            original_init(self, *a, **kw)

        vllm.LLM.__init__ = dummy_init
    model_dir = make_model_dir(args.shape, args.models / args.shape, args.tokenizer)
    tok = AutoTokenizer.from_pretrained(model_dir)
    words = word_ids(tok)
    rng = random.Random(0)
    per_device = args.trl_per_device or args.group_size
    if (args.groups * args.group_size) % per_device:
        raise SystemExit(f"--trl-per-device {per_device} must divide the {args.groups * args.group_size} "
                         "completions of a step")
    result: dict = {"shape": args.shape, "workload": args.trl_workload, "trl_version": __import__("trl").__version__,
                    "per_device_train_batch_size": per_device, "dry_run": args.dry_run, "errors": []}
    out_json = args.out / (f"trl-agent-{args.shape}.json" if agent else f"trl-{args.shape}.json")
    first_tokens = args.turn_tokens if agent else args.prefix_tokens
    rows = [{"prompt": [{"role": "user", "content": synthetic_text(tok, words, first_tokens, rng)}]}
            for _ in range(args.groups * args.trl_steps)]
    data = Dataset.from_list(rows)
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    fixed = {"min_tokens": args.gen, "ignore_eos": True, "allowed_token_ids": words}
    wanted = dict(  # noqa: C408 - the GRPOConfig keyword arguments, filtered below
        output_dir=str(args.out / "trl"), learning_rate=1e-5, num_generations=args.group_size,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=args.groups * args.group_size // per_device,
        max_completion_length=args.gen, max_steps=args.trl_steps, loss_type="dr_grpo", beta=0.0,
        temperature=1.0, use_vllm=not args.dry_run, vllm_mode="colocate", vllm_gpu_memory_utilization=args.util,
        vllm_enable_sleep_mode=True, vllm_max_model_length=args.max_seq, bf16=not args.dry_run,
        gradient_checkpointing=not args.dry_run, logging_steps=1, report_to=[], save_strategy="no", seed=0,
        shuffle_dataset=False, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
        max_prompt_length=None, generation_kwargs={} if args.dry_run else fixed)
    result["config_dropped"] = sorted(k for k in wanted if k not in fields)
    config = GRPOConfig(**{k: v for k, v in wanted.items() if k in fields})
    lora = LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], target_modules=LLAMA_LIKE_TARGETS,
                      task_type="CAUSAL_LM")
    rollout = trl_agent_rollout(args, tok, words, rng, result) if agent else None

    def reward(completions, **_):
        return [float(i % 3) for i in range(len(completions))]

    def partial(clock) -> None:  # after each step: what it took so far, written at once
        result["step_end_s"] = [b - a for a, b in zip(clock.stamps[0::2], clock.stamps[1::2], strict=False)]
        result["peak_gpu_gib_so_far"] = mem.gib
        out_json.write_text(json.dumps(result, indent=1, default=str))

    clock = step_clock(partial)

    with PeakMemory() as mem:
        try:
            started = time.perf_counter()
            torch.manual_seed(0)
            with torch.device("cpu" if args.dry_run else "cuda"):
                hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir),
                                                      dtype=torch.float32 if args.dry_run else torch.bfloat16)
            trainer = GRPOTrainer(model=hf, reward_funcs=reward, args=config, train_dataset=data,
                                  processing_class=tok, peft_config=lora, callbacks=[clock],
                                  **({"rollout_func": rollout} if rollout else {}))
            result["setup_s"] = time.perf_counter() - started
            trainer.train()
        except Exception:  # noqa: BLE001 - what TRL failed on is the result
            result["errors"].append(traceback.format_exc()[-3000:])
    if clock.stamps:
        result["step_s"] = clock.step_s()
    if "trainer" in locals():
        result["log"] = list(trainer.state.log_history)
    result["peak_gpu_gib"] = mem.gib
    out_json.write_text(json.dumps(result, indent=1, default=str))
    return result


def trl_agent_rollout(args, tok, words: list[int], rng: random.Random, result: dict):
    """TRL's `rollout_func` for the agent workload (see `trl`): records per-turn seconds in
    `result["trl_rollout_turn_s"]` and the completion lengths in `result["trl_completion_tokens"]`."""
    import torch

    def tool_ids() -> list[int]:  # what the chat template puts between two assistant turns, with the tool result
        text = synthetic_text(tok, words, args.turn_tokens, rng)
        return tok.encode(f"<|im_end|>\n<|im_start|>user\nTool result: {text}<|im_end|>\n<|im_start|>assistant\n",
                          add_special_tokens=False)

    def sample(trainer, contexts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        if not args.dry_run:  # TRL's own vLLM path: wake, sync weights, generate, sleep
            _, completions, logprobs, _ = trainer.vllm_generation.generate(prompts=contexts, images=None,
                                                                           num_generations=1)
            return [list(c) for c in completions], [[lp[0] for lp in seq] for seq in logprobs]
        model = trainer.accelerator.unwrap_model(trainer.model)
        out = []
        for ids in contexts:  # the plumbing check: sampled by the trainer's model, logprob 0
            with torch.no_grad():
                gen = model.generate(torch.tensor([ids]), max_new_tokens=args.gen, min_new_tokens=args.gen,
                                     do_sample=True, pad_token_id=tok.pad_token_id or tok.eos_token_id)
            out.append(gen[0, len(ids):].tolist())
        return out, [[0.0] * len(c) for c in out]

    def rollout(prompts, trainer) -> dict:
        # one rollout per entry: TRL's sampler already repeats each prompt num_generations times in `prompts`
        firsts = [tok.encode(tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True),
                             add_special_tokens=False) for p in prompts]
        contexts = [list(ids) for ids in firsts]
        completion = [[] for _ in contexts]
        logprobs: list[list[float]] = [[] for _ in contexts]
        mask: list[list[int]] = [[] for _ in contexts]
        for turn in range(args.turns):
            started = time.perf_counter()
            sampled, lps = sample(trainer, contexts)
            result.setdefault("trl_rollout_turn_s", []).append(time.perf_counter() - started)
            for i, (ids, lp) in enumerate(zip(sampled, lps, strict=True)):
                completion[i] += ids
                logprobs[i] += lp
                mask[i] += [1] * len(ids)
                contexts[i] += ids
                if turn < args.turns - 1:
                    tool = tool_ids()
                    completion[i] += tool
                    logprobs[i] += [0.0] * len(tool)
                    mask[i] += [0] * len(tool)
                    contexts[i] += tool
        result.setdefault("trl_completion_tokens", []).append([len(c) for c in completion])
        return {"prompt_ids": firsts, "completion_ids": completion,
                "logprobs": logprobs, "env_mask": mask}

    return rollout


# --------------------------------------------------------------------------------------------- activations

def bare_model(args, part: str) -> dict:
    """What `activations` and `sharing` measure on: the shape's architecture with random weights (seed 0, SDPA)
    wrapped with the benchmark's LoRA, in bf16 on the GPU (float32 on the CPU with `--dry-run`), in train mode;
    and the fields every such part records. Gradient checkpointing is left to the part."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.config import LoRAConfig

    cuda = not args.dry_run
    if cuda and not torch.cuda.is_available():
        raise SystemExit(f"{part} measures CUDA memory: run it on a GPU, or --dry-run on the CPU")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    lora = LoRAConfig(rank=LORA["rank"], alpha=LORA["alpha"])
    fields = {"part": part, "shape": args.shape, "device": device, "dtype": str(dtype),
              "lora": {**LORA, "target_modules": lora.target_modules}, "dry_run": args.dry_run,
              "torch": torch.__version__, **({"gpu": torch.cuda.get_device_name(0)} if cuda else {})}
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**SHAPES[args.shape]), dtype=dtype,
                                              attn_implementation="sdpa")
    model = lora.wrap(hf, args.shape)
    model.train()
    fields["build_s"] = time.perf_counter() - started
    return {"cuda": cuda, "lora": lora, "hf": hf, "model": model, "fields": fields}


def checkpointing_settings(args) -> list[str]:
    """`--act-tokens` and `--act-checkpointing` checked (the `activations` and `profile` parts); the settings in
    the order they run, off first."""
    if not args.act_tokens or any(t < 16 for t in args.act_tokens):
        raise SystemExit("--act-tokens: comma-separated token counts, each >= 16")
    if not args.act_checkpointing or not set(args.act_checkpointing) <= {"off", "on"}:
        raise SystemExit("--act-checkpointing: off, on or off,on")
    return sorted(dict.fromkeys(args.act_checkpointing), key=("off", "on").index)


def enable_checkpointing(hf) -> None:
    """Gradient checkpointing on a `bare_model` as the backend has it (non-reentrant), its inputs requiring grad
    (the frozen embeddings' output feeds the checkpointed LoRA layers)."""
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    hf.enable_input_require_grads()


def fresh_peak(cuda: bool) -> int:
    """Before a measured pass: the allocator's cache emptied, the device synchronised and torch's peak reset;
    returns what is allocated now (0 without CUDA)."""
    if not cuda:
        return 0
    import torch

    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def activations(args) -> dict:
    """One training pass's peak activation memory per (tokens, checkpointing), measured and planned."""
    import torch

    from trainer.config import TrainConfig
    from trainer.memory import GIB, activation_bytes, model_shape
    from trainer.sequences import TrainingSequence
    from trainer.training import accumulate_loss

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


# --------------------------------------------------------------------------------------------- sharing
def sharing(args) -> dict:
    """#18's training part alone, without vLLM: `--groups` x `--group-size` sequences, each group one
    `--prefix-tokens` random prompt plus `--gen` trained tokens per sequence, through `accumulate_loss` (forward
    and backward, gradient checkpointing as the trainer sets it for >= 1B on a GPU) with `share_prefix` True,
    False, True. Per call: seconds, torch's peak allocated in this process above what was allocated before it
    (`torch.cuda.max_memory_allocated`), rows, sequence and forward tokens, the loss. No optimizer step (it
    touches only the LoRA parameters)."""
    import torch

    from trainer.config import TrainConfig
    from trainer.memory import GIB, default_checkpointing, model_shape
    from trainer.sequences import TrainingSequence
    from trainer.training import accumulate_loss

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


# --------------------------------------------------------------------------------------------- profile
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
    per block, `trainer.attention`; with `--prof-prefix` P the k sequences share their first P tokens, computed
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

    from trainer import attention as block_attention
    from trainer.config import TrainConfig
    from trainer.memory import model_shape
    from trainer.sequences import TrainingSequence
    from trainer.training import accumulate_loss

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


# --------------------------------------------------------------------------------------------- report
def _peak(row: dict) -> str:
    """The device's peak during a train call; runs before this field existed only recorded the rise above the
    call's start (vLLM awake), which sleeping vLLM hides: shown as not measured."""
    v = row.get("peak_gpu_gib_device_during")
    mine = row.get("trainer_peak_allocated_gib")
    return ("not measured" if v is None else f"{v:.1f}") + ("" if mine is None else f" (trainer's torch: {mine:.1f})")


def report(out: Path) -> str:
    """Markdown tables from the JSON files in `out`."""
    lines = []
    for f in sorted(out.glob("ours-*.json")):
        a = json.loads(f.read_text())
        shape = a["shape"]
        lines.append(f"\n### {shape} ({a['params'] / 1e9:.2f}B parameters), ours\n")
        lines.append("| measure | value |\n|---|---|")
        lines.append(f"| register (trainer build + vLLM server start, s) | {a.get('register_s', float('nan')):.0f} |")
        lines.append(f"| peak GPU memory over the whole run (GiB, NVML, device) | {a.get('peak_gpu_gib', 0):.1f} |")
        p = a.get("prefix")
        if p:
            lines.append(f"| prefix: rollout s (4x8, {statistics.mean(p['prompt_tokens']):.0f}-token prompts, "
                         f"{p['sampled_tokens']} sampled), base model | "
                         f"{' / '.join(f'{x:.2f}' for x in p['rollout_s'])} |")
            if p.get("rollout_adapter_s"):
                lines.append("| prefix: rollout s before each train call (with the latest adapter) | "
                             f"{' / '.join(f'{x:.2f}' for x in p['rollout_adapter_s'])} |")
            for key in ("share", "no_share"):
                for row in p.get(key, []):
                    if "error" in row:
                        lines.append(f"| prefix {key}: train | {row['error'][:200]} |")
                        continue
                    lines.append(f"| prefix {key}: train s / sequence tokens / forward tokens / rows / device peak "
                                 f"GiB in the train call | {row['train_s']:.2f} / {row['sequence_tokens']} / "
                                 f"{row['forward_tokens']} / {row['rows']} / {_peak(row)} |")
                    lines.append(f"| prefix {key}: sleep+wake s / adapter load s / step s | "
                                 f"{row['sleep_wake_s']:.2f} / {row['adapter_swap_s']:.2f} / {row['step_s']:.2f} |")
        ag = a.get("agent")
        if ag:
            for i, row in enumerate(ag["steps"]):
                if "error" in row:
                    lines.append(f"| agent step {i + 1} | {row['error'][:300]} |")
                    continue
                pad = 0.0  # rows are batches of one: no padding token is ever run
                offload = f" + {row['offload_s']:.2f}" if "offload_s" in row else ""
                lines.append(f"| agent step {i + 1}: wall s = rollout + train + sleep/wake + adapter"
                             f"{' + offload' if offload else ''} | {row['wall_s']:.1f} = {row['rollout_wall_s']:.1f} + "
                             f"{row['train_s']:.1f} + {row['sleep_wake_s']:.2f} + {row['adapter_swap_s']:.2f}{offload} "
                             "(+ rest) |")
                lines.append(f"| agent step {i + 1}: rollout tok/s / train tok/s (sequence tokens) | "
                             f"{row['rollout_tokens_per_s']:.0f} / {row['train_tokens_per_s']:.0f} |")
                lines.append(f"| agent step {i + 1}: sequences / sequence tokens / forward tokens / rows / "
                             f"context breaks / padding | {row['sequences']} / {row['sequence_tokens']} / "
                             f"{row['forward_tokens']} / {row['rows']} / {row['context_breaks']} / {pad:.0%} |")
                lines.append(f"| agent step {i + 1}: device peak GiB in the train call | {_peak(row)} |")
        for e in a.get("errors", []):
            lines.append(f"| error | {e.splitlines()[-1][:300] if e else ''} |")
    for f in sorted(out.glob("raw-*.json")):
        if f.name.startswith("raw-server-"):  # below
            continue
        r = json.loads(f.read_text())
        lines.append(f"\nraw vLLM {r['shape']}: " + ", ".join(f"{x['s']:.2f}s {x['tokens_per_s']:.0f} tok/s"
                                                             for x in r["runs"]))
        ours_file = out / f"ours-{r['shape']}.json"
        mine = json.loads(ours_file.read_text()).get("prefix", {}) if ours_file.is_file() else {}
        if len(mine.get("rollout_tokens_per_s", [])) > 1 and len(r["runs"]) > 1:  # the first of each warms up
            ours_best = max(mine["rollout_tokens_per_s"][1:])
            raw_best = max(x["tokens_per_s"] for x in r["runs"][1:])
            lines.append(f"rollout throughput, ours / raw vLLM (best after the first run of each): "
                         f"{ours_best:.0f} / {raw_best:.0f} = {ours_best / raw_best:.2f}x")
            ours_med = statistics.median(mine["rollout_tokens_per_s"][1:])
            raw_med = statistics.median(x["tokens_per_s"] for x in r["runs"][1:])
            lines.append(f"rollout throughput, ours / raw vLLM (median after the first run of each; "
                         f"{len(mine['rollout_tokens_per_s']) - 1} and {len(r['runs']) - 1} runs): "
                         f"{ours_med:.0f} / {raw_med:.0f} = {ours_med / raw_med:.2f}x")
    for f in sorted(out.glob("raw-server-*.json")):
        r = json.loads(f.read_text())
        for kind, runs in r["kinds"].items():
            if runs:
                med = statistics.median(x["tokens_per_s"] for x in runs)
                lines.append(f"vLLM's own server ({kind}), {r['shape']}: " + ", ".join(f"{x['s']:.2f}s" for x in runs)
                             + f"; median {med:.0f} tok/s")
    for f in sorted(out.glob("trl-*.json")):
        t = json.loads(f.read_text())
        lines.append(f"\nTRL {t['shape']} ({t.get('workload', 'prefix')} workload): steps {t.get('step_s')}, "
                     f"peak {t.get('peak_gpu_gib', 0):.1f} GiB, "
                     f"errors {len(t.get('errors', []))}")
    return "\n".join(lines)


def pipeline_report(out: Path) -> str:
    """Markdown tables of the `pipeline-*.json` files in `out`: per run and phase the steady seconds per step and
    steps/s, the rollout seconds hidden behind training, the adapter hand-over, sleep/wake and policy lag; then
    each run's reward per step side by side (equal curves: the same task, seed and step count)."""
    runs = [json.loads(f.read_text()) for f in sorted(Path(out).glob("pipeline-*.json"))]
    if not runs:
        return f"no pipeline-*.json in {out}"

    def num(v, fmt=".2f"):
        return "" if v is None else format(v, fmt)

    lines = [("| run | phase | steps | first step s | steady step s | steps/s | rollout s (all) | hidden s | hidden "
              "| adapter hand-over s | sleep+wake s | policy lag mean / max | reward last |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for p in run.get("phase_summary", []):
            steady = p.get("steady_step_s")
            lines.append(f"| {run['label']} | {p['kind']} | {p['steps']} | {num(p.get('first_step_s'))} | "
                         f"{num(steady)} | {num(1 / steady if steady else None, '.3f')} | "
                         f"{num(p.get('rollout_total_s'))} | {num(p.get('rollout_hidden_s'))} | "
                         f"{num(p.get('rollout_hidden_frac'), '.0%')} | {num(p.get('adapter_swap_s_mean'), '.3f')} | "
                         f"{num(p.get('sleep_wake_s_mean'))} | {num(p.get('policy_lag_mean'))} / "
                         f"{'' if p.get('policy_lag_max') is None else p['policy_lag_max']} | "
                         f"{num(p.get('reward_last'), '.3f')} |")
        if run.get("errors"):
            lines.append(f"| {run['label']} | error | | | | | | | | | | | {run['errors'][-1].splitlines()[-1][:80]} |")
    steps = max(len(run["steps"]) for run in runs)
    lines += ["", "| step | " + " | ".join(run["label"] for run in runs) + " |",
              "|---" * (len(runs) + 1) + "|"]
    for i in range(steps):
        cells = [num(run["steps"][i].get("reward_mean"), ".3f") if i < len(run["steps"]) else "" for run in runs]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
                    default=["mask", "blocks"], help="profile: mask (one 4-D mask per row), blocks (trainer.attention)")
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
