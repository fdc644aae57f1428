"""`LocalBackend`: loads the base model with a peft LoRA, starts the inference server, and runs training
steps with checkpoints and the run log.

    backend = LocalBackend(path="./runs")
    await model.register(backend)          # resumes from the latest complete checkpoint, if any

Engine `auto`: vLLM's own OpenAI server (a child process per model, `trainer/vllm_server.py`) when vLLM is
installed and a GPU is present, else the CPU engine (transformers behind `trainer/server.py`, one server
for all models). Either way rollouts get `prompt_token_ids`, `token_ids` and sampled logprobs on every
choice, and training uses exactly those (`trainer/sequences.py`). The backend drives both engines through
the `ruler_rl.trainer.engine.Engine` protocol alone: an engine with its own `base_url` answers rollouts itself, one
without is served by the CPU server; `can_sleep` says whether to sleep it around a training step.

Placement (`EngineConfig.placement`): `colocated` shares one device between the engine and the trainer;
`dedicated` gives vLLM's server `inference_gpus` and trains on the first of `trainer_gpus` with no sleep/wake,
so the server keeps answering (with the previous adapter) while a step trains; with the transformers engine
`dedicated` runs the CPU server in a child process of its own (`trainer/engine_process.py`). With
`EngineConfig.launcher="ray"` the dedicated server is started by a Ray actor on a placement group instead of
as this process's child (`trainer/ray_placement.py`); the trainer stays here unless
`EngineConfig.trainer_launcher="ray"` puts it in a Ray actor too (`trainer/ray_trainer.py`: this backend then
forwards `train`, `get_step` and `delete_checkpoints` to it). A dedicated vLLM placement may split one GPU in
two (`EngineConfig.shares_gpu`: vLLM's `gpu_memory_utilization` and the trainer's `trainer_memory_share`, to
which its allocator is capped). Either way each served choice says which policy step sampled it
(`policy_step`), and `train` refuses trajectories older than `TrainConfig.max_off_policy_steps`
(`ruler_rl.trainer.sequences.StalePolicyError`).

A step is all or nothing (`LocalBackend._step`): a failure once the update has begun is rolled back whole
(`StepFailedError`), or, when that cannot be vouched for, stops the trainer (`TrainerStateError`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import ruler_rl.trainer.checkpoints as ckpt
from ruler_rl import tracing
from ruler_rl.trainer import attention
from ruler_rl.trainer.chat import pick_chat_template
from ruler_rl.trainer.config import TrainConfig
from ruler_rl.trainer.engine import Engine, GeneratingEngine
from ruler_rl.trainer.memory import default_checkpointing, resolve_dtype, vllm_dtype
from ruler_rl.trainer.runlog import append_row, load_run_log
from ruler_rl.trainer.sequences import TrainingSequence, end_of_turn_ids
from ruler_rl.trainer.server import BackgroundServer, Served, create_server_app
from ruler_rl.trainer.training import call_after_step, prepare, train_step, verify_logprob_path, verify_packed_rows

log = logging.getLogger("ruler.trainer")


class StepFailedError(RuntimeError):
    """A training step failed after it began changing the trainer's state (the update, its checkpoint, the
    server's adapter load, vLLM's wake-up) and was rolled back whole: the adapter weights and optimizer state are
    those of the last completed step again and the failed step's checkpoint is not on disk; a server of its own
    was told to drop the failed step's adapter (best effort: the message says whether that worked). Retrying the
    step applies its update once. The cause is `__cause__`."""

    def __init__(self, message: str, *, step: int):
        super().__init__(message)
        self.step = step  # the step that was not applied

    def __reduce__(self):  # pickled whole (a trainer in a Ray actor raises it in the driver)
        return _step_failed, (str(self), self.step)


def _step_failed(message: str, step: int) -> StepFailedError:
    return StepFailedError(message, step=step)


class TrainerStateError(RuntimeError):
    """The trainer cannot vouch for its in-memory state (a step or its rollback was interrupted, or rolling back a
    failed step failed): it takes no further step. Close the backend and register the model again: it resumes
    from the newest complete checkpoint on disk."""


def resolve_base_model(name: str) -> str:
    """A local folder, the embedded model's name (`local/smollm2-135m-instruct`), or a hub id."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("base_model must be a non-empty string")
    from ruler_rl.judges import EMBEDDED_JUDGE

    if name in (EMBEDDED_JUDGE, EMBEDDED_JUDGE.split("/", 1)[1]):
        from ruler_rl.judges.embedded import embedded_model_path

        return str(embedded_model_path())
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name)
    except Exception as exc:
        raise ValueError(f"base model {name!r} is neither a local folder nor a model this machine can fetch "
                         f"from the hub ({type(exc).__name__})") from None
    return name


def _check_lora(cfg, engine: str) -> None:
    """Refuse LoRA settings the engine cannot serve; warn about those that make training logprobs differ
    from the sampler's."""
    if cfg.lora.dropout > 0:
        log.warning("lora.dropout=%s: dropout is active in the training forward but not when sampling, so "
                    "importance ratios start away from 1; 0 keeps training token-exact", cfg.lora.dropout)
    if engine == "vllm":
        from ruler_rl.trainer.vllm_server import lora_serving_rank

        lora_serving_rank(cfg.lora.rank)
        unservable = sorted(set(cfg.lora.target_modules) & {"embed_tokens", "lm_head", "wte", "word_embeddings"})
        if unservable:
            raise ValueError(f"vLLM serves LoRA on linear layers, not on {unservable}: drop them from "
                             "lora.target_modules")


