"""Talking to judge LLMs: litellm calls with retries, the embedded offline model, rubrics.

`judges` knows nothing about trajectories; `ruler` builds prompts and reads scores on top of it.
Importing it registers two litellm providers, `local/...` (the embedded judge) and `vllm-engine/...`;
neither imports torch or vLLM until a judge of theirs is called (`judges.extras` says what is missing).
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-table download at import

import litellm

from judges.completion import JudgeReply, RetryPolicy, complete
from judges.errors import JudgeConfigError, JudgeError, JudgeInputError, JudgeOutputError, JudgeUnavailableError
from judges.extras import MissingExtraError
from judges.local_provider import EMBEDDED_JUDGE, register_local_provider
from judges.rubrics import DEFAULT_RUBRIC, RUBRICS, RubricText, get_rubric
from judges.vllm_engine import register_vllm_engine_provider

litellm.suppress_debug_info = True  # no provider-list banners on our errors
register_local_provider()
register_vllm_engine_provider()

__all__ = [
    "DEFAULT_RUBRIC", "EMBEDDED_JUDGE", "RUBRICS", "JudgeConfigError", "JudgeError", "JudgeInputError",
    "JudgeOutputError", "JudgeReply", "JudgeUnavailableError", "MissingExtraError", "RetryPolicy", "RubricText",
    "complete", "get_rubric", "register_local_provider",
]
