"""GRPO-family training of a LoRA adapter with ART's client/server loop: rollouts talk to an OpenAI-compatible
server (vLLM's own on a GPU, a small transformers-backed one otherwise; `ruler_rl.trainer.engine.Engine`), rewards come
from RULER or your own code, and each `await model.train(groups)` is one step (`TrainConfig`: grpo, dr_grpo
or dapo) trained on exactly the tokens and logprobs the server sampled.

Needs the `train` extra: without it, importing `ruler_rl.trainer` raises `ruler_rl.judges.extras.MissingExtraError`
(an ImportError) naming the `pip install` that adds it."""

if __name__ != "ruler_rl.trainer":  # one name, so one copy (pyproject's package-dir)
    raise ImportError(f"the folder trainer/ is the package ruler_rl.trainer: import ruler_rl.trainer, not {__name__} "
                      "(install the checkout with `pip install -e .`, as .ci/setup does)")

from ruler_rl.judges.extras import require

require("train", "the trainer (import ruler_rl.trainer)")  # before anything below imports torch

import importlib

# each name loads its module on first use (PEP 562): `import ruler_rl.trainer` (and `ruler train-report --help`, which
# imports ruler_rl.trainer.cli) does not import torch, transformers or pandas until a name below is used
_NAMES = {
    "LocalBackend": "ruler_rl.trainer.backend", "StepFailedError": "ruler_rl.trainer.backend",
    "TrainerStateError": "ruler_rl.trainer.backend", "EngineConfig": "ruler_rl.trainer.config",
    "LoRAConfig": "ruler_rl.trainer.config", "MemoryCheckConfig": "ruler_rl.trainer.config",
    "ModelConfig": "ruler_rl.trainer.config", "TrainConfig": "ruler_rl.trainer.config",
    "MemoryPlanError": "ruler_rl.trainer.memory", "plan_memory": "ruler_rl.trainer.memory",
    "TooManyExceptions": "ruler_rl.gather", "gather_trajectory_groups": "ruler_rl.gather",
    "TrainableModel": "ruler_rl.trainer.model", "train_pipelined": "ruler_rl.trainer.pipeline",
    "record_trajectory": "ruler_rl.trainer.record",
}


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'ruler_rl.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})


__all__ = ["EngineConfig", "LoRAConfig", "LocalBackend", "MemoryCheckConfig", "MemoryPlanError", "ModelConfig",
           "StepFailedError", "TooManyExceptions", "TrainConfig", "TrainableModel", "TrainerStateError",
           "gather_trajectory_groups", "plan_memory", "record_trajectory", "train_pipelined"]
