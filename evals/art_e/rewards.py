"""ART·E correctness and rewards: the deterministic answer matcher, ART's rubric, and the optional LLM judge.

    answer_matches("It was $3,000.", "$3000")            -> True
    answer_matches("$3000", "$300")                      -> False
    rubric = Rubric(...)   # filled in by the agent loop (evals.art_e.agent), as ART's rollout fills it
    art_reward(rubric, max_turns=10)                     -> ART·E's reward
    await grade(trajectory, scenario, judge_model=None)  -> correctness (match, then judge), reward, metrics

Correctness is decided by the matcher (`match_verdict`, evals.art_e.matching) first: "accept", "ask" or "reject". An
answer it does not accept ("ask": it holds other values of the reference's kind, a negation, a contrast word, another
person beside a person reference, or only part of a sentence reference; "reject") goes to an LLM correctness judge
when one is given (its verdicts cached with the RULER cache's key rules); without a judge only "accept" is correct.

`art_reward` is ART·E's `calculate_reward` (the ART·E project's rollout.py in OpenPipe/ART), branch for branch:

    partial credit: 0.1 each for having found the right email in a search, read it, never read an email
                    that does not exist, and cited it (ART sums these; at most 0.4)
    could not parse the tool call                -2   + partial
    named a tool that does not exist             -1.9 + partial
    gave a tool bad arguments (or no tool call)  -1.8 + partial   (each of these ends the episode)
    answered, wrongly                            -1   + partial
    "I don't know", or ran out of turns           0   + partial   (`idk_reward`: 0 is ART·E's original;
                                                                   -1 scores it as a wrong answer)
    answered correctly                            1 + 0.3 if the right email is cited + 0.1 / number of
                                                  sources cited + 0.1 * (1 - turns / max_turns)

"The right email" is the scenario's first message id, as in ART. One difference: ART's rubric has the
`num_sources` term but its rollout never sets it, so there it always adds 0; here it is the number of
sources the answer cited, so citing 21 ids earns 0.1/21 where citing the one right id earns 0.1.
The reward-free alternative needs none of this: `ruler_score_group` on a group of rollouts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from evals.art_e.matching import IDK, answer_matches, match_verdict
from evals.art_e.questions import Scenario
from ruler_rl.cache import cache_key, open_cache
from ruler_rl.judges.completion import RetryPolicy, complete
from ruler_rl.judges.local_provider import LOCAL_PROVIDER

__all__ = ["IDK", "REWARDS", "Grade", "Rubric", "answer_matches", "art_reward", "check_idk_reward", "grade",
           "judge_answer", "match_verdict"]

REWARDS = ("art",)

# ---------------------------------------------------------------------------------------------------------
# ART's rubric and reward
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Rubric:
    """What happened in one rollout, in ART·E's terms (its `FinalRubric`); the agent loop fills it in."""

    answer_correct: bool = False
    sources_correct: bool = False
    num_turns: int = 0
    attempted_answer: bool = False
    ever_found_right_email: bool = False
    ever_read_right_email: bool = False
    cant_parse_tool_call: bool = False
    bad_tool_call_name: bool = False
    bad_tool_call_args: bool = False
    ran_out_of_turns: bool = False
    returned_i_dont_know: bool = False
    num_sources: int = 0
    ever_tried_to_read_invalid_email: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def to_metrics(self) -> dict[str, int]:
        out = {k: int(v) for k, v in asdict(self).items()}
        out["failed_format_validation"] = int(self.cant_parse_tool_call or self.bad_tool_call_name
                                              or self.bad_tool_call_args)
        return out

    @classmethod
    def from_metrics(cls, metrics: dict) -> Rubric:
        fields = cls.__dataclass_fields__
        return cls(**{k: (type(f.default)(metrics[k])) for k, f in fields.items() if k in metrics})


def check_idk_reward(idk_reward) -> float:
    """`idk_reward` as a float if it is a number from -1 to 0, else ValueError (TypeError for a non-number)."""
    if isinstance(idk_reward, bool) or not isinstance(idk_reward, (int, float)):
        raise TypeError(f"idk_reward must be a number from -1 to 0, got {idk_reward!r}")
    if not -1 <= idk_reward <= 0:  # also refuses NaN
        raise ValueError(f"idk_reward must be from -1 (a wrong answer's) to 0 (ART·E's original), got {idk_reward!r}")
    return float(idk_reward)


def art_reward(rubric: Rubric, max_turns: int = 10, idk_reward: float = 0.0) -> float:
    """ART·E's reward for one rollout (the table in this module's docstring); "I don't know" and running out
    of turns score `idk_reward` (0, ART·E's original, to -1) plus the partial credit."""
    if not isinstance(rubric, Rubric):
        raise TypeError(f"art_reward takes a Rubric, not {type(rubric).__name__}")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
    idk_reward = check_idk_reward(idk_reward)
    partial = 0.1 * (rubric.ever_found_right_email + rubric.ever_read_right_email
                     + (not rubric.ever_tried_to_read_invalid_email) + rubric.sources_correct)
    if rubric.cant_parse_tool_call:
        return -2 + partial
    if rubric.bad_tool_call_name:
        return -1.9 + partial
    if rubric.bad_tool_call_args:
        return -1.8 + partial
    if rubric.attempted_answer and not rubric.answer_correct:
        return -1 + partial
    if rubric.returned_i_dont_know or rubric.ran_out_of_turns:
        return idk_reward + partial
    if rubric.answer_correct:
        reward = 1 + (0.3 if rubric.sources_correct else 0)
        reward += 0.1 / rubric.num_sources if rubric.num_sources > 0 else 0
        return reward + 0.1 * (1 - rubric.num_turns / max_turns)
    raise ValueError(f"a rubric no branch of ART's reward covers: {rubric}")


