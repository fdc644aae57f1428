"""What a run is configured with: the LoRA, the inference engine, and each training step."""

from __future__ import annotations

from typing import Any, Literal

import pydantic

LossKind = Literal["grpo", "dr_grpo", "dapo"]
LLAMA_LIKE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)


class LoRAConfig(_Strict):
    rank: int = pydantic.Field(8, ge=1, le=512)
    alpha: float = pydantic.Field(16.0, gt=0)
    dropout: float = pydantic.Field(0.0, ge=0, lt=1)
    target_modules: list[str] = pydantic.Field(default_factory=lambda: list(LLAMA_LIKE_TARGETS), min_length=1)


class EngineConfig(_Strict):
    """Which engine serves rollouts and how.

    engine: `auto` picks vLLM's own OpenAI server when vLLM is installed and a GPU is there, else the CPU
    engine (transformers behind a small server speaking the same API subset).
    tool_call_parser / reasoning_parser: vLLM parser names; None picks by model family
    (`trainer.vllm_server.default_parsers`: Qwen3 hermes+qwen3, Qwen2.5/ChatML hermes, Llama-3.x
    llama3_json, Mistral mistral). The CPU server parses `hermes` and `llama3_json`.
    chat_template: a jinja template replacing the tokenizer's (None: the tokenizer's; a ChatML template
    that cannot render tools is replaced by `trainer.chat.HERMES_CHATML_TEMPLATE`).
    The vLLM fields go to vLLM's server as flags; `vllm_args` adds any other (`{"swap_space": 8}` →
    `--swap-space 8`, `True` → a bare flag).
    """
    engine: Literal["auto", "transformers", "vllm"] = "auto"
    max_seq_length: int = pydantic.Field(2048, ge=16)
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None
    gpu_memory_utilization: float = pydantic.Field(0.5, gt=0, le=1)
    max_model_len: int | None = pydantic.Field(None, ge=16)
    enforce_eager: bool = False
    enable_sleep_mode: bool = True
    max_num_seqs: int = pydantic.Field(256, ge=1)
    keep_adapters: int = pydantic.Field(2, ge=1)           # adapters of recent steps kept loaded in vLLM
    startup_timeout_s: float = pydantic.Field(900, gt=0)   # how long vLLM's server may take to come up
    server_timeout_s: float = pydantic.Field(600, gt=0)    # per control call (load adapter, sleep, wake)
    vllm_args: dict[str, Any] = pydantic.Field(default_factory=dict)


class ModelConfig(_Strict):
    lora: LoRAConfig = pydantic.Field(default_factory=LoRAConfig)
    engine: EngineConfig = pydantic.Field(default_factory=EngineConfig)
    # None: on for models of 1B parameters or more on a GPU (activations of long agent sequences dominate
    # memory there), off otherwise
    gradient_checkpointing: bool | None = None
    seed: int = 0
    # Benchmarks of real architectures without their weights: the base model folder needs only config.json and
    # the tokenizer; the trainer builds the model with transformers `from_config` (bf16 on a GPU, created on
    # the device, seeded by `seed`) and vLLM starts with `--load-format dummy` (its own random weights). The
    # two engines then hold different weights, so importance ratios mean nothing: for speed and memory only.
    random_weights: bool = False


class TrainConfig(_Strict):
    """One training step.

    loss: `grpo` (PPO-clip at ±epsilon, each trajectory's trained tokens averaged, then trajectories averaged),
    `dr_grpo` (no length normalisation: each trajectory's token sum divided by `completion_budget`, then
    averaged over trajectories; advantages not divided by the std),
    `dapo` (clip-higher: 1-epsilon .. 1+epsilon_high, one mean over all trained tokens of the batch).
    """
    learning_rate: float = pydantic.Field(5e-5, gt=0)
    loss: LossKind = "grpo"
    epsilon: float = pydantic.Field(0.2, gt=0, lt=1)
    epsilon_high: float = pydantic.Field(0.28, gt=0)
    kl_coef: float = pydantic.Field(0.0, ge=0)
    scale_advantages: bool | None = None  # None: yes, except for dr_grpo
    # A forward pass holds whole sequences packed up to this many tokens (one longer sequence gets a pass
    # of its own); each group's shared prompt is computed once when `share_prefix` and it is at least
    # `min_shared_prefix` tokens (trainer/packing.py).
    max_tokens_per_micro_batch: int = pydantic.Field(8192, ge=16)
    # dr_grpo's constant: the most tokens a trajectory may generate (TRL's max_completion_length). None: the
    # largest count of trained tokens of any trajectory in the batch.
    completion_budget: int | None = pydantic.Field(None, ge=1)
    share_prefix: bool = True
    min_shared_prefix: int = pydantic.Field(32, ge=1)
    max_grad_norm: float = pydantic.Field(1.0, gt=0)
    weight_decay: float = pydantic.Field(0.0, ge=0)
    logprob_chunk_size: int = pydantic.Field(256, ge=1)
    # Choices without served token ids (e.g. from an API model, or a streamed answer) are refused unless this
    # is on: then their text is re-rendered with the chat template, trained with ratio 1, and counted.
    allow_off_policy_text: bool = False
    # Tokens sampled by vLLM get logprobs from its kernels, which differ from the trainer's (bf16: mean
    # |ratio - 1| ~0.05 measured). "tis": the PPO ratio uses the trainer's own logprobs before the update,
    # and each token's policy term is scaled by min(exp(trainer - sampler), sampler_cap) (truncated importance
    # sampling, as TRL's vLLM correction). "none": the sampled logprobs are the old policy as they are.
    sampler_correction: Literal["none", "tis"] = "none"
    sampler_cap: float = pydantic.Field(2.0, gt=0)

    def scales_advantages(self) -> bool:
        return self.loss != "dr_grpo" if self.scale_advantages is None else self.scale_advantages
