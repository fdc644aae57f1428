"""mkdocs hook: the API reference reads ruler_rl's source from the checkout.

pyproject's package-dir maps ruler/ to ruler_rl and judges/, trainer/ to ruler_rl.judges, ruler_rl.trainer; griffe
(mkdocstrings) searches folders by import name, so when mkdocs loads this hook, before griffe loads anything, it links the three folders into
build/docs-packages/ruler_rl/ (as evals/device/link_package.sh does), the path mkdocs.yml gives it."""

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINKS = ROOT / "build" / "docs-packages" / "ruler_rl"


def link() -> None:
    if LINKS.is_symlink() or LINKS.is_file():
        LINKS.unlink()
    elif LINKS.exists():  # links, and any __pycache__ an import from here left (rmtree removes links, not targets)
        shutil.rmtree(LINKS)
    LINKS.mkdir(parents=True)
    for path in (ROOT / "ruler").iterdir():
        if path.name != "__pycache__":
            (LINKS / path.name).symlink_to(path)
    for folder in ("judges", "trainer"):
        (LINKS / folder).symlink_to(ROOT / folder)


link()  # when mkdocs loads this hook, before any plugin's on_config: mkdocstrings keeps only paths that exist
