"""The trainer end to end on CPU: the OpenAI-compatible server (real HTTP) serving a freshly trained adapter,
checkpoints written atomically and resumed, gather_trajectory_groups, bad configurations."""


import httpx
import pytest
import torch

from ruler import Trajectory, TrajectoryGroup
from trainer import (
    LocalBackend,
    LoRAConfig,
    ModelConfig,
    TooManyExceptions,
    TrainableModel,
    TrainConfig,
    gather_trajectory_groups,
)
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
        assert model.get_inference_name() == "m@0" and model.inference_base_url.endswith("/v1")
        async with httpx.AsyncClient(base_url=model.inference_base_url, timeout=120) as http:
            listed = (await http.get("/models")).json()["data"]
            assert [d["id"] for d in listed] == ["m", "m@0"] and listed[0]["step"] == 0
            group = await rollouts(model)
            choice = group.trajectories[0].messages_and_choices[-1]
            # token ids and sampled logprobs come whether or not the rollout asked for them
            assert len(group) == 4 and len(choice.model_extra["token_logprobs"]) == len(choice.model_extra["token_ids"]) > 0
            # through litellm with ART's parameters (as ART's rollout code talks), the served tokens still
            # reach the trainer
            import litellm
            from trainer.sequences import served_turn

            from ruler.trajectory import convert_litellm_choice_to_openai
            from trainer.sequences import training_sequences

            params = model.litellm_completion_params()
            assert params["model"] == "hosted_vllm/m@0" and params["temperature"] == 1 and model.trainable
            via = await litellm.acompletion(messages=MSGS, max_tokens=4, **params)
            turn = served_turn(convert_litellm_choice_to_openai(via.choices[0]))
            assert len(turn.completion) == len(turn.logprobs) == via.usage.completion_tokens
            assert turn.prompt == group.trajectories[0].messages_and_choices[-1].model_extra["prompt_token_ids"]
            # a litellm choice kept as it is in a trajectory is converted with its served tokens
            (seq,) = training_sequences(Trajectory(messages_and_choices=[*MSGS, via.choices[0]]))
            assert seq.token_ids == turn.prompt + turn.completion and sum(seq.trained) == len(turn.completion)
            assert model.openai_client() is model.openai_client()  # one client, as ART keeps one
            row = await model.train([group], TrainConfig(learning_rate=1e-3))
            assert row["trained"] and row["step"] == 1 and await model.get_step() == 1
            assert row["sequences"] == 4 and row["trained_tokens"] > 0 and row["grad_norm"] > 0
            # the ratio of fresh sampled logprobs to training logprobs is 1: training saw what was sampled
            assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
            r = await http.post("/chat/completions", json={"model": "m@1", "messages": MSGS, "max_tokens": 6,
                                                           "temperature": 0, "logprobs": True,
                                                           "return_tokens_as_token_ids": True})
            assert r.status_code == 200 and r.json()["model"] == "m@1"
            served = r.json()["choices"][0]["logprobs"]["content"]
            assert [int(e["token"].split(":")[1]) for e in served] == r.json()["choices"][0]["token_ids"]
            assert model.get_inference_name() == "m@1" and model.get_inference_name(0) == "m@0"
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
        prompt = r.json()["choices"][0]["prompt_token_ids"]
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


async def test_multi_turn_batch_starts_with_every_importance_ratio_at_one(tmp_path):
    """Two sampled turns per trajectory, through the CPU server: before the update, training's logprobs of
    every sampled token equal the sampled ones (fp32), so each ratio is 1 within 1e-3."""
    model = TrainableModel("mt", "p", BASE)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    client = model.openai_client()
    try:
        async def rollout(seed, reward):
            items = list(MSGS)
            for turn in range(2):
                reply = await client.chat.completions.create(model=model.get_inference_name(), max_tokens=6,
                                                             messages=[i if isinstance(i, dict) else
                                                                       {"role": "assistant",
                                                                        "content": i.message.content}
                                                                       for i in items], seed=seed + turn)
                items += [reply.choices[0], {"role": "user", "content": "Say it again."}]
            return Trajectory(messages_and_choices=items[:-1], reward=reward)

        group = TrajectoryGroup([await rollout(10 * i, r) for i, r in enumerate((0.0, 1.0, 3.0))])
        row = await model.train([group], TrainConfig(learning_rate=1e-3))
        assert row["turns"] == 6 and row["context_breaks"] == 0 and row["sequences"] == 3
        assert row["ratio_dev_max"] < 1e-3 and row["trained_tokens"] > 6
    finally:
        await backend.close()


def test_logprobs_are_the_models_own_for_architectures_that_transform_logits():
    """Gemma-2 soft-caps its logits: the chunked path applies the same transform, proven equal to the
    model's forward; without it the check sees the difference (and the backend would use the full forward)."""
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from trainer import training

    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=0.5)
    model = Gemma2ForCausalLM(cfg).float()
    assert training.verify_logprob_path(model) < 1e-5
    real = training.logit_transform
    try:
        training.logit_transform = lambda config: None
        assert training.verify_logprob_path(model) > 1e-2
    finally:
        training.logit_transform = real


def test_lora_settings_vllm_cannot_serve_are_refused_and_dropout_is_warned_about(caplog):
    from trainer.backend import _check_lora

    with pytest.raises(ValueError, match="embed_tokens"):
        _check_lora(ModelConfig(lora=LoRAConfig(target_modules=["q_proj", "embed_tokens"])), "vllm")
    _check_lora(ModelConfig(lora=LoRAConfig(target_modules=["q_proj", "embed_tokens"])), "transformers")
    with caplog.at_level("WARNING", logger="ruler.trainer"):
        _check_lora(ModelConfig(lora=LoRAConfig(dropout=0.1)), "transformers")
    assert "dropout" in caplog.text and "importance ratios" in caplog.text


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