# ---------------------------------------------------------------------------------------------------------
# The LLM correctness judge, and grading a rollout
# ---------------------------------------------------------------------------------------------------------

CORRECTNESS_PROMPT = """You grade answers to questions about a user's email. You get the question, the reference answer
and the AI's answer. The reference answer may be a bare value (a date, an amount, a name, an address, a phone number)
or a sentence; from it take only the facts that answer the question. Accept the AI's answer if it states every one of
those facts with the same meaning: other wording, other formats of a value (3/29/00 = March 29, 2000), abbreviations,
and extra detail that does not conflict are fine, and so is another value of the same kind that the answer clearly
rules out or gives for something else ("March 26, not March 19"; "$50k now, $55k offered" for the current salary).
Reject it if it contradicts the reference even while stating its value or words: it gives the value to another
person, role or thing ("X forwarded it to Y, who replied" when X replied), swaps who did what, negates the value
("not $300"), says it is cancelled, former or changed, adds a member to a list, offers several candidates without
choosing, or leaves out a fact the question asks for. Answer with JSON only:
{"reason": "<one short sentence>", "correct": true or false}"""

SCHEMA = {"type": "object", "properties": {"reason": {"type": "string", "maxLength": 200},
                                           "correct": {"type": "boolean"}},
          "required": ["reason", "correct"], "additionalProperties": False}


async def judge_answer(scenario: Scenario, answer: str | None, model: str, *, params: dict | None = None,
                       cache=None, retry: RetryPolicy | None = None) -> bool:
    """Whether `answer` is correct for `scenario`, by an LLM judge (any litellm model; cached).

    Raises a `JudgeError` when the judge cannot be asked; an unreadable verdict is False.
    """
    if answer is None or not answer.strip() or answer.strip() == IDK:
        return False
    messages = [{"role": "system", "content": CORRECTNESS_PROMPT},
                {"role": "user", "content": json.dumps({"question": scenario.question,
                                                        "reference_answer": scenario.answer,
                                                        "ai_answer": answer}, ensure_ascii=False)}]
    fmt = {"type": "json_schema", "json_schema": {"name": "correctness", "schema": SCHEMA}}
    store = open_cache(cache)
    key = cache_key(model, messages, fmt, params) if store is not None else None
    if key is not None and (hit := store.get(key)) is not None:
        return bool(hit)
    supports_schema = model.startswith(LOCAL_PROVIDER + "/") or (params or {}).get("api_base")
    reply = await complete(model, messages, response_format=fmt if supports_schema else None, params=params,
                           retry=retry)
    try:
        verdict = json.loads(reply.content)["correct"]
        verdict = verdict if isinstance(verdict, bool) else False
    except (ValueError, KeyError, TypeError):
        verdict = False  # unreadable: not accepted (and not cached, so a retry may read it)
        return verdict
    if key is not None:
        store.set(key, verdict)
    return verdict


@dataclass
class Grade:
    """How one rollout was graded: the matcher's verdict ("accept", "ask" or "reject"; "reject" when no answer was
    attempted), whether it accepted, the judge's verdict (None: not asked), the correctness used, and the reward."""

    matched: bool
    judged: bool | None
    correct: bool
    reward: float
    verdict: str = "reject"


async def grade(traj, scenario: Scenario, *, max_turns: int, judge_model: str | None = None,
                judge_params: dict | None = None, reward: str = "art", cache=None,
                retry: RetryPolicy | None = None, idk_reward: float = 0.0) -> Grade:
    """Decide correctness and set the trajectory's reward (`idk_reward`: what "I don't know" scores, see `art_reward`).

    The matcher (`match_verdict`, with the scenario's question) rules first; an attempted answer it does not
    accept ("ask" or "reject") goes to the judge when `judge_model` is given, and the judge's verdict decides.
    Without a judge only "accept" is correct. The rubric the agent loop left in `traj.metrics` gets
    `answer_correct`, the metrics get `answer_matched` (1: accepted) and `answer_match_asked` (1: the matcher
    said "ask"), and `traj.reward` becomes ART's reward. A judge that fails raises (`JudgeError`); the trajectory
    is then left as it was.
    """
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}")
    check_idk_reward(idk_reward)
    if judge_model is not None and (not isinstance(judge_model, str) or not judge_model.strip()):
        raise ValueError(f"judge_model must be a non-empty litellm model name or None, got {judge_model!r}")
    rubric = Rubric.from_metrics(traj.metrics)
    answer = traj.metadata.get("answer")
    verdict = match_verdict(answer, scenario.answer, scenario.question) if rubric.attempted_answer else "reject"
    matched = verdict == "accept"
    judged = None
    if rubric.attempted_answer and not matched and judge_model is not None:
        judged = await judge_answer(scenario, answer, judge_model, params=judge_params, cache=cache, retry=retry)
    rubric.answer_correct = matched or bool(judged)
    value = art_reward(rubric, max_turns, idk_reward)
    traj.metrics.update(rubric.to_metrics())
    traj.metrics["answer_matched"] = int(matched)
    traj.metrics["answer_match_asked"] = int(verdict == "ask")
    traj.reward = value
    return Grade(matched=matched, judged=judged, correct=rubric.answer_correct, reward=value, verdict=verdict)
