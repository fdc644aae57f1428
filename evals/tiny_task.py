"""A tiny verifiable task for trainer checks and benchmarks: answer short questions in one word.

Reward: 1 if the right answer is among the reply's words, plus up to 0.5 for brevity (0.5 for one word,
0 from nine words on): the best replies are exactly the answer. SmolLM2-135M starts around 0.3 and
learns it within minutes on a CPU (`examples/tiny_task.py`)."""

from __future__ import annotations

import re

QUESTIONS = [
    ("What is the capital of France?", "paris"), ("What is 2 + 3?", "5"),
    ("What color is the sky on a clear day?", "blue"), ("How many legs does a spider have?", "8"),
    ("What is the capital of Japan?", "tokyo"), ("What is 10 - 4?", "6"),
    ("What animal says moo?", "cow"), ("What is the opposite of hot?", "cold"),
]
SYSTEM = "Answer with one word."


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def reward(text: str | None, answer: str) -> float:
    words = re.findall(r"[a-z0-9]+", (text or "").lower())
    if not words:
        return 0.0
    return float(answer in words) + 0.5 * max(0.0, 1 - (len(words) - 1) / 8)


def questions_for_step(step: int, per_step: int) -> list[tuple[str, str]]:
    """The step's questions, rotating through the set (the same for every trainer compared)."""
    if per_step < 1:
        raise ValueError("per_step must be >= 1")
    return [QUESTIONS[(step * per_step + k) % len(QUESTIONS)] for k in range(per_step)]
