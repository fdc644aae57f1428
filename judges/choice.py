"""Which judge a command runs when the user did not name one: an API key in the environment picks a real judge.

The order: the judge given (`--judge`), then `$RULER_JUDGE_MODEL`, then the first provider below whose API key
is set, then the embedded offline judge (which checks the plumbing, not quality).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ruler_rl.judges.names import EMBEDDED_JUDGE

# (environment variable holding the provider's key, the judge it picks): litellm model strings that litellm's
# bundled price table knows (context size, JSON-schema support), first match wins
JUDGES_BY_KEY: tuple[tuple[str, str], ...] = (
    ("OPENAI_API_KEY", "openai/gpt-4.1-mini"),
    ("ANTHROPIC_API_KEY", "anthropic/claude-sonnet-4-5"),
    ("GEMINI_API_KEY", "gemini/gemini-2.5-flash"),
)


@dataclass(frozen=True)
class JudgeChoice:
    """The judge picked and why: `given` (named by the caller), `env` ($RULER_JUDGE_MODEL), `key` (an API key
    in the environment; `key_var` names it) or `embedded` (nothing else was there)."""

    model: str
    source: Literal["given", "env", "key", "embedded"]
    key_var: str | None = None


def choose_judge(judge: str | None = None, environ: Mapping[str, str] | None = None) -> JudgeChoice:
    """The judge to use: `judge` > `$RULER_JUDGE_MODEL` > a key in the environment > the embedded judge.

    Empty or blank values count as unset. `environ` defaults to `os.environ`.
    """
    if judge is not None and not isinstance(judge, str):
        raise TypeError(f"judge must be a litellm model string or None, got {type(judge).__name__}")
    env = os.environ if environ is None else environ
    if judge and judge.strip():
        return JudgeChoice(judge.strip(), "given")
    named = (env.get("RULER_JUDGE_MODEL") or "").strip()
    if named:
        return JudgeChoice(named, "env")
    for var, model in JUDGES_BY_KEY:
        if (env.get(var) or "").strip():
            return JudgeChoice(model, "key", var)
    return JudgeChoice(EMBEDDED_JUDGE, "embedded")
