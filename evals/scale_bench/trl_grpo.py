"""`trl`: TRL's GRPOTrainer on the same shape and workloads, the peer the trainer is compared with."""

from __future__ import annotations

import json
import os
import random
import time
import traceback

from evals.scale_bench.shapes import LORA, make_model_dir
from evals.scale_bench.workloads import synthetic_text, varied_rewards, word_ids
from evals.trainer_gpu_bench import PeakMemory, step_clock


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

    from ruler_rl.trainer.config import LLAMA_LIKE_TARGETS

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
        return varied_rewards(len(completions))

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


