"""The tree passes ruff under the rules pyproject pins (`[tool.ruff.lint]`): a new unused import, a name that is
never defined, imports out of order or a bugbear finding fails the suite, not a later reader."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_passes_ruff_under_the_pinned_rules():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed: it comes with the dev extra (`pip install -e '.[dev]'`, as .ci/setup does)"
    # --isolated would drop pyproject's rules; --no-cache keeps the checkout clean
    found = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stdout + found.stderr
