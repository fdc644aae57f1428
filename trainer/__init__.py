"""GRPO on LoRA with ART's client/server loop: rollouts through an OpenAI-compatible server (vLLM or
transformers), rewards from RULER or your own code, one training step per `await model.train(groups)`."""

from trainer.backend import LocalBackend
from trainer.config import EngineConfig, LoRAConfig, ModelConfig, TrainConfig
from ruler.gather import TooManyExceptions, gather_trajectory_groups  # they depend only on ruler
from trainer.model import TrainableModel

__all__ = ["EngineConfig", "LoRAConfig", "LocalBackend", "ModelConfig", "TooManyExceptions", "TrainConfig",
           "TrainableModel", "gather_trajectory_groups"]
