"""Talking to judge LLMs: litellm calls with retries, the embedded offline model, rubrics.

`ruler_rl.judges` knows nothing about trajectories; `ruler_rl` builds prompts and reads scores on top of it.
Importing `ruler_rl.judges` does not import litellm: the names that need it (`complete`, `JudgeReply`,
`EMBEDDED_JUDGE`, `register_local_provider`) load `ruler_rl.judges.completion` on first use (PEP 562), which imports
litellm and registers two litellm providers, `local/...` (the embedded judge) and `vllm-engine/...`; neither imports
torch or vLLM until a judge of theirs is called (`ruler_rl.judges.extras` says what is missing). Code that calls
litellm itself with those model strings gets them registered by `from ruler_rl.judges import EMBEDDED_JUDGE` or by
importing `ruler_rl.judges.completion`.
"""

if __name__ != "ruler_rl.judges":  # one name, so one copy (pyproject's package-dir)
    raise ImportError(f"the folder judges/ is the package ruler_rl.judges: import ruler_rl.judges, not {__name__} "
                      "(install the checkout with `pip install -e .`, as .ci/setup does)")

import importlib
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-table download when litellm is imported

from ruler_rl.judges.errors import (
    JudgeConfigError,
    JudgeError,
    JudgeInputError,
    JudgeOutputError,
    JudgeUnavailableError,
)
from ruler_rl.judges.extras import MissingExtraError
from ruler_rl.judges.retry import RetryPolicy
from ruler_rl.judges.rubrics import DEFAULT_RUBRIC, RUBRICS, RubricText, get_rubric

# name -> its module; each is loaded after ruler_rl.judges.completion, so litellm is set up and both providers
# are registered
_WITH_LITELLM = {
    "JudgeReply": "ruler_rl.judges.completion", "complete": "ruler_rl.judges.completion",
    "EMBEDDED_JUDGE": "ruler_rl.judges.names", "register_local_provider": "ruler_rl.judges.local_provider",
}


def __getattr__(name: str):
    module = _WITH_LITELLM.get(name)
    if module is None:
        raise AttributeError(f"module 'ruler_rl.judges' has no attribute {name!r}")
    importlib.import_module("ruler_rl.judges.completion")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WITH_LITELLM})


__all__ = [
    "DEFAULT_RUBRIC", "EMBEDDED_JUDGE", "RUBRICS", "JudgeConfigError", "JudgeError", "JudgeInputError",
    "JudgeOutputError", "JudgeReply", "JudgeUnavailableError", "MissingExtraError", "RetryPolicy", "RubricText",
    "complete", "get_rubric", "register_local_provider",
]
