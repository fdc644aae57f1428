"""Your own labels for judges: a JSONL file of labelled pairs and groups (`load_user_dataset`), the format
`ruler eval judge --dataset` measures a judge against and `ruler distill --dataset` trains a judge on.

A row with `trajectories` is a TrajectoryGroup, a row with `responses` a group (`scores` or `ranking`), any
other row a pair (LLMBar's `output_1`/`output_2`/`label` or `response_a`/`response_b`/`preferred`); the
prompt is `task`, or `instruction` (with `input`), or `input`. `Pair` and `Group` are also what the built-in
judge meta-evaluation sets load into (`evals.judge_meta`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


class DatasetError(ValueError):
    """A dataset file or record that cannot be used, named by path and record index."""


@dataclass
class Pair:
    id: str
    prompt: str
    a: str
    b: str
    label: int  # 1: a is better, 2: b is better, 0: a tie (PandaLM only)
    extra: dict = field(default_factory=dict)  # a user row's other fields, for `by=`


@dataclass
class Group:
    id: str
    prompt: str
    responses: list[str]
    human: list[float]  # the human label per response, higher is better (PandaLM: wins from pairwise votes)
    convs: list[list[dict]] | None = None  # whole conversations (a TrajectoryGroup row); else prompt + response
    tools: list[dict] | None = None  # tool schemas offered in those conversations
    extra: dict = field(default_factory=dict)


def text_field(rec: dict, key: str, where: str) -> str:
    """A text field; plain numbers and booleans (PandaLM has a few, e.g. `true`) are taken as their text."""
    value = rec.get(key)
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field {key!r} is missing or not text")
    return value


def instruction_prompt(r: dict, where: str) -> str:
    """`instruction`, with `input` appended after a blank line when it is given (as PandaLM does)."""
    instruction, inp = text_field(r, "instruction", where), r.get("input") or ""
    return instruction + (f"\n\n{inp}" if inp else "")


PAIR_FIELDS = ({"output_1", "output_2", "label"}, {"response_a", "response_b", "preferred"})
PROMPT_FIELDS = {"task", "instruction", "input"}
GROUP_FIELDS = {"responses", "scores", "ranking"}


def _user_prompt(r: dict, where: str) -> str:
    """`task`, or `instruction` (with `input` appended when both are given, as PandaLM does), or `input`."""
    if "task" in r:
        if "instruction" in r or "input" in r:
            raise DatasetError(f"{where}: give the prompt as 'task' or as 'instruction'/'input', not both")
        return text_field(r, "task", where)
    if "instruction" in r:
        return instruction_prompt(r, where)
    if "input" in r:
        return text_field(r, "input", where)
    raise DatasetError(f"{where}: no prompt: field 'task', 'instruction' or 'input' is missing")


def _number(value, where: str, what: str) -> float:
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DatasetError(f"{where}: {what} must be a finite number, got {value!r}")
    return float(value)


def _user_pair(r: dict, where: str, rid: str) -> Pair | None:
    llmbar, ours = ({f for f in names if f in r} for names in PAIR_FIELDS)
    if llmbar and ours:
        raise DatasetError(f"{where}: mixes LLMBar's fields {sorted(llmbar)} with {sorted(ours)}; use one naming")
    names = ("output_1", "output_2", "label") if llmbar or not ours else ("response_a", "response_b", "preferred")
    missing = [f for f in names if f not in r]
    if missing:
        raise DatasetError(f"{where}: not a pair nor a group: field {missing[0]!r} is missing (a pair needs "
                           f"{'/'.join(names)}; a group needs 'responses' or 'trajectories')")
    prompt, a, b = _user_prompt(r, where), text_field(r, names[0], where), text_field(r, names[1], where)
    raw = r[names[2]]
    labels = {1: 1, 2: 2} if names[2] == "label" else {1: 1, 2: 2, "a": 1, "b": 2, "A": 1, "B": 2}
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or raw not in labels:
        allowed = "1 or 2" if names[2] == "label" else "'a', 'b', 1 or 2"
        raise DatasetError(f"{where}: field {names[2]!r} must be {allowed}, got {raw!r}")
    if not a.strip() or not b.strip():
        return None
    extra = {k: v for k, v in r.items() if k not in {*names, *PROMPT_FIELDS, "id"}}
    return Pair(rid, prompt, a, b, labels[raw], extra)


def _user_group(r: dict, where: str, rid: str) -> Group | None:
    prompt = _user_prompt(r, where)
    responses = r["responses"]
    if not isinstance(responses, list) or len(responses) < 2:
        raise DatasetError(f"{where}: field 'responses' must be a list of at least 2 texts")
    bad = [i for i, x in enumerate(responses) if not isinstance(x, str)]
    if bad:
        raise DatasetError(f"{where}: field 'responses' must hold texts; responses[{bad[0]}] is not text")
    texts = responses
    if ("scores" in r) == ("ranking" in r):
        raise DatasetError(f"{where}: a group needs exactly one of 'scores' and 'ranking'")
    n = len(texts)
    if "scores" in r:
        scores = r["scores"]
        if not isinstance(scores, list) or len(scores) != n:
            raise DatasetError(f"{where}: field 'scores' must be a list of {n} numbers (one per response), "
                               f"got {len(scores) if isinstance(scores, list) else type(scores).__name__}")
        human = [_number(x, where, f"scores[{i}]") for i, x in enumerate(scores)]
    else:
        ranking = r["ranking"]
        if (not isinstance(ranking, list) or len(ranking) != n
                or any(isinstance(x, bool) or not isinstance(x, int) for x in ranking)):
            raise DatasetError(f"{where}: field 'ranking' must list the {n} response indices (0-based), best first")
        if sorted(ranking) != list(range(n)):
            dup = sorted({x for x in ranking if ranking.count(x) > 1})
            why = f"duplicate {dup}" if dup else f"out of range {sorted(x for x in ranking if not 0 <= x < n)}"
            raise DatasetError(f"{where}: field 'ranking' must be a permutation of 0..{n - 1}, best first ({why})")
        human = [0.0] * n
        for place, index in enumerate(ranking):
            human[index] = float(n - place)
    if not all(t.strip() for t in texts):
        return None
    extra = {k: v for k, v in r.items() if k not in {*GROUP_FIELDS, *PROMPT_FIELDS, "id"}}
    return Group(rid, prompt, texts, human, extra=extra)


def _trajectory_group(r: dict, where: str, rid: str) -> Group:
    import pydantic

    from ruler_rl import TrajectoryGroup
    from ruler_rl.trajectory import validate_trajectories

    try:
        group = TrajectoryGroup.model_validate(r)
        validate_trajectories(group)
    except (pydantic.ValidationError, ValueError) as exc:
        raise DatasetError(f"{where}: not a valid TrajectoryGroup: {exc}") from None
    ts = group.trajectories
    if len(ts) < 2:
        raise DatasetError(f"{where}: a TrajectoryGroup needs at least 2 trajectories, got {len(ts)}")
    marked = ["independent_reward" in t.metrics for t in ts]
    if any(marked) and not all(marked):
        raise DatasetError(f"{where}: metrics.independent_reward is on some trajectories but not all "
                           f"(missing on {[i for i, m in enumerate(marked) if not m]})")
    human = [_number(t.metrics["independent_reward"] if all(marked) else t.reward, where,
                     f"trajectories[{i}] label") for i, t in enumerate(ts)]
    tools = {json.dumps(tool, sort_keys=True): tool for t in ts for tool in t.tools or []}
    return Group(rid, "", [], human, convs=[t.messages() for t in ts], tools=list(tools.values()) or None,
                 extra=dict(group.metadata))


def load_user_dataset(path: Path) -> tuple[list[Pair], list[Group], int, int]:
    """A JSONL file of labelled pairs and/or groups: (pairs, groups, rows skipped for an empty response,
    groups skipped because every label is equal). Errors name `path:line` and the field.

    A row with `trajectories` is a TrajectoryGroup (labels: every trajectory's `metrics.independent_reward`
    when all have one, else `reward`; `--by` reads its `metadata`); a row with `responses` is a group
    (`scores`, higher is better, or `ranking`: 0-based response indices, best first); any other row is a pair.
    Fields a row does not use are kept for `by=`.
    """
    path = Path(path)
    if path.is_dir():
        raise DatasetError(f"{path} is a folder; give a JSONL file")
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    pairs, groups, skipped, uniform = [], [], 0, 0
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not a JSON object ({exc.msg})") from None
        if not isinstance(r, dict):
            raise DatasetError(f"{where}: expected a JSON object, got {type(r).__name__}")
        rid = str(r.get("id", f"{path.stem}:{lineno}"))
        if "trajectories" in r:
            item = _trajectory_group(r, where, rid)
        elif "responses" in r:
            item = _user_group(r, where, rid)
        else:
            item = _user_pair(r, where, rid)
        if item is None:
            skipped += 1
        elif isinstance(item, Pair):
            pairs.append(item)
        elif len(set(item.human)) < 2:
            uniform += 1  # every response labelled the same: no preference to agree with
        else:
            groups.append(item)
    if not pairs and not groups:
        raise DatasetError(f"{path}: no usable rows (empty file, or every row skipped: {skipped} with an empty "
                           f"response, {uniform} groups with all labels equal)")
    return pairs, groups, skipped, uniform


def conversation(prompt: str, response: str) -> list[dict]:
    """A prompt and one response as the conversation a judge scores: a user message, an assistant message."""
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
