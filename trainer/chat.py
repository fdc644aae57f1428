"""Chat messages → prompt tokens for the CPU server, rendered the way vLLM's OpenAI server renders them, and
tool calls parsed back out of a completion the way vLLM's tool parsers do.

Only the CPU server (`trainer/server.py`) renders prompts here. Training never re-renders a sampled turn:
it trains on the `prompt_token_ids` and `token_ids` each response carried (`trainer/sequences.py`).

Rendering follows vLLM's chat path: message content parts joined to text, tool-call `arguments` given to the
template as a JSON *object* (templates such as Qwen2.5's apply `| tojson` to them), the template rendered
to text with the generation prompt, then tokenized without adding special tokens. Chat templates that
cannot render tools get, for ChatML models, `HERMES_CHATML_TEMPLATE` for requests with tools (tools in the
system turn, calls as Hermes `<tool_call>` blocks) and their own rendering for all others; the same
template is handed to vLLM (`--chat-template`), so CPU and GPU render alike. A non-ChatML template without
tool support refuses requests with tools.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

# A ChatML template with Hermes-style tools (the format of Qwen2.5/Hermes models), for ChatML models whose
# own template ignores tools (SmolLM2's, many small models'). Written for this project.
HERMES_CHATML_TEMPLATE = """{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' else '' -%}
{%- if tools -%}
<|im_start|>system
{% if sys %}{{ sys }}

{% endif %}# Tools

You may call one or more functions. Function signatures, one per line, inside <tools></tools>:
<tools>
{% for tool in tools %}{{ (tool.function if tool.function is defined else tool) | tojson }}
{% endfor %}</tools>

To call a function, reply with a JSON object inside <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif sys %}<|im_start|>system
{{ sys }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m['role'] == 'system' and loop.first -%}
{%- elif m['role'] == 'tool' -%}
{%- if loop.first or loop.previtem['role'] != 'tool' %}<|im_start|>user{% endif %}
<tool_response>
{{ m['content'] }}
</tool_response>
{%- if loop.last or loop.nextitem['role'] != 'tool' %}<|im_end|>
{% endif -%}
{%- elif m['role'] == 'assistant' -%}
<|im_start|>assistant
{% if m['content'] %}{{ m['content'] }}{% endif -%}
{%- for call in (m['tool_calls'] or []) -%}
{%- set f = call.function if call.function is defined else call -%}
{% if m['content'] or not loop.first %}
{% endif %}<tool_call>
{"name": "{{ f.name }}", "arguments": {{ f.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else -%}
<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""

_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_name_4f1c", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}


def renders_tools(tokenizer, chat_template: str | None = None) -> bool:
    """Whether the chat template shows the tools it is given (checked by rendering, not by grepping)."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL],
                                             chat_template=chat_template, add_generation_prompt=True,
                                             tokenize=False)
    except Exception:
        return False
    return "probe_tool_name_4f1c" in text


def is_chatml(tokenizer, chat_template: str | None = None) -> bool:
    template = chat_template or getattr(tokenizer, "chat_template", None) or ""
    return "<|im_start|>" in template


def with_hermes_tools(template: str) -> str:
    """`template` unchanged for requests without tools, `HERMES_CHATML_TEMPLATE` for requests with tools."""
    return "{% if tools %}" + HERMES_CHATML_TEMPLATE + "{% else %}" + template + "{% endif %}"


def pick_chat_template(tokenizer, override: str | None = None) -> tuple[str | None, bool]:
    """(template to render with — None means the tokenizer's own —, whether it can render tools).

    A ChatML template that ignores tools renders requests with tools through `HERMES_CHATML_TEMPLATE` and
    every other request exactly as before (`with_hermes_tools`)."""
    if override:
        return override, renders_tools(tokenizer, override)
    if renders_tools(tokenizer):
        return None, True
    if is_chatml(tokenizer):
        return with_hermes_tools(tokenizer.chat_template), True
    return None, False


def _text(content: Any) -> str | None:
    if isinstance(content, list):  # OpenAI content parts: the text ones, joined (as vLLM's "string" format)
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as vLLM's chat path hands them to the template: each becomes `role` + text `content` (None
    → "", text parts joined by newlines); assistant `tool_calls` kept unless None or empty, their
    `arguments` parsed to JSON objects; assistant `reasoning` kept, also as `reasoning_content`; a tool
    message's `tool_call_id` kept. Other fields are not shown to the template."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        role, content = m["role"], _text(m.get("content"))
        msg: dict[str, Any] = {"role": role, "content": "" if content is None else content}
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                raise ValueError(f"messages[{i}].tool_calls must be a list")
            if calls:
                msg["tool_calls"] = [_template_call(call, f"messages[{i}].tool_calls[{j}]")
                                     for j, call in enumerate(calls)]
            reasoning = m.get("reasoning", m.get("reasoning_content"))
            if reasoning is not None:
                msg["reasoning"] = msg["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in m:
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _template_call(call: Any, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or call.get("type", "function") != "function":
        raise ValueError(f"{where} must be a function call with function.name")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise ValueError(f"{where}.function.arguments is not JSON") from None
    return {**call, "function": {**fn, "arguments": args if args is not None else {}}}


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None, *,
               chat_template: str | None = None, **template_kwargs) -> list[int]:
    """Token ids of the prompt for the next assistant turn, as vLLM's chat endpoint computes them."""
    text = tokenizer.apply_chat_template(template_messages(messages), tools=tools or None,
                                         chat_template=chat_template, add_generation_prompt=True,
                                         tokenize=False, **template_kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---- tool-call parsers (the subset of vLLM's --tool-call-parser choices the CPU server speaks) ----

HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.S)


def _call(name: str, arguments: Any) -> dict:
    return {"id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def parse_hermes(text: str) -> tuple[str | None, list[dict]]:
    """`<tool_call>{"name": …, "arguments": …}</tool_call>` blocks; all or nothing, as vLLM's hermes parser."""
    if "<tool_call>" not in text:
        return text, []
    try:
        calls = []
        for closed, open_ in HERMES_CALL.findall(text):
            data = json.loads(closed or open_)
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                raise ValueError("not a call")
            calls.append(_call(data["name"], data.get("arguments", {})))
    except ValueError:
        return text, []
    content = text[: text.find("<tool_call>")]
    return (content or None), calls


def parse_llama3_json(text: str) -> tuple[str | None, list[dict]]:
    """JSON objects `{"name": …, "parameters"|"arguments": …}` anywhere in the reply, surrounding text
    ignored; any object that does not decode or lacks a key means no calls (as vLLM's llama3_json parser)."""
    if "{" not in text:
        return text, []
    decoder = json.JSONDecoder()
    calls, end = [], -1
    try:
        for start in (i for i, ch in enumerate(text) if ch == "{"):
            if start <= end:
                continue  # inside an object already decoded
            data, length = decoder.raw_decode(text[start:])
            end = start + length
            args = data["arguments"] if "arguments" in data else data["parameters"]
            if not isinstance(data["name"], str):
                raise ValueError("not a call")
            calls.append(_call(data["name"], args))
    except (ValueError, KeyError, TypeError):
        return text, []
    return (None, calls) if calls else (text, [])


TOOL_PARSERS = {"hermes": parse_hermes, "llama3_json": parse_llama3_json}


def parse_tool_calls(text: str, parser: str = "hermes") -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) from a completion's text; a malformed call stays content."""
    if parser not in TOOL_PARSERS:
        raise ValueError(f"the CPU server parses tool calls with one of {sorted(TOOL_PARSERS)}, not {parser!r}")
    return TOOL_PARSERS[parser](text)
