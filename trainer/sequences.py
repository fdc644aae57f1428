"""Trajectories → training sequences, token for token as the model was served.

Every assistant turn a rollout kept (a `Choice`) carries what the server saw and sampled: the request's
`prompt_token_ids`, the choice's `token_ids` and the sampled tokens' logprobs (vLLM's server and the CPU
server both return them; `trainer/vllm_middleware.py`). For each turn the training context is exactly that
prompt, the trained tokens exactly those ids, the old logprobs exactly those logprobs. Text is never
re-rendered for a trained turn.

Turns share one sequence (one forward pass) when a turn's prompt extends the previous turn's prompt and
completion exactly — the usual case for an agent that appends to its history. Otherwise (the agent edited
its history, a template dropped earlier reasoning, a completion re-tokenized differently) a new sequence
starts, so no turn is ever trained in a context it was not sampled in.

A choice without token ids (an API model, a streamed answer) is refused with `MissingTokenIdsError` unless
the caller opts in to off-policy text (`allow_off_policy_text=True`): then the turn is re-rendered with the
chat template, trained with ratio 1 (no sampled logprobs) and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat.chat_completion import Choice

from ruler_rl.trajectory import Trajectory, choice_to_message


class MissingTokenIdsError(ValueError):
    """A generated turn has no served token ids, and off-policy text was not allowed."""


class AbortedTurnError(ValueError):
    """A generated turn was aborted by the server: it is not a finished turn and is never trained."""


class StalePolicyError(ValueError):
    """A trajectory holds a turn sampled by a policy step further behind the trainer than
    `TrainConfig.max_off_policy_steps` allows, or by a step ahead of it."""


@dataclass
class TrainingSequence:
    """One forward pass: `token_ids`, which of them the model sampled (`trained`), and their sampled
    logprobs (`old_logprobs`, NaN where not trained or not known)."""
    token_ids: list[int]
    trained: list[bool]
    old_logprobs: list[float]
    turns: int = 0
    policy_step: int | None = None  # the oldest policy step that sampled one of its turns (None: none known)
    newest_policy_step: int | None = None  # the newest one
    unweighted_turns: list[tuple[int, int]] = field(default_factory=list)  # (policy step, index of its first
    # sampled token) of each turn without sampled logprobs (constrained, or none sent): trained with the trainer's
    # own logprobs as the old policy, ratio 1
    advantage: float = 0.0
    trajectory: int = 0  # the trajectory's index in its batch (losses normalise per trajectory)
    group: int = 0       # its group's index (sequences of one group may share their prefix in training)
    position: int = 0    # the trajectory's index in its group: `groups[group].trajectories[position]`

    def __post_init__(self) -> None:
        if not (len(self.token_ids) == len(self.trained) == len(self.old_logprobs)):
            raise ValueError("token_ids, trained and old_logprobs must have the same length")


@dataclass
class SequenceReport:
    """What `training_sequences` did, summed over a batch."""
    sequences: int = 0
    turns: int = 0
    context_breaks: int = 0          # turns whose prompt did not extend the previous turn: new sequence
    off_policy_turns: int = 0        # re-rendered text (allow_off_policy_text)
    turns_without_logprobs: int = 0  # served ids but no sampled logprobs, or constrained ones: ratio 1
    turns_without_policy_step: int = 0  # served turns that do not say which policy step sampled them
    truncated: int = 0               # sequences cut to max_seq_length (counted by `training.prepare`)


@dataclass
class _Turn:
    prompt: list[int]
    completion: list[int]
    logprobs: list[float] | None
    policy_step: int | None = None


def _extra(choice: Choice, key: str) -> Any:
    """A server's extra field on a choice: directly (OpenAI client) or where litellm moves it."""
    extra = choice.model_extra or {}
    if extra.get(key) is not None:
        return extra[key]
    nested = extra.get("provider_specific_fields") or {}
    if isinstance(nested, dict) and nested.get(key) is not None:
        return nested[key]
    msg_extra = (choice.message.model_extra or {}) if choice.message is not None else {}
    nested = msg_extra.get("provider_specific_fields") or {}
    return nested.get(key) if isinstance(nested, dict) else None


def aborted(choice: Choice) -> bool:
    """Whether the server aborted `choice` (an unfinished turn): its `finish_reason` says `abort`, or, since
    clients rewrite the finish reason (litellm maps vLLM's `abort` to `stop`), the `aborted` mark the trainer's
    middleware in vLLM's server puts on such a choice (`trainer/vllm_middleware.py`)."""
    return choice.finish_reason == "abort" or _extra(choice, "aborted") is True


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    return None


