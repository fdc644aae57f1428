"""Judge prompt size for one multi-turn group under each saving: no dedup, prefix dedup, compact, truncation.

    .venv/bin/python evals/prompt_tokens.py [--groups ../shared/bench/ruler-peer/groups.json] [--index 4]

Counts cl100k tokens (litellm's bundled encoding) of the system + user messages RULER would send.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ruler_rl.judges import DEFAULT_RUBRIC  # first: it keeps litellm offline (local price table)

# isort: split
from litellm.litellm_core_utils.default_encoding import encoding

from ruler_rl.budget import CAPS, answer_reserve, truncate_group
from ruler_rl.prompt import build_prompt

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "bench" / "ruler-peer" / "groups.json"


def tokens(messages: list[dict]) -> int:
    return sum(len(encoding.encode(m["content"])) for m in messages)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=Path, default=DEFAULT)
    ap.add_argument("--index", type=int, default=4, help="which group (the bench's 4 and 5 have 16 trajectories)")
    ap.add_argument("--budget", type=int, default=8192)
    args = ap.parse_args()
    group = json.loads(args.groups.read_text())[args.index]
    n = len(group)
    # no prefix dedup: every trajectory sent whole (what a naive judge prompt does)
    whole = build_prompt([[{"role": "user", "content": f"#{i}"}] + ml for i, ml in enumerate(group)], DEFAULT_RUBRIC,
                         render="art")
    rows = [("ART rendering, no prefix dedup", tokens(whole.messages)),
            ("ART rendering, prefix once (ART)", tokens(build_prompt(group, DEFAULT_RUBRIC, render="art").messages)),
            ("compact + shared content (ours)", tokens(build_prompt(group, DEFAULT_RUBRIC).messages))]
    limit = args.budget - answer_reserve(n)
    for cap in CAPS:
        t = tokens(build_prompt(truncate_group(group, cap), DEFAULT_RUBRIC).messages)
        rows.append((f"ours, bodies cut to {cap} chars", t))
        if t <= limit:
            break
    print(f"group {args.index}: {n} trajectories, {sum(len(ml) for ml in group)} messages; "
          f"budget {args.budget} tokens ({limit} for the prompt)")
    for name, t in rows:
        print(f"{name:<40} {t:>7} tokens  {t / rows[1][1]:.2f}x ART")


if __name__ == "__main__":
    main()