def _check_memory(cfg, base: str, kind: str, device: str):
    """The memory plan (`ruler_rl.trainer.memory.plan_memory`) of `cfg` on `device`, made before anything is loaded:
    `MemoryPlanError` when it does not fit, one info line when it does. Made on a CUDA device (its total
    memory; what other processes and models this process already holds count as in use, this process's
    context and allocator cache do not; with a dedicated vLLM placement vLLM's share is of the first inference
    GPU's total), or on any device as if it had `cfg.memory_check.device_gib` GiB; skipped when
    `memory_check.enabled` is off, on the CPU without `device_gib`, and (with a warning) for a config.json the
    planner cannot read or a quantised or offloaded model. Returns `(plan, replan)`, `replan(train_config)`
    making the same plan for a step's `TrainConfig`, or `(None, None)` when no plan is made."""
    check = cfg.memory_check
    on_cuda = device.startswith("cuda")
    if not check.enabled or (not on_cuda and check.device_gib is None):
        return None, None
    from transformers import AutoConfig

    from ruler_rl.trainer.memory import GIB, MemoryPlanError, memory_in_use, plan_memory

    inference_total = None
    if check.device_gib is not None:
        total, in_use = int(check.device_gib * GIB), 0
    else:
        import torch

        dev = torch.device(device)
        free, total = torch.cuda.mem_get_info(dev)
        # asking created this process's context; its allocator's cached blocks are its own to reuse
        in_use = memory_in_use(free, total, torch.cuda.memory_reserved(dev), torch.cuda.memory_allocated(dev))
        if kind == "vllm" and cfg.engine.placement == "dedicated" and cfg.engine.inference_gpus:
            # placed by Ray, the inference GPU is not known here: planned as one of the trainer's size
            inference_total = (total if cfg.engine.launcher == "ray"
                               else torch.cuda.mem_get_info(cfg.engine.inference_gpus[0])[1])
    hf_config: dict = {}

    host = _host_bytes(check)

    def replan(train=None):
        return plan_memory(cfg, hf_config, device_bytes=total, in_use_bytes=in_use, cuda=on_cuda, engine=kind,
                           base=base, inference_device_bytes=inference_total, train=train, host_bytes=host)

    try:
        hf_config.update(AutoConfig.from_pretrained(base).to_dict())
        plan = replan()
    except ValueError as exc:
        log.warning("no memory plan for %s (%s); registering without one", base, exc)
        return None, None
    if not plan.fits:
        raise MemoryPlanError(plan)
    log.info("%s", plan.summary())
    return plan, replan


def _host_bytes(check) -> int:
    """CPU memory free for the run: `check.host_gib` (a `MemoryCheckConfig`) when set, else what the OS reports
    available now (psutil)."""
    if check.host_gib is not None:
        from ruler_rl.trainer.memory import GIB

        return int(check.host_gib * GIB)
    import psutil

    return psutil.virtual_memory().available


def _cpu_checkpointing(cfg, base: str, kind: str, device: str) -> bool | None:
    """`ModelConfig.gradient_checkpointing=None` on the CPU: True when one training pass without checkpointing would
    not fit 80% of the memory the OS reports available (psutil; `memory_check.host_gib` when set; at most
    `memory_check.device_gib`), by the memory plan (`plan_memory` with that as the device, of passes of
    `max(memory_check.max_tokens_per_micro_batch or 8192, max_seq_length)` tokens; the rest for what it does not
    count: the rollouts' logits, Python and torch themselves); else None (the default rule: off). Never refuses a run: the
    CPU is not planned unless `memory_check.device_gib` says so. None as well when the config sets checkpointing,
    on a GPU, with `memory_check` off, or when the planner cannot read the model's config.json.

    Without it, `ruler distill --method grpo` on SmolLM2-135M (8,192-token passes: ~20 GiB of fp32 activations
    planned) was killed by the kernel at 24 GB on a 24-GB machine (2026-12-07); with it the same pass is planned
    at ~1.6 GiB."""
    if cfg.gradient_checkpointing is not None or device.startswith("cuda") or not cfg.memory_check.enabled:
        return None
    from transformers import AutoConfig

    from ruler_rl.trainer.memory import GIB, plan_memory

    available = _host_bytes(cfg.memory_check)
    # a fifth of what is available kept for what the plan does not count (the rollouts' logits, Python, torch);
    # with `device_gib`, which `_check_memory` then plans against, no more than that
    room = int(0.8 * available)
    if cfg.memory_check.device_gib is not None:
        room = min(room, int(cfg.memory_check.device_gib * GIB))
    try:
        plan = plan_memory(cfg.model_copy(update={"gradient_checkpointing": False}),
                           AutoConfig.from_pretrained(base).to_dict(), device_bytes=room, cuda=False,
                           engine=kind, base=base, host_bytes=available)
    except (ValueError, OSError) as exc:
        log.warning("no memory plan for %s on the CPU (%s): gradient checkpointing stays off", base, exc)
        return None
    if plan.fits:
        return None
    log.warning("gradient checkpointing on: training passes of up to %d tokens without it are planned at %.1f GiB "
                "(activations %.1f GiB), more than the %.1f GiB kept for them (80%% of the %.1f GiB available, or "
                "memory_check.device_gib). ModelConfig.gradient_checkpointing=False keeps it off; a smaller "
                "TrainConfig.max_tokens_per_micro_batch, with ModelConfig.memory_check.max_tokens_per_micro_batch "
                "set to it, needs less", plan.tokens_per_pass, plan.training_bytes / GIB,
                plan.activations_bytes / GIB, room / GIB, available / GIB)
    return True


def _replan_for_step(run, config: TrainConfig) -> None:
    """A step whose `TrainConfig.max_tokens_per_micro_batch` exceeds what the register-time memory plan assumed:
    re-plan with it, warn naming both numbers and the re-planned need, and raise `MemoryPlanError` (nothing
    trained) when the re-plan does not fit. The re-plan that fits becomes the run's plan (one warning)."""
    plan = run.memory_plan
    if plan is None or run.replan is None or config.max_tokens_per_micro_batch <= plan.max_tokens_per_micro_batch:
        return
    from ruler_rl.trainer.memory import GIB, MemoryPlanError

    again = run.replan(config)
    log.warning("TrainConfig.max_tokens_per_micro_batch %d is larger than the %d the memory plan at register "
                "assumed (ModelConfig.memory_check.max_tokens_per_micro_batch): re-planned activations %.1f GiB "
                "(%d-token passes), training %.1f of %.1f GiB: %s", config.max_tokens_per_micro_batch,
                plan.max_tokens_per_micro_batch, again.activations_bytes / GIB, again.tokens_per_pass,
                again.training_bytes / GIB, again.device_bytes / GIB, "fits" if again.fits else "does NOT fit")
    if not again.fits:
        raise MemoryPlanError(again)
    run.memory_plan = again


