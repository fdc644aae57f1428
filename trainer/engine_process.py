"""The transformers engine in a child process of its own: `EngineConfig(engine="transformers",
placement="dedicated")`.

The dedicated placement of the CPU engine, with the same protocol as vLLM's dedicated server: a second
process holds its own copy of the base model with the LoRA, answers rollouts through the CPU server
(`trainer/server.py`, same shapes) and loads each step's adapter from its checkpoint folder through
`/v1/load_lora_adapter` (vLLM's endpoint and body). It never sleeps: while the trainer trains step k in the
parent process, the child keeps serving the step-k adapter, so rollouts for the next step can be gathered
meanwhile and carry `policy_step` k. It exists so the pipelined loop (`ruler_rl.trainer.pipeline`,
`TrainConfig.max_off_policy_steps`) runs and is tested on a CPU; on GPUs the dedicated engine is vLLM's.

    python -m ruler_rl.trainer.engine_process --spec '{"base_model": ..., "served_name": ..., "port": ...}'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pydantic

from ruler_rl.trainer.config import EngineConfig, LoRAConfig
from ruler_rl.trainer.vllm_server import ServerProcess


class LoadAdapter(pydantic.BaseModel):
    """vLLM's `/v1/load_lora_adapter` body."""
    lora_name: str
    lora_path: str


class UnloadAdapter(pydantic.BaseModel):
    """vLLM's `/v1/unload_lora_adapter` body."""
    lora_name: str


class TransformersServerProcess(ServerProcess):
    """The CPU server with its own transformers model in a child process (a `ruler_rl.trainer.engine.Engine` with a
    `base_url`): the base model and a LoRA of `lora`'s shape (zero-initialised B, so step 0 is the base
    model, as in the trainer), generation on the CPU, each step's adapter loaded from its checkpoint.
    Only the latest adapter is served (as by the in-process CPU engine); `/v1/unload_lora_adapter` is
    accepted and does nothing."""

    name = "transformers-process"

    def __init__(self, base_model: str, config: EngineConfig, *, served_name: str, lora: LoRAConfig, log_dir: Path,
                 chat_template: str | None, renders_tools: bool, tool_parser: str, reasoning_parser: str | None,
                 end_of_turn: list[int], host: str = "127.0.0.1", port: int | None = None,
                 random_weights: bool = False, seed: int = 0):
        super().__init__(config, served_name=served_name, log_dir=log_dir, host=host, port=port)
        if not isinstance(lora, LoRAConfig):
            raise TypeError(f"lora must be a ruler_rl.trainer.LoRAConfig, got {type(lora).__name__}")
        if not end_of_turn or not all(isinstance(t, int) and not isinstance(t, bool) for t in end_of_turn):
            raise ValueError(f"end_of_turn must be a non-empty list of token ids, got {end_of_turn!r}")
        self.spec = {"base_model": base_model, "served_name": served_name, "host": self.host, "port": self.port,
                     "lora": lora.model_dump(), "max_seq_length": config.max_seq_length,
                     "chat_template": chat_template, "renders_tools": renders_tools, "tool_parser": tool_parser,
                     "reasoning_parser": reasoning_parser, "end_of_turn": list(end_of_turn),
                     "random_weights": random_weights, "seed": seed}

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ruler_rl.trainer.engine_process", "--spec", json.dumps(self.spec)]


def build_app(spec: dict):
    """The child's FastAPI app: the CPU server for one model plus vLLM's adapter endpoints."""
    import asyncio
    import threading

    import torch
    from fastapi import HTTPException
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ruler_rl.trainer.engine_transformers import TransformersEngine
    from ruler_rl.trainer.server import Served, create_server_app

    lora = LoRAConfig.model_validate(spec["lora"])
    base = spec["base_model"]
    torch.manual_seed(spec.get("seed", 0))  # the trainer's order: seed, base model, LoRA
    tokenizer = AutoTokenizer.from_pretrained(base)
    if spec.get("random_weights"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base), dtype=torch.float32)
    else:
        hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = get_peft_model(hf, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                          target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    model.eval()
    lock = threading.Lock()
    engine = TransformersEngine(model, tokenizer, lock, stop_token_ids=spec["end_of_turn"])
    name = spec["served_name"]
    served = Served(name, engine, tokenizer, spec["max_seq_length"], 0, chat_template=spec["chat_template"],
                    renders_tools=spec["renders_tools"], tool_parser=spec["tool_parser"],
                    reasoning_parser=spec["reasoning_parser"], end_of_turn=spec["end_of_turn"])
    app = create_server_app({name: served})

    from peft import get_peft_model_state_dict

    # the adapters it served, newest last (at most two): unloading the newest (a step rolled back) goes back to the
    # one before, as vLLM's bare name does
    held = [(0, {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()})]

    def swap(step: int, weights: dict) -> None:
        with lock:  # between two generations: every sample is wholly one step's
            set_peft_model_state_dict(model, weights)
            engine.policy_step = step
            served.step = step

    @app.post("/v1/load_lora_adapter")
    async def load_adapter(req: LoadAdapter):
        prefix, _, step = req.lora_name.rpartition("@")
        if prefix != name or not step.isdigit():
            raise HTTPException(400, f"lora_name must be {name}@<step>, got {req.lora_name!r}")
        path = Path(req.lora_path) / "adapter_model.safetensors"
        if not path.is_file():
            raise HTTPException(404, f"no adapter at {path}")
        weights = await asyncio.to_thread(load_file, str(path))
        await asyncio.to_thread(swap, int(step), weights)
        held[:] = [*[h for h in held if h[0] != int(step)][-1:], (int(step), weights)]
        return {"loaded": req.lora_name}

    @app.post("/v1/unload_lora_adapter")
    async def unload_adapter(req: UnloadAdapter):
        prefix, _, step = req.lora_name.rpartition("@")
        if prefix == name and step.isdigit() and len(held) > 1 and held[-1][0] == int(step):
            held.pop()  # the adapter being served (a step rolled back): back to the one before
            await asyncio.to_thread(swap, *held[-1])
        return {"unloaded": req.lora_name}  # any other name: nothing held to release

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the CPU engine's server in a child process (LocalBackend starts it)")
    parser.add_argument("--spec", required=True, help="JSON: base_model, served_name, host, port, lora, ...")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec)
    import uvicorn

    uvicorn.run(build_app(spec), host=spec["host"], port=spec["port"], log_level="warning")


if __name__ == "__main__":
    main()
