"""The GPU engine: vLLM's own OpenAI-compatible server, started and owned by `LocalBackend` as a child process.

    python -m vllm.entrypoints.openai.api_server --model BASE --served-model-name NAME NAME@0 --enable-lora
        --enable-sleep-mode --generation-config vllm --enable-auto-tool-choice --tool-call-parser P
        [--reasoning-parser R] [--chat-template F] --middleware ruler_rl.trainer.vllm_middleware.TrainingDataMiddleware
        --max-num-batched-tokens N --disable-log-stats

- Rollouts talk to it directly (`model.inference_base_url`); `trainer/vllm_middleware.py` makes every
  completion carry `prompt_token_ids`, `token_ids` and sampled logprobs, and routes the bare name to the
  latest adapter.
- Each step's adapter is loaded from its checkpoint folder through `/v1/load_lora_adapter` as
  `NAME@<step>` (vLLM's runtime LoRA loading); names of adapters more than `keep_adapters` steps old are
  unregistered (`/v1/unload_lora_adapter`; vLLM's engine then drops them from its LoRA cache as it fills).
- Around training the server sleeps: `/sleep?level=1&mode=wait` lets in-flight requests finish, queues new
  ones, offloads the weights and frees the KV cache; `/wake_up` restores them and runs the queued requests.
  No request is aborted, so none is trained as if it had finished.
- `--max-num-batched-tokens` and `--disable-log-stats`: the server schedules as vLLM's offline engine does
  (`rollout_batched_tokens`; vLLM's server defaults take a half or a quarter of its tokens per step, for chat
  latency), since rollouts are batch work (`EngineConfig.max_num_batched_tokens`, `log_stats`).
- `--generation-config vllm`: sampling defaults are vLLM's (temperature 1, no penalties), not the model's
  `generation_config.json` (often temperature 0.7, Qwen2.5's repetition penalty 1.05): a rollout that sets no
  sampling parameters draws from the policy whose logprobs it reports. The CPU engine does the same: it hides
  the model's generation config from `generate()` (`trainer/engine_transformers.py`).

Tool-call and reasoning parsers default by model family (`default_parsers`) and are configurable
(`EngineConfig.tool_call_parser`, `reasoning_parser`). vLLM itself is never imported in this process.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ruler_rl.judges.vllm_settings import COMPACT_JSON
from ruler_rl.trainer.config import EngineConfig, vllm_flag_name

log = logging.getLogger("ruler.trainer")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed --max-lora-rank values


def vllm_available() -> bool:
    """vLLM installed (without importing it) and a CUDA GPU present."""
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def resolved_engine(config: EngineConfig) -> str:
    """The engine `config.engine` names, `auto` resolved: `vllm` when vLLM is installed and a CUDA GPU is present
    (`vllm_available`), else `transformers`."""
    if config.engine != "auto":
        return config.engine
    return "vllm" if vllm_available() else "transformers"


def default_parsers(model_type: str, chat_template: str | None) -> tuple[str, str | None]:
    """(tool-call parser, reasoning parser) for a model family, by vLLM's parser names.

    Qwen3 → hermes + qwen3; Qwen2.5 and other ChatML/Hermes templates → hermes; Llama-3.x (a template with
    `<|start_header_id|>`) → llama3_json; Mistral → mistral. Anything else → hermes (other Llama-architecture
    models such as Llama-2 or R1 distills lack `<|python_tag|>`, which vLLM's llama3_json parser requires).
    Set `EngineConfig.tool_call_parser` to override.
    """
    template = chat_template or ""
    model_type = (model_type or "").lower()
    reasoning = "qwen3" if model_type.startswith("qwen3") else None
    if "<|im_start|>" in template or model_type.startswith(("qwen2", "qwen3")):
        return "hermes", reasoning
    if "<|start_header_id|>" in template:
        return "llama3_json", reasoning
    if "[INST]" in template or model_type in ("mistral", "mixtral"):
        return "mistral", reasoning
    return "hermes", reasoning


def lora_serving_rank(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above {VLLM_LORA_RANKS[-1]}, the largest vLLM can serve")


def rollout_batched_tokens(total_bytes: int, device_name: str) -> int:
    """The `--max-num-batched-tokens` a rollout server gets by default: what vLLM 0.24 gives its offline engine
    (`vllm.LLM`) on this GPU, 16384 on GPUs of 70 GiB or more other than the A100 (H100, H200, MI300x, ...) and
    8192 on others. vLLM's OpenAI server picks 8192 / 2048 there, for chat latency; rollouts are batch work, so
    the server runs as vLLM's batch engine would."""
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes <= 0:
        raise ValueError(f"total_bytes must be a positive int, got {total_bytes!r}")
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a str, got {type(device_name).__name__}")
    return 16384 if total_bytes >= 70 * 2**30 and "a100" not in device_name.lower() else 8192


def _serving_gpu_batched_tokens(config: EngineConfig) -> int | None:
    """`rollout_batched_tokens` of the GPU vLLM will serve on: the first of `inference_gpus` when dedicated and
    launched here, the first visible device inside a Ray actor (Ray set its `CUDA_VISIBLE_DEVICES` to the
    inference GPUs), else this process's current CUDA device; None when CUDA is not available here (vLLM then
    decides)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    if config.placement != "dedicated":
        index = torch.cuda.current_device()
    else:
        index = config.inference_gpus[0] if config.launcher == "local" and config.inference_gpus else 0
    props = torch.cuda.get_device_properties(index)
    return rollout_batched_tokens(int(props.total_memory), props.name)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def visible_device_ids(indices: list[int], parent_visible: str | None = None) -> str:
    """`CUDA_VISIBLE_DEVICES` for a child process that should see `indices` of this process's CUDA devices:
    this process numbers its devices through its own `CUDA_VISIBLE_DEVICES` (when set), so index i is
    entry i of that list (a GPU id or UUID), not physical GPU i."""
    if not indices:
        raise ValueError("no device indices given")
    if parent_visible is None or not parent_visible.strip():
        return ",".join(str(i) for i in indices)
    listed = [d.strip() for d in parent_visible.split(",") if d.strip()]
    beyond = [i for i in indices if i >= len(listed)]
    if beyond:
        raise ValueError(f"GPU index(es) {beyond} are beyond this process's CUDA_VISIBLE_DEVICES={parent_visible!r} "
                         f"({len(listed)} visible)")
    return ",".join(listed[i] for i in indices)


def check_gpus(config: EngineConfig, device_count: int) -> None:
    """Refuse a dedicated placement naming GPUs this machine does not have (`device_count` visible CUDA
    devices; 0: no CUDA) before anything starts."""
    if config.placement != "dedicated" or not (config.inference_gpus or config.trainer_gpus):
        return
    if device_count < 1:
        raise ValueError("placement='dedicated' names GPUs (inference_gpus, trainer_gpus) but no CUDA GPU is visible "
                         "here; use placement='colocated' (or engine='transformers' with no GPU lists)")
    missing = sorted(g for g in config.inference_gpus + config.trainer_gpus if g >= device_count)
    if missing:
        raise ValueError(f"placement='dedicated': GPU(s) {missing} do not exist; {device_count} CUDA device(s) are "
                         f"visible (indices 0..{device_count - 1})")


# an exception as Python prints it last: "ValueError: ...", "torch.OutOfMemoryError: ...", "AssertionError: ..."
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)\b:?")


class ServerProcess:
    """An inference server in a child process that `LocalBackend` starts and owns: health-checked start,
    adapter loading by path through `/v1/load_lora_adapter` (vLLM's endpoint), log file, clean close. A
    `ruler_rl.trainer.engine.Engine` with a `base_url` of its own. Subclasses give `command()` and `environment()`."""

    name = "server-process"

    def __init__(self, config: EngineConfig, *, served_name: str, log_dir: Path, host: str = "127.0.0.1",
                 port: int | None = None):
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be a ruler_rl.trainer.EngineConfig, got {type(config).__name__}")
        if not isinstance(served_name, str) or not served_name:
            raise ValueError("served_name must be a non-empty string")
        self.config, self.served_name, self.log_dir = config, served_name, Path(log_dir)
        self.host = host
        self.port = port or _free_port(host)  # chosen now, so that base_url is known before start()
        self.loaded: list[int] = []
        self.proc: subprocess.Popen | None = None
        self.http: httpx.AsyncClient | None = None

    @property
    def base_url(self) -> str:
        """The server's OpenAI-compatible base URL (it answers once `start()` has returned)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def can_sleep(self) -> bool:
        return False

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The child's environment: `base` (default this process's) with the folder that holds `ruler_rl` on
        PYTHONPATH when it is a plain folder (a wheel's site-packages, a link tree such as
        evals/device/link_package.sh makes); an editable install needs nothing: the child finds it as this
        process does."""
        import ruler_rl

        base = dict(os.environ if base is None else base)
        package = Path(ruler_rl.__file__).parent  # not resolved: a link tree's folder is the one to add
        root = str(package.parent) if package.name == "ruler_rl" else None
        path = os.pathsep.join(p for p in (root, base.get("PYTHONPATH")) if p)
        if path:
            base["PYTHONPATH"] = path
        else:  # an empty PYTHONPATH entry would be the working folder
            base.pop("PYTHONPATH", None)
        return base

    def _require(self) -> None:
        """Raise when what the child needs is not installed."""

    async def start(self) -> None:
        self._require()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_file = self.log_dir / f"{self.name}-server.log"
        started = time.perf_counter()
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(self.command(), env=self.environment(), stdout=out,
                                         stderr=subprocess.STDOUT)
        self.http = httpx.AsyncClient(base_url=f"http://{self.host}:{self.port}",
                                      timeout=httpx.Timeout(self.config.server_timeout_s, connect=5.0))
        deadline = started + self.config.startup_timeout_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.name} server exited with code {self.proc.returncode} while starting"
                                   f"{self._first_errors()}; the end of {self.log_file}:\n{self._log_tail()}")
            try:
                if (await self.http.get("/health", timeout=2.0)).status_code == 200:
                    log.info("%s server for %s up in %.0f s at %s", self.name, self.served_name,
                             time.perf_counter() - started, self.base_url)
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
        await self.close()
        raise TimeoutError(f"the {self.name} server did not answer within {self.config.startup_timeout_s} s; "
                           f"see {self.log_file}")

    def _first_errors(self, limit: int = 3) -> str:
        """The log's first distinct error lines (an exception's `Name: message`), which a failed start can print
        long before its last words (vLLM's engine core: the cause, then pages of traceback, then "Engine core
        initialization failed. See root cause above"); "" when there are none."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        found: list[str] = []
        for line in text.splitlines():
            line = re.sub(r"^\(\w+ pid=\d+\)\s*", "", line).strip()  # vLLM's "(EngineCore pid=12) " prefix
            if _ERROR_LINE.match(line) and line not in found:
                found.append(line[:500])
                if len(found) == limit:
                    break
        return "; first error lines:\n" + "\n".join(found) if found else ""

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    async def _post(self, path: str, **kwargs) -> httpx.Response:
        if self.http is None:
            raise RuntimeError(f"the {self.name} server is not started")
        r = await self.http.post(path, **kwargs)
        if r.status_code != 200:
            raise RuntimeError(f"{self.name} server {path}: HTTP {r.status_code}: {r.text[:500]}")
        return r

    async def load_adapter(self, step: int, path: str | Path) -> None:
        """Serve the adapter saved at `path` as `NAME@step`, make it the bare name's, unregister old names.

        By path, through the disk: vLLM 0.24's `/v1/load_lora_adapter` takes a folder (or a tensorizer
        config), and its weight-update endpoints replace base weights, not a LoRA; the adapter is a few MB
        the checkpoint writes anyway (README, Scale)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        # not `load_inplace`: vLLM 0.24 keeps that flag on the adapter and reloads it from disk at every engine
        # step (vLLM issue 33791); a step re-done after a rollback finds its name unloaded (`unload_adapter`)
        await self._post("/v1/load_lora_adapter", json={"lora_name": f"{self.served_name}@{step}",
                                                        "lora_path": str(path)})
        if step in self.loaded:
            self.loaded.remove(step)
        self.loaded.append(step)
        while len(self.loaded) > self.config.keep_adapters:  # housekeeping: a failure here fails no step
            old = self.loaded.pop(0)
            try:
                await self._post("/v1/unload_lora_adapter", json={"lora_name": f"{self.served_name}@{old}"})
            except (RuntimeError, httpx.HTTPError) as exc:
                log.warning("%s server: unloading the adapter of step %d failed (%s); it stays loaded", self.name,
                            old, exc)

    async def unload_adapter(self, step: int) -> None:
        """Stop serving `NAME@step` (a step rolled back); the bare name then means the latest adapter still
        loaded, or the base model when none is (`trainer/vllm_middleware.py`). A name the server does not hold
        (404: the failed load never reached it) is fine."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        try:
            await self._post("/v1/unload_lora_adapter", json={"lora_name": f"{self.served_name}@{step}"})
        except RuntimeError as exc:
            if "HTTP 404" not in str(exc):
                raise
        if step in self.loaded:
            self.loaded.remove(step)

    async def sleep(self) -> None:
        raise RuntimeError(f"the {self.name} server does not sleep")

    async def wake(self) -> None:
        raise RuntimeError(f"the {self.name} server does not sleep")

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        self.proc = None


class VLLMServer(ServerProcess):
    """vLLM's OpenAI server in a child process, with the adapter, sleep and wake calls a trainer needs (a
    `ruler_rl.trainer.engine.Engine` with a `base_url` of its own; it generates nothing in this process).

    Placement (`EngineConfig.placement`): colocated, it shares the trainer's GPU and sleeps around each
    training step (when `enable_sleep_mode`); dedicated, it runs on `inference_gpus` (its
    `CUDA_VISIBLE_DEVICES`, tensor or data parallel over several through vLLM's own flags) and never sleeps:
    it keeps serving the previous adapter while the trainer trains on `trainer_gpus`."""

    name = "vllm"

    def __init__(self, base_model: str, config: EngineConfig, *, served_name: str, lora_rank: int,
                 log_dir: Path, chat_template_file: Path | None, tool_parser: str, reasoning_parser: str | None,
                 host: str = "127.0.0.1", port: int | None = None, tools_ok: bool = True):
        super().__init__(config, served_name=served_name, log_dir=log_dir, host=host, port=port)
        lora_serving_rank(lora_rank)  # refuse a rank vLLM cannot serve before starting anything
        self.base_model, self.lora_rank = base_model, lora_rank
        self.chat_template_file, self.tool_parser, self.reasoning_parser = (chat_template_file, tool_parser,
                                                                             reasoning_parser)
        self.tools_ok = tools_ok

    @property
    def dedicated(self) -> bool:
        return self.config.placement == "dedicated"

    @property
    def can_sleep(self) -> bool:
        """Sleep mode frees the GPU for training steps only when vLLM shares it (colocated) and runs with
        `--enable-sleep-mode`; a dedicated server never sleeps."""
        return self.config.enable_sleep_mode and not self.dedicated

    def command(self) -> list[str]:
        c = self.config
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.base_model,
                "--served-model-name", self.served_name, f"{self.served_name}@0",
                "--host", self.host, "--port", str(self.port),
                "--enable-lora", "--max-lora-rank", str(lora_serving_rank(self.lora_rank)),
                "--max-loras", "2", "--max-cpu-loras", str(max(2, self.config.keep_adapters + 1)),
                "--gpu-memory-utilization", str(c.gpu_memory_utilization),
                "--max-model-len", str(c.served_length),
                "--max-num-seqs", str(c.max_num_seqs), "--generation-config", "vllm",
                "--enable-auto-tool-choice", "--tool-call-parser", self.tool_parser,
                "--middleware", "ruler_rl.trainer.vllm_middleware.TrainingDataMiddleware",
                "--disable-uvicorn-access-log"]
        batched = c.max_num_batched_tokens
        if batched is None:  # vLLM's offline value for this GPU, raised where vLLM would refuse it
            batched = _serving_gpu_batched_tokens(c)
            if batched is not None:
                batched = max(batched, c.max_num_seqs, c.served_length if c.chunked_prefill_off() else 0)
        if batched:
            argv += ["--max-num-batched-tokens", str(batched)]
        if not c.log_stats:
            argv.append("--disable-log-stats")
        if self.can_sleep:
            argv.append("--enable-sleep-mode")
        if self.dedicated and len(c.inference_gpus) > 1:
            flag = "--tensor-parallel-size" if c.inference_parallel == "tensor" else "--data-parallel-size"
            argv += [flag, str(len(c.inference_gpus))]
        if c.enforce_eager:
            argv.append("--enforce-eager")
        if c.compact_json:  # vLLM refuses disable_any_whitespace under backend "auto"
            argv += ["--structured-outputs-config", _cli_value(COMPACT_JSON)]
        if self.reasoning_parser:
            argv += ["--reasoning-parser", self.reasoning_parser]
        if self.chat_template_file is not None:
            argv += ["--chat-template", str(self.chat_template_file)]
        for key, value in c.vllm_args.items():
            base, dot, fields = vllm_flag_name(key).partition(".")
            flag = "--" + base.replace("_", "-") + dot + fields  # a config's field names keep their underscores
            if dot:  # vLLM's dotted form (`--a-config.field VALUE`) always takes a value, which it reads as JSON
                if value is not None:
                    argv += [flag, json.dumps(value)]
                continue
            if value is True:
                argv.append(flag)
            elif value is not False and value is not None:
                argv += [flag, value if isinstance(value, str) else _cli_value(value)]
        return argv

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """vLLM's environment: runtime LoRA loading and the dev endpoints (sleep/wake) on, the served name for
        the middleware and, dedicated, `CUDA_VISIBLE_DEVICES` of the inference GPUs (mapped through this
        process's own `CUDA_VISIBLE_DEVICES`)."""
        env = super().environment(base)
        env.update({"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                    "RULER_SERVED_NAME": self.served_name})
        if not self.tools_ok:
            env["RULER_TOOLS_UNSUPPORTED"] = "1"
        if self.dedicated:
            parent = (os.environ if base is None else base).get("CUDA_VISIBLE_DEVICES")
            env["CUDA_VISIBLE_DEVICES"] = visible_device_ids(self.config.inference_gpus, parent)
        return env

    def _require(self) -> None:
        from ruler_rl.judges.checkpoint import check_checkpoint
        from ruler_rl.trainer.config import vllm_flag_name

        args = {vllm_flag_name(k): v for k, v in self.config.vllm_args.items()}
        check_checkpoint(self.base_model, args.get("load_format"))  # vLLM would serve a missing tensor uninitialized
        if importlib.util.find_spec("vllm") is None:
            from ruler_rl.judges.extras import pip_command

            raise RuntimeError(f"the vLLM engine needs vLLM: {pip_command('gpu')}")

    async def sleep(self) -> None:
        """Level 1 (weights offloaded to CPU, KV cache freed); `mode=wait` lets in-flight requests finish."""
        if not self.can_sleep:
            raise RuntimeError("vLLM runs without sleep mode (EngineConfig.enable_sleep_mode=False, or a dedicated "
                               "placement)")
        await self._post("/sleep", params={"level": "1", "mode": "wait"})

    async def wake(self) -> None:
        if not self.can_sleep:
            raise RuntimeError("vLLM runs without sleep mode (EngineConfig.enable_sleep_mode=False, or a dedicated "
                               "placement)")
        await self._post("/wake_up")


def _cli_value(value) -> str:
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)
