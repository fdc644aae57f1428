"""One place that turns OpenAI-style chat messages and tools into the model's prompt, used both by the
server (to generate) and by the trainer (to tokenize what was generated), so the two always agree.

Chat templates that know about tools get `tools=` directly. For the others (SmolLM2's, many small
models') the tools are described in the system message and the model calls them Hermes-style:

    <tool_call>{"name": "search_inbox", "arguments": {"keywords": ["budget"]}}</tool_call>

`parse_tool_calls` reads those blocks back into OpenAI `tool_calls`.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

TOOLS_SYSTEM = """

# Tools
You may call these functions. To call one, reply with <tool_call>{{"name": <function name>, "arguments": <JSON object>}}</tool_call>
{tools}"""


def template_supports_tools(tokenizer) -> bool:
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def tool_call_text(name: str, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


def _content(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def template_messages(messages: list[dict], tools: list[dict] | None, tokenizer) -> tuple[list[dict], list | None]:
    """(messages, tools) ready for `tokenizer.apply_chat_template`."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    native = template_supports_tools(tokenizer)
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"message {i} must be an object with a role")
        msg = {"role": m["role"], "content": _content(m)}
        calls = m.get("tool_calls") or []
        if calls and native:
            msg["tool_calls"] = calls
        elif calls:
            msg["content"] += "".join(tool_call_text(c["function"]["name"], c["function"].get("arguments", {}))
                                      for c in calls)
        out.append(msg)
    if tools and not native:
        described = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
        extra = TOOLS_SYSTEM.format(tools=described)
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + extra}
        else:
            out.insert(0, {"role": "system", "content": extra.strip()})
    return out, (tools if tools and native else None)


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """Token ids of the prompt for the next assistant turn."""
    msgs, native_tools = template_messages(messages, tools, tokenizer)
    text = tokenizer.apply_chat_template(msgs, tools=native_tools, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content without the tool-call blocks, OpenAI tool_calls) from a completion's text."""
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            data = json.loads(block)
            name, args = data["name"], data.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            continue  # not a well-formed call: it stays in the content for the agent to see
        calls.append({"id": f"call_{uuid.uuid4().hex[:16]}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
    if not calls:
        return text, []
    content = TOOL_CALL.sub("", text).strip()
    return (content or None), calls