def _sampled_logprobs(choice: Choice, n: int) -> list[float] | None:
    """The logprobs of a choice's `n` sampled tokens (standard `logprobs` or compact `token_logprobs`; a
    non-finite one as NaN), or None when the server sent none for each token or marks the choice `constrained`."""
    if _extra(choice, "constrained") is True:  # sampled under a grammar: not the policy's own logprobs
        return None
    content = getattr(choice.logprobs, "content", None) if choice.logprobs is not None else None
    if content and len(content) == n:
        lps = [float(item.logprob) for item in content]
    else:
        compact = _extra(choice, "token_logprobs")
        if not (isinstance(compact, list) and len(compact) == n):
            return None
        lps = [float(x) for x in compact]
    return [x if math.isfinite(x) else math.nan for x in lps]


def served_turn(choice: Choice) -> _Turn | None:
    """(prompt ids, sampled ids, sampled logprobs) of a choice, or None when the server sent no ids. The
    logprobs are None when the server sent none, or when it marks the choice `constrained` (sampled under a
    grammar: vLLM's logprobs are then those of the masked distribution, not the policy's); training then uses
    the trainer's own logprobs before the update as the old policy (ratio 1 on policy)."""
    prompt, completion = _ints(_extra(choice, "prompt_token_ids")), _ints(_extra(choice, "token_ids"))
    if prompt is None or completion is None:
        return None
    lps = _sampled_logprobs(choice, len(completion))
    return _Turn(list(prompt), list(completion), lps, policy_step(choice))


