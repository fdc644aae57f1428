"""The dedicated inference server placed by Ray: `EngineConfig(placement="dedicated", launcher="ray")`.

Ray does the placement, nothing here schedules: `RayServer.start()` asks for a placement group
(`ray.util.placement_group`, `STRICT_PACK`) of one bundle sized from the config (`inference_bundle`:
`{"GPU": len(inference_gpus), "CPU": 1}` for vLLM, `{"CPU": 1}` for the transformers engine's CPU form),
waits at most `EngineConfig.placement_timeout_s` for the cluster to place it, and creates a `ServerActor`
in it (`PlacementGroupSchedulingStrategy`). Ray sets the actor's `CUDA_VISIBLE_DEVICES` to the GPUs it
picked; the actor builds the same `ServerProcess` the local launcher would (vLLM's `VLLMServer` or the CPU
`TransformersServerProcess`: its command and environment) on its node's IP address and a port free there,
starts it as its own child process, waits for its health check and returns its base URL. From then on the
driver talks HTTP to that URL as it does to a local child (health, `/v1/load_lora_adapter`), so the rollout
code, `TrainConfig`, the pipeline and the staleness rules are unchanged. The trainer stays in the driver
process (`trainer_gpus`) unless `EngineConfig.trainer_launcher="ray"` puts it in an actor of its own
(`trainer/ray_trainer.py`, which then starts this server from inside that actor); FSDP over several trainer
GPUs is the README's Scale plan. On one GPU split in two (`EngineConfig.shares_gpu`) the bundle asks for
`gpu_memory_utilization` of a GPU.

Ray is imported only when a server is started (`pip install 'ruler-rl[ray]'`; `MissingExtraError` naming
it otherwise). The driver connects to a running cluster when `ray.is_initialized()` or `RAY_ADDRESS` is
set, else starts a local one with `ray.init()`; only a cluster this process started is shut down, when the
last `RayServer` using it closes. The `ruler-rl` package must be importable on every node (the actor and
its child import `ruler_rl.trainer`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from ruler_rl.trainer.config import EngineConfig
from ruler_rl.trainer.vllm_server import ServerProcess

log = logging.getLogger("ruler.trainer")

_lock = threading.Lock()
_started_here = False  # this process called ray.init() itself (no cluster was running or named)
_users = 0  # RayServers between start() and close() on the cluster this process connected to
_abandoned: tuple[threading.Thread, str] | None = None  # a ray.init given up on at its timeout (and its
# address), maybe still running


class PlacementTimeoutError(TimeoutError):
    """A placement group the cluster did not place within `EngineConfig.placement_timeout_s`; `bundle` is what
    it asked for, `cluster_resources` what the cluster has in all (`ray.cluster_resources()`)."""

    def __init__(self, message: str, *, bundle: dict[str, float], cluster_resources: dict[str, float]):
        super().__init__(message)
        self.bundle, self.cluster_resources = bundle, cluster_resources


def require_ray():
    """The `ray` module, imported now; `ruler_rl.judges.extras.MissingExtraError` naming `pip install 'ruler-rl[ray]'`
    when it is not installed."""
    from ruler_rl.judges.extras import require

    require("ray", "EngineConfig(launcher='ray') (the inference server placed by Ray)",
            "or use launcher='local' (a child process of this one)")
    import ray

    return ray


def inference_bundle(config: EngineConfig) -> dict[str, float]:
    """The one bundle of the inference server's placement group: `{"GPU": len(inference_gpus), "CPU": 1}` when
    the config names inference GPUs (vLLM), `{"GPU": gpu_memory_utilization, "CPU": 1}` when they are one GPU
    shared with the trainer (`EngineConfig.shares_gpu`: a fraction of a GPU, so that the trainer's bundle fits
    beside it), `{"CPU": 1}` otherwise (the transformers engine's CPU form)."""
    if not isinstance(config, EngineConfig):
        raise TypeError(f"config must be a ruler_rl.trainer.EngineConfig, got {type(config).__name__}")
    if config.placement != "dedicated":
        raise ValueError(f"only a dedicated inference server has a bundle of its own (placement={config.placement!r})")
    if config.shares_gpu:
        return {"GPU": float(config.gpu_memory_utilization), "CPU": 1.0}
    return {"GPU": float(len(config.inference_gpus)), "CPU": 1.0} if config.inference_gpus else {"CPU": 1.0}


class RayConnectionError(ConnectionError):
    """The Ray cluster `RAY_ADDRESS` names cannot be reached: nothing listens there, or it did not answer within
    `EngineConfig.placement_timeout_s`."""


def _probe_address(address: str, timeout_s: float) -> None:
    """A TCP connection to `address` (`host:port` or `ray://host:port`) within `timeout_s`: `RayConnectionError`
    at once when nothing listens there. Forms without a port (`auto`, `local`) are left to Ray."""
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
            return
    except OSError as exc:
        raise RayConnectionError(f"nothing answers at RAY_ADDRESS={address!r} ({type(exc).__name__}: {exc}); start "
                                 "the cluster (ray start --head) or unset RAY_ADDRESS to start a local one") from None


def _init_within(ray, address: str, timeout_s: float) -> None:
    """`ray.init(address=address)` given at most `timeout_s` (Ray itself waits minutes for a GCS that accepts
    connections and never answers): `RayConnectionError` past it. Ray's attempt cannot be stopped: it is left to
    give up on its own (minutes; the process's exit waits for it), and no new attempt is made meanwhile."""
    global _abandoned
    if _abandoned is not None and _abandoned[0].is_alive():
        raise RayConnectionError(f"an earlier attempt to connect to the Ray cluster at {_abandoned[1]} is "
                                 "still running in this process (Ray gives up on its own after minutes, and this "
                                 "process may take that long to exit); start a new process to try again")
    _probe_address(address, min(5.0, timeout_s))
    done = threading.Event()
    outcome: dict[str, BaseException] = {}

    def init():
        try:
            ray.init(address=address)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=init, name=f"ruler-ray-init {address}", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        _abandoned = (thread, address)
        raise RayConnectionError(f"the Ray cluster at RAY_ADDRESS={address!r} did not answer within "
                                 f"placement_timeout_s={timeout_s:g} s (something accepts connections there but "
                                 "does not speak Ray's protocol, or the cluster is overloaded)")
    if "error" in outcome:
        raise RayConnectionError(f"could not connect to the Ray cluster at RAY_ADDRESS={address!r}: "
                                 f"{type(outcome['error']).__name__}: {outcome['error']}") from outcome["error"]


def connect(trainer_gpus: list[int] | None = None, *, timeout_s: float = 120.0) -> bool:
    """Connect this process to Ray: the cluster it is already connected to (`ray.is_initialized()`), else the
    one `RAY_ADDRESS` names (reached within `timeout_s`, else `RayConnectionError`), else a local one started now
    with `ray.init()`. A local cluster started here is shown only this process's visible GPUs that are not in
    `trainer_gpus` (so Ray never places the server on the trainer's). Returns True when this call started the
    cluster. Each call counts one user; `disconnect()` releases it."""
    global _started_here, _users
    if trainer_gpus is not None and (not isinstance(trainer_gpus, list)
                                     or any(isinstance(g, bool) or not isinstance(g, int) or g < 0
                                            for g in trainer_gpus)):
        raise ValueError(f"trainer_gpus must be a list of GPU indices (ints >= 0), got {trainer_gpus!r}")
    ray = require_ray()
    with _lock:
        started = False
        if not ray.is_initialized():
            if os.environ.get("RAY_ADDRESS"):
                _init_within(ray, os.environ["RAY_ADDRESS"], timeout_s)
            else:
                _init_local(ray, trainer_gpus or [])
                started = _started_here = True
        _users += 1
        return started


def _init_local(ray, trainer_gpus: list[int]) -> None:
    """`ray.init()` of a local cluster whose GPUs are this process's visible ones minus `trainer_gpus` (Ray
    reads `CUDA_VISIBLE_DEVICES` when it starts its node)."""
    if not trainer_gpus:
        ray.init(include_dashboard=False)
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed = ([d.strip() for d in parent.split(",") if d.strip()] if parent and parent.strip()
              else [str(i) for i in range(count)])
    shown = [d for i, d in enumerate(listed) if i not in trainer_gpus]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(shown)
    try:
        ray.init(include_dashboard=False, num_gpus=len(shown))
    finally:
        if parent is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = parent


def disconnect() -> None:
    """Release one `connect()`; the last release shuts down a cluster this process started (one it joined is
    left running)."""
    global _started_here, _users
    import ray

    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _started_here:
            ray.shutdown()
            _started_here = False


class ServerActor:
    """The Ray actor that owns the inference server's child process (created by `RayServer`, one per server,
    in its placement group). Its methods run in the actor's own event loop."""

    def __init__(self, factory: Callable[..., ServerProcess], gpus: int):
        self.factory, self.gpus = factory, gpus
        self.server: ServerProcess | None = None

    async def start(self) -> dict[str, Any]:
        """Build the server on this node's IP address and a port free here, start it, wait for its health
        check; returns its base URL and where it runs (node IP, child PID, placement group, GPUs, pid of this
        actor)."""
        import ray

        host = ray.util.get_node_ip_address()
        server = self.factory(host=host)
        if self.gpus:  # Ray's CUDA_VISIBLE_DEVICES for this actor are its GPUs 0..n-1; the child gets all of them
            server.config = server.config.model_copy(update={"inference_gpus": list(range(self.gpus))})
        self.server = server
        await server.start()
        context = ray.get_runtime_context()
        return {"base_url": server.base_url, "host": server.host, "port": server.port, "server_pid": server.proc.pid,
                "actor_pid": os.getpid(), "node_id": context.get_node_id(),
                "placement_group_id": context.get_placement_group_id(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "log_file": str(server.log_file)}

    def alive(self) -> bool:
        """Whether the server's child process is running."""
        return self.server is not None and self.server.proc is not None and self.server.proc.poll() is None

    async def stop(self) -> None:
        """Stop the child process (terminate, then kill after 60 s)."""
        if self.server is not None:
            await self.server.close()


class ActorHolder:
    """What `RayServer` and the Ray trainer share: a Ray actor in a placement group of its own, what the actor
    reported once started (`info`, with its `base_url`), and whether this holder connected to Ray."""

    def _hold(self) -> None:
        self.info: dict[str, Any] = {}
        self.actor = None
        self.placement_group = None
        self._connected = False

    @property
    def base_url(self) -> str | None:
        """The inference server's OpenAI-compatible base URL; None before `start()`."""
        return self.info.get("base_url")

    async def release(self) -> None:
        """The end of the actor's life once it has stopped its work: kill the actor, remove its placement group,
        clear `info`, release the Ray connection (a local cluster this process started is shut down with its
        last user). Each is skipped when already done."""
        if self.actor is not None:
            import ray

            ray.kill(self.actor, no_restart=True)
            self.actor = None
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)
            self.placement_group = None
        self.info = {}
        if self._connected:
            self._connected = False
            await asyncio.to_thread(disconnect)


class RayServer(ActorHolder, ServerProcess):
    """The dedicated inference server in a Ray actor (a `ruler_rl.trainer.engine.Engine` with a `base_url`): the driver
    side. `factory(host=...)` builds the `ServerProcess` the actor runs (`VLLMServer` or
    `TransformersServerProcess` with everything but the host bound); adapter loads and health go over HTTP to
    the URL the actor returns, as with a local child (`ServerProcess.load_adapter`). `info` says where the
    server runs once started."""

    name = "ray"

    def __init__(self, factory: Callable[..., ServerProcess], config: EngineConfig, *, served_name: str,
                 log_dir: Path):
        if not callable(factory):
            raise TypeError(f"factory must build the ServerProcess from host=..., got {type(factory).__name__}")
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be a ruler_rl.trainer.EngineConfig, got {type(config).__name__}")
        if config.launcher != "ray":
            raise ValueError(f"RayServer needs EngineConfig(launcher='ray'), got launcher={config.launcher!r}")
        super().__init__(config, served_name=served_name, log_dir=log_dir, port=0)
        self.factory = factory
        self.bundle = inference_bundle(config)
        self.host, self.port = "", 0  # the actor's node and port, known once started
        self._hold()

    async def start(self) -> None:
        """Connect to Ray (`RayConnectionError` when `RAY_ADDRESS` names a cluster that cannot be reached within
        `placement_timeout_s`), reserve the bundle (`PlacementTimeoutError` naming it and the cluster's resources
        past `placement_timeout_s`), start the actor and through it the server; on any failure what was
        created is released."""
        ray = require_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # a local cluster is shown the GPUs the trainer does not hold alone (a shared one stays Ray's to place)
        hidden = [] if self.config.shares_gpu or self.config.trainer_launcher == "ray" else self.config.trainer_gpus
        await asyncio.to_thread(connect, hidden, timeout_s=self.config.placement_timeout_s)
        self._connected = True
        try:
            self.placement_group = placement_group([self.bundle], strategy="STRICT_PACK",
                                                   name=f"ruler-inference-{self.served_name}-{os.getpid()}")
            await wait_placed(self.placement_group, self.bundle, self.config.placement_timeout_s,
                              "the inference server's")
            gpus = self.bundle.get("GPU", 0.0)  # a fraction of one GPU when it is shared with the trainer
            actor_class = ray.remote(ServerActor)
            self.actor = actor_class.options(
                num_cpus=self.bundle["CPU"], num_gpus=gpus, max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement_group,
                                                                     placement_group_bundle_index=0),
            ).remote(self.factory, math.ceil(gpus))
            self.info = await self.actor.start.remote()
            self.host, self.port = self.info["host"], self.info["port"]
            self.log_file = Path(self.info["log_file"])
            self.http = httpx.AsyncClient(base_url=f"http://{self.host}:{self.port}",
                                          timeout=httpx.Timeout(self.config.server_timeout_s, connect=5.0))
            log.info("%s server for %s placed by Ray at %s (node %s, GPUs %s)", self.name, self.served_name,
                     self.base_url, self.info["node_id"], self.info["cuda_visible_devices"])
        except BaseException:
            await self.close()
            raise

    async def alive(self) -> bool:
        """Whether the actor's server child is running (False once closed)."""
        return self.actor is not None and bool(await self.actor.alive.remote())

    async def close(self) -> None:
        """Stop the child, kill the actor, remove the placement group, and release the Ray connection (a local
        cluster this process started is shut down with its last user). Safe twice or after a failed start."""
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        if self.actor is not None:
            import ray

            try:
                await self.actor.stop.remote()
            except ray.exceptions.RayActorError as exc:  # the actor died: its child may outlive it
                log.warning("the Ray inference actor of %s died before stopping its server (%s); see %s",
                            self.served_name, exc, getattr(self, "log_file", "its log"))
        await self.release()


async def wait_placed(group, bundle: dict[str, float], timeout_s: float, whose: str) -> None:
    """Wait at most `timeout_s` for the cluster to place `group` (one STRICT_PACK bundle, `bundle`);
    `PlacementTimeoutError` naming `whose` bundle, it, and the cluster's resources (in all and free) past it."""
    import ray

    if not await asyncio.to_thread(group.wait, timeout_s):
        total = ray.cluster_resources()
        free = ray.available_resources()
        raise PlacementTimeoutError(
            f"Ray could not place {whose} bundle {bundle} (STRICT_PACK) within placement_timeout_s={timeout_s} s: "
            f"the cluster has {_resources(total)} in all, {_resources(free)} free", bundle=dict(bundle),
            cluster_resources=total)


def _resources(resources: dict[str, float]) -> str:
    """Ray's resource dict without its per-node and memory entries: `{'CPU': 2.0, 'GPU': 0}`."""
    shown = {k: v for k, v in sorted(resources.items())
             if not k.startswith("node:") and k not in ("memory", "object_store_memory")}
    shown.setdefault("GPU", 0.0)
    return str(shown)
