"""The answer matcher, and the matcher with an LLM judge, on a labelled table of right and wrong answers.

    python -m evals.art_e.answer_accuracy --out out/art-e/accuracy-matcher.json
    python -m evals.art_e.answer_accuracy --judge local/smollm2-135m --out out/art-e/accuracy-judge.json
    python -m evals.art_e.answer_accuracy --judge hosted_vllm/Qwen/Qwen2.5-7B-Instruct \\
        --judge-api-base http://localhost:8000/v1 --out out/art-e/accuracy-qwen.json

The table (`answer_pairs.jsonl` beside this module, or --pairs) holds (question, reference, answer, label, form,
note) rows labelled right or wrong by a person. For each row the matcher (`match_verdict`) says accept, ask or
reject; "matcher alone" counts only accept as correct. "matcher + judge" sends every ask and reject to the judge
(as `grade` does) and keeps every accept. Printed and written (JSON): the false-accept rate (wrong answers taken
as correct / wrong answers) and the false-reject rate (right answers not taken / right answers), for all rows
and for bare and sentence-form references apart, each with a Wilson 95% interval, and every row's verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from evals.art_e.matching import match_verdict

PAIRS_PATH = Path(__file__).with_name("answer_pairs.jsonl")
LABELS = ("right", "wrong")
FORMS = ("bare", "sentence")
VERDICTS = ("accept", "ask", "reject")
FIELDS = ("id", "source", "question", "reference", "answer", "label", "form", "note")


@dataclass(frozen=True)
class Pair:
    """One labelled row: an answer to `question`, judged against `reference` by a person (`label`)."""

    id: str
    source: str
    question: str
    reference: str
    answer: str
    label: str
    form: str
    note: str


def load_pairs(path: str | Path = PAIRS_PATH) -> list[Pair]:
    """The table's rows, checked: every field a string, the text fields non-empty, `label` right or wrong,
    `form` bare or sentence, ids unique. Raises ValueError naming the line of the first bad row."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no table of answer pairs at {path}")
    pairs, seen = [], set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(row, dict) or set(row) != set(FIELDS):
            raise ValueError(f"{path}:{n}: a row needs exactly the fields {', '.join(FIELDS)}")
        if not all(isinstance(row[f], str) for f in FIELDS):
            raise ValueError(f"{path}:{n}: every field must be a string")
        if not all(row[f].strip() for f in ("id", "question", "reference", "answer")):
            raise ValueError(f"{path}:{n}: id, question, reference and answer must be non-empty")
        if row["label"] not in LABELS:
            raise ValueError(f"{path}:{n}: label must be one of {LABELS}, got {row['label']!r}")
        if row["form"] not in FORMS:
            raise ValueError(f"{path}:{n}: form must be one of {FORMS}, got {row['form']!r}")
        if row["id"] in seen:
            raise ValueError(f"{path}:{n}: the id {row['id']!r} is used twice")
        seen.add(row["id"])
        pairs.append(Pair(**row))
    if not pairs:
        raise ValueError(f"{path}: no rows")
    return pairs


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% for z = 1.96) of a proportion k/n; (0, 1) when n is 0."""
    if isinstance(k, bool) or isinstance(n, bool) or not isinstance(k, int) or not isinstance(n, int):
        raise TypeError("k and n must be integers")
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def rates(pairs: list[Pair], accepted: list[bool]) -> dict:
    """False-accept and false-reject rates (counts, rate, Wilson 95% interval) for all rows, bare and sentence."""
    if len(pairs) != len(accepted):
        raise ValueError(f"{len(pairs)} pairs but {len(accepted)} verdicts")
    out = {}
    for part in ("all",) + FORMS:
        rows = [(p, a) for p, a in zip(pairs, accepted, strict=True) if part == "all" or p.form == part]
        wrong = [a for p, a in rows if p.label == "wrong"]
        right = [a for p, a in rows if p.label == "right"]
        fa, fr = sum(wrong), sum(not a for a in right)
        out[part] = {"false_accept": fa, "wrong": len(wrong), "fa_rate": fa / len(wrong) if wrong else None,
                     "fa_ci": wilson(fa, len(wrong)), "false_reject": fr, "right": len(right),
                     "fr_rate": fr / len(right) if right else None, "fr_ci": wilson(fr, len(right))}
    return out


async def judge_pairs(pairs: list[Pair], model: str, *, params: dict | None = None, concurrency: int = 4,
                      cache=None) -> list[bool]:
    """The judge's verdict (`judge_answer`) on each pair, `concurrency` at a time."""
    from evals.art_e.questions import Scenario
    from evals.art_e.rewards import judge_answer

    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    gate = asyncio.Semaphore(concurrency)

    async def one(p: Pair) -> bool:
        scenario = Scenario(id=p.id, question=p.question, answer=p.reference, message_ids=[p.source],
                            how_realistic=1.0, inbox_address="labelled.pairs@example.com", query_date="2002-12-31")
        async with gate:
            return await judge_answer(scenario, p.answer, model, params=params, cache=cache)

    return list(await asyncio.gather(*(one(p) for p in pairs)))


