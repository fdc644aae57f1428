"""A training step is all or nothing. A full disk while the checkpoint is written, or a server that fails to
load the new adapter, leaves the trainer exactly at the previous step — adapter weights and optimizer state
bit for bit, no checkpoint of the failed step, the server pointed at the previous adapter — and a retry applies
the update once (Adam's step count says how many updates the weights have had). The real tiny model on the
CPU; the vLLM-side calls go over real HTTP to a scripted stand-in for vLLM's server."""

import errno

import pytest
import torch

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.trainer import (
    EngineConfig,
    LocalBackend,
    ModelConfig,
    StepFailedError,
    TrainableModel,
    TrainConfig,
    TrainerStateError,
)
from ruler_rl.trainer import checkpoints as ckpt
from tests.scripted_vllm import ScriptedVLLM
from tests.test_trainer_engine import MSGS, served_choice

pytestmark = pytest.mark.slow
BASE = "local/smollm2-135m-instruct"


def snapshot(run) -> dict:
    """Every trainable weight and every optimizer state tensor, copied."""
    params = {n: p.detach().clone() for n, p in run.peft_model.named_parameters() if p.requires_grad}
    state = {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for i, s in enumerate(run.optimizer.state[p] for p in run.optimizer.param_groups[0]["params"])}
    return {"params": params, "state": state}


def assert_same(run, before: dict) -> None:
    now = snapshot(run)
    assert now["params"].keys() == before["params"].keys()
    for name, p in before["params"].items():
        assert torch.equal(now["params"][name], p), f"{name} changed"
    assert now["state"].keys() == before["state"].keys()
    for i, s in before["state"].items():
        assert now["state"][i].keys() == s.keys()
        for k, v in s.items():
            assert torch.equal(now["state"][i][k], v) if torch.is_tensor(v) else now["state"][i][k] == v


def adam_steps(run) -> set[int]:
    """How many updates Adam has applied, per parameter (one value when they agree)."""
    return {int(s["step"]) for s in run.optimizer.state.values()}


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def group(tokenizer) -> TrajectoryGroup:
    return TrajectoryGroup([Trajectory(messages_and_choices=[*MSGS, served_choice(tokenizer, text)], reward=r)
                            for text, r in (("Paris.", 1.0), ("Lyon, I think.", 0.0))])


