"""RULER's bounds, with no dependencies: the caps on one group (`Limits`, which `validate_trajectories` enforces),
on permutations and on judge prompts. The command line reads them for its help without importing the scoring path."""

from __future__ import annotations

from dataclasses import dataclass

MAX_PERMUTATIONS = 32  # orderings per group (each one is a judge call)
MIN_PROMPT_TOKENS = 256  # smaller budgets cannot hold the instructions and an answer
MAX_PROMPT_TOKENS = 2_000_000
UNKNOWN_CONTEXT_TOKENS = 131_072  # assumed for a judge whose context litellm does not know


@dataclass(frozen=True)
class Limits:
    """Caps on one group, enforced by `validate_trajectories` (library defaults; the service sets its own).

    max_trajectories: trajectories per group. max_messages: messages (and choices) per conversation.
    max_message_chars: characters in one message: its text, tool-call arguments and other fields together.
    max_depth: how deeply JSON values inside a message or a tool schema may nest.
    """

    max_trajectories: int = 256
    max_messages: int = 1024
    max_message_chars: int = 1_000_000
    max_depth: int = 32

    def __post_init__(self):
        for name in ("max_trajectories", "max_messages", "max_message_chars", "max_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be an integer >= 1, got {value!r}")