def _fmt(part: dict, kind: str) -> str:
    k, n = (part["false_accept"], part["wrong"]) if kind == "fa" else (part["false_reject"], part["right"])
    lo, hi = part[f"{kind}_ci"]
    return f"{k}/{n} = {k / n:.1%} [{lo:.1%}, {hi:.1%}]" if n else "-"


def table(results: dict) -> str:
    """A Markdown table of the false-accept and false-reject rates of each grader in `results`."""
    lines = [("| grader | references | false accept (wrong accepted / wrong) [95% CI] | "
              "false reject (right not accepted / right) [95% CI] |"), "|---|---|---|---|"]
    for name, by_part in results.items():
        for part in ("all",) + FORMS:
            lines.append(f"| {name} | {part} | {_fmt(by_part[part], 'fa')} | {_fmt(by_part[part], 'fr')} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=Path, default=PAIRS_PATH)
    ap.add_argument("--judge", help="a litellm model name for the correctness judge (asked on ask and reject)")
    ap.add_argument("--judge-api-base", help="an OpenAI-compatible base URL for the judge (e.g. a vLLM server)")
    ap.add_argument("--concurrency", type=int, default=4, help="judge requests in flight at once")
    ap.add_argument("--out", type=Path, required=True, help="where to write the JSON results")
    args = ap.parse_args(argv)
    if args.judge_api_base and not args.judge:
        ap.error("--judge-api-base needs --judge")
    pairs = load_pairs(args.pairs)
    verdicts = [match_verdict(p.answer, p.reference, p.question) for p in pairs]
    results = {"matcher alone": rates(pairs, [v == "accept" for v in verdicts])}
    judged: list[bool | None] = [None] * len(pairs)
    if args.judge:
        params = {"api_base": args.judge_api_base, "api_key": "local"} if args.judge_api_base else None
        asked = [i for i, v in enumerate(verdicts) if v != "accept"]
        for i, j in zip(asked, asyncio.run(judge_pairs([pairs[i] for i in asked], args.judge, params=params,
                                                       concurrency=args.concurrency)), strict=True):
            judged[i] = j
        results[f"matcher + judge ({args.judge})"] = rates(
            pairs, [v == "accept" or bool(j) for v, j in zip(verdicts, judged, strict=True)])
    counts = {v: sum(x == v for x in verdicts) for v in VERDICTS}
    text = table(results) + "\n\nmatcher verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items())
    print(text)
    out = {"pairs": str(args.pairs), "rows": len(pairs), "judge": args.judge, "judge_api_base": args.judge_api_base,
           "verdict_counts": counts, "results": results,
           "rows_detail": [{**asdict(p), "verdict": v, "judged": j}
                           for p, v, j in zip(pairs, verdicts, judged, strict=True)]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