async def test_a_failed_adapter_load_wake_up_or_checkpoint_write_rolls_the_step_back_whole(tmp_path, monkeypatch):
    from ruler_rl.trainer import vllm_server

    monkeypatch.setattr(vllm_server, "VLLMServer", ScriptedVLLM)
    ScriptedVLLM.calls, ScriptedVLLM.refuse = [], {"v@1"}
    model = TrainableModel("v", "p", BASE, ModelConfig(engine=EngineConfig(engine="vllm", keep_adapters=2)))
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    run = backend._runs["v"]
    config = TrainConfig(learning_rate=1e-3)
    try:
        batch = [group(run.tokenizer)]
        initial = snapshot(run)
        # the first step's adapter is refused: back to the initial adapter, the server told to drop v@1
        with pytest.raises(StepFailedError, match=r"step 1 was not applied: .*HTTP 500.* back at step 0.*serves "
                                                  r"step 0's adapter"):
            await model.train(batch, config)
        assert_same(run, initial) and await model.get_step() == 0
        assert [p for p, _ in ScriptedVLLM.calls] == ["/sleep", "/wake_up", "/v1/load_lora_adapter",
                                                      "/v1/unload_lora_adapter"]
        ScriptedVLLM.calls, ScriptedVLLM.refuse = [], set()
        assert (await model.train(batch, config))["step"] == 1 and adam_steps(run) == {1}
        after_one = snapshot(run)

        # vLLM fails to load step 2's adapter after the checkpoint is written: nothing of step 2 remains
        ScriptedVLLM.calls, ScriptedVLLM.refuse = [], {"v@2"}
        with pytest.raises(StepFailedError, match=r"step 2 was not applied: RuntimeError: .*HTTP 500.* back at step 1"
                                                  r".*serves step 1's adapter.*retrying applies step 2 once") as err:
            await model.train(batch, config)
        assert err.value.step == 2 and isinstance(err.value.__cause__, RuntimeError)
        assert await model.get_step() == 1 and model.get_inference_name() == "v@1"
        assert_same(run, after_one)
        assert ckpt.list_checkpoints(model.run_dir) == [1]
        assert [p for p, _ in ScriptedVLLM.calls] == ["/sleep", "/wake_up", "/v1/load_lora_adapter",
                                                      "/v1/unload_lora_adapter"]
        load, unload = ScriptedVLLM.calls[2][1], ScriptedVLLM.calls[3][1]
        assert '"v@2"' in load and "load_inplace" not in load and '"v@2"' in unload

        # vLLM does not wake up after step 2 trained: rolled back too
        ScriptedVLLM.refuse = {"/wake_up"}
        with pytest.raises(StepFailedError, match=r"step 2 was not applied: RuntimeError: .*/wake_up: HTTP 500"):
            await model.train(batch, config)
        assert_same(run, after_one) and ckpt.list_checkpoints(model.run_dir) == [1]

        # the retry applies step 2 once: Adam has made two updates, not three
        ScriptedVLLM.refuse = set()
        row = await model.train(batch, config)
        assert row["step"] == 2 and await model.get_step() == 2 and adam_steps(run) == {2}
        saved = torch.load(ckpt.checkpoint_dir(model.run_dir, 2) / "optimizer.pt")
        assert {int(s["step"]) for s in saved["state"].values()} == {2}
        after_two = snapshot(run)

        # the disk fills up while step 3's optimizer state is written: no step 3, no half-written folder
        ScriptedVLLM.calls = []
        monkeypatch.setattr(torch, "save", no_space)
        with pytest.raises(StepFailedError, match=r"step 3 was not applied: OSError: .*No space left on device"):
            await model.train(batch, config)
        monkeypatch.undo()
        assert await model.get_step() == 2 and adam_steps(run) == {2}
        assert_same(run, after_two)
        assert sorted(p.name for p in (model.run_dir / "checkpoints").iterdir()) == ["0001", "0002"]
        assert [p for p, _ in ScriptedVLLM.calls] == ["/sleep", "/wake_up", "/v1/unload_lora_adapter"]
    finally:
        await backend.close()


async def test_a_failed_first_step_goes_back_to_the_initial_adapter_and_the_server_keeps_labelling_step_zero(
        tmp_path, monkeypatch):
    """The CPU engine samples with the trained weights themselves: after a failed first step it samples with
    the initial adapter again, labelled step 0."""
    model = TrainableModel("c", "p", BASE)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    run = backend._runs["c"]
    try:
        client = model.openai_client()

        async def rollouts():
            reply = await client.chat.completions.create(model=model.name, messages=MSGS, n=3, max_tokens=6,
                                                         temperature=1.0, seed=5)
            return reply, TrajectoryGroup([Trajectory(messages_and_choices=[*MSGS, c], reward=r)
                                           for c, r in zip(reply.choices, (0.0, 1.0, 3.0))])

        reply, batch = await rollouts()
        initial = snapshot(run)
        assert initial["state"] == {i: {} for i in initial["state"]}  # no update yet
        monkeypatch.setattr(torch, "save", no_space)
        with pytest.raises(StepFailedError, match="step 1 was not applied.*back at step 0.*in-process engine"):
            await model.train([batch], TrainConfig(learning_rate=1e-3))
        monkeypatch.undo()
        assert_same(run, initial)
        assert await model.get_step() == 0
        assert not (model.run_dir / "checkpoints").exists() or list((model.run_dir / "checkpoints").iterdir()) == []
        again, batch = await rollouts()  # the same seed: the same tokens, the same logprobs, still step 0
        assert [c.model_extra["policy_step"] for c in again.choices] == [0, 0, 0]
        assert [c.model_extra["token_ids"] for c in again.choices] == [c.model_extra["token_ids"]
                                                                       for c in reply.choices]
        row = await model.train([batch], TrainConfig(learning_rate=1e-3))
        assert row["step"] == 1 and adam_steps(run) == {1} and row["ratio_dev_max"] < 1e-3
    finally:
        await backend.close()


