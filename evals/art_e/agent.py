"""The ART·E agent loop: answer a question about an inbox with search_emails / read_email, recorded as a
`Trajectory` whose metrics are ART's rubric (`evals.art_e.rewards.Rubric`).

The loop is ART·E's rollout:

- each turn is one model call, asking for one tool call (`parallel_tool_calls` false); the first tool call
  of the reply is run (further calls, from a provider that sends them anyway, are answered "not run", so the
  conversation stays well formed for the next turn and for training);
- the episode ends at `return_final_answer`, at the first tool call that cannot be parsed (text mode),
  names no tool that exists, or has bad arguments (a reply without a tool call counts as bad arguments,
  as in ART), and after `max_turns` turns (ran out of turns);
- reading a message id that is not in the inbox is answered with an error and the episode goes on;
- a search date that cannot be read is answered with an error naming it and the episode goes on (ART
  compares date strings in SQL and never ends an episode on one); the metric `unreadable_dates` counts them;
- found/read the right email means the scenario's first message id, as in ART.

Models with native tool calling get the OpenAI tool schemas and `tool_choice` ("required" by default, as
ART sends to the prompted models it compares against; "auto" for a policy being trained, as ART's trained
models get; "none" forbids tool calls, so every turn ends the episode as bad arguments). Others (the
embedded SmolLM2, many small local models) use ART's text protocol: each turn the model answers with one JSON object
`{"tool_name": name, "tool_args": {...}}` (constrained to that shape by a JSON schema where the provider
supports it), and the tool's result comes back as a user message. Every model call goes through
`ruler_rl.judges.complete`, so 429s, 5xx and timeouts are retried in both modes.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Literal

import litellm
from openai.types.chat.chat_completion import Choice

from evals.art_e.matching import IDK
from evals.art_e.questions import Scenario
from evals.art_e.rewards import Rubric
from evals.art_e.tools import TOOL_SCHEMAS, InboxTools
from ruler_rl.judges.completion import RetryPolicy, complete
from ruler_rl.trajectory import Trajectory, choice_to_message

ToolMode = Literal["auto", "native", "text"]
ToolChoice = Literal["required", "auto", "none"]
TOOL_CHOICES = ("required", "auto", "none")
TEXT_MAX_CHARS = 200
TEXT_TURN_MAX_TOKENS = 256  # text protocol: one tool call per turn never needs more

SYSTEM = """You are an email search agent. Answer the user's question by searching their inbox with the tools and reading
the emails you find. You may take up to {max_turns} turns; if a search finds nothing useful, search again with other
keywords. When you know the answer, call return_final_answer with a short answer and the message_ids of the emails it
comes from. If you cannot find it, answer exactly "I don't know" with no sources.

