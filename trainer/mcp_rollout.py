"""MCP·RL's rollouts: `rollout` gives the policy (an OpenAI-compatible client: `model.openai_client()` for a
`TrainableModel`) an MCP server's tools natively; each of its tool calls runs on the server through
`MCPToolbox.call`. A tool that fails or runs past the timeout becomes a tool message the agent reads, and is
counted in the trajectory's metrics (`tool_errors`, `tool_timeouts`). The served `Choice`s are kept whole in the
trajectory, so the trainer gets their token ids. A policy or connection that fails raises: as a rollout of a
`TrajectoryGroup` it is recorded in `group.exceptions` and counted by `gather_trajectory_groups`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ruler_rl.trainer.mcp_client import MCPToolbox, ToolCallResult
from ruler_rl.trainer.mcp_tasks import MCPTask
from ruler_rl.trajectory import Trajectory, choice_to_message

SYSTEM = """You are an agent with the tools of an MCP server. Do the user's task by calling the tools you need and \
reading their results; call tools again if a result does not settle it. When the task is done, reply with the final \
answer in plain text, without a tool call. You may take up to {max_turns} turns.{instructions}"""


async def rollout(task: MCPTask, toolbox: MCPToolbox, client: Any, model: str, *, max_turns: int = 6,
                  max_tokens: int = 256, temperature: float = 1.0, system: str | None = None,
                  tool_choice: str | dict = "auto") -> Trajectory:
    """One episode of the agent on `task`: a `Trajectory` of the conversation, the served `Choice`s kept whole.

    `client`: an `openai.AsyncOpenAI` (or compatible) serving `model` (for a `TrainableModel`:
    `model.openai_client()` and `model.get_inference_name()`). Each turn is one completion with the server's
    tools; every tool call in it runs (in order) and gets a tool message; the episode ends at a reply without
    a tool call (the answer) or after `max_turns` turns (`metrics["ran_out_of_turns"]`). Tool failures are
    tool messages (see `MCPToolbox.call`); a failing policy or connection raises.

    `tool_choice` is the OpenAI `tool_choice` of the first turn (`"auto"`, the default; `"required"`; or
    `{"type": "function", "function": {"name": NAME}}` naming one of the toolbox's tools): `"required"` or a
    name makes the agent start with a tool call; later turns are always `"auto"`, so the agent can still
    answer. (The CPU server forces exactly one call for a forced turn; vLLM may make several.)
    """
    if not isinstance(task, MCPTask):
        raise TypeError(f"rollout takes an MCPTask, got {type(task).__name__}")
    if not isinstance(toolbox, MCPToolbox):
        raise TypeError(f"toolbox must be a connected MCPToolbox, got {type(toolbox).__name__}")
    if not callable(getattr(getattr(getattr(client, "chat", None), "completions", None), "create", None)):
        raise TypeError("client must be an OpenAI-compatible async client (openai.AsyncOpenAI)")
    for name, value, low in (("max_turns", max_turns, 1), ("max_tokens", max_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise ValueError(f"temperature must be a number in [0, 2], got {temperature!r}")
    if not toolbox.openai_tools:
        raise RuntimeError("the toolbox has no tools: use it inside `async with`")
    check_tool_choice(tool_choice, toolbox.tool_names)
    instructions = f"\n\nAbout the server: {toolbox.instructions.strip()}" if toolbox.instructions else ""
    messages: list = [{"role": "system", "content": system if system is not None else
                       SYSTEM.format(max_turns=max_turns, instructions=instructions)},
                      {"role": "user", "content": task.task}]
    metrics = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0, "ran_out_of_turns": False,
               "answered": False}
    started = time.perf_counter()
    while True:
        if metrics["turns"] >= max_turns:
            metrics["ran_out_of_turns"] = True
            break
        metrics["turns"] += 1
        history = [m if isinstance(m, dict) else choice_to_message(m) for m in messages]
        response = await client.chat.completions.create(model=model, messages=history, tools=toolbox.openai_tools,
                                                        tool_choice=tool_choice if metrics["turns"] == 1
                                                        else "auto", max_tokens=max_tokens,
                                                        temperature=temperature)
        if not getattr(response, "choices", None):
            raise RuntimeError(f"the policy {model} answered with no choice")
        choice = response.choices[0]
        messages.append(choice)
        calls = choice.message.tool_calls or []
        if not calls:
            metrics["answered"] = bool((choice.message.content or "").strip())
            break
        for call in calls:
            metrics["tool_calls"] += 1
            result = await _run_call(toolbox, call)
            metrics["tool_errors"] += result.is_error
            metrics["tool_timeouts"] += result.timed_out
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result.text or "(no output)"})
    metrics["latency_s"] = time.perf_counter() - started
    return Trajectory(messages_and_choices=messages, tools=toolbox.openai_tools, metrics=metrics,
                      metadata={"task_id": task.id, "task": task.task, "split": task.split, "policy": model})


def check_tool_choice(tool_choice: Any, names: list[str] | None = None) -> None:
    if tool_choice in ("auto", "required"):
        return
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or tool_choice.get("type", "function") != "function":
        raise ValueError("tool_choice must be 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}, "
                         f"got {tool_choice!r}")
    if names is not None and name not in names:
        raise ValueError(f"tool_choice names {name!r}, which is not a tool of the server ({', '.join(names)})")


async def _run_call(toolbox: MCPToolbox, call: Any) -> ToolCallResult:
    fn = getattr(call, "function", None)
    name = getattr(fn, "name", None)
    if fn is None or not isinstance(name, str):
        return ToolCallResult("error: a tool call must name a function", is_error=True)
    try:
        arguments = json.loads(fn.arguments or "{}")
    except (ValueError, TypeError) as exc:
        return ToolCallResult(f"error: the arguments of {name} are not valid JSON ({exc})", is_error=True)
    return await toolbox.call(name, arguments)
