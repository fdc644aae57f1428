"""Reading the judge's answer: lenient parsing, then strict validation **by id, not position**.

Accepted: the JSON object alone, inside a code fence, or with text around it; a bare list of scores.
Rejected (each a stated problem, sent back to the judge for a structural retry): missing, extra or
duplicate ids, non-numeric scores, scores outside [0, 1]. A *consistent* 0-10 or 0-100 scale (every
score within it, at least one above 1) is rescaled to [0, 1] and the rescale is noted in the logs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)


class TrajectoryScore(BaseModel):
    """The judge's score for one trajectory (ART's shape)."""

    trajectory_id: str = Field(description="The id of the trajectory being scored.")
    explanation: str = Field(description="A short description of the trajectory's performance.")
    score: float = Field(description="A score between 0 and 1.")


@dataclass
class ParsedScores:
    scores: list[TrajectoryScore]
    notes: list[str] = field(default_factory=list)


class ScoreProblems(ValueError):
    """The answer could not be turned into one valid score per id; `problems` says why, for the judge."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _candidates(text: str):
    for m in _FENCE.finditer(text):
        yield m.group(1)
    yield text
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        yield obj


def extract_entries(text: str) -> list:
    """The list of score entries in a judge's answer, found leniently."""
    for cand in _candidates(text or ""):
        obj = cand
        if isinstance(cand, str):
            try:
                obj = json.loads(cand.strip())
            except ValueError:
                continue
        if isinstance(obj, dict) and isinstance(obj.get("scores"), list):
            return obj["scores"]
        if isinstance(obj, list) and obj and all(isinstance(e, dict) for e in obj):
            return obj
    snippet = (text or "").strip()[:200]
    raise ScoreProblems([f'the answer is not JSON of the form {{"scores": [...]}} (it began: {snippet!r})'])


def _as_id(value) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        v = value.strip().strip('"').strip()
        v = re.sub(r"^(trajectory[\s_-]*)", "", v, flags=re.I)
        return v or None
    return None


def _as_number(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def validate_scores(entries: list, expected_ids: list[str]) -> ParsedScores:
    """One `TrajectoryScore` per expected id, in expected order, or `ScoreProblems`."""
    problems: list[str] = []
    by_id: dict[str, tuple[float, str]] = {}
    for k, e in enumerate(entries, 1):
        if not isinstance(e, dict):
            problems.append(f"entry {k} is not an object")
            continue
        tid = _as_id(e.get("trajectory_id", e.get("id")))
        if tid is None:
            problems.append(f"entry {k} has no usable trajectory_id")
            continue
        score = _as_number(e.get("score"))
        if score is None or math.isnan(score) or math.isinf(score):
            problems.append(f"trajectory {tid}: score {e.get('score')!r} is not a number")
            continue
        if tid in by_id:
            problems.append(f"trajectory {tid} is scored more than once")
            continue
        by_id[tid] = (score, str(e.get("explanation", "") or ""))
    expected = set(expected_ids)
    missing = [i for i in expected_ids if i not in by_id]
    extra = sorted(set(by_id) - expected, key=lambda s: (len(s), s))
    if missing:
        problems.append(f"missing trajectory ids: {', '.join(missing)}")
    if extra:
        problems.append(f"unknown trajectory ids: {', '.join(extra)} (valid ids: {', '.join(expected_ids)})")
    if problems:
        raise ScoreProblems(problems)

    notes = []
    values = [by_id[i][0] for i in expected_ids]
    lo, hi = min(values), max(values)
    if lo < 0:
        raise ScoreProblems([f"scores must be between 0 and 1; got {lo}"])
    if hi > 1:
        scale = 10.0 if hi <= 10 else 100.0 if hi <= 100 else None
        if scale is None:
            raise ScoreProblems([f"scores must be between 0 and 1; got {hi}"])
        notes.append(f"judge answered on a 0-{scale:g} scale; scores divided by {scale:g}")
        by_id = {i: (s / scale, x) for i, (s, x) in by_id.items()}
    return ParsedScores(
        [TrajectoryScore(trajectory_id=i, explanation=by_id[i][1], score=by_id[i][0]) for i in expected_ids],
        notes,
    )


def parse_scores(text: str, expected_ids: list[str]) -> ParsedScores:
    """Lenient parse + strict validation; raises `ScoreProblems` listing everything wrong."""
    return validate_scores(extract_entries(text), expected_ids)
