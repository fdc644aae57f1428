"""Evaluations on top of ruler_rl (RULER, its judges and the trainer): judge meta-evaluation, the ART·E benchmark, judge-cost,
prompt-size and trainer benchmarks.

evals is not in the ruler-rl wheel: it runs from a checkout of the repository (`.ci/setup` lets the venv find
the name `evals` in the checkout) and needs the `eval` extra; without it, importing `evals` raises
`ruler_rl.judges.extras.MissingExtraError` naming the `pip install` that adds it.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from ruler_rl.judges.extras import require

require("eval", "the evaluations (import evals, ruler eval)")