The user's email address is {address}. Today's date is {date}."""

TEXT_PROTOCOL = """
Reply with exactly one JSON object per turn: {{"tool_name": "<name>", "tool_args": {{...}}}}. The tools:
{tools}"""


def _bounded(schema: dict) -> dict:
    """A copy of a tool's parameters with every string and list bounded, so a small model that rambles
    inside the JSON grammar is stopped by the grammar instead of by max_tokens."""
    out = copy.deepcopy(schema)
    for prop in out.get("properties", {}).values():
        if prop.get("type") == "string":
            prop.setdefault("maxLength", TEXT_MAX_CHARS)
        elif prop.get("type") == "array":
            prop.setdefault("maxItems", 5)
            if prop.get("items", {}).get("type") == "string":
                prop["items"].setdefault("maxLength", TEXT_MAX_CHARS)
    return out


def _text_schema() -> dict:
    variants = [{"type": "object", "properties": {"tool_name": {"const": t["function"]["name"]},
                                                  "tool_args": _bounded(t["function"]["parameters"])},
                 "required": ["tool_name", "tool_args"], "additionalProperties": False} for t in TOOL_SCHEMAS]
    return {"anyOf": variants}


def _mode(model: str, tool_mode: ToolMode) -> str:
    if tool_mode not in ("auto", "native", "text"):
        raise ValueError(f"tool_mode must be auto, native or text, got {tool_mode!r}")
    if tool_mode != "auto":
        return tool_mode
    try:
        return "native" if litellm.supports_function_calling(model=model) else "text"
    except Exception:
        return "text"


def _parse_text_call(content: str | None) -> tuple[str | None, object, str | None]:
    """(tool name, arguments, problem) from a text-protocol reply, as ART reads it: the outermost {...}."""
    if not content or content.find("{") == -1 or content.rfind("}") < content.find("{"):
        return None, None, "cant_parse_tool_call"
    try:
        call = json.loads(content[content.find("{"): content.rfind("}") + 1])
    except ValueError:
        return None, None, "cant_parse_tool_call"
    if not isinstance(call, dict) or "tool_args" not in call:
        return None, None, "bad_tool_call_args"
    return call.get("tool_name"), call["tool_args"], None


def check_tool_choice(tool_choice) -> str:
    """`tool_choice` if it is one of TOOL_CHOICES, else ValueError."""
    if tool_choice not in TOOL_CHOICES:
        raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, got {tool_choice!r}")
    return tool_choice


async def run_agent(scenario: Scenario, db_path, model: str, *, params: dict | None = None, max_turns: int = 10,
                    tool_mode: ToolMode = "auto", tool_choice: ToolChoice = "required",
                    retry: RetryPolicy | None = None) -> Trajectory:
    """One rollout of the email agent on `scenario`; never raises for the agent's own mistakes.

    `tool_choice` is sent with every native-mode request ("required", the default, is what ART sends to
    prompted models; pass "auto" for a policy being trained); the text protocol does not send it.
    The trajectory's reward is 0 until it is graded (`evals.art_e.rewards.grade`); its metrics are ART's
    rubric (`answer_correct` too is only set by grading) plus `turns` (model calls made), `latency_s` and
    `unreadable_dates` (search dates answered with an error, the episode going on).
    A model endpoint that keeps failing raises (`ruler_rl.judges.JudgeError`).
    """
    if not isinstance(scenario, Scenario):
        raise TypeError(f"run_agent takes a Scenario, not {type(scenario).__name__}")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"params must be a dict of litellm parameters, got {type(params).__name__}")
    check_tool_choice(tool_choice)
    if params and "tool_choice" in params:
        raise ValueError("pass tool_choice as run_agent's own argument, not inside params")
    mode = _mode(model, tool_mode)
    tools = InboxTools(db_path, scenario.inbox_address, scenario.query_date)
    system = SYSTEM.format(address=scenario.inbox_address, date=scenario.query_date, max_turns=max_turns)
    if mode == "text":
        system += TEXT_PROTOCOL.format(tools="\n".join(
            f"- {t['function']['name']}: {t['function']['description']} Arguments: "
            f"{json.dumps(t['function']['parameters']['properties'])}" for t in TOOL_SCHEMAS))
    messages: list = [{"role": "system", "content": system}, {"role": "user", "content": scenario.question}]
    rubric, turns, unreadable = Rubric(), 0, [0]
    right = scenario.message_ids[0]
    started = time.perf_counter()
    try:
        while True:
            rubric.num_turns += 1
            if rubric.num_turns > max_turns:
                rubric.ran_out_of_turns = True
                break
            turns += 1
            history = [m if isinstance(m, dict) else choice_to_message(m) for m in messages]
            if mode == "native":
                # one call per turn, asked for: ART runs only a reply's first call, and under tool_choice
                # "required" vLLM's grammar allows a list of any length (a policy trained on a weak judge learned
                # to write ten calls in one turn until max_tokens cut the list); vLLM keeps only the first call
                # when parallel_tool_calls is false, and the trainer's middleware bounds vLLM's grammar to one
                # call (ruler_rl.trainer.vllm_middleware.bound_required_tool_lists)
                reply = await complete(model, history, params={"tools": TOOL_SCHEMAS, "tool_choice": tool_choice,
                                                               "parallel_tool_calls": False, **(params or {})},
                                       retry=retry)
                rubric.prompt_tokens += reply.prompt_tokens
                rubric.completion_tokens += reply.completion_tokens
                choice = Choice.model_validate(reply.response.choices[0].model_dump())
                messages.append(choice)
                calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
                if not calls:  # ART: no tool call is bad arguments, and the episode ends
                    rubric.bad_tool_call_args = True
                    break
                call_id, name, args = calls[0]
                problem, result = _run(tools, name, args, rubric, right, unreadable)
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
                for extra_id, _, _ in calls[1:]:
                    messages.append({"role": "tool", "tool_call_id": extra_id,
                                     "content": json.dumps({"error": "not run: one tool call per turn"})})
            else:
                reply = await complete(model, history, params={"max_tokens": TEXT_TURN_MAX_TOKENS, **(params or {})},
                                       retry=retry, response_format={
                    "type": "json_schema", "json_schema": {"name": "tool_call", "schema": _text_schema()}})
                rubric.prompt_tokens += reply.prompt_tokens
                rubric.completion_tokens += reply.completion_tokens
                # the served choice itself (its prompt and sampled token ids, logprobs): what the trainer trains on
                messages.append(Choice.model_validate(reply.response.choices[0].model_dump()))
                name, args, problem = _parse_text_call(reply.content)
                if problem is None:
                    problem, result = _run(tools, name, args, rubric, right, unreadable)
                    messages.append({"role": "user", "content": f"Result of {name}: {result}"})
            if problem in ("cant_parse_tool_call", "bad_tool_call_name", "bad_tool_call_args"):
                setattr(rubric, problem, True)
                break
            if tools.final_answer is not None:
                break
    finally:
        tools.close()
    final = tools.final_answer or {}
    if final:
        rubric.num_sources = len(final["sources"])
        if final["answer"] == IDK:
            rubric.returned_i_dont_know = True
        else:
            rubric.attempted_answer = True
            rubric.sources_correct = right in final["sources"]
    metrics = {**rubric.to_metrics(), "turns": turns, "latency_s": time.perf_counter() - started,
               "unreadable_dates": unreadable[0]}
    return Trajectory(messages_and_choices=messages, tools=TOOL_SCHEMAS if mode == "native" else None, reward=0.0,
                      metrics=metrics,
                      metadata={"scenario_id": scenario.id, "model": model, "tool_mode": mode,
                                "tool_choice": tool_choice if mode == "native" else None,
                                "inbox_address": scenario.inbox_address, "answer": final.get("answer"),
                                "sources": json.dumps(final.get("sources", []))})


def _run(tools: InboxTools, name, args, rubric: Rubric, right: str, unreadable: list[int]) -> tuple[str | None, str]:
    """Run one tool call; mark what ART's rubric marks and add unreadable dates to `unreadable[0]`.
    (problem, the result text the agent reads)."""
    outcome = tools.call(name, args)
    unreadable[0] += outcome.unreadable_dates
    if name == "search_emails" and outcome.problem is None:
        rubric.ever_found_right_email |= any(hit["message_id"] == right for hit in json.loads(outcome.content))
    if name == "read_email" and outcome.problem in (None, "invalid_email"):
        read = (json.loads(args) if isinstance(args, str) else args).get("message_id")
        rubric.ever_read_right_email |= read == right
        rubric.ever_tried_to_read_invalid_email |= outcome.problem == "invalid_email"
    return outcome.problem, outcome.content
