"""Talking to judge LLMs: litellm calls with retries, the embedded offline model, rubrics.

`judges` knows nothing about trajectories; `ruler` builds prompts and reads scores on top of it.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-table download at import

from judges.completion import JudgeReply, RetryPolicy, complete
from judges.errors import (JudgeConfigError, JudgeError, JudgeInputError, JudgeOutputError,
                           JudgeUnavailableError)
from judges.local_provider import EMBEDDED_JUDGE, register_local_provider
from judges.rubrics import DEFAULT_RUBRIC, RUBRICS, RubricText, get_rubric

import litellm

litellm.suppress_debug_info = True  # no provider-list banners on our errors
register_local_provider()

from judges.vllm_engine import register_vllm_engine_provider  # noqa: E402

register_vllm_engine_provider()

__all__ = [
    "DEFAULT_RUBRIC", "EMBEDDED_JUDGE", "RUBRICS", "JudgeConfigError", "JudgeError", "JudgeInputError", "JudgeOutputError",
    "JudgeReply", "JudgeUnavailableError", "RetryPolicy", "RubricText", "complete", "get_rubric", "register_local_provider",
]
