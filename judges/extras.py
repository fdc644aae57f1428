"""Optional parts of ruler-rl and the one error raised when one is used without its extra installed.

Installed with no extra, ruler-rl gives RULER with any litellm judge, the cache and retries. Everything heavier is an
extra: `embedded` (the offline judge), `serve` (the judging service), `train` (the GRPO/LoRA trainer),
`gpu` (vLLM), `eval` (the evaluations, which run from a checkout), `tracing` (Langfuse, `ruler_rl.tracing`),
`mcp` (MCP·RL: the MCP SDK), `agents` (recording LangGraph and OpenAI Agents SDK agents: `ruler_rl.trainer.record`),
`ray` (the dedicated inference server placed by Ray: `ruler_rl.trainer.ray_placement`).
Code that needs an extra calls `require(extra, what)` before importing it, so the user reads which
`pip install` to run (`pip_command`: from the checkout, git URL or index ruler-rl itself came from) instead of a
`ModuleNotFoundError` for a module they never asked for.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import shlex
from urllib.parse import urlparse
from urllib.request import url2pathname

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
    """The command that installs `extra` the way ruler-rl itself was installed (read from its `direct_url.json`,
    PEP 610): from a checkout, `pip install -e '/path/to/checkout[EXTRA]'`; from a git URL, `pip install
    'ruler-rl[EXTRA] @ git+URL'`; otherwise (an index, a wheel file) `pip install 'ruler-rl[EXTRA]'`."""
    return command_for(extra, _direct_url())


def command_for(extra: str, direct_url: dict | None) -> str:
    """`pip_command` for an installation described by `direct_url` (the parsed `direct_url.json`, or None)."""
    _check_extra(extra)
    url = direct_url.get("url") if isinstance(direct_url, dict) else None
    if isinstance(url, str) and url.startswith("file://") and (direct_url.get("dir_info") or {}).get("editable"):
        return f"pip install -e {shlex.quote(url2pathname(urlparse(url).path) + f'[{extra}]')}"
    vcs = (direct_url.get("vcs_info") or {}) if isinstance(url, str) else {}
    if isinstance(vcs.get("vcs"), str):
        ref = vcs.get("requested_revision")
        spec = f"ruler-rl[{extra}] @ {vcs['vcs']}+{url}" + (f"@{ref}" if ref else "")
        return f"pip install {shlex.quote(spec)}"
    return f"pip install 'ruler-rl[{extra}]'"


@functools.cache
def _direct_url() -> dict | None:
    # every copy of the metadata on the path (a checkout's build leaves a ruler_rl.egg-info in it, without the file)
    for dist in importlib.metadata.distributions(name="ruler-rl"):
        try:
            text = dist.read_text("direct_url.json")
            if text:
                return json.loads(text)
        except ValueError:
            continue
    return None


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
