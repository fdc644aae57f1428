"""GRPO-family training of a LoRA adapter with ART's client/server loop: rollouts talk to an OpenAI-compatible
server (vLLM's own on a GPU, a small transformers-backed one otherwise; `trainer.engine.Engine`), rewards come
from RULER or your own code, and each `await model.train(groups)` is one step (`TrainConfig`: grpo, dr_grpo
or dapo) trained on exactly the tokens and logprobs the server sampled.

Needs the `train` extra (`pip install 'ruler-rl[train]'`): without it, importing `trainer` raises
`judges.extras.MissingExtraError` (an ImportError) naming that command."""

from judges.extras import require

require("train", "the trainer (import trainer)")  # before anything below imports torch

import importlib

# each name loads its module on first use (PEP 562): `import trainer` (and `ruler train-report --help`, which
# imports trainer.cli) does not import torch, transformers or pandas until a name below is used
_NAMES = {
    "LocalBackend": "trainer.backend", "StepFailedError": "trainer.backend", "TrainerStateError": "trainer.backend",
    "EngineConfig": "trainer.config", "LoRAConfig": "trainer.config", "MemoryCheckConfig": "trainer.config",
    "ModelConfig": "trainer.config", "TrainConfig": "trainer.config", "MemoryPlanError": "trainer.memory",
    "plan_memory": "trainer.memory", "TooManyExceptions": "ruler.gather", "gather_trajectory_groups": "ruler.gather",
    "TrainableModel": "trainer.model", "train_pipelined": "trainer.pipeline", "record_trajectory": "trainer.record",
}


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})


__all__ = ["EngineConfig", "LoRAConfig", "LocalBackend", "MemoryCheckConfig", "MemoryPlanError", "ModelConfig",
           "StepFailedError", "TooManyExceptions", "TrainConfig", "TrainableModel", "TrainerStateError", "gather_trajectory_groups", "plan_memory", "record_trajectory",
           "train_pipelined"]
