"""Does the compact rendering change the judge's verdicts? Pairwise agreement with human labels on LLMBar.

For the first N pairs of `judge-meta/LLMBar/Natural`, each pair is judged as a RULER group of two
(the instruction as the user message, each output as an assistant answer) twice: with the compact
rendering and with ART's `json.dumps` rendering, through the same `ruler()` path. Prints accuracy
against the human label for each rendering, how often the two renderings pick the same winner, and ties.

    .venv/bin/python evals/render_agreement.py [--judge MODEL] [--limit 20] [--data FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from tqdm import tqdm

from evals.judge_meta import DEFAULT_ROOT, LLMBAR, _verdict, load_llmbar
from ruler_rl import ruler
from ruler_rl.labels import Pair, conversation

DEFAULT_DATA = DEFAULT_ROOT / LLMBAR["llmbar-natural"]


async def verdict(pair: Pair, judge: str | None, render: str) -> int:
    """1 or 2 for the output the judge scored higher, 0 for a tie."""
    s = await ruler([conversation(pair.prompt, pair.a), conversation(pair.prompt, pair.b)], judge, render=render)
    return _verdict(s[0].score, s[1].score)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judge", default=None)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="an LLMBar-format dataset.json")
    args = ap.parse_args()
    if args.limit < 1:
        raise SystemExit("--limit must be >= 1")
    pairs = load_llmbar(args.data)[0][: args.limit]
    started = time.perf_counter()
    rows = []
    for p in tqdm(pairs, desc="pairs"):
        rows.append({"label": p.label, "compact": await verdict(p, args.judge, "compact"),
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
