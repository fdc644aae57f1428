"""The dedicated inference server placed by Ray (`EngineConfig(launcher="ray")`, `trainer/ray_placement.py`), on a
real one-machine Ray cluster: the pipelined loop of tests/test_trainer_pipeline.py with the CPU server started by
a Ray actor in a STRICT_PACK placement group, a bundle the cluster cannot place refused within the timeout, the
config's rules, and the missing extra."""

import importlib.util
import os
import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pydantic
import pytest
import ray
from ray.util.placement_group import placement_group_table

from ruler_rl.judges.extras import MissingExtraError, pip_command
from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel
from ruler_rl.trainer.ray_placement import PlacementTimeoutError, RayServer, inference_bundle, require_ray
from ruler_rl.trainer.vllm_server import VLLMServer
from tests.test_trainer_pipeline import BASE, rollouts, two_pipelined_steps

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster of 2 CPUs (no GPU) for the module; the backend joins it (it did not start it)."""
    assert not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
async def test_the_pipeline_runs_with_the_dedicated_server_in_a_ray_actor(tmp_path, ray_cluster):
    cfg = ModelConfig(engine=EngineConfig(engine="transformers", placement="dedicated", launcher="ray",
                                          max_seq_length=256))
    model = TrainableModel("rayed", "p", BASE, cfg)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    try:
        engine = backend._runs["rayed"].engine
        assert isinstance(engine, RayServer) and not engine.can_sleep and backend._server is None
        info, pg, actor = engine.info, engine.placement_group, engine.actor
        # the server is a child of the actor, a Ray worker process other than this one, in the placement group
        assert info["actor_pid"] != os.getpid() and ppid(info["server_pid"]) == info["actor_pid"]
        assert info["placement_group_id"] == pg.id.hex()
        table = placement_group_table(pg)
        assert (table["state"], table["strategy"]) == ("CREATED", "STRICT_PACK")
        assert list(table["bundles"].values()) == [{"CPU": 1.0}]
        assert info["host"] == ray.util.get_node_ip_address()
        assert model.inference_base_url == engine.base_url == f"http://{info['host']}:{info['port']}/v1"
        assert await engine.alive()
        await two_pipelined_steps(model)  # step 1's rollouts sampled by policy 0 while step 0 trained
        # the adapter load went over HTTP to the actor's server: fresh rollouts carry step 2
        fresh = await rollouts(model, seed=7)
        assert {t.messages_and_choices[-1].model_extra["policy_step"] for t in fresh} == {2}
        assert placement_group_table(pg)["state"] == "CREATED"
    finally:
        await backend.close()
    # the child stopped, the actor killed, the group removed; the cluster (not started by the backend) stays
    assert not alive(info["server_pid"])
    assert placement_group_table(pg)["state"] == "REMOVED"
    with pytest.raises(ray.exceptions.RayActorError):
        await actor.alive.remote()
    assert engine.actor is None and engine.base_url is None and ray.is_initialized()


async def test_a_bundle_the_cluster_cannot_place_is_a_clear_error_within_the_timeout(tmp_path, ray_cluster):
    config = EngineConfig(engine="vllm", placement="dedicated", launcher="ray", inference_gpus=[0], trainer_gpus=[1],
                          placement_timeout_s=2)
    make = partial(VLLMServer, BASE, config, served_name="m", lora_rank=8, log_dir=tmp_path,
                   chat_template_file=None, tool_parser="hermes", reasoning_parser=None)
    server = RayServer(make, config, served_name="m", log_dir=tmp_path)
    started = time.perf_counter()
    with pytest.raises(PlacementTimeoutError, match=r"bundle \{'GPU': 1.0, 'CPU': 1.0\} \(STRICT_PACK\) within "
                                                    r"placement_timeout_s=2.0 s: the cluster has \{'CPU': 2.0, "
                                                    r"'GPU': 0.0\} in all") as caught:
        await server.start()
    assert time.perf_counter() - started < 20
    assert caught.value.bundle == {"GPU": 1.0, "CPU": 1.0} and caught.value.cluster_resources["CPU"] == 2.0
    # nothing left behind: the group removed, no actor
    groups = [g for g in placement_group_table().values() if g["name"].startswith("ruler-inference-m-")]
    assert groups and {g["state"] for g in groups} == {"REMOVED"}
    assert server.actor is None and server.placement_group is None and server.base_url is None


def test_the_launcher_is_checked_with_the_placement():
    with pytest.raises(pydantic.ValidationError, match="launcher='ray' launches the dedicated inference server: it "
                                                       "needs placement='dedicated' \\(got placement='colocated'\\)"):
        EngineConfig(launcher="ray")
    with pytest.raises(pydantic.ValidationError, match="placement_timeout_s only acts with launcher='ray'"):
        EngineConfig(placement="dedicated", placement_timeout_s=5)
    cfg = EngineConfig(engine="transformers", placement="dedicated", launcher="ray")
    with pytest.raises(pydantic.ValidationError, match="needs placement='dedicated'"):
        cfg.placement = "colocated"
    assert cfg.placement == "dedicated"  # the refused assignment left it as it was
    assert EngineConfig.model_validate(cfg.model_dump()) == cfg  # a dumped config reloads
    assert inference_bundle(cfg) == {"CPU": 1.0}
    gpus = EngineConfig(engine="vllm", placement="dedicated", launcher="ray", inference_gpus=[2, 3], trainer_gpus=[0])
    assert inference_bundle(gpus) == {"GPU": 2.0, "CPU": 1.0}
    with pytest.raises(ValueError, match="only a dedicated inference server has a bundle"):
        inference_bundle(EngineConfig())
    with pytest.raises(TypeError, match="config must be a ruler_rl.trainer.EngineConfig"):
        inference_bundle({"placement": "dedicated"})
    with pytest.raises(ValueError, match="RayServer needs EngineConfig\\(launcher='ray'\\)"):
        RayServer(lambda host: None, EngineConfig(placement="dedicated"), served_name="m", log_dir=Path("."))
    with pytest.raises(TypeError, match="factory must build"):
        RayServer(None, cfg, served_name="m", log_dir=Path("."))


async def test_without_ray_the_error_names_the_extra(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"needs the 'ray' extra \(ray not installed\): "
                                                + re.escape(pip_command("ray"))) as caught:
        require_ray()
    assert (caught.value.extra, caught.value.missing) == ("ray", ["ray"])
    cfg = EngineConfig(engine="transformers", placement="dedicated", launcher="ray")
    server = RayServer(lambda host: None, cfg, served_name="m", log_dir=tmp_path)
    with pytest.raises(MissingExtraError, match=re.escape(pip_command("ray"))):
        await server.start()
    with pytest.raises(MissingExtraError, match=re.escape(pip_command("ray"))):
        LocalBackend(tmp_path)._launch(lambda host: None, cfg, "m", tmp_path)


def test_the_trainer_imports_ray_only_when_a_server_is_placed():
    code = "import sys, ruler_rl.trainer, ruler_rl.trainer.backend, ruler_rl.trainer.ray_placement; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_a_local_cluster_is_shown_the_visible_gpus_the_trainer_does_not_use(monkeypatch):
    """The next test's claim with `ray.init` recorded instead of a cluster started: the GPUs Ray is shown, and this
    process's CUDA_VISIBLE_DEVICES as it was after."""
    from ruler_rl.trainer.ray_placement import _init_local

    seen = {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6,7")
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw, visible=os.environ["CUDA_VISIBLE_DEVICES"]))
    _init_local(ray, [1])
    assert seen == {"include_dashboard": False, "num_gpus": 2, "visible": "5,7"}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6,7"


@pytest.mark.slow
def test_a_local_cluster_started_here_gets_the_gpus_the_trainer_does_not_use(tmp_path):
    # its own process: a cluster this test starts, not the module's; GPU ids are only names to Ray here
    code = """
import os, ray
from ruler_rl.trainer.ray_placement import connect, disconnect
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
assert connect([1]) is True and ray.is_initialized()
assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6,7", os.environ["CUDA_VISIBLE_DEVICES"]  # restored
print("gpus", ray.cluster_resources().get("GPU"))
pg = placement_group([{"GPU": 2, "CPU": 1}], strategy="STRICT_PACK")
assert pg.wait(60)
seen = ray.get(ray.remote(lambda: os.environ["CUDA_VISIBLE_DEVICES"]).options(
    num_cpus=1, num_gpus=2, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote())
print("seen", ",".join(sorted(seen.split(","))))
disconnect()
print("after", ray.is_initialized())
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "5,6,7"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         check=False, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    # this process's GPU 1 (id 6) is the trainer's: Ray was shown 5 and 7 only, and the actor got both
    said = [line for line in out.stdout.splitlines() if line.startswith(("gpus ", "seen ", "after "))]
    assert said == ["gpus 2.0", "seen 5,7", "after False"], out.stdout
