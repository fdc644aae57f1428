"""Both sides placed by Ray (`EngineConfig(launcher="ray", trainer_launcher="ray")`, `trainer/ray_trainer.py`) on a
real one-machine Ray cluster: the trainer (LoRA model, optimizer, step, checkpoints) in one actor, the CPU server
in another, the driver running the same pipelined loop; the bundles of one GPU split in two placed side by side;
a trainer bundle the cluster cannot place refused within the timeout; the config's rules."""

import os

import pydantic
import pytest
import ray
import torch
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
from ruler_rl.trainer import checkpoints as ckpt
from ruler_rl.trainer.ray_placement import PlacementTimeoutError, inference_bundle
from ruler_rl.trainer.ray_trainer import RayTrainer, actor_config, trainer_bundle
from ruler_rl.trainer.sequences import StalePolicyError
from tests.test_ray_placement import alive, ppid
from tests.test_trainer_pipeline import BASE, STALE_KW, rollouts, two_pipelined_steps

SPLIT = {"engine": "vllm", "placement": "dedicated", "launcher": "ray", "trainer_launcher": "ray",
         "inference_gpus": [0], "trainer_gpus": [0], "gpu_memory_utilization": 0.5, "trainer_memory_share": 0.5}


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster of 2 CPUs and one GPU (a name only: nothing here uses CUDA) for the module; the
    backend joins it."""
    assert not ray.is_initialized()
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False)
    yield
    ray.shutdown()


def group_of(name: str, prefix: str) -> dict:
    (table,) = [g for g in placement_group_table().values() if g["name"].startswith(f"{prefix}-{name}-")
                and g["state"] == "CREATED"]
    return table


@pytest.mark.slow
async def test_the_trainer_and_the_server_in_ray_actors_run_the_same_pipelined_loop(tmp_path, ray_cluster):
    cfg = ModelConfig(engine=EngineConfig(engine="transformers", placement="dedicated", launcher="ray",
                                          trainer_launcher="ray", max_seq_length=256))
    model = TrainableModel("both", "p", BASE, cfg)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    try:
        remote = backend._remote["both"]
        assert isinstance(remote, RayTrainer) and backend._runs == {} and backend._server is None
        info, server = remote.info, remote.info["server"]
        # three processes: this driver, the trainer actor, the server actor (whose child serves), each its own
        assert len({os.getpid(), info["actor_pid"], server["actor_pid"]}) == 3
        assert ppid(server["server_pid"]) == server["actor_pid"] and info["device"] == "cpu"
        trainer_group, server_group = group_of("both", "ruler-trainer"), group_of("both", "ruler-inference")
        assert info["placement_group_id"] == trainer_group["placement_group_id"]
        assert server["placement_group_id"] == server_group["placement_group_id"]
        assert [(g["strategy"], list(g["bundles"].values())) for g in (trainer_group, server_group)] == \
            [("STRICT_PACK", [{"CPU": 1.0}])] * 2
        assert model.inference_base_url == server["base_url"] == remote.base_url
        before = await remote.adapter_state()

        await two_pipelined_steps(model)  # the same loop and checks as with the trainer in this process

        # the actor's adapter moved, and the server actor serves it: fresh rollouts carry step 2
        after = await remote.adapter_state()
        assert before.keys() == after.keys()
        assert any(not torch.equal(before[k], after[k]) for k in before)
        fresh = await rollouts(model, seed=7)
        assert {t.messages_and_choices[-1].model_extra["policy_step"] for t in fresh} == {2}
        assert model.get_inference_name() == "both@2" and ckpt.latest_checkpoint(model.run_dir) == 2
        # the actor's own error class reaches the driver, and nothing was applied
        stale = await rollouts(model, seed=8)
        for turn in stale.trajectories:
            turn.messages_and_choices[-1].model_extra["policy_step"] = 0
        with pytest.raises(StalePolicyError, match="sampled by policy step 0; the trainer is at step 2") as caught:
            await model.train([stale], TrainConfig(learning_rate=1e-3, **STALE_KW))
        assert isinstance(caught.value.__cause__, ray.exceptions.RayTaskError)
        assert await model.get_step() == 2
        seen = []
        row = await backend.train(model, [fresh], TrainConfig(learning_rate=1e-3, **STALE_KW),
                                  on_step=lambda r, seqs: seen.append((r["step"], len(seqs))))
        assert row["step"] == 3 and seen == [(3, 4)] and remote.step == 3
        assert await model.delete_checkpoints() == [1] and ckpt.list_checkpoints(model.run_dir) == [2, 3]
        actors = (remote.actor, remote.info["server"]["actor_pid"])
    finally:
        await backend.close()
    # both actors gone, both groups removed, the server's child stopped; the cluster (not the backend's) stays
    assert not alive(server["server_pid"])
    assert {placement_group_table()[g["placement_group_id"]]["state"] for g in (trainer_group, server_group)} == \
        {"REMOVED"}
    with pytest.raises(ray.exceptions.RayActorError):
        await actors[0].get_step.remote("both")
    assert remote.actor is None and backend._remote == {} and ray.is_initialized()


def test_one_gpu_split_in_two_is_two_fractional_bundles_ray_places_on_it(ray_cluster):
    cfg = EngineConfig(**SPLIT)
    assert cfg.shares_gpu
    assert trainer_bundle(cfg) == {"GPU": 0.5, "CPU": 1.0} and inference_bundle(cfg) == {"GPU": 0.5, "CPU": 1.0}
    groups = [placement_group([b], strategy="STRICT_PACK") for b in (trainer_bundle(cfg), inference_bundle(cfg))]
    try:
        assert all(g.wait(30) for g in groups)

        @ray.remote
        def visible():
            return os.environ.get("CUDA_VISIBLE_DEVICES")

        seen = ray.get([visible.options(num_cpus=1, num_gpus=0.5, scheduling_strategy=PlacementGroupSchedulingStrategy(
            g, placement_group_bundle_index=0)).remote() for g in groups])
        assert seen == ["0", "0"]  # both sides on the one GPU
        whole = placement_group([{"GPU": 0.6}], strategy="STRICT_PACK")  # more than the two shares leave
        assert not whole.wait(2)
        remove_placement_group(whole)
    finally:
        for g in groups:
            remove_placement_group(g)
    # the actor's backend sees its one GPU as cuda:0, shared with the server
    inner = actor_config(cfg)
    assert (inner.trainer_launcher, inner.trainer_gpus, inner.inference_gpus, inner.shares_gpu) == \
        ("local", [0], [0], True)
    apart = actor_config(EngineConfig(**{**SPLIT, "inference_gpus": [0, 1], "trainer_gpus": [3],
                                          "trainer_memory_share": None, "trainer_cpus": 4}))
    assert (apart.trainer_gpus, apart.inference_gpus, apart.trainer_cpus) == ([0], [1, 2], 1.0)
    assert trainer_bundle(EngineConfig(**{**SPLIT, "inference_gpus": [1], "trainer_memory_share": None,
                                          "trainer_cpus": 4})) == {"GPU": 1.0, "CPU": 4.0}


async def test_a_trainer_bundle_the_cluster_cannot_place_is_a_clear_error_within_the_timeout(tmp_path, ray_cluster):
    cfg = ModelConfig(engine=EngineConfig(engine="transformers", placement="dedicated", launcher="ray",
                                          trainer_launcher="ray", trainer_cpus=8, placement_timeout_s=2))
    model = TrainableModel("big", "p", BASE, cfg)
    backend = LocalBackend(tmp_path)
    with pytest.raises(PlacementTimeoutError, match=r"the trainer's bundle \{'CPU': 8.0\} \(STRICT_PACK\) within "
                                                    r"placement_timeout_s=2.0 s: the cluster has \{'CPU': 2.0, "
                                                    r"'GPU': 1.0\} in all"):
        await model.register(backend)
    assert backend._remote == {}
    groups = [g for g in placement_group_table().values() if g["name"].startswith("ruler-trainer-big-")]
    assert groups and {g["state"] for g in groups} == {"REMOVED"}


def test_the_trainer_launcher_is_checked_with_the_rest_of_the_placement():
    with pytest.raises(pydantic.ValidationError, match="trainer_launcher='ray' places the trainer beside an "
                                                       "inference server Ray places: it needs launcher='ray'"):
        EngineConfig(engine="transformers", placement="dedicated", trainer_launcher="ray")
    with pytest.raises(pydantic.ValidationError, match="trainer_cpus only acts with trainer_launcher='ray'"):
        EngineConfig(engine="transformers", placement="dedicated", launcher="ray", trainer_cpus=2)
    cfg = EngineConfig(engine="transformers", placement="dedicated", launcher="ray", trainer_launcher="ray")
    assert EngineConfig.model_validate(cfg.model_dump()) == cfg and trainer_bundle(cfg) == {"CPU": 1.0}
    with pytest.raises(ValueError, match="only a trainer placed by Ray has a bundle"):
        trainer_bundle(EngineConfig())
    with pytest.raises(TypeError, match="config must be a ruler_rl.trainer.EngineConfig"):
        trainer_bundle({"trainer_launcher": "ray"})
    with pytest.raises(ValueError, match="RayTrainer needs EngineConfig\\(trainer_launcher='ray'\\)"):
        RayTrainer(EngineConfig(placement="dedicated", launcher="ray"), backend_cls=LocalBackend, path=".")