def _credit_by_policy_step(rows: list[dict], metric: str) -> dict[int, tuple[float, float]]:
    """`{policy step: (sum of metric x weight, weight)}` over the run log's trained rows: `reward_mean` split by
    `reward_by_policy_step` (weighted by `rollouts_by_policy_step`); another metric, or a row without the split,
    credited whole to the step that sampled most of its rollouts, else to the row's step minus one."""
    credit: dict[int, list[float]] = {}

    def add(step: int, value, weight: float) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and weight > 0:
            total = credit.setdefault(step, [0.0, 0.0])
            total[0] += float(value) * weight
            total[1] += weight

    for row in rows:
        if row.get("trained") != True:  # noqa: E712 - a numpy bool from the DataFrame counts
            continue
        split, counts = row.get("reward_by_policy_step"), row.get("rollouts_by_policy_step")
        counts = counts if isinstance(counts, dict) else {}
        if metric == "reward_mean" and isinstance(split, dict) and split:
            for k, value in split.items():
                add(int(k), value, float(counts.get(k, 1)))
        elif counts:
            add(int(max(counts, key=lambda k: (counts[k], -int(k)))), row.get(metric), 1.0)
        elif isinstance(row.get("step"), (int, float)) and math.isfinite(row["step"]):
            add(int(row["step"]) - 1, row.get(metric), 1.0)
    return {k: (v[0], v[1]) for k, v in credit.items()}


def _state_on_cpu(peft_model, optimizer) -> tuple[dict, dict]:
    """A copy, on the CPU, of the adapter's weights (peft's saved form) and the optimizer's state."""
    import copy

    from peft import get_peft_model_state_dict

    adapter = {k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(peft_model).items()}
    return adapter, copy.deepcopy(optimizer.state_dict())


def _engine_kind(cfg) -> str:
    """The engine `cfg` asks for (`auto`: vLLM when installed, else transformers), its settings checked against
    it: `offload_during_rollouts` needs a colocated, sleeping vLLM, and vLLM does not serve float32."""
    from ruler_rl.trainer.vllm_server import resolved_engine

    kind = resolved_engine(cfg.engine)
    if cfg.offload_during_rollouts and (kind != "vllm" or cfg.engine.placement != "colocated"
                                        or not cfg.engine.enable_sleep_mode):
        raise ValueError("offload_during_rollouts frees the trainer's GPU memory for a colocated vLLM during "
                         f"rollouts: it needs the vLLM engine (here {kind!r}), placement='colocated' (here "
                         f"{cfg.engine.placement!r}) and enable_sleep_mode=True (here "
                         f"{cfg.engine.enable_sleep_mode}), so that vLLM frees its memory while the weights "
                         "come back for a step")
    if kind == "vllm" and vllm_dtype(cfg) in ("float32", "float"):
        raise ValueError("vLLM serves LoRA adapters in bfloat16/float16 only (its LoRA kernels refuse float32): "
                         "with engine='vllm' keep dtype 'auto' or 'bfloat16', or train in float32 beside a bf16 "
                         "sampler with EngineConfig(vllm_args={'dtype': 'bfloat16'})")
    return kind


def _resume(peft_model, optimizer, run_dir: Path, name: str, device) -> tuple[int, tuple[dict, dict] | None]:
    """(the latest complete checkpoint's step, loaded into `peft_model` and `optimizer`; None as the initial
    state) or, with no checkpoint, (0, the initial adapter and optimizer state on the CPU: what a failed first
    step rolls back to)."""
    step = ckpt.latest_checkpoint(run_dir) or 0
    if not step:
        return 0, _state_on_cpu(peft_model, optimizer)
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    where = ckpt.checkpoint_dir(run_dir, step)
    set_peft_model_state_dict(peft_model, load_file(str(where / "adapter_model.safetensors")))
    if (where / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(where / "optimizer.pt", map_location=device))
    log.info("resumed %s from step %d", name, step)
    return step, None


@dataclass(frozen=True)
class _Chat:
    """How a model's chats are rendered and parsed: its chat template (None: the tokenizer's own), whether it
    renders tools, the tool-call and reasoning parsers, and the end-of-turn token ids."""
    template: str | None
    tools_ok: bool
    tool_parser: str | None
    reasoning_parser: str | None
    end_of_turn: Any


def _chat_settings(cfg, tokenizer, hf) -> _Chat:
    """The `_Chat` of a loaded model: `EngineConfig.chat_template` or what `pick_chat_template` picks, and the
    parsers the engine config names or the model type defaults to."""
    from ruler_rl.trainer.vllm_server import default_parsers

    end_of_turn = end_of_turn_ids(tokenizer, getattr(hf, "generation_config", None))
    template, tools_ok = pick_chat_template(tokenizer, cfg.engine.chat_template)
    tool_parser, reasoning_parser = default_parsers(hf.config.model_type,
                                                    template or getattr(tokenizer, "chat_template", None))
    return _Chat(template, tools_ok, cfg.engine.tool_call_parser or tool_parser,
                 cfg.engine.reasoning_parser or reasoning_parser, end_of_turn)


