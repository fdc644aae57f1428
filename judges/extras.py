"""Optional parts of ruler-rl and the one error raised when one is used without its extra installed.

`pip install ruler-rl` gives RULER with any litellm judge, the cache and retries. Everything heavier is an
extra: `embedded` (the offline judge), `serve` (the judging service), `train` (the GRPO/LoRA trainer),
`gpu` (vLLM), `eval` (the evaluations, which run from a checkout), `tracing` (Langfuse, `ruler_rl.tracing`),
`mcp` (MCP·RL: the MCP SDK), `agents` (recording LangGraph and OpenAI Agents SDK agents: `ruler_rl.trainer.record`),
`ray` (the dedicated inference server placed by Ray: `ruler_rl.trainer.ray_placement`).
Code that needs an extra calls `require(extra, what)` before importing it, so the user reads which
`pip install` to run instead of a `ModuleNotFoundError` for a module they never asked for.
"""

from __future__ import annotations

import importlib.util

from ruler_rl.judges.errors import JudgeConfigError

# the modules each extra installs that its code imports (import names, not distribution names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "embedded": ("torch", "transformers", "accelerate", "gguf", "xgrammar", "psutil"),
    "serve": ("fastapi", "uvicorn", "prometheus_client"),
    "train": ("torch", "transformers", "peft", "accelerate", "fastapi", "uvicorn", "pandas", "matplotlib", "psutil"),
    "gpu": ("vllm",),
    "eval": ("pandas", "pyarrow", "matplotlib", "scipy", "dateutil"),
    "tracing": ("langfuse",),
    "mcp": ("mcp",),
    "agents": ("langgraph", "langchain_openai", "agents"),
    "ray": ("ray",),
}


class MissingExtraError(JudgeConfigError, ImportError):
    """A part of ruler-rl was used without its extra installed. `extra` names it, `missing` lists the modules
    that could not be found, and the message carries the `pip install` command to run."""

    def __init__(self, message: str, *, extra: str, missing: list[str]):
        super().__init__(message)
        self.extra = extra
        self.missing = missing


def pip_command(extra: str) -> str:
    """The command that installs `extra`: `pip install 'ruler-rl[EXTRA]'`."""
    _check_extra(extra)
    return f"pip install 'ruler-rl[{extra}]'"


def missing_modules(extra: str, modules: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """The modules of `extra` (or of its subset `modules`) that are not installed (found without importing)."""
    _check_extra(extra)
    if modules is None:
        names = EXTRAS[extra]
    else:
        if isinstance(modules, str) or not isinstance(modules, (list, tuple)) or not modules:
            raise ValueError(f"modules must be a non-empty list of module names of the {extra!r} extra")
        unknown = [m for m in modules if m not in EXTRAS[extra]]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} not among the modules of the {extra!r} extra "
                             f"({', '.join(EXTRAS[extra])})")
        names = tuple(modules)
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or blocked installation counts as missing
            found = False
        if not found:
            missing.append(name)
    return missing


def require(extra: str, what: str, hint: str = "", *, modules: list[str] | tuple[str, ...] | None = None) -> None:
    """Raise MissingExtraError unless every module of `extra` is installed (only those of `modules`, a
    subset of the extra's, when given: a part that uses one framework of an extra checks only that one).

    `what` names the part being used (e.g. "the judging service (ruler serve)"); `hint` is appended to the
    message (another way out, such as passing a real judge).
    """
    if not isinstance(what, str) or not what.strip():
        raise ValueError("require() needs `what`: the part of ruler-rl that needs the extra")
    missing = missing_modules(extra, modules)
    if missing:
        message = f"{what} needs the '{extra}' extra ({', '.join(missing)} not installed): {pip_command(extra)}"
        raise MissingExtraError(message + (f"; {hint}" if hint else ""), extra=extra, missing=missing)


def _check_extra(extra: str) -> None:
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; extras: {', '.join(EXTRAS)}")
