"""Scale benchmark on one GPU (issues #12 and #18): real architectures with random weights.

    python -m evals.scale_bench model  --shape qwen2.5-7b --dir MODELS             # config.json + tokenizer
    python -m evals.scale_bench ours   --shape qwen2.5-7b --out DIR --parts prefix,agent
    python -m evals.scale_bench raw    --shape qwen2.5-7b --out DIR                # raw vllm.LLM, after `ours`
    python -m evals.scale_bench raw    --shape qwen2.5-7b --out DIR --raw-via server  # vLLM's server, no middleware
    python -m evals.scale_bench trl    --shape qwen2.5-7b --out DIR                # TRL GRPOTrainer, prefix workload
    python -m evals.scale_bench report --out DIR                                   # the tables from the JSON files
    python -m evals.scale_bench ours --shape tiny --dry-run --out DIR             # CPU check of the script
    # issue #13, two GPUs: (a) colocated, (b) dedicated, (c) dedicated with one step of overlap
    python -m evals.scale_bench pipeline --task agent --shape qwen2.5-7b --out DIR --placement colocated
    python -m evals.scale_bench pipeline --task agent --shape qwen2.5-7b --out DIR --placement dedicated
    python -m evals.scale_bench pipeline --task agent --shape qwen2.5-7b --out DIR --placement dedicated --overlap
    python -m evals.scale_bench pipeline --task agent --shape qwen2.5-7b --out DIR --placement dedicated --phases plain:2,overlap:3
    python -m evals.scale_bench pipeline --task tiny --out DIR --placement dedicated --overlap    # SmolLM2, reward
    python -m evals.scale_bench pipeline --task tiny --dry-run --out DIR --placement dedicated --overlap  # CPU
    # issue #35, one GPU split in two (vLLM --util, the trainer --trainer-share of GPU 0), against colocated
    python -m evals.scale_bench pipeline --task tiny --out DIR --placement split --util 0.3 --trainer-share 0.5 --phases overlap:20
    python -m evals.scale_bench pipeline --task tiny --out DIR --placement split --ray-trainer --phases overlap:5  # Ray actors
    python -m evals.scale_bench pipeline-report --out DIR           # the pipeline runs' tables and reward curves
    # the memory planner's calibration (trainer/memory.py): one pass's peak, planned against measured
    python -m evals.scale_bench activations --shape qwen2.5-7b --out DIR --act-tokens 4096,8192,16384,32768
    python -m evals.scale_bench activations --shape tiny --dry-run --out DIR                     # CPU check
    # where a training pass's time goes: one causal sequence against packed ones, checkpointing off/on
    python -m evals.scale_bench profile --shape qwen2.5-7b --out DIR --act-tokens 8192,16384 --prof-sequences 1,2

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
  `--task tiny` (`examples/tiny_task.py` on SmolLM2, real weights: reward) through `ruler_rl.trainer.pipeline`, with
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
  backward pass (`ruler_rl.trainer.training.accumulate_loss`: packing, the 4-D mask, chunked logprobs; no optimizer
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

Modules: `shapes` (the shapes and their model folders), `workloads` (random word text, the prefix and agent
workloads, their rewards, the budget), one per part (`ours`, `raw` with `raw --raw-via server`, `trl_grpo`,
`pipeline`, `activations`, `sharing`, `profile`; `passes`: what the last three share), `report` (`report` and
`pipeline-report`) and `cli` (the command line; `__main__` runs it).
"""