def _proven_paths(peft_model, base: str, dtype) -> tuple[bool, bool]:
    """(full_forward, masks): whether training must use the model's full forward (the chunked logprobs differ
    from it), and whether packed rows may share prefixes: checked against each sequence's own forward in
    float32, taken as given in half precision (where rounding alone differs as much as a mask fault)."""
    import torch

    # logprobs for training: the chunked path only where it is proven equal to the model's own forward
    deviation = verify_logprob_path(peft_model)
    full_forward = deviation > (1e-3 if dtype == torch.float32 else 5e-2)
    if full_forward:
        log.warning("%s: chunked logprobs differ from the model's own forward by %.2g; training uses the "
                    "model's full forward (more memory)", base, deviation)
    # packed rows against each sequence alone: in float32 only, where they agree to ~1e-5; in half precision
    # rounding alone moves a logprob by 0.1-0.25 (SmolLM2 in bf16 against float32), as much as a mask fault
    packed_deviation = verify_packed_rows(peft_model) if dtype == torch.float32 else 0.0
    masks = packed_deviation <= 1e-3
    if not masks:
        log.warning("%s: packed rows (a 4-D mask, shared prefixes) differ from each sequence's own forward by "
                    "%.2g; training gives every sequence a forward pass of its own (no sharing)", base,
                    packed_deviation)
    return full_forward, masks


@dataclass
class _Run:
    model: Any
    run_dir: Path
    peft_model: Any
    tokenizer: Any
    optimizer: Any
    engine: Engine
    served: Served
    lock: threading.Lock
    full_forward: bool = False
    masks: bool = True  # packed rows (4-D masks) proven equal to the model's own forward (verify_packed_rows)
    last_train_end: float = field(default_factory=time.perf_counter)
    wandb_run: Any = None
    memory_plan: Any = None  # ruler_rl.trainer.memory.MemoryPlan made at register (None: no plan)
    replan: Any = None  # TrainConfig -> MemoryPlan, the same plan for a step's TrainConfig
    offload: Any = None  # ruler_rl.trainer.offload.WeightOffload with ModelConfig.offload_during_rollouts
    initial_state: Any = None  # (adapter state, optimizer state) on the CPU before step 1: what a failed first
    # step rolls back to (later steps roll back to their predecessor's checkpoint)
    broken: str | None = None  # why the trainer takes no further step (TrainerStateError), or None
    dirty: bool = False  # the weights / optimizer state may differ from the served step's (a step is underway)
    stepping: bool = False  # a train() call is between its prepare and its end


