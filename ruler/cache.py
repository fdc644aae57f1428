"""The judge cache: validated judge answers on disk (diskcache, SQLite-backed, safe across processes).

Location: the `cache=` argument (a path, a cache object, or False to disable), else
`$RULER_CACHE_DIR`, else `~/.cache/ruler-rl/judge`. The key is a hash of everything that decides the
answer: judge model, the exact prompt messages (which contain the rubric), the response format and
the decoding parameters. Credentials, timeouts and retry settings are not part of the key. Only
answers that passed validation are stored, so a hit is always a usable score.

Each entry written since record version 2 (`judgment_record`) also keeps what was asked and answered: the
judge model string, the prompt messages, the raw answer and the time it was stored, so the judgments paid
for can be exported by judge model and date (`export_judgments`, the teacher data of `ruler distill`).
Older entries (scores and notes only) are still served as hits; an export counts and skips them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import diskcache

# parameters that change how a call is made, never what it answers
NON_SEMANTIC_PARAMS = {"api_key", "timeout", "num_retries", "max_retries", "metadata", "extra_headers",
                       "azure_ad_token_provider", "client", "caching"}


class CacheLike(Protocol):
    def get(self, key: str, default: Any = None) -> Any: ...
    def set(self, key: str, value: Any) -> Any: ...


_open: dict[str, diskcache.Cache] = {}
_open_lock = threading.Lock()


def default_cache_dir() -> Path:
    env = os.environ.get("RULER_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ruler-rl" / "judge"


def open_cache(cache: "str | os.PathLike | CacheLike | bool | None" = None) -> CacheLike | None:
    """The cache to use: None/True -> default directory, False -> no cache, a path, or a cache object."""
    if cache is False:
        return None
    if cache is None or cache is True:
        cache = default_cache_dir()
    if isinstance(cache, (str, os.PathLike)):
        path = str(Path(cache).expanduser().resolve())
        with _open_lock:
            if path not in _open:
                _open[path] = diskcache.Cache(path, size_limit=2**32)
            return _open[path]
    if hasattr(cache, "get") and hasattr(cache, "set"):
        return cache  # type: ignore[return-value]
    raise TypeError(f"cache must be a path, a cache object with get/set, or False; got {type(cache).__name__}")


def cache_key(model: str, messages: list[dict], response_format: Any, params: dict | None) -> str:
    """A stable hash of everything that decides the judge's answer."""
    semantic = {k: v for k, v in sorted((params or {}).items()) if k not in NON_SEMANTIC_PARAMS}
    blob = json.dumps(
        {"v": 1, "model": model, "messages": messages, "response_format": response_format, "params": semantic},
        sort_keys=True, ensure_ascii=False, default=str,
    )
    return "ruler:" + hashlib.sha256(blob.encode()).hexdigest()


RECORD_VERSION = 2


def judgment_record(scores: list[dict], notes: list[str], *, model: str, messages: list[dict], answer: str,
                    created: float | None = None) -> dict:
    """The value stored for one validated judgment: the scores and notes a hit is served from, plus (record
    version 2) the judge `model` string, the prompt `messages` it was asked, its raw `answer` and `created`
    (Unix seconds, default now), which `export_judgments` selects on."""
    if not isinstance(model, str) or not model:
        raise ValueError("model must be a non-empty string")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages must be a list of message dicts")
    return {"scores": scores, "notes": list(notes), "v": RECORD_VERSION, "model": model, "messages": messages,
            "answer": answer, "created": time.time() if created is None else float(created)}


@dataclass
class CachedJudgment:
    """One exported judgment: the prompt messages the judge was asked, its validated scores (dicts with
    `trajectory_id`, `explanation`, `score`, in id order), its raw answer, and when it was stored."""

    key: str
    model: str
    messages: list[dict]
    scores: list[dict]
    answer: str
    created: float


@dataclass
class ExportReport:
    """What an export looked at and why entries were left out (each entry is counted once)."""

    entries: int = 0            # entries in the cache
    exported: int = 0
    other_models: int = 0       # recorded judgments of another judge model
    outside_dates: int = 0      # the chosen model's judgments stored outside [since, until)
    unrecorded: int = 0         # RULER judgments stored before record version 2: no model/prompt kept
    not_judgments: int = 0      # other entries (e.g. the ART·E correctness judge's verdicts)
    models: dict[str, int] = field(default_factory=dict)  # recorded judgments per judge model


def _timestamp(value: "datetime | float | int | None", name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{name} must be timezone-aware (e.g. datetime(..., tzinfo=timezone.utc)); "
                             f"a naive datetime is ambiguous")
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a timezone-aware datetime or Unix seconds, got {value!r}")
    return float(value)


def export_judgments(cache: "str | os.PathLike | diskcache.Cache", model: str, *,
                     since: "datetime | float | None" = None,
                     until: "datetime | float | None" = None) -> tuple[list[CachedJudgment], ExportReport]:
    """Every judgment of the judge `model` (the exact litellm model string it was called with) stored in
    `cache` (a cache folder or an open `diskcache.Cache`) at or after `since` and before `until`, oldest
    first, with a report of what was left out and why. Only entries written with record version 2 carry a
    model and a prompt; older entries are counted as `unrecorded`."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError("model must name a judge model (a litellm model string)")
    lo, hi = _timestamp(since, "since"), _timestamp(until, "until")
    if lo is not None and hi is not None and lo >= hi:
        raise ValueError(f"since ({since}) must be before until ({until})")
    if isinstance(cache, (str, os.PathLike)):
        path = Path(cache).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"no judge cache at {path} (a cache is a folder)")
        store = open_cache(path)
    elif isinstance(cache, diskcache.Cache):
        store = cache
    else:
        raise TypeError(f"cache must be a cache folder or a diskcache.Cache, got {type(cache).__name__}")
    report = ExportReport()
    out: list[CachedJudgment] = []
    for key in store.iterkeys():
        report.entries += 1
        value = store.get(key)
        if not (isinstance(key, str) and key.startswith("ruler:") and isinstance(value, dict)
                and isinstance(value.get("scores"), list)):
            report.not_judgments += 1
            continue
        if not isinstance(value.get("model"), str) or not isinstance(value.get("messages"), list):
            report.unrecorded += 1
            continue
        report.models[value["model"]] = report.models.get(value["model"], 0) + 1
        if value["model"] != model:
            report.other_models += 1
            continue
        created = float(value.get("created", 0.0))
        if (lo is not None and created < lo) or (hi is not None and created >= hi):
            report.outside_dates += 1
            continue
        out.append(CachedJudgment(key, value["model"], value["messages"], value["scores"],
                                  str(value.get("answer", "")), created))
    out.sort(key=lambda j: (j.created, j.key))
    report.exported = len(out)
    return out, report
