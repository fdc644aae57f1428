"""Evaluations on top of ruler and judges: judge meta-evaluation, judge-cost and prompt-size benchmarks."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
