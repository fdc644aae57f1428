"""The CPU server refuses tools a model's chat template cannot show (they would silently vanish from the
prompt), with the embedded SmolLM2 tokenizer, a template without tools, and real HTTP on loopback."""

from __future__ import annotations

import json

import httpx
import pytest

from ruler_rl.trainer.chat import renders_tools
from ruler_rl.trainer.server import BackgroundServer, Served, create_server_app

NO_TOOLS_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


class NeverCalled:
    """An engine the refused request must never reach."""

    def __init__(self):
        self.calls = 0

    async def generate(self, *args, **kwargs):
        self.calls += 1
        raise AssertionError("a request with tools the template cannot render reached the engine")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from ruler_rl.judges.embedded import embedded_model_path

    return AutoTokenizer.from_pretrained(embedded_model_path())


@pytest.mark.parametrize("tool_choice", [None, "auto", "none"])
async def test_tools_are_refused_when_the_chat_template_cannot_render_them(tokenizer, tool_choice):
    assert not renders_tools(tokenizer, NO_TOOLS_TEMPLATE)
    engine = NeverCalled()
    served = Served("agent", engine, tokenizer, 512, chat_template=NO_TOOLS_TEMPLATE, renders_tools=False)
    server = BackgroundServer(create_server_app({"agent": served}), "127.0.0.1")
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            body = {"model": "agent", "messages": [{"role": "user", "content": "weather in Paris?"}],
                    "tools": [TOOL], **({"tool_choice": tool_choice} if tool_choice else {})}
            r = await http.post("/chat/completions", json=body)
    finally:
        await server.stop()
    assert r.status_code == 400, r.text
    assert "cannot render tools" in json.loads(r.text)["error"]["message"] and engine.calls == 0
