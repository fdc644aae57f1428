"""ART·E rewards: a programmatic reward built on an answer-correctness judge, and the reward-free way.

    correct = await judge_answer(scenario, trajectory.metadata["answer"], "openai/o4-mini")
    reward  = art_e_reward(trajectory.metrics, answer, sources, scenario, correct)

`art_e_reward` follows ART·E's rubric (the ranges keep every outcome ordered):
    format errors (no valid tool call, ran out of turns)  -2 .. -1   less bad with partial progress
    wrong answer                                          -1 .. 0    below "I don't know": guessing costs
    no answer / "I don't know"                             0 .. 1    partial credit for progress
    correct answer                                         1 .. 2    bonus for citing the right email, fewer turns
Partial credit: 0.1 for finding (searching up) the right email's id, 0.1 for reading it, 0.1 for citing it.
The reward-free alternative needs none of this: `ruler_score_group` on a group of rollouts.

The correctness judge goes through `judges.complete` (retries) and the RULER cache (same key rules).
"""

from __future__ import annotations

import json

from judges.completion import RetryPolicy, complete
from judges.local_provider import LOCAL_PROVIDER
from ruler.cache import cache_key, open_cache

from evals.art_e.questions import Scenario

CORRECTNESS_PROMPT = """You grade answers to questions about a user's email. Given the question, the reference answer and the
agent's answer, decide whether the agent's answer is correct: it must contain the information of the reference answer
(wording may differ; extra correct detail is fine; a different fact is wrong). Answer with JSON only:
{"correct": true or false, "reason": "<one short sentence>"}"""

SCHEMA = {"type": "object", "properties": {"reason": {"type": "string", "maxLength": 200},
                                           "correct": {"type": "boolean"}},
          "required": ["reason", "correct"], "additionalProperties": False}

IDK = {"", "i don't know", "i do not know", "i don't know.", "unknown"}


def is_no_answer(answer: str | None) -> bool:
    return answer is None or answer.strip().lower() in IDK


async def judge_answer(scenario: Scenario, answer: str | None, model: str, *, params: dict | None = None,
                       cache=None, retry: RetryPolicy | None = None) -> bool:
    """Whether `answer` is correct for `scenario`, by an LLM judge (any litellm model; cached)."""
    if is_no_answer(answer):
        return False
    messages = [{"role": "system", "content": CORRECTNESS_PROMPT},
                {"role": "user", "content": json.dumps({"question": scenario.question,
                                                        "reference_answer": scenario.answer,
                                                        "agent_answer": answer}, ensure_ascii=False)}]
    fmt = {"type": "json_schema", "json_schema": {"name": "correctness", "schema": SCHEMA}}
    store = open_cache(cache)
    key = cache_key(model, messages, fmt, params) if store is not None else None
    if key is not None and (hit := store.get(key)) is not None:
        return bool(hit)
    supports_schema = model.startswith(LOCAL_PROVIDER + "/") or (params or {}).get("api_base")
    reply = await complete(model, messages, response_format=fmt if supports_schema else None, params=params,
                           retry=retry)
    try:
        verdict = bool(json.loads(reply.content)["correct"])
    except (ValueError, KeyError, TypeError):
        verdict = "true" in reply.content.lower() and "false" not in reply.content.lower()
    if key is not None:
        store.set(key, verdict)
    return verdict


def art_e_reward(metrics: dict, answer: str | None, sources: list[str], scenario: Scenario,
                 correct: bool, *, max_turns: int = 10) -> float:
    """ART·E's programmatic reward for one rollout (see the module docstring for the ranges)."""
    if max_turns < 1:
        raise ValueError("max_turns must be >= 1")
    cited = any(s in scenario.message_ids for s in sources or [])
    progress = 0.1 * bool(metrics.get("found_right_email")) + 0.1 * bool(metrics.get("read_right_email")) \
        + 0.1 * cited
    if metrics.get("format_errors") and answer is None or metrics.get("ran_out_of_turns"):
        return -2.0 + progress
    if is_no_answer(answer):
        return 0.0 + progress
    if not correct:
        return -1.0 + progress
    fewer_turns = 0.1 * (1 - min(metrics.get("turns", max_turns), max_turns) / max_turns)
    return 1.0 + 0.3 * cited + progress + fewer_turns
