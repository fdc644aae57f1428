"""GRPO-family training of a LoRA adapter with ART's client/server loop: rollouts talk to an OpenAI-compatible
server (vLLM's own on a GPU, a small transformers-backed one otherwise; `trainer.engine.Engine`), rewards come
from RULER or your own code, and each `await model.train(groups)` is one step (`TrainConfig`: grpo, dr_grpo
or dapo) trained on exactly the tokens and logprobs the server sampled.

Needs the `train` extra (`pip install 'ruler-rl[train]'`): without it, importing `trainer` raises
`judges.extras.MissingExtraError` (an ImportError) naming that command."""

from judges.extras import require

require("train", "the trainer (import trainer)")  # before anything below imports torch

from trainer.backend import LocalBackend, StepFailedError, TrainerStateError
from trainer.config import EngineConfig, LoRAConfig, MemoryCheckConfig, ModelConfig, TrainConfig
from trainer.memory import MemoryPlanError, plan_memory
from ruler.gather import TooManyExceptions, gather_trajectory_groups
from trainer.model import TrainableModel
from trainer.pipeline import train_pipelined
from trainer.record import record_trajectory

__all__ = ["EngineConfig", "LoRAConfig", "LocalBackend", "MemoryCheckConfig", "MemoryPlanError", "ModelConfig",
           "StepFailedError", "TooManyExceptions", "TrainConfig", "TrainableModel", "TrainerStateError", "gather_trajectory_groups", "plan_memory", "record_trajectory",
           "train_pipelined"]
