"""GRPO on LoRA with ART's client/server loop: rollouts through an OpenAI-compatible server (vLLM or
transformers), rewards from RULER or your own code, one training step per `await model.train(groups)`.

Needs the `train` extra (`pip install 'ruler-rl[train]'`): without it, importing `trainer` raises
`judges.extras.MissingExtraError` (an ImportError) naming that command."""

from judges.extras import require

require("train", "the trainer (import trainer)")  # before anything below imports torch

from trainer.backend import LocalBackend  # noqa: E402
from trainer.config import EngineConfig, LoRAConfig, ModelConfig, TrainConfig  # noqa: E402
from ruler.gather import TooManyExceptions, gather_trajectory_groups  # noqa: E402  (they depend only on ruler)
from trainer.model import TrainableModel  # noqa: E402

__all__ = ["EngineConfig", "LoRAConfig", "LocalBackend", "ModelConfig", "TooManyExceptions", "TrainConfig",
           "TrainableModel", "gather_trajectory_groups"]
