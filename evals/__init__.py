"""Evaluations on top of ruler, judges and trainer: judge meta-evaluation, the ART·E benchmark, judge-cost,
prompt-size and trainer benchmarks.

evals is not in the ruler-rl wheel: it runs from a checkout of the repository (a dev install, `.ci/setup`,
puts the checkout on the venv's path) and needs the `eval` extra; without it, importing `evals` raises
`ruler_rl.judges.extras.MissingExtraError` naming `pip install 'ruler-rl[eval]'`.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from ruler_rl.judges.extras import require

require("eval", "the evaluations (import evals, ruler eval)")
