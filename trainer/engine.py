"""What `LocalBackend` asks of an inference engine: the `Engine` protocol and the `Sample` an in-process engine
returns.

Two engines implement it:

- `ruler_rl.trainer.engine_transformers.TransformersEngine` (CPU, or a GPU without vLLM): generates in this process with
  the very model being trained, so it is a `GeneratingEngine`; its `base_url` is None and the backend's own
  small server (`trainer/server.py`) answers HTTP for it. Nothing to load per step, nothing to put to sleep
  (training and generation take turns under one lock).
- `ruler_rl.trainer.vllm_server.VLLMServer` (GPU): vLLM's own OpenAI server in a child process. It has its own
  `base_url`, loads each step's adapter from its checkpoint folder, and sleeps around training steps when
  `EngineConfig.enable_sleep_mode` is on and it shares the trainer's GPU (`can_sleep`; a dedicated placement
  on GPUs of its own never sleeps).
- `ruler_rl.trainer.engine_process.TransformersServerProcess` (CPU, `placement="dedicated"`): the CPU server with its
  own copy of the model in a child process, loading adapters like vLLM's; it never sleeps.

The backend uses only what is declared here: it never checks which engine it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

FINISH_REASONS = ("stop", "length")


@dataclass
class Sample:
    """One generated completion of an in-process engine.

    token_ids: the sampled token ids, including the end-of-turn id that stopped it (when it stopped).
    logprobs: the policy's own (temperature-1) log-probability of each sampled token; same length.
    finish_reason: `stop` (an end-of-turn id was sampled) or `length` (`max_tokens` reached).
    top_logprobs: per sampled token, the `top_logprobs` most likely (token id, logprob) pairs, most likely
    first; empty when they were not asked for.
    policy_step: the policy step (adapter step) of the weights that generated it, read under the engine's lock;
    None when the engine does not know (the server then reports the served step).
    """
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    policy_step: int | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"a sample needs one logprob per token: {len(self.token_ids)} token ids, "
                             f"{len(self.logprobs)} logprobs")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if self.top_logprobs and len(self.top_logprobs) != len(self.token_ids):
            raise ValueError(f"top_logprobs, when given, has one list per token: {len(self.token_ids)} token ids, "
                             f"{len(self.top_logprobs)} lists")


@runtime_checkable
class Engine(Protocol):
    """The inference side of a trainable model, as `LocalBackend` drives it.

    Lifecycle: `start()` once after construction, then per training step `sleep()` (only when `can_sleep`),
    the optimizer step, `wake()`, and `load_adapter(step, path)` with the checkpoint just written; `close()`
    at the end (also after a failed `start`, so it must tolerate a half-started engine).
    """

    name: str
    """A short label for logs and errors (`transformers`, `vllm`)."""

    @property
    def base_url(self) -> str | None:
        """The engine's own OpenAI-compatible base URL (`http://host:port/v1`) once started; None when the engine
        generates in-process (`GeneratingEngine.generate`) and the backend's CPU server answers for it."""
        ...

    @property
    def can_sleep(self) -> bool:
        """Whether `sleep()` frees the engine's accelerator memory for a training step (and `wake()` restores
        it). The backend calls them only when this is true."""
        ...

    async def start(self) -> None:
        """Bring the engine up (for a server: until it answers its health check)."""
        ...

    async def load_adapter(self, step: int, path: Path) -> None:
        """Serve the LoRA adapter saved at `path` (a peft checkpoint folder) as step `step`'s, and make the bare
        served name mean it. An engine that generates with the trained weights themselves has nothing to do."""
        ...

    async def unload_adapter(self, step: int) -> None:
        """Stop serving step `step`'s adapter (a step that failed after its load and was rolled back); the bare
        served name then means the latest adapter still held, or the base model. Nothing to do for an engine
        that generates with the trained weights themselves."""
        ...

    async def sleep(self) -> None:
        """Free memory for training; requests that arrive meanwhile wait, none is cut short."""
        ...

    async def wake(self) -> None:
        """Undo `sleep()` and run the requests that waited."""
        ...

    async def close(self) -> None:
        """Release everything the engine holds; safe to call twice or after a failed `start()`."""
        ...


@runtime_checkable
class GeneratingEngine(Engine, Protocol):
    """An engine that generates in this process; the backend's server (`trainer/server.py`) turns its samples
    into OpenAI-shaped completions."""

    policy_step: int
    """The policy step of the weights it generates with. Whoever changes the weights (the backend's training
    step, an adapter load) sets it while holding the lock generation takes, so each `Sample.policy_step` is
    exactly the step that sampled it."""

    async def generate(self, prompt_ids: list[int], *, n: int = 1, max_tokens: int = 256,
                       temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                       top_logprobs: int = 0, grammar=None) -> list[Sample]:
        """`n` completions of `prompt_ids`, each at most `max_tokens` long (temperature 0: greedy), with the
        sampled tokens' logprobs and, when `top_logprobs` > 0, that many alternatives per token. `grammar`
        (an `xgrammar.Grammar`, or None) constrains the completion (the server's `tool_choice` `required` or
        a named function); the logprobs stay the policy's own."""
        ...
