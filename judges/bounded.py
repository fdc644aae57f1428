"""Running code that comes with a model folder (its chat template) with a bound on time and memory.

A chat template is a program: a folder's `tokenizer_config.json` or `chat_template.jinja` can loop for ever or
build a string until the machine runs out of memory. transformers renders it in a Jinja sandbox, which stops it
from reaching files or Python internals but not from running long. `run_bounded` runs such a call in a thread of
its own and watches it: past `seconds`, or once this process's resident memory has grown by more than
`max_growth_bytes` since the call began, the thread is interrupted (an exception raised inside it at its next
Python instruction, so a Jinja loop stops where it is and what it built is freed) and the caller gets
`BoundExceeded`. A single instruction that allocates a lot at once (one huge string repetition) is not
interrupted half-way; it fails with MemoryError when it cannot have the memory.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.01


class BoundExceeded(RuntimeError):
    """A bounded call ran past its time or memory bound and was stopped; `why` says which."""

    def __init__(self, message: str, *, why: str):
        super().__init__(message)
        self.why = why


class _Stop(BaseException):
    """Raised inside the watched thread to stop it (a BaseException: code there catching Exception lets it pass)."""


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _interrupt(thread: threading.Thread) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Stop))


def run_bounded(fn: Callable[[], T], *, seconds: float, max_growth_bytes: int, what: str) -> T:
    """`fn()`'s result, computed in a thread of its own within `seconds` and `max_growth_bytes` of memory growth
    (this process's resident size, polled every 10 ms); what it raises is raised here. Past a bound:
    `BoundExceeded` naming `what` and the bound, after the thread was stopped (waited for up to 2 s more)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"seconds must be a number > 0, got {seconds!r}")
    if isinstance(max_growth_bytes, bool) or not isinstance(max_growth_bytes, int) or max_growth_bytes < 1:
        raise ValueError(f"max_growth_bytes must be an integer >= 1, got {max_growth_bytes!r}")
    outcome: dict[str, object] = {}

    def target():
        try:
            outcome["value"] = fn()
        except _Stop:
            outcome["stopped"] = True
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    start_rss, started = _rss(), time.monotonic()
    thread = threading.Thread(target=target, name=f"bounded: {what}"[:60], daemon=True)
    thread.start()
    why = None
    while True:
        thread.join(POLL_S)
        if not thread.is_alive():
            break
        if time.monotonic() - started > seconds:
            why = f"did not finish within {seconds:g} s"
        elif _rss() - start_rss > max_growth_bytes:
            why = f"grew this process's memory by more than {max_growth_bytes / 2**20:,.0f} MiB"
        if why is not None:
            _interrupt(thread)
            thread.join(2.0)
            break
    if why is not None:
        raise BoundExceeded(f"{what} {why} and was stopped", why=why)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
