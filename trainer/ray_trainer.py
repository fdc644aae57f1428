"""The trainer placed by Ray too: `EngineConfig(placement="dedicated", launcher="ray", trainer_launcher="ray")`.

Both sides of a run in Ray actors, the driver keeping the same user loop:

    cfg = ModelConfig(engine=EngineConfig(engine="vllm", placement="dedicated", launcher="ray",
                                          trainer_launcher="ray", inference_gpus=[0], trainer_gpus=[0],
                                          gpu_memory_utilization=0.45, trainer_memory_share=0.5))
    await model.register(LocalBackend("./runs"))     # a trainer actor, which starts the server actor
    await train_pipelined(model, gather, steps=10, config=TrainConfig(max_off_policy_steps=1,
                                                                      sampler_correction="tis"))

`LocalBackend.register` of such a model asks Ray for a placement group (`STRICT_PACK`) of one bundle,
`trainer_bundle(config)`, waits at most `placement_timeout_s` for it (`PlacementTimeoutError` past it) and
creates a `TrainerActor` in it. The actor holds a `LocalBackend` of its own and registers the model there with
`trainer_launcher="local"` and the trainer's GPUs numbered as Ray shows them to the actor (`actor_config`): the
LoRA model, its optimizer, each step (all or nothing), the checkpoints and the run log live in the actor, and
that backend starts the inference server as `launcher="ray"` does (`ruler_rl.trainer.ray_placement.RayServer`: a second
actor in a placement group of its own, created from inside the trainer actor). The driver's backend forwards
`train`, `get_step` and `delete_checkpoints` to the actor (`RayTrainer`) and answers `inference_url` and
`current_step` from what the actor last returned; rollouts go straight from the driver to the server's URL.
An error the actor raises is raised in the driver as its own class (`StalePolicyError`, `StepFailedError`,
`MemoryPlanError`, ...), its `__cause__` the `ray.exceptions.RayTaskError` holding the actor's traceback.

On one GPU split in two (`EngineConfig.shares_gpu`) the two bundles ask for `trainer_memory_share` and
`gpu_memory_utilization` of a GPU: Ray's fractional GPUs are a scheduling count, not a memory limit; the limits
are the trainer's allocator cap (`torch.cuda.set_per_process_memory_fraction`) and vLLM's own
`--gpu-memory-utilization`. On a one-GPU node both land on that GPU; on a node of several Ray picks each
bundle's GPU. Checkpoints are written by the actor under the backend's `path`: on several nodes that path
must be shared storage, and `ruler-rl` installed on every node.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from ruler_rl.trainer.config import EngineConfig, ModelConfig, TrainConfig
from ruler_rl.trainer.ray_placement import ActorHolder

log = logging.getLogger("ruler.trainer")


def trainer_bundle(config: EngineConfig) -> dict[str, float]:
    """The one bundle of the trainer actor's placement group: `{"GPU": trainer_memory_share, "CPU":
    trainer_cpus}` on one GPU shared with vLLM (`shares_gpu`), `{"GPU": len(trainer_gpus), "CPU": trainer_cpus}`
    with trainer GPUs of its own, `{"CPU": trainer_cpus}` without GPU lists (the transformers engine's CPU
    form)."""
    if not isinstance(config, EngineConfig):
        raise TypeError(f"config must be a ruler_rl.trainer.EngineConfig, got {type(config).__name__}")
    if config.trainer_launcher != "ray":
        raise ValueError(f"only a trainer placed by Ray has a bundle (trainer_launcher={config.trainer_launcher!r})")
    cpus = float(config.trainer_cpus)
    if config.shares_gpu:
        return {"GPU": float(config.trainer_memory_share), "CPU": cpus}
    if config.trainer_gpus:
        return {"GPU": float(len(config.trainer_gpus)), "CPU": cpus}
    return {"CPU": cpus}


def actor_config(config: EngineConfig) -> EngineConfig:
    """The `EngineConfig` the trainer actor's own backend registers with: `trainer_launcher="local"` (the actor
    is the trainer) and the GPUs numbered as Ray shows them to the actor: its `CUDA_VISIBLE_DEVICES` holds
    exactly its bundle's GPUs, so the trainer's become 0..n-1; the inference GPUs (a count only, Ray picks
    them) follow, or stay the trainer's one shared GPU."""
    if not isinstance(config, EngineConfig):
        raise TypeError(f"config must be a ruler_rl.trainer.EngineConfig, got {type(config).__name__}")
    if config.trainer_launcher != "ray":
        raise ValueError(f"actor_config is for trainer_launcher='ray', got {config.trainer_launcher!r}")
    update: dict[str, Any] = {"trainer_launcher": "local"}
    if config.trainer_gpus:
        n = len(config.trainer_gpus)
        trainer = list(range(n))
        update.update(trainer_gpus=trainer, inference_gpus=trainer if config.shares_gpu
                      else list(range(n, n + len(config.inference_gpus))))
    # validated again as a local trainer's; trainer_cpus is the driver's business (the bundle)
    data = {k: v for k, v in config.model_dump(exclude_unset=True).items() if k != "trainer_cpus"}
    return EngineConfig.model_validate({**data, **update})


class TrainerActor:
    """The Ray actor that is the trainer: a `LocalBackend` of its own in the actor's process (created by
    `RayTrainer`, one per model, in its placement group). Async methods, run in the actor's event loop; the
    training step itself runs in a thread there (as in `LocalBackend`), so `get_step` answers during a step."""

    def __init__(self, backend_cls: type, path: str, wandb_project: str | None, random_weights: bool = False):
        import ray

        self.backend = backend_cls(path, host=ray.util.get_node_ip_address(), wandb_project=wandb_project,
                                    random_weights=random_weights)
        self.models: dict[str, Any] = {}

    async def register(self, name: str, project: str, base_model: str, config: ModelConfig) -> dict[str, Any]:
        """Register the model with this actor's backend (which loads it, starts its inference server and resumes
        from its latest checkpoint); returns the server's URL, the served step and where things run (this
        actor's pid, node, placement group and visible GPUs, the trainer's torch device, the server's `info`)."""
        import ray

        from ruler_rl.trainer.model import TrainableModel

        model = TrainableModel(name, project, base_model, config)
        await model.register(self.backend)
        self.models[name] = model
        run = self.backend._runs[name]
        context = ray.get_runtime_context()
        return {"base_url": self.backend.inference_url(model), "step": self.backend.current_step(model),
                "actor_pid": os.getpid(), "node_id": context.get_node_id(),
                "placement_group_id": context.get_placement_group_id(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "device": str(run.peft_model.device), "server": dict(getattr(run.engine, "info", {}) or {})}

    async def train(self, name: str, groups: list, config: TrainConfig,
                    sequences: bool) -> tuple[dict, list]:
        """One step (`LocalBackend.train`); the run-log row, and the sequences it trained on when `sequences`
        (for the driver's `on_step`)."""
        kept: list = []

        def keep(row, seqs):
            kept[:] = seqs

        row = await self.backend.train(self.models[name], groups, config, on_step=keep if sequences else None)
        return row, kept

    async def get_step(self, name: str) -> int:
        """The served step."""
        return await self.backend.get_step(self.models[name])

    async def delete_checkpoints(self, name: str, metric: str) -> list[int]:
        """`LocalBackend.delete_checkpoints`."""
        return await self.backend.delete_checkpoints(self.models[name], metric)

    async def adapter_state(self, name: str) -> dict:
        """The trainer's LoRA weights now, on the CPU (peft's saved form), for checks."""
        from peft import get_peft_model_state_dict

        run = self.backend._runs[name]
        with run.lock:
            return {k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(run.peft_model).items()}

    async def close(self) -> None:
        """Close the backend: the inference server's actor stopped, its placement group removed."""
        await self.backend.close()


class RayTrainer(ActorHolder):
    """The driver's side of a trainer placed by Ray (`EngineConfig.trainer_launcher="ray"`): the placement group,
    the `TrainerActor`, and what `LocalBackend` forwards to it. `info` says where both sides run once started."""

    def __init__(self, config: EngineConfig, *, backend_cls: type, path: Path, wandb_project: str | None = None,
                 random_weights: bool = False):
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be a ruler_rl.trainer.EngineConfig, got {type(config).__name__}")
        if config.trainer_launcher != "ray":
            raise ValueError(f"RayTrainer needs EngineConfig(trainer_launcher='ray'), got "
                             f"trainer_launcher={config.trainer_launcher!r}")
        self.config, self.path, self.wandb_project = config, Path(path), wandb_project
        # the driver's backend class (`LocalBackend`): the actor runs one of its own; passed in, not imported, so
        # that ruler_rl.trainer.backend -> ruler_rl.trainer.ray_trainer is the one direction between the two modules
        self.backend_cls = backend_cls
        self.random_weights = random_weights  # the driver's LocalBackend(random_weights=...), for the actor's
        self.bundle = trainer_bundle(config)
        self.name = ""
        self.step = 0
        self._hold()

    async def start(self, model) -> None:
        """Connect to Ray, reserve the trainer's bundle (`PlacementTimeoutError` past `placement_timeout_s`),
        create the actor and register `model` in it; on any failure what was created is released."""
        from ruler_rl.trainer.ray_placement import connect, require_ray, wait_placed

        ray = require_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        config = model.config.model_copy(update={"engine": actor_config(model.config.engine)})
        await asyncio.to_thread(connect, [], timeout_s=self.config.placement_timeout_s)
        self._connected = True
        self.name = model.name
        try:
            self.placement_group = placement_group([self.bundle], strategy="STRICT_PACK",
                                                   name=f"ruler-trainer-{model.name}-{os.getpid()}")
            await wait_placed(self.placement_group, self.bundle, self.config.placement_timeout_s, "the trainer's")
            self.actor = ray.remote(TrainerActor).options(
                num_cpus=self.bundle["CPU"], num_gpus=self.bundle.get("GPU", 0.0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement_group,
                                                                     placement_group_bundle_index=0),
            ).remote(self.backend_cls, str(self.path), self.wandb_project, self.random_weights)
            self.info = await self._call(self.actor.register, model.name, model.project, model.base_model, config)
            self.step = self.info["step"]
            log.info("trainer of %s placed by Ray (node %s, GPUs %s, %s); its server at %s", model.name,
                     self.info["node_id"], self.info["cuda_visible_devices"], self.info["device"], self.base_url)
        except BaseException:
            await self.close()
            raise

    @staticmethod
    async def _call(method, *args):
        """`await method.remote(*args)`, an error the actor raised re-raised as its own class."""
        import ray

        try:
            return await method.remote(*args)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from exc
            raise

    async def train(self, groups: list, config: TrainConfig, on_step=None) -> dict:
        """One step in the actor; `on_step(row, sequences)` called here once it returned (what it raises is
        logged, not raised, as `LocalBackend.train` does). Returns the step's run-log row."""
        from ruler_rl.trainer.training import call_after_step

        row, seqs = await self._call(self.actor.train, self.name, list(groups), config, on_step is not None)
        self.step = int(row["step"]) if row.get("trained") else self.step
        call_after_step(on_step, row, seqs)
        return row

    async def get_step(self) -> int:
        """The served step, asked of the actor."""
        self.step = await self._call(self.actor.get_step, self.name)
        return self.step

    async def delete_checkpoints(self, metric: str) -> list[int]:
        return await self._call(self.actor.delete_checkpoints, self.name, metric)

    async def adapter_state(self) -> dict:
        """The trainer's LoRA weights now, fetched from the actor (peft's saved form, CPU tensors)."""
        return await self._call(self.actor.adapter_state, self.name)

    async def close(self) -> None:
        """Close the actor's backend (its server actor and group), kill the actor, remove the group, release the
        Ray connection. Safe twice or after a failed start."""
        if self.actor is not None:
            import ray

            try:
                await self.actor.close.remote()
            except ray.exceptions.RayError as exc:  # the actor died: its server actor may outlive it
                log.warning("the Ray trainer actor of %s failed to close its backend (%s)", self.name, exc)
        await self.release()
