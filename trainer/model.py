"""`TrainableModel`: ART's user-facing shape. Agent code talks to `model.openai_client()`; between steps
`await model.train(groups)` trains the LoRA and the server starts answering with the new adapter."""

from __future__ import annotations

import re
from pathlib import Path

from trainer.config import ModelConfig, TrainConfig

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class TrainableModel:
    def __init__(self, name: str, project: str, base_model: str, config: ModelConfig | None = None):
        for what, value in (("name", name), ("project", project)):
            if not isinstance(value, str) or not NAME.match(value):
                raise ValueError(f"{what} must be 1-100 letters, digits, '.', '_' or '-', got {value!r}")
        if not isinstance(base_model, str) or not base_model.strip():
            raise ValueError("base_model must be a non-empty string")
        if config is not None and not isinstance(config, ModelConfig):
            raise TypeError("config must be a trainer.ModelConfig")
        self.name, self.project, self.base_model = name, project, base_model
        self.config = config or ModelConfig()
        self._backend = None

    @property
    def backend(self):
        if self._backend is None:
            raise RuntimeError(f"model {self.name!r} is not registered: await model.register(backend) first")
        return self._backend

    async def register(self, backend) -> None:
        await backend.register(self)
        self._backend = backend

    @property
    def base_url(self) -> str:
        return self.backend.base_url

    @property
    def run_dir(self) -> Path:
        return self.backend.path / self.project / self.name

    def openai_client(self, **kwargs):
        """An `AsyncOpenAI` for this model's server; use `model=model.name` in requests."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key="ruler-rl", **{"max_retries": 2, **kwargs})

    def litellm_params(self) -> dict:
        """(model, params) pieces for litellm-based code, e.g. the ART·E agent: `openai/<name>` at our server."""
        return {"model": f"openai/{self.name}", "params": {"api_base": self.base_url, "api_key": "ruler-rl"}}

    async def get_step(self) -> int:
        return await self.backend.get_step(self)

    async def train(self, groups: list, config: TrainConfig | None = None) -> dict:
        return await self.backend.train(self, groups, config or TrainConfig())

    async def delete_checkpoints(self, metric: str = "reward_mean") -> list[int]:
        return await self.backend.delete_checkpoints(self, metric)
