"""The trainer end to end on CPU: the OpenAI-compatible server (real HTTP) serving a freshly trained adapter,
checkpoints written atomically and resumed, gather_trajectory_groups, bad configurations."""


import httpx
import pytest
import torch

from ruler import Trajectory, TrajectoryGroup
from trainer import LocalBackend, LoRAConfig, ModelConfig, TooManyExceptions, TrainableModel, TrainConfig
from trainer import gather_trajectory_groups
from trainer import checkpoints as ckpt
from trainer.runlog import load_run_log, plot_train_report

pytestmark = pytest.mark.slow
BASE = "local/smollm2-135m-instruct"
MSGS = [{"role": "system", "content": "Answer with one word."}, {"role": "user", "content": "Capital of France?"}]


async def rollouts(model, n=4, seed=1):
    reply = await model.openai_client().chat.completions.create(model=model.name, messages=MSGS, n=n, max_tokens=8,
                                                                temperature=1.0, seed=seed)
    return TrajectoryGroup([Trajectory(messages_and_choices=[*MSGS, c], reward=float(i)) for i, c in
                            enumerate(reply.choices)])


async def test_server_serves_the_freshly_trained_adapter_and_resumes_from_checkpoints(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.backend import resolve_base_model

    model = TrainableModel("m", "p", BASE)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    try:
        async with httpx.AsyncClient(base_url=model.base_url, timeout=120) as http:
            listed = (await http.get("/models")).json()["data"]
            assert listed[0]["id"] == "m" and listed[0]["step"] == 0
            group = await rollouts(model)
            choice = group.trajectories[0].messages_and_choices[-1]
            assert len(group) == 4 and choice.logprobs is None  # standard logprobs only when asked for
            assert len(choice.model_extra["token_ids"]) == len(choice.model_extra["token_logprobs"]) > 0
            # through litellm (as the ART·E agent talks), the sampled tokens still reach the trainer
            import litellm
            from openai.types.chat.chat_completion import Choice

            from trainer.sequences import _sampled

            via = await litellm.acompletion(model=model.litellm_params()["model"], messages=MSGS, max_tokens=4,
                                            **model.litellm_params()["params"])
            ids, lps = _sampled(Choice.model_validate(via.choices[0].model_dump()))
            assert len(ids) == len(lps) == via.usage.completion_tokens
            row = await model.train([group], TrainConfig(learning_rate=1e-3))
            assert row["trained"] and row["step"] == 1 and await model.get_step() == 1
            assert row["sequences"] == 4 and row["trained_tokens"] > 0 and row["grad_norm"] > 0
            # the ratio of fresh sampled logprobs to training logprobs is 1: training saw what was sampled
            assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
            r = await http.post("/chat/completions", json={"model": "m@1", "messages": MSGS, "max_tokens": 6,
                                                           "temperature": 0, "logprobs": True})
            assert r.status_code == 200 and r.json()["model"] == "m@1"
            served = r.json()["choices"][0]["logprobs"]["content"]
            assert [int(e["token"].split(":")[1]) for e in served] == r.json()["choices"][0]["token_ids"]
            for bad, status in (({"model": "m@0"}, 404), ({"model": "other"}, 404), ({"n": 0}, 400),
                                ({"stop": ["\n"]}, 400), ({"messages": []}, 400)):
                body = {"model": "m", "messages": MSGS, **bad}
                res = await http.post("/chat/completions", json=body)
                assert res.status_code == status and res.json()["error"]["message"], (bad, res.text)
        # the checkpoint is a plain peft adapter that reproduces the served logprobs
        where = ckpt.checkpoint_dir(model.run_dir, 1)
        assert sorted(p.name for p in where.iterdir()) == ["README.md", "adapter_config.json",
                                                           "adapter_model.safetensors", "optimizer.pt",
                                                           "trainer_state.json"]
        base = AutoModelForCausalLM.from_pretrained(resolve_base_model(BASE), dtype=torch.float32)
        from trainer.chat import prompt_ids

        prompt = prompt_ids(backend._runs["m"].served.tokenizer, MSGS)
        ids = prompt + [int(e["token"].split(":")[1]) for e in served]
        with torch.no_grad():
            base_lp = torch.log_softmax(base(torch.tensor([ids])).logits[0, len(prompt) - 1:-1], -1)
            tuned = PeftModel.from_pretrained(base, str(where)).eval()
            tuned_lp = torch.log_softmax(tuned(torch.tensor([ids])).logits[0, len(prompt) - 1:-1], -1)
        picked = torch.tensor(ids[len(prompt):])[:, None]
        got = torch.tensor([e["logprob"] for e in served])
        assert torch.allclose(tuned_lp.gather(1, picked).squeeze(1), got, atol=1e-3)
        assert not torch.allclose(base_lp.gather(1, picked).squeeze(1), got, atol=1e-5)  # the adapter matters
        # a group without signal: no step, but a logged row that says why
        flat = TrajectoryGroup([Trajectory(messages_and_choices=t.messages_and_choices, reward=1.0)
                                for t in group.trajectories])
        row = await model.train([flat])
        assert row["trained"] is False and row["skipped"] == {"group with all-equal rewards": 1}
        assert await model.get_step() == 1
        await model.train([await rollouts(model, seed=2)], TrainConfig(loss="dapo", kl_coef=0.05))
        assert ckpt.list_checkpoints(model.run_dir) == [1, 2]
    finally:
        await backend.close()

    # a crash while saving step 3 leaves a partial folder that is never taken for a checkpoint
    (model.run_dir / "checkpoints" / ".tmp-0003-999").mkdir()
    (model.run_dir / "checkpoints" / "0003").mkdir()
    assert ckpt.latest_checkpoint(model.run_dir) == 2
    again = TrainableModel("m", "p", BASE)
    backend = LocalBackend(tmp_path)
    await again.register(backend)
    try:
        assert await again.get_step() == 2
        assert sorted(p.name for p in (model.run_dir / "checkpoints").iterdir()) == ["0001", "0002"]
        await again.train([await rollouts(again, seed=3)])
        assert ckpt.list_checkpoints(model.run_dir) == [1, 2, 3]
        history = load_run_log(model.run_dir)
        assert list(history["step"]) == [1, 1, 2, 3] and {"reward_mean", "loss", "grad_norm", "clip_fraction",
                                                         "kl", "rollout_s", "train_s"} <= set(history.columns)
        assert plot_train_report(model.run_dir).stat().st_size > 10_000
        assert set(await again.delete_checkpoints()) <= {1, 2}
        kept = ckpt.list_checkpoints(model.run_dir)
        assert 3 in kept and len(kept) <= 2
    finally:
        await backend.close()


async def test_bad_configurations_fail_clearly(tmp_path):
    backend = LocalBackend(tmp_path)
    with pytest.raises(ValueError, match="target_modules"):
        await TrainableModel("t", "p", BASE, ModelConfig(lora=LoRAConfig(target_modules=["no_such_proj"]))
                             ).register(backend)
    with pytest.raises(ValueError, match="base model"):
        await TrainableModel("u", "p", str(tmp_path / "nowhere") + "/no-such-model").register(backend)
    with pytest.raises(ValueError, match="name"):
        TrainableModel("bad name!", "p", BASE)
    with pytest.raises(RuntimeError, match="register"):
        await TrainableModel("v", "p", BASE).get_step()
    await backend.close()


async def test_gather_rescoring_dropping_and_exception_limits():
    async def ok(r):
        return Trajectory(messages_and_choices=MSGS, reward=r)

    async def boom():
        raise RuntimeError("rollout failed")

    async def rescore(group):
        return None if group.trajectories[0].reward < 0 else TrajectoryGroup(
            [Trajectory(messages_and_choices=t.messages_and_choices, reward=t.reward * 10) for t in group])

    kept = await gather_trajectory_groups([TrajectoryGroup([ok(1), ok(2)]), TrajectoryGroup([ok(-1), ok(0)]),
                                           TrajectoryGroup([ok(3), boom()])], after_each=rescore,
                                          max_exceptions=1, pbar_desc=None)
    assert [[t.reward for t in g] for g in kept] == [[10, 20], [30]]
    with pytest.raises(TooManyExceptions, match="1 of 2"):
        await gather_trajectory_groups([TrajectoryGroup([ok(1), boom()])], pbar_desc=None)
    half = await gather_trajectory_groups([TrajectoryGroup([ok(1), boom()])], max_exceptions=0.5, pbar_desc=None)
    assert [len(g) for g in half] == [1] and len(half[0].exceptions) == 1
    with pytest.raises(TypeError):
        await gather_trajectory_groups([["not a group"]], pbar_desc=None)