class LocalBackend:
    """Loads, serves and trains the models registered with it (the module docstring says how). `path`: the folder
    of the runs (checkpoints, run logs), `host`: the address the servers it starts listen on, `port`: the CPU
    server's (None: a free one), `wandb_project`: log each step to Weights & Biases.

    `random_weights`, for benchmarks and tests only: build every model registered here from its config.json with
    random weights instead of reading its weights (transformers `from_config` in the trainer's dtype, created on
    its device, seeded by `ModelConfig.seed`; vLLM started with `load_format='dummy'`, its own random weights), so
    the base folder needs only config.json and the tokenizer. The two engines then hold different weights:
    importance ratios and rewards mean nothing, speed and memory are those of the real architecture. It is an
    argument of the backend, not a `ModelConfig` field, so that no training configuration carries it."""

    def __init__(self, path: str | Path = "./.ruler-runs", *, host: str = "127.0.0.1", port: int | None = None,
                 wandb_project: str | None = None, random_weights: bool = False):
        self.path = Path(path)
        self.random_weights = random_weights
        self.host, self.port = host, port
        self.wandb_project = wandb_project
        self._runs: dict[str, _Run] = {}
        self._remote: dict[str, Any] = {}  # ruler_rl.trainer.ray_trainer.RayTrainer of models trained in a Ray actor
        self._served: dict[str, Served] = {}
        self._server: BackgroundServer | None = None

    def inference_url(self, model) -> str:
        """The OpenAI-compatible base URL serving `model` (vLLM's server on a GPU, the CPU server otherwise)."""
        remote = self._remote.get(getattr(model, "name", None))
        if remote is not None:
            return remote.base_url
        run = self._run(model)
        own = run.engine.base_url
        if own is not None:
            return own
        if self._server is None:
            raise RuntimeError("the CPU server is not running")
        return self._server.url

    def current_step(self, model) -> int:
        """The served step (with the trainer in a Ray actor: as the actor last reported it)."""
        remote = self._remote.get(getattr(model, "name", None))
        return remote.step if remote is not None else self._run(model).served.step

    async def register(self, model) -> None:
        if model.name in self._runs or model.name in self._remote:
            raise ValueError(f"a model named {model.name!r} is already registered with this backend")
        if model.config.engine.trainer_launcher == "ray":  # the trainer in a Ray actor (trainer/ray_trainer.py)
            from ruler_rl.trainer.ray_trainer import RayTrainer

            remote = RayTrainer(model.config.engine, backend_cls=type(self), path=self.path,
                                wandb_project=self.wandb_project, random_weights=self.random_weights)
            await remote.start(model)
            self._remote[model.name] = remote
            return
        run_dir = self.path / model.project / model.name
        removed = ckpt.remove_partial(run_dir)
        if removed:
            log.warning("removed half-written checkpoints left by a crash: %s", removed)
        run = await asyncio.to_thread(self._load, model, run_dir)
        try:
            await run.engine.start()
            if run.served.step:  # resumed: the engine serves the checkpoint's adapter (a no-op in-process)
                await run.engine.load_adapter(run.served.step, ckpt.checkpoint_dir(run_dir, run.served.step))
            in_process = run.engine.base_url is None
            if in_process and not isinstance(run.engine, GeneratingEngine):
                raise TypeError(f"engine {run.engine.name!r} has no server of its own and cannot generate "
                                "in-process: it implements neither half of ruler_rl.trainer.engine's protocols")
        except BaseException:
            await run.engine.close()
            raise
        if self.wandb_project:
            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError("wandb_project is set but wandb is not installed: pip install wandb") from exc
            run.wandb_run = wandb.init(project=self.wandb_project, name=f"{model.project}/{model.name}",
                                       id=f"{model.project}-{model.name}", resume="allow",
                                       config=model.config.model_dump())
        self._runs[model.name] = run
        if in_process:  # the CPU server answers for engines without a server of their own
            self._served[model.name] = run.served
            if self._server is None:
                self._server = BackgroundServer(create_server_app(self._served), self.host, self.port or 0)
                await self._server.start()

    def _load(self, model, run_dir: Path) -> _Run:
        """Load `model` for `register`, in order: the engine and the memory plan checked before anything is
        loaded, the tokenizer and the base model with its LoRA and optimizer (resumed from the latest
        checkpoint), the chat settings, the proven logprob paths, the engine (not yet started), and with
        `offload_during_rollouts` the base weights moved to CPU memory."""
        import torch
        from transformers import AutoTokenizer

        cfg = model.config
        base = resolve_base_model(model.base_model)
        cuda = torch.cuda.is_available()
        kind = _engine_kind(cfg)
        device = self._trainer_device(cfg.engine, kind, cuda)
        if _cpu_checkpointing(cfg, base, kind, device):  # the activations would not fit this machine's memory
            cfg = cfg.model_copy(update={"gradient_checkpointing": True})
        plan, replan = _check_memory(cfg, base, kind, device)  # before the tokenizer, the weights or vLLM
        if cuda and kind == "vllm" and cfg.engine.shares_gpu:  # one GPU split in two: the trainer keeps to its share
            torch.cuda.set_per_process_memory_fraction(cfg.engine.trainer_memory_share, torch.device(device))
        torch.manual_seed(cfg.seed)
        tokenizer = AutoTokenizer.from_pretrained(base)
        hf = self._base_model(cfg, base, device, cuda)
        peft_model = cfg.lora.wrap(hf, base)
        optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-5)
        step, initial = _resume(peft_model, optimizer, run_dir, model.name, hf.device)
        lock = threading.Lock()
        _check_lora(cfg, kind)
        chat = _chat_settings(cfg, tokenizer, hf)
        full_forward, masks = _proven_paths(peft_model, base, hf.dtype)
        if kind == "vllm":
            engine = self._vllm_engine(model, base, chat, run_dir)
        else:
            engine = self._transformers_engine(model, base, chat, run_dir, peft_model, tokenizer, lock, step)
        served = Served(model.name, engine if isinstance(engine, GeneratingEngine) else None, tokenizer,
                        cfg.engine.max_seq_length, step, chat_template=chat.template, renders_tools=chat.tools_ok,
                        tool_parser=chat.tool_parser, reasoning_parser=chat.reasoning_parser,
                        end_of_turn=chat.end_of_turn)
        offload = None
        if cfg.offload_during_rollouts:  # before vLLM starts: its start-up sizes the KV cache to the free memory
            from ruler_rl.trainer.offload import WeightOffload

            offload = WeightOffload(peft_model)
            log.info("%s: %.1f GiB of base weights moved to CPU memory in %.1f s (offload_during_rollouts)",
                     model.name, offload.bytes / 2**30, offload.to_cpu())
        return _Run(model, run_dir, peft_model, tokenizer, optimizer, engine, served, lock, full_forward,
                    masks=masks, memory_plan=plan, replan=replan, offload=offload, initial_state=initial)

    def _base_model(self, cfg, base: str, device: str, cuda: bool):
        """The transformers model of `base` on `device` in the trainer's dtype (its weights read, or with the
        backend's `random_weights` built from its config.json on the device), gradient checkpointing and block
        attention set as `cfg` asks."""
        import torch
        from transformers import AutoModelForCausalLM

        dtype = getattr(torch, resolve_dtype(cfg.dtype, cuda))
        if self.random_weights:  # the architecture only: built on the device, no weights read
            from transformers import AutoConfig

            with torch.device(device):
                hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base), dtype=dtype)
        else:
            hf = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
            hf.to(device)
        checkpointing = cfg.gradient_checkpointing
        if checkpointing is None:  # on for 1B+ models on a GPU (on the CPU `_load` decides by the memory available)
            checkpointing = default_checkpointing(sum(p.numel() for p in hf.parameters()), cuda)
        if checkpointing:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            hf.enable_input_require_grads()
        if cfg.block_attention:  # packed rows as one SDPA call per block (no [T x T] mask); SDPA models only
            attention.enable(hf)
        return hf

    def _vllm_engine(self, model, base: str, chat: _Chat, run_dir: Path):
        """vLLM's server for `model` (not started): the chat template written to the run folder, vLLM's dtype the
        trainer's unless `vllm_args` sets one, and with the backend's `random_weights` vLLM's own random weights
        (`load_format='dummy'`)."""
        from ruler_rl.trainer.vllm_server import VLLMServer

        cfg = model.config
        template_file = None
        if chat.template is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            template_file = run_dir / "chat_template.jinja"
            template_file.write_text(chat.template)
        defaults = {**({"load_format": "dummy"} if self.random_weights else {}),
                    **({"dtype": vllm_dtype(cfg)} if vllm_dtype(cfg) else {})}
        engine_cfg = cfg.engine.model_copy(update={"vllm_args": {**defaults, **cfg.engine.vllm_args}})
        make = partial(VLLMServer, base, engine_cfg, served_name=model.name, lora_rank=cfg.lora.rank,
                       log_dir=run_dir, chat_template_file=template_file, tool_parser=chat.tool_parser,
                       reasoning_parser=chat.reasoning_parser, tools_ok=chat.tools_ok)
        return self._launch(make, engine_cfg, model.name, run_dir)

    def _transformers_engine(self, model, base: str, chat: _Chat, run_dir: Path, peft_model, tokenizer,
                             lock: threading.Lock, step: int):
        """The transformers engine for `model`: in a child process of its own with `placement='dedicated'`,
        else generating with the trainer's own `peft_model` in this process (served by the CPU server)."""
        from ruler_rl.trainer.chat import TOOL_PARSERS
        from ruler_rl.trainer.engine_transformers import TransformersEngine

        cfg = model.config
        if chat.tool_parser not in TOOL_PARSERS:
            raise ValueError(f"the CPU engine parses tool calls with {sorted(TOOL_PARSERS)}; {base} defaults to "
                             f"{chat.tool_parser!r}: set EngineConfig.tool_call_parser")
        if cfg.engine.placement == "dedicated":  # the CPU server in a child process of its own
            from ruler_rl.trainer.engine_process import TransformersServerProcess

            make = partial(TransformersServerProcess, base, cfg.engine, served_name=model.name, lora=cfg.lora,
                           log_dir=run_dir, chat_template=chat.template, renders_tools=chat.tools_ok,
                           tool_parser=chat.tool_parser, reasoning_parser=chat.reasoning_parser,
                           end_of_turn=chat.end_of_turn, random_weights=self.random_weights, seed=cfg.seed)
            return self._launch(make, cfg.engine, model.name, run_dir)
        engine = TransformersEngine(peft_model, tokenizer, lock, stop_token_ids=chat.end_of_turn)
        engine.policy_step = step
        return engine

    def _launch(self, make, engine_cfg, name: str, run_dir: Path):
        """The dedicated server `make(host=...)` builds: a child process of this one on the backend's host
        (`launcher='local'`), or one a Ray actor starts on the node Ray places it (`launcher='ray'`,
        `ruler_rl.trainer.ray_placement.RayServer`: Ray is imported only then)."""
        if engine_cfg.launcher == "ray":
            from ruler_rl.trainer.ray_placement import RayServer, require_ray

            require_ray()  # MissingExtraError naming the extra before the server is built
            return RayServer(make, engine_cfg, served_name=name, log_dir=run_dir)
        return make(host=self.host)

    @staticmethod
    def _trainer_device(engine_cfg, kind: str, cuda: bool) -> str:
        """The trainer's torch device: `cuda:<first trainer GPU>` for a dedicated vLLM placement (its GPUs checked
        to exist first), `cuda` or `cpu` otherwise."""
        if engine_cfg.placement != "dedicated" or not engine_cfg.trainer_gpus:
            return "cuda" if cuda else "cpu"
        if kind != "vllm":
            from ruler_rl.judges.extras import pip_command

            raise ValueError("placement='dedicated' with inference_gpus/trainer_gpus needs the vLLM engine, and vLLM "
                             f"is not available here ({pip_command('gpu')} on a CUDA machine); without GPU "
                             "lists the transformers engine's dedicated form runs its server on the CPU")
        import torch

        from ruler_rl.trainer.vllm_server import check_gpus

        # with Ray the inference GPUs are Ray's to pick (on any node): only the trainer's must be here
        local = engine_cfg.model_copy(update={"inference_gpus": []}) if engine_cfg.launcher == "ray" else engine_cfg
        check_gpus(local, torch.cuda.device_count() if cuda else 0)
        if len(engine_cfg.trainer_gpus) > 1:
            log.warning("trainer_gpus=%s: this version trains on the first only (cuda:%d); sharding the trainer "
                        "(torch FSDP) is the README's Scale plan", engine_cfg.trainer_gpus, engine_cfg.trainer_gpus[0])
        return f"cuda:{engine_cfg.trainer_gpus[0]}"

    def _run(self, model) -> _Run:
        run = self._runs.get(getattr(model, "name", None))
        if run is None:
            raise RuntimeError("register the model with this backend first: await model.register(backend)")
        return run

    async def get_step(self, model) -> int:
        remote = self._remote.get(getattr(model, "name", None))
        return await remote.get_step() if remote is not None else self._run(model).served.step

    async def train(self, model, groups: list, config: TrainConfig, *,
                    on_step: Callable[[dict, list[TrainingSequence]], None] | None = None) -> dict:
        """One step on `groups`; returns (and logs) the step's row. Nothing to learn from: no step taken. What
        `ruler_rl.trainer.training.prepare` raises (malformed, stale or untokenised trajectories, `MissingTokenIdsError`
        for a batch without a served choice) is raised before anything is trained.
        `on_step(row, sequences)`, when given, is called once the row is logged, with the sequences the step
        trained on (each with its `advantage`, `group` and `position`; none when no step was taken); what it
        raises is logged, not raised, since the step is taken by then (model.train's tracing hook). With the trainer
        in a Ray actor (`EngineConfig.trainer_launcher="ray"`) the step runs there and `on_step` here."""
        remote = self._remote.get(getattr(model, "name", None))
        if remote is not None:
            if not isinstance(config, TrainConfig):
                raise TypeError("config must be a ruler_rl.trainer.TrainConfig")
            if on_step is not None and not callable(on_step):
                raise TypeError(f"on_step must be callable or None, got {type(on_step).__name__}")
            return await remote.train(groups, config, on_step)
        run = self._run(model)
        if run.broken:
            raise TrainerStateError(f"{run.broken}; no further step is taken: close the backend and register the "
                                    "model again to resume from the last complete checkpoint")
        if not isinstance(config, TrainConfig):
            raise TypeError("config must be a ruler_rl.trainer.TrainConfig")
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be callable or None, got {type(on_step).__name__}")
        if run.stepping:
            raise RuntimeError(f"a step of {model.name!r} is being trained already: await it before the next one")
        run.stepping = True
        try:
            return await self._train(run, groups, config, on_step)
        finally:
            run.stepping = False

    async def _train(self, run: _Run, groups: list, config: TrainConfig, on_step) -> dict:
        _replan_for_step(run, config)  # MemoryPlanError before anything is trained
        started = time.perf_counter()
        rollout_s = started - run.last_train_end
        seqs, prep = await asyncio.to_thread(prepare, list(groups), run.tokenizer, config,
                                             run.served.max_seq_length, chat_template=run.served.chat_template,
                                             end_of_turn=run.served.end_of_turn, policy_step=run.served.step)
        row: dict[str, Any] = {"step": run.served.step, "time": time.time(), "loss_kind": config.loss,
                               "rollout_s": rollout_s, **prep}
        if not seqs:
            log.warning("step %d: no group with a learning signal (%s); no update", run.served.step, prep["skipped"])
            row.update(trained=False)
            append_row(run.run_dir, row, wandb_run=run.wandb_run)
            run.last_train_end = time.perf_counter()
            call_after_step(on_step, row, seqs)
            return row
        if prep["stale_turns_uncorrected"]:
            log.warning("step %d: %d stale turn(s) without sampled logprobs (constrained, or none sent) are trained "
                        "with the trainer's own logprobs as the old policy: no importance weight corrects their "
                        "staleness (stale_turns_uncorrected)", run.served.step + 1, prep["stale_turns_uncorrected"])
        return await self._step(run, run.served.step + 1, seqs, config, row, prep, started, on_step)

    async def _step(self, run: _Run, step: int, seqs, config: TrainConfig, row: dict, prep: dict, started: float,
                    on_step) -> dict:
        """Train, checkpoint and serve step `step`, all or nothing (`_roll_back`)."""
        sleeps = run.engine.can_sleep  # vLLM without sleep mode keeps answering with the previous adapter, the
        slept = moved = 0.0            # transformers engine's requests wait on the training lock
        try:
            try:
                sleep_started = time.perf_counter()
                if sleeps:
                    await run.engine.sleep()
                slept = time.perf_counter() - sleep_started
                if run.offload is not None:  # the base weights back on the GPU vLLM's sleep just freed
                    moved += await asyncio.to_thread(run.offload.to_device)
                stats, where = await asyncio.to_thread(self._train_and_save, run, seqs, config, step,
                                                       {"reward_mean": prep["reward_mean"]})
            finally:
                try:
                    if run.offload is not None:  # and off it again before vLLM wakes
                        moved += await asyncio.to_thread(run.offload.to_cpu)
                finally:
                    wake_started = time.perf_counter()
                    if sleeps:  # also after a failed sleep: whatever it left asleep is woken
                        await run.engine.wake()
                    slept += time.perf_counter() - wake_started
            swap_started = time.perf_counter()
            await run.engine.load_adapter(step, where)
        except Exception as exc:
            await self._roll_back(run, step, exc)  # raises
        except BaseException:  # cancelled or interrupted: a thread may still be writing the weights or the checkpoint
            run.broken = (f"step {step} was interrupted before it completed, so the adapter weights, the optimizer "
                          "state and the checkpoints may be at either step")
            raise
        with run.lock:  # the step is complete: the served step moves with the in-process engine's
            run.served.step = step
            run.dirty = False
            if isinstance(run.engine, GeneratingEngine):
                run.engine.policy_step = step
        run.initial_state = None  # a checkpoint holds the state to roll back to from now on
        if run.offload is not None:
            row["offload_s"] = moved
        row.update(trained=True, step=step, **stats, sleep_wake_s=slept,
                   adapter_swap_s=time.perf_counter() - swap_started, step_s=time.perf_counter() - started)
        try:
            append_row(run.run_dir, row, wandb_run=run.wandb_run)
        except Exception as exc:  # the step is complete (checkpoint, served adapter): say so, do not undo it
            log.error("step %d is applied and checkpointed, but its run-log row could not be written (%s: %s): %s",
                      step, type(exc).__name__, exc, row)
        run.last_train_end = time.perf_counter()
        call_after_step(on_step, row, seqs)
        return row

    def _train_and_save(self, run: _Run, seqs, config: TrainConfig, step: int, state: dict) -> tuple[dict, Path]:
        """The update and its checkpoint under the training lock, so the in-process engine never samples with
        weights whose checkpoint is not written: a failure once the update has begun restores the last step's
        state before the lock is let go. `(stats, checkpoint folder)`."""
        import torch

        def updating():
            run.dirty = True  # from here on the weights and the optimizer state may be the new step's

        with run.lock:
            for g in run.optimizer.param_groups:
                g["lr"], g["weight_decay"] = config.learning_rate, config.weight_decay
            try:
                stats = train_step(run.peft_model, run.optimizer, seqs, config, full_forward=run.full_forward,
                                   masks=run.masks, before_update=updating)
                if torch.cuda.is_available():  # hand the activations' cached blocks back before vLLM wakes
                    torch.cuda.empty_cache()
                where = ckpt.save_checkpoint(run.run_dir, step, run.peft_model, run.optimizer,
                                             {**state, "loss": stats["loss"]})
            except torch.OutOfMemoryError:
                self._undo_locked(run, step, "out of memory")
                torch.cuda.empty_cache()
                raise MemoryError("out of memory in the training step (nothing applied; the last checkpoint is "
                                  "intact): lower max_tokens_per_micro_batch or max_seq_length, or enable "
                                  "gradient_checkpointing") from None
            except BaseException as exc:
                self._undo_locked(run, step, f"{type(exc).__name__}: {exc}", exc)
                raise
            if isinstance(run.engine, GeneratingEngine):  # it samples with these weights from now on
                run.engine.policy_step = step
            return stats, where

    def _undo_locked(self, run: _Run, step: int, why: str, exc: BaseException | None = None) -> None:
        """Inside `_train_and_save`, a failure: gradients dropped and, when the update had begun, the last step's
        state restored; `TrainerStateError` (and the trainer stopped) when that restore fails."""
        run.optimizer.zero_grad(set_to_none=True)
        if not run.dirty:
            return
        try:
            self._restore_locked(run)
        except Exception as again:
            run.broken = (f"step {step} failed ({why}) and rolling it back failed too ({type(again).__name__}: "
                          f"{again})")
            raise TrainerStateError(f"{run.broken}; no further step is taken: close the backend and register the "
                                    "model again to resume from the last complete checkpoint") from exc

    async def _roll_back(self, run: _Run, step: int, exc: Exception) -> None:
        """Undo a step that failed at any point after it began: an engine with a server of its own told to stop
        serving the failed step's adapter (first: a request it still routes there must not find the folder gone;
        it touches no trainer state), the failed step's checkpoint removed (a crash after that resumes from the
        last completed step), then the adapter weights and the optimizer state as that step left them (its
        checkpoint, or the state before step 1) unless they are already, the in-process engine's step back.
        Raises `StepFailedError` from `exc`; the trainer's own errors that promise nothing was applied (out of
        memory, a non-finite gradient) are raised as they are; `TrainerStateError` when the rollback itself fails
        (no further step is taken). Interrupted (cancelled), it leaves the trainer refusing further steps."""
        try:
            serving = await self._serve_again(run, step)
            if isinstance(exc, TrainerStateError):  # the restore under the lock failed already
                await asyncio.to_thread(ckpt.remove_checkpoint, run.run_dir, step)
                raise exc
            try:
                await asyncio.to_thread(ckpt.remove_checkpoint, run.run_dir, step)
                if run.dirty:
                    await asyncio.to_thread(self._restore, run)
            except Exception as again:
                run.broken = (f"step {step} failed ({type(exc).__name__}: {exc}) and rolling it back failed too "
                              f"({type(again).__name__}: {again})")
                raise TrainerStateError(f"{run.broken}; no further step is taken: close the backend and register "
                                        "the model again to resume from the last complete checkpoint") from exc
        except BaseException as interrupted:
            if not isinstance(interrupted, Exception):
                run.broken = (f"step {step} failed ({type(exc).__name__}: {exc}) and its rollback was interrupted, so "
                              "the adapter weights and the optimizer state may be at either step")
            raise
        log.warning("step %d failed (%s: %s) and was rolled back: the trainer is at step %d", step,
                    type(exc).__name__, exc, run.served.step)
        if isinstance(exc, (MemoryError, FloatingPointError)):
            raise exc
        raise StepFailedError(f"step {step} was not applied: {type(exc).__name__}: {exc}. The trainer is back at "
                              f"step {run.served.step} (adapter weights, optimizer state and checkpoints as that "
                              f"step left them; {serving}): retrying applies step {step} once", step=step) from exc

    async def _serve_again(self, run: _Run, failed: int) -> str:
        """After a rollback, an engine with a server of its own is told to stop serving the failed step's adapter,
        in case its load reached the server (a load that failed on this side after it succeeded on the server's):
        the server then serves the latest adapter it still holds, the last completed step's. Best effort (the
        trainer's own state is already whole); what happened, for the error message."""
        if run.engine.base_url is None:
            return "the in-process engine samples with the restored weights"
        try:
            await run.engine.unload_adapter(failed)
        except Exception as exc:
            log.warning("after rolling back step %d, the %s server could not be told to drop its adapter (%s: %s)",
                        failed, run.engine.name, type(exc).__name__, exc)
            return (f"the {run.engine.name} server could not be told to drop step {failed}'s adapter "
                    f"({type(exc).__name__}), which it holds only if the failed load reached it")
        return f"the {run.engine.name} server serves step {run.served.step}'s adapter"

    def _restore(self, run: _Run) -> None:
        """The adapter weights and optimizer state of the served step, under the training lock."""
        with run.lock:
            self._restore_locked(run)

    def _restore_locked(self, run: _Run) -> None:
        """`_restore` with the training lock held by the caller: the old optimizer state is let go before the
        saved one is loaded (one copy at a time on the device)."""
        import torch
        from peft import set_peft_model_state_dict

        step = run.served.step
        if step == 0:
            adapter, optimizer = run.initial_state
        else:
            from safetensors.torch import load_file

            where = ckpt.checkpoint_dir(run.run_dir, step)
            adapter = load_file(str(where / "adapter_model.safetensors"))
            optimizer = (torch.load(where / "optimizer.pt", map_location="cpu") if (where / "optimizer.pt").is_file()
                         else None)
        run.optimizer.zero_grad(set_to_none=True)
        set_peft_model_state_dict(run.peft_model, adapter)
        run.optimizer.state.clear()
        if optimizer is not None:  # None: a checkpoint written without optimizer state, resumed with a fresh one
            run.optimizer.load_state_dict(optimizer)
        if isinstance(run.engine, GeneratingEngine):
            run.engine.policy_step = step
        run.dirty = False

    async def delete_checkpoints(self, model, metric: str = "reward_mean") -> list[int]:
        """Keep the latest checkpoint and the best one, the checkpoint whose own rollouts scored the highest
        `metric`; the steps deleted. Rollouts are credited to the policy step that sampled them (each served
        choice's `policy_step`; a row's `reward_by_policy_step` splits its rewards by it), so with pipelining,
        where a step trains on rollouts of the policy one step older, the rewards still reach the checkpoint
        that produced them. Other metrics (and rows logged without the split) go to the step that sampled most
        of the row's rollouts, or the one before the row's step when that is unknown (on-policy)."""
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be a run-log column name, got {metric!r}")
        remote = self._remote.get(getattr(model, "name", None))
        if remote is not None:
            return await remote.delete_checkpoints(metric)
        run = self._run(model)
        steps = ckpt.list_checkpoints(run.run_dir)
        keep = {run.served.step}
        try:
            rows = load_run_log(run.run_dir).to_dict("records")
        except FileNotFoundError:
            rows = []
        credit = _credit_by_policy_step(rows, metric)
        best = {s: total / weight for s, (total, weight) in credit.items() if s in steps and weight > 0}
        if best:
            keep.add(max(best, key=best.get))
        return await asyncio.to_thread(ckpt.delete_checkpoints, run.run_dir, keep)

    async def close(self) -> None:
        for remote in self._remote.values():  # each closes its actor's backend, server included
            await remote.close()
        self._remote.clear()
        for run in self._runs.values():
            await run.engine.close()
            if run.wandb_run is not None:
                run.wandb_run.finish()
        if self._server is not None:
            await self._server.stop()
            self._server = None
        await asyncio.to_thread(tracing.flush)  # what the tracer buffered (ruler_rl.tracing), when tracing is on
