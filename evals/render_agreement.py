"""Does the compact rendering change the judge's verdicts? Pairwise agreement with human labels on LLMBar.

For the first N pairs of `judge-meta/LLMBar/Natural`, each pair is judged as a RULER group of two
(the instruction as the user message, each output as an assistant answer) twice: with the compact
rendering and with ART's `json.dumps` rendering, through the same `ruler()` path. Prints accuracy
against the human label for each rendering, how often the two renderings pick the same winner, and ties.

    .venv/bin/python evals/render_agreement.py [--judge MODEL] [--limit 20] [--data DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from tqdm import tqdm

from ruler import ruler

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "judge-meta" / "LLMBar" / "Natural"


def load_pairs(folder: Path, limit: int) -> list[dict]:
    path = folder / "dataset.json"
    if not path.is_file():
        raise SystemExit(f"no LLMBar dataset at {path}")
    rows = json.loads(path.read_text(encoding="utf-8"))
    good = [r for r in rows if {"input", "output_1", "output_2", "label"} <= set(r) and r["label"] in (1, 2)]
    return good[:limit]


async def verdict(pair: dict, judge: str | None, render: str) -> int:
    """1 or 2 for the output the judge scored higher, 0 for a tie."""
    convs = [[{"role": "user", "content": pair["input"]}, {"role": "assistant", "content": pair[f"output_{k}"]}]
             for k in (1, 2)]
    s = await ruler(convs, judge, render=render)
    return 0 if s[0].score == s[1].score else (1 if s[0].score > s[1].score else 2)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judge", default=None)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = ap.parse_args()
    if args.limit < 1:
        raise SystemExit("--limit must be >= 1")
    pairs = load_pairs(args.data, args.limit)
    started = time.perf_counter()
    rows = []
    for p in tqdm(pairs, desc="pairs"):
        rows.append({"label": p["label"], "compact": await verdict(p, args.judge, "compact"),
                     "art": await verdict(p, args.judge, "art")})
    n = len(rows)
    for r in ("compact", "art"):
        acc = sum(x[r] == x["label"] for x in rows) / n
        ties = sum(x[r] == 0 for x in rows)
        print(f"{r:>8}: accuracy {acc:.2f} ({n} pairs), ties {ties}")
    same = sum(x["compact"] == x["art"] for x in rows) / n
    print(f"same verdict under both renderings: {same:.2f}; wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    asyncio.run(main())
