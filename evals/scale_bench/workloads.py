"""What the parts run on: random text of whole words that renders back to the same token ids, the prefix and
agent workloads' prompts and multi-turn rollouts, their varied rewards, and the time budget a part stops at."""

from __future__ import annotations

import random
import time


def word_ids(tokenizer) -> list[int]:
    """Ids of single tokens that are one lowercase word with a leading space ('Ġword'): a run of them decodes
    to text that tokenizes back to the same ids."""
    vocab = tokenizer.get_vocab()
    return sorted(i for t, i in vocab.items() if t.startswith("Ġ") and t[1:].isalpha() and t[1:].islower()
                  and 3 <= len(t) <= 9)


def synthetic_text(tokenizer, words: list[int], n_tokens: int, rng: random.Random) -> str:
    """Text of about `n_tokens` tokens (random words of the vocabulary)."""
    return tokenizer.decode([rng.choice(words) for _ in range(n_tokens)]).strip()



class Budget:
    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()