async def test_a_step_that_cannot_be_rolled_back_stops_the_trainer_until_it_is_registered_again(tmp_path,
                                                                                               monkeypatch):
    model = TrainableModel("b", "p", BASE)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    run = backend._runs["b"]
    try:
        async def rollouts():
            reply = await model.openai_client().chat.completions.create(model=model.name, messages=MSGS, n=2,
                                                                        max_tokens=4, seed=1)
            return [TrajectoryGroup([Trajectory(messages_and_choices=[*MSGS, c], reward=r)
                                     for c, r in zip(reply.choices, (0.0, 1.0))])]

        await model.train(await rollouts(), TrainConfig(learning_rate=1e-3))
        batch = await rollouts()
        # step 1's checkpoint, which a rollback of step 2 would restore, is gone; then step 2 fails
        ckpt.remove_checkpoint(model.run_dir, 1)
        monkeypatch.setattr(torch, "save", no_space)
        with pytest.raises(TrainerStateError, match="step 2 failed .*No space left.* rolling it back failed too"):
            await model.train(batch, TrainConfig(learning_rate=1e-3))
        monkeypatch.undo()
        with pytest.raises(TrainerStateError, match="no further step is taken: close the backend and register"):
            await model.train(batch, TrainConfig(learning_rate=1e-3))
        assert run.broken
    finally:
        await backend.close()


async def test_a_rollout_during_a_failing_step_is_sampled_by_the_weights_its_label_names(tmp_path, monkeypatch):
    """The CPU engine waits on the training lock; a step that fails while saving restores the previous weights
    before it lets go of the lock, so a rollout that was waiting samples the step-0 weights it is labelled with."""
    import asyncio
    import time

    model = TrainableModel("r", "p", BASE)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    client = model.openai_client()
    try:
        async def ask():
            reply = await client.chat.completions.create(model=model.name, messages=MSGS, n=2, max_tokens=6,
                                                         temperature=1.0, seed=5)
            return ([c.model_extra["policy_step"] for c in reply.choices],
                    [c.model_extra["token_ids"] for c in reply.choices],
                    [c.model_extra["token_logprobs"] for c in reply.choices], reply)

        before = await ask()
        batch = [TrajectoryGroup([Trajectory(messages_and_choices=[*MSGS, c], reward=r)
                                  for c, r in zip(before[3].choices, (0.0, 1.0))])]

        def slow_full_disk(*args, **kwargs):
            time.sleep(1.5)  # the rollout below is waiting on the training lock by now
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(ckpt, "save_checkpoint", slow_full_disk)
        training = asyncio.create_task(model.train(batch, TrainConfig(learning_rate=5e-2)))
        await asyncio.sleep(0.5)
        with pytest.raises(RuntimeError, match="a step of 'r' is being trained already"):
            await model.train(batch, TrainConfig(learning_rate=5e-2))  # a second step at once is refused
        during = await ask()
        with pytest.raises(StepFailedError):
            await training
        # step 0's weights, as labelled: the same tokens, and the same log-probabilities up to float rounding (a
        # CPU matmul may sum in another order from one call to the next, seen up to 1.6e-5 apart on a loaded
        # 2-core machine; a step at lr 5e-2 moves them by far more than the 1e-4 allowed here)
        assert during[0] == [0, 0] and during[1] == before[1]
        for now, then in zip(during[2], before[2]):
            assert now == pytest.approx(then, abs=1e-4)
    finally:
        await backend.close()
