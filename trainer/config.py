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
    """Which engine serves rollouts and how. `auto`: vLLM when it is installed and a GPU is there, else
    transformers. The vLLM fields are passed to `vllm.AsyncEngineArgs`; `vllm_args` adds any other."""
    engine: Literal["auto", "transformers", "vllm"] = "auto"
    max_seq_length: int = pydantic.Field(2048, ge=16)
    gpu_memory_utilization: float = pydantic.Field(0.5, gt=0, le=1)
    max_model_len: int | None = pydantic.Field(None, ge=16)
    enforce_eager: bool = False
    enable_sleep_mode: bool = True
    max_num_seqs: int = pydantic.Field(256, ge=1)
    vllm_args: dict[str, Any] = pydantic.Field(default_factory=dict)


class ModelConfig(_Strict):
    lora: LoRAConfig = pydantic.Field(default_factory=LoRAConfig)
    engine: EngineConfig = pydantic.Field(default_factory=EngineConfig)
    gradient_checkpointing: bool = False
    seed: int = 0


class TrainConfig(_Strict):
    """One training step.

    loss: `grpo` (PPO-clip at ±epsilon, each sequence's tokens averaged, then sequences averaged),
    `dr_grpo` (no length normalisation: token sums over a constant, advantages not divided by the std),
    `dapo` (clip-higher: 1-epsilon .. 1+epsilon_high, one mean over all tokens of the batch).
    """
    learning_rate: float = pydantic.Field(5e-5, gt=0)
    loss: LossKind = "grpo"
    epsilon: float = pydantic.Field(0.2, gt=0, lt=1)
    epsilon_high: float = pydantic.Field(0.28, gt=0)
    kl_coef: float = pydantic.Field(0.0, ge=0)
    scale_advantages: bool | None = None  # None: yes, except for dr_grpo
    micro_batch_size: int = pydantic.Field(4, ge=1)
    max_grad_norm: float = pydantic.Field(1.0, gt=0)
    weight_decay: float = pydantic.Field(0.0, ge=0)
    logprob_chunk_size: int = pydantic.Field(256, ge=1)

    def scales_advantages(self) -> bool:
        return self.loss != "dr_grpo" if self.scale_advantages is None else self.scale_advantages
