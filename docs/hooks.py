"""mkdocs hook: the API reference reads ruler_rl's source from the checkout.

pyproject's package-dir maps ruler/ to ruler_rl and judges/, trainer/ to ruler_rl.judges, ruler_rl.trainer; griffe
(mkdocstrings) searches folders by import name, so when mkdocs loads this hook, before griffe loads anything,
evals/device/link_package.sh links the three folders into build/docs-packages/ruler_rl/, the path mkdocs.yml
gives it."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# when mkdocs loads this hook, before any plugin's on_config: mkdocstrings keeps only paths that exist
subprocess.run(["bash", str(ROOT / "evals/device/link_package.sh"), str(ROOT / "build/docs-packages")], check=True)
