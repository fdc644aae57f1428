"""The judge cache: validated judge answers on disk (diskcache, SQLite-backed, safe across processes).

Location: the `cache=` argument (a path, a cache object, or False to disable), else
`$RULER_CACHE_DIR`, else `~/.cache/ruler-rl/judge`. The key is a hash of everything that decides the
answer: judge model, the exact prompt messages (which contain the rubric), the response format and
the decoding parameters. Credentials, timeouts and retry settings are not part of the key. Only
answers that passed validation are stored, so a hit is always a usable score.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
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
