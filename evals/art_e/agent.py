"""The ART·E agent loop: answer a question about an inbox with search_inbox / read_email, recorded as a
`Trajectory` (messages, tools, final answer and metrics).

Models with native tool calling get the OpenAI tool schemas. Others (the embedded SmolLM2, many small
local models) use a text protocol: each turn the model answers with one JSON object
`{"tool": name, "arguments": {...}}`, constrained to that shape by a JSON schema where the provider
supports it, and the tool's result comes back as a user message.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Literal

import litellm
from openai.types.chat.chat_completion import Choice

from evals.art_e.questions import Scenario
from evals.art_e.tools import TOOL_SCHEMAS, InboxTools, inbox_for_address
from judges.completion import RetryPolicy, complete
from ruler.trajectory import Trajectory, choice_to_message

ToolMode = Literal["auto", "native", "text"]
TEXT_MAX_CHARS = 200
TEXT_TURN_MAX_TOKENS = 256  # text protocol: one tool call per turn never needs more

SYSTEM = """You are an email search agent. You answer the user's question by searching their inbox and reading emails.
The user's email address is {address}. Today's date is {date}. You may take up to {max_turns} turns.
Search with short keyword lists; read the most promising emails; then give the final answer with
return_final_answer(answer, sources), citing the message_ids you used. If the inbox does not hold the
answer, answer "I don't know"."""

TEXT_PROTOCOL = """
Reply with exactly one JSON object per turn: {{"tool": "<name>", "arguments": {{...}}}}. Tools:
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
    variants = [{"type": "object", "properties": {"tool": {"const": t["function"]["name"]},
                                                  "arguments": _bounded(t["function"]["parameters"])},
                 "required": ["tool", "arguments"], "additionalProperties": False} for t in TOOL_SCHEMAS]
    return {"anyOf": variants}


def _mode(model: str, tool_mode: ToolMode) -> str:
    if tool_mode != "auto":
        return tool_mode
    try:
        return "native" if litellm.supports_function_calling(model=model) else "text"
    except Exception:
        return "text"


async def run_agent(scenario: Scenario, db_path, model: str, *, params: dict | None = None, max_turns: int = 10,
                    tool_mode: ToolMode = "auto", retry: RetryPolicy | None = None) -> Trajectory:
    """One rollout of the email agent on `scenario`; never raises for the agent's own mistakes."""
    if max_turns < 1:
        raise ValueError("max_turns must be >= 1")
    mode = _mode(model, tool_mode)
    tools = InboxTools(db_path, scenario.inbox or inbox_for_address(db_path, scenario.inbox_address), scenario.query_date)
    system = SYSTEM.format(address=scenario.inbox_address, date=scenario.query_date, max_turns=max_turns)
    if mode == "text":
        system += TEXT_PROTOCOL.format(tools="\n".join(
            f"- {t['function']['name']}: {t['function']['description']} arguments: "
            f"{json.dumps(t['function']['parameters']['properties'])}" for t in TOOL_SCHEMAS))
    messages: list = [{"role": "system", "content": system}, {"role": "user", "content": scenario.question}]
    metrics = {"turns": 0, "tool_errors": 0, "found_right_email": False, "read_right_email": False,
               "attempted_answer": False,
               "ran_out_of_turns": False, "prompt_tokens": 0, "completion_tokens": 0, "format_errors": 0}
    started = time.perf_counter()
    for turn in range(max_turns):
        metrics["turns"] = turn + 1
        history = [m if isinstance(m, dict) else choice_to_message(m) for m in messages]
        if mode == "native":
            reply = await litellm.acompletion(model=model, messages=history, tools=TOOL_SCHEMAS, tool_choice="auto",
                                              **(params or {}))
            metrics["prompt_tokens"] += reply.usage.prompt_tokens
            metrics["completion_tokens"] += reply.usage.completion_tokens
            choice = Choice.model_validate(reply.choices[0].model_dump())
            messages.append(choice)
            calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
            if not calls:
                metrics["format_errors"] += 1
                messages.append({"role": "user", "content": "Use a tool: search_inbox, read_email or return_final_answer."})
                continue
            for call_id, name, args in calls:
                result = _run_tool(tools, name, args, scenario, metrics)
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            reply = await complete(model, history, params={"max_tokens": TEXT_TURN_MAX_TOKENS, **(params or {})},
                                   retry=retry, response_format={
                "type": "json_schema", "json_schema": {"name": "tool_call", "schema": _text_schema()}})
            metrics["prompt_tokens"] += reply.prompt_tokens
            metrics["completion_tokens"] += reply.completion_tokens
            messages.append({"role": "assistant", "content": reply.content})
            try:
                call = json.loads(reply.content)
                name, args = call["tool"], call.get("arguments", {})
            except (ValueError, KeyError, TypeError):
                metrics["format_errors"] += 1
                messages.append({"role": "user", "content": 'Reply with one JSON object: {"tool": ..., "arguments": {...}}'})
                continue
            messages.append({"role": "user", "content": f"Result of {name}: " + _run_tool(tools, name, args, scenario, metrics)})
        if tools.final_answer is not None:
            break
    else:
        metrics["ran_out_of_turns"] = tools.final_answer is None
    metrics["latency_s"] = time.perf_counter() - started
    final = tools.final_answer or {}
    return Trajectory(messages_and_choices=messages, tools=TOOL_SCHEMAS, reward=0.0, metrics=metrics,
                      metadata={"scenario_id": scenario.id, "model": model, "tool_mode": mode,
                                "answer": final.get("answer"), "sources": json.dumps(final.get("sources", []))})


def _run_tool(tools: InboxTools, name: str, args, scenario: Scenario, metrics: dict) -> str:
    result = tools.call(name, args)
    if '"error"' in result[:12]:
        metrics["tool_errors"] += 1
    if name == "search_inbox":
        metrics["found_right_email"] = metrics["found_right_email"] or any(m in result for m in scenario.message_ids)
    if name == "read_email":
        try:
            read = (json.loads(args) if isinstance(args, str) else args).get("message_id")
        except (ValueError, AttributeError):
            read = None
        metrics["read_right_email"] = metrics["read_right_email"] or read in scenario.message_ids
    if name == "return_final_answer" and tools.final_answer is not None:
        metrics["attempted_answer"] = tools.final_answer["answer"].strip().lower() not in ("", "i don't know")
    return result
