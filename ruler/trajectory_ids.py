"""Trajectory ids as strings: where a trajectory keeps its id, fresh ids, and the Langfuse trace id of an id.

`Trajectory` has no id field, so the id lives in `metadata["ruler_trajectory_id"]` (`TRAJECTORY_ID_KEY`);
`ruler_rl.tracing` says who writes it and when. This module imports nothing of ruler's: the trajectory model's
check (`ruler_rl.trajectory.validate_trajectories`), the tracing hooks and the Langfuse exporter all read the
key from here.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

TRAJECTORY_ID_KEY = "ruler_trajectory_id"
"""The trajectory metadata key holding its stable id (see `ruler_rl.tracing`)."""

_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def new_trajectory_id() -> str:
    """A fresh trajectory id: a uuid4 as 32 lowercase hex digits (also a valid Langfuse trace id)."""
    return uuid.uuid4().hex


def known_trajectory_id(metadata: dict[str, Any]) -> str | None:
    """The valid id in a trajectory's metadata, or None (none, or not a non-empty string): never raises,
    never assigns."""
    value = metadata.get(TRAJECTORY_ID_KEY)
    return value if isinstance(value, str) and value.strip() else None


def langfuse_trace_id(trajectory_id: str) -> str:
    """The Langfuse trace id of a trajectory id: the id itself when it is 32 lowercase hex digits, else the
    first 16 bytes of its SHA-256 (the same as `langfuse.Langfuse.create_trace_id(seed=id)`)."""
    if not isinstance(trajectory_id, str) or not trajectory_id.strip():
        raise ValueError(f"a trajectory id is a non-empty string, got {trajectory_id!r}")
    if _HEX32.match(trajectory_id):
        return trajectory_id
    return hashlib.sha256(trajectory_id.encode("utf-8")).digest()[:16].hex()