def policy_step(choice: Choice) -> int | None:
    """The policy step that sampled `choice`, as its server labelled it (`policy_step`); None when it does not
    say."""
    step = _extra(choice, "policy_step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def trajectory_policy_steps(trajectory: Trajectory) -> list[int]:
    """The `policy_step` of every served choice in `trajectory` (its main history and each additional one), in
    order; choices that do not say are left out."""
    steps = []
    for items in [trajectory.messages_and_choices, *(h.messages_and_choices for h in trajectory.additional_histories)]:
        for item in items:
            step = policy_step(item) if isinstance(item, Choice) else None
            if step is not None:
                steps.append(step)
    return steps


def end_of_turn_ids(tokenizer, generation_config=None) -> list[int]:
    """The ids that end an assistant turn: the generation config's `eos_token_id` (an id or a list, e.g.
    Gemma's `<end_of_turn>`) and the tokenizer's, deduplicated, in that order."""
    ids: list[int] = []
    for source in (getattr(generation_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        for t in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(t, int) and t not in ids:
                ids.append(t)
    return ids


def _text_turn(tokenizer, before: list[dict], choice: Choice, tools, chat_template: str | None,
               end_of_turn: list[int] | None) -> _Turn:
    """Off-policy text: the turn re-rendered with the served chat template (only with allow_off_policy_text)."""
    from ruler_rl.trainer.chat import prompt_ids, template_messages

    prompt = prompt_ids(tokenizer, before, tools, chat_template=chat_template)
    full_text = tokenizer.apply_chat_template(template_messages([*before, choice_to_message(choice)]),
                                              tools=tools or None, chat_template=chat_template, tokenize=False)
    full = tokenizer(full_text, add_special_tokens=False)["input_ids"]
    ends = list(end_of_turn or end_of_turn_ids(tokenizer))
    if full[:len(prompt)] == prompt:
        rest = full[len(prompt):]
        cut = next((i + 1 for i, t in enumerate(rest) if t in ends), len(rest))
        completion = rest[:cut]
    else:  # the template renders history differently from a generation prompt (e.g. think blocks)
        completion = tokenizer(choice.message.content or "", add_special_tokens=False)["input_ids"]
        completion += ends[:1]
    return _Turn(prompt, completion, None)


def _history_sequences(items: list, tools, tokenizer, allow_off_policy_text: bool, where: str,
                       report: SequenceReport, render: dict) -> list[TrainingSequence]:
    seqs: list[TrainingSequence] = []
    current: TrainingSequence | None = None
    before: list[dict] = []
    for i, item in enumerate(items):
        if not isinstance(item, Choice):
            before.append(item)
            continue
        if aborted(item):
            raise AbortedTurnError(f"{where}: messages_and_choices[{i}] was aborted by the server")
        turn = served_turn(item)
        if turn is None:
            if not allow_off_policy_text:
                raise MissingTokenIdsError(
                    f"{where}: messages_and_choices[{i}] has no served token ids (prompt_token_ids and "
                    "token_ids), so what the model saw is unknown. Sample through the model's server "
                    "(model.openai_client() / model.litellm_completion_params()) and keep its choices whole "
                    "(a converter that rebuilds a Choice from message and logprobs alone drops them: use "
                    "ruler_rl.trajectory.convert_litellm_choice_to_openai), or pass TrainConfig(allow_off_policy_text=True) "
                    "to train re-rendered text with ratio 1")
            if tokenizer is None:
                raise ValueError("a tokenizer is needed to re-render off-policy text")
            turn = _text_turn(tokenizer, before, item, tools, **render)
            report.off_policy_turns += 1
        else:
            if turn.logprobs is None:
                report.turns_without_logprobs += 1
            if turn.policy_step is None:
                report.turns_without_policy_step += 1
        before.append(choice_to_message(item))
        report.turns += 1
        lps = turn.logprobs or [math.nan] * len(turn.completion)
        if current is not None and turn.prompt[:len(current.token_ids)] == current.token_ids:
            gap = turn.prompt[len(current.token_ids):]      # e.g. a tool result and the next generation prompt
        else:
            if current is not None:
                report.context_breaks += 1
            current = TrainingSequence([], [], [])
            seqs.append(current)
            gap = turn.prompt
        first = len(current.token_ids) + len(gap)  # the turn's first sampled token
        current.token_ids += gap + turn.completion
        current.trained += [False] * len(gap) + [True] * len(turn.completion)
        current.old_logprobs += [math.nan] * len(gap) + lps
        current.turns += 1
        if turn.policy_step is not None:
            current.policy_step = (turn.policy_step if current.policy_step is None
                                   else min(current.policy_step, turn.policy_step))
            current.newest_policy_step = (turn.policy_step if current.newest_policy_step is None
                                          else max(current.newest_policy_step, turn.policy_step))
            if turn.logprobs is None:
                current.unweighted_turns.append((turn.policy_step, first))
    return seqs


def training_sequences(trajectory: Trajectory, tokenizer=None, *, allow_off_policy_text: bool = False,
                       report: SequenceReport | None = None, where: str = "trajectory",
                       chat_template: str | None = None, end_of_turn: list[int] | None = None,
                       ) -> list[TrainingSequence]:
    """The training sequences of one trajectory (its `messages_and_choices` and each of its
    `additional_histories`), each with `token_ids`, `trained` (same length) and `old_logprobs`.

    Raises `MissingTokenIdsError` for a choice without served ids (unless `allow_off_policy_text`, which
    needs `tokenizer` and renders with `chat_template` — the served one — ending the turn with the first of
    `end_of_turn`), `AbortedTurnError` for an aborted one.
    """
    if not isinstance(trajectory, Trajectory):
        raise TypeError(f"{where} is a {type(trajectory).__name__}, not a Trajectory")
    report = report if report is not None else SequenceReport()
    histories = [(trajectory.messages_and_choices, trajectory.tools)]
    histories += [(h.messages_and_choices, h.tools) for h in trajectory.additional_histories]
    seqs = []
    for h, (items, tools) in enumerate(histories):
        label = where if h == 0 else f"{where}.additional_histories[{h - 1}]"
        seqs += _history_sequences(list(items), tools, tokenizer, allow_off_policy_text, label, report,
                                   {"chat_template": chat_template, "end_of_turn": end_of_turn})
    report.sequences += len(seqs)
    return seqs


def trained_spans(seqs: list[TrainingSequence]) -> list[tuple[list[int], list[int], list[float]]]:
    """(context, trained ids, their old logprobs) of each run of trained tokens, in order: for sequences built
    by `training_sequences`, one per assistant turn, to compare with what the server answered."""
    spans = []
    for seq in seqs:
        i = 0
        while i < len(seq.token_ids):
            if not seq.trained[i]:
                i += 1
                continue
            j = i
            while j < len(seq.token_ids) and seq.trained[j]:
                j += 1
            spans.append((seq.token_ids[:i], seq.token_ids[i:j], seq.old_logprobs[i:j]))
            i = j
    return spans
