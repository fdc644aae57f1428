"""`TrainableModel`: ART's user-facing shape of a model being trained with LoRA.

    model = TrainableModel("agent-001", "my-project", "Qwen/Qwen2.5-1.5B-Instruct")
    await model.register(LocalBackend())      # loads it, starts its engine, resumes from a checkpoint
    client = model.openai_client()            # rollouts: model=model.get_inference_name()
    await model.train(groups)                 # one GRPO step; the served adapter is then the new one

Rollout code written for ART runs unchanged against it: `inference_base_url`, `inference_api_key`,
`inference_model_name`, `get_inference_name()`, `litellm_completion_params()`, `trainable`. The model holds
no weights itself: the backend it is registered with does (`ruler_rl.trainer.backend.LocalBackend`).
"""

from __future__ import annotations

import re
from pathlib import Path

from ruler_rl import tracing
from ruler_rl.trainer.config import ModelConfig, TrainConfig

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class TrainableModel:
    """A named LoRA run on `base_model` (a hub id, a local folder, or `local/smollm2-135m-instruct`, the embedded
    model). `name` and `project` (1-100 letters, digits, `.`, `_`, `-`) place its run at
    `{backend.path}/{project}/{name}`; `name` is also the served model name. `config`: `ModelConfig()` by
    default."""

    trainable = True  # ART's flag: rollout code branches on it (e.g. no response caching for trainable models)

    def __init__(self, name: str, project: str, base_model: str, config: ModelConfig | None = None):
        for what, value in (("name", name), ("project", project)):
            if not isinstance(value, str) or not NAME.match(value):
                raise ValueError(f"{what} must be 1-100 letters, digits, '.', '_' or '-', got {value!r}")
        if not isinstance(base_model, str) or not base_model.strip():
            raise ValueError("base_model must be a non-empty string")
        if config is not None and not isinstance(config, ModelConfig):
            raise TypeError("config must be a ruler_rl.trainer.ModelConfig")
        self.name, self.project, self.base_model = name, project, base_model
        self.config = config or ModelConfig()
        self._backend = None
        self._client = None

    @property
    def backend(self):
        if self._backend is None:
            raise RuntimeError(f"model {self.name!r} is not registered: await model.register(backend) first")
        return self._backend

    async def register(self, backend) -> None:
        """Load the model into `backend`, start its engine and resume from its latest complete checkpoint."""
        if not callable(getattr(backend, "register", None)):
            raise TypeError(f"backend must be a ruler_rl.trainer.LocalBackend, got {type(backend).__name__}")
        await backend.register(self)
        self._backend = backend

    # ---- ART's inference fields: rollout code written for ART runs unchanged against this model ----

    @property
    def inference_base_url(self) -> str:
        """The OpenAI-compatible base URL serving this model (`…/v1`)."""
        return self.backend.inference_url(self)

    @property
    def inference_api_key(self) -> str:
        return "ruler-rl"  # the local servers take any key

    @property
    def inference_model_name(self) -> str:
        """The served name: it always means the latest step's adapter (`get_inference_name()` names a step)."""
        return self.name

    @property
    def run_dir(self) -> Path:
        """Where the run's checkpoints and log live: `{backend.path}/{project}/{name}`."""
        return self.backend.path / self.project / self.name

    def get_inference_name(self, step: int | None = None) -> str:
        """`name@step`: the latest step's adapter by default (the bare `name` also means the latest)."""
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        return f"{self.name}@{self.backend.current_step(self) if step is None else step}"

    def openai_client(self, **kwargs):
        """An `AsyncOpenAI` for this model's server (one client, reused, unless `kwargs` ask for another); use
        `model=model.get_inference_name()` (or `model.name`). Its completions made inside
        `ruler_rl.trainer.record_trajectory` are recorded (unless `kwargs` give another `http_client`)."""
        from openai import AsyncOpenAI

        from ruler_rl.trainer.record import recording_async_http_client

        if kwargs or self._client is None or str(self._client.base_url).rstrip("/") != self.inference_base_url:
            settings = {"max_retries": 2, **kwargs}
            if settings.get("http_client") is None:
                settings["http_client"] = recording_async_http_client()
            client = AsyncOpenAI(base_url=self.inference_base_url, api_key=self.inference_api_key, **settings)
            if kwargs:
                return client
            self._client = client
        return self._client

    def litellm_completion_params(self, step: int | None = None) -> dict:
        """Keyword arguments for `litellm.acompletion` (as ART's): `hosted_vllm/<name>@<step>` at this model's
        server, temperature 1 (the policy itself is sampled)."""
        return {"model": f"hosted_vllm/{self.get_inference_name(step)}", "base_url": self.inference_base_url,
                "api_key": self.inference_api_key, "temperature": 1}

    async def get_step(self) -> int:
        """The step of the adapter being served: 0 before any training, else the latest checkpoint's."""
        return await self.backend.get_step(self)

    async def train(self, groups: list, config: TrainConfig | None = None) -> dict:
        """One training step on `groups` (`ruler_rl.TrajectoryGroup`s) with `config` (`TrainConfig()` by default);
        returns the step's run-log row (`trained` is False, with the reasons in `skipped`, when no group had a
        learning signal). Bad trajectories (`TrajectoryError`) and a tracing misconfiguration (`MissingExtraError`)
        are raised before the step, as is a trajectory sampled by a policy step further behind than
        `config.max_off_policy_steps` (`ruler_rl.trainer.sequences.StalePolicyError`), a choice without served token
        ids, or a batch whose trajectories with a learning signal hold no served choice at all, only plain messages
        (`ruler_rl.trainer.sequences.MissingTokenIdsError`: ART skips such a batch silently); once it is taken, tracing
        it (`ruler_rl.tracing`) never raises. A step that fails once its update has begun (a full disk, a failed adapter
        load) is rolled back whole and raises `ruler_rl.trainer.StepFailedError`; retrying it applies it once."""
        if isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
            raise TypeError(f"groups must be a list of TrajectoryGroup, got {type(groups).__name__}")
        groups = list(groups)
        # resolved once, before the step: a tracing misconfiguration is raised before any work, not after the step
        tracer = tracing.current_tracer()

        def traced(row: dict, seqs: list) -> None:  # after the step: never raises (ruler_rl.tracing.train_step)
            tracing.train_step(tracer, self, row, groups, {(s.group, s.position): s.advantage for s in seqs})

        return await self.backend.train(self, groups, config or TrainConfig(),
                                        on_step=traced if tracer is not None else None)

    async def delete_checkpoints(self, metric: str = "reward_mean") -> list[int]:
        """Delete every checkpoint but the latest and the best by `metric`; the steps deleted."""
        return await self.backend.delete_checkpoints(self, metric)
