"""A stand-in for vLLM's OpenAI server for the trainer's control calls (vLLM does not run on this machine)."""

import json
from typing import ClassVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ruler_rl.trainer.server import BackgroundServer
from ruler_rl.trainer.vllm_server import VLLMServer


class ScriptedVLLM(VLLMServer):
    """`VLLMServer` with every control call real, whose child process is replaced by a loopback server that
    records the calls vLLM would get."""

    calls: ClassVar[list[tuple[str, str]]] = []
    refuse: ClassVar[set[str]] = set()  # adapter names whose load fails with HTTP 500, and "/wake_up" to fail it

    async def start(self) -> None:
        async def record(request: Request):
            body = await request.body()
            ScriptedVLLM.calls.append((request.url.path, body.decode() or str(request.query_params)))
            if request.url.path == "/v1/load_lora_adapter" and json.loads(body)["lora_name"] in ScriptedVLLM.refuse:
                return Response(status_code=500, content=b"the engine failed to load the adapter")
            if request.url.path in ScriptedVLLM.refuse:
                return Response(status_code=500, content=b"the engine failed")
            return Response(status_code=404 if b"/missing" in body else 200)

        app = Starlette(routes=[Route(p, record, methods=["POST"])
                                for p in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/wake_up")])
        self.fake = BackgroundServer(app, self.host)
        await self.fake.start()
        self.port = int(self.fake.url.rsplit(":", 1)[1].split("/")[0])
        import httpx

        self.http = httpx.AsyncClient(base_url=f"http://{self.host}:{self.port}", timeout=30)

    async def close(self) -> None:
        await super().close()
        if getattr(self, "fake", None) is not None:
            await self.fake.stop()
            self.fake = None
