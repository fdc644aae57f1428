"""The trainer end to end on CPU: the OpenAI-compatible server (real HTTP) serving a freshly trained adapter,
checkpoints written atomically and resumed, gather_trajectory_groups, bad configurations."""

from types import SimpleNamespace

import httpx
import pytest
import torch

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.trainer import (
    LocalBackend,
    LoRAConfig,
    ModelConfig,
    TooManyExceptions,
    TrainableModel,
    TrainConfig,
    gather_trajectory_groups,
)
from ruler_rl.trainer import checkpoints as ckpt
from ruler_rl.trainer.runlog import load_run_log, plot_train_report

pytestmark = pytest.mark.slow
BASE = "local/smollm2-135m-instruct"
MSGS = [{"role": "system", "content": "Answer with one word."}, {"role": "user", "content": "Capital of France?"}]


async def rollouts(model, n=4, seed=1, reward_base=0.0):
    reply = await model.openai_client().chat.completions.create(model=model.name, messages=MSGS, n=n, max_tokens=8,
                                                                temperature=1.0, seed=seed)
    return TrajectoryGroup([Trajectory(messages_and_choices=[*MSGS, c], reward=reward_base + i) for i, c in
                            enumerate(reply.choices)])


@pytest.fixture(scope="module")
async def step_one(tmp_path_factory):
    """A model registered on a CPU backend (what its server listed at step 0 is kept), then trained one step
    on a group of four rollouts; served until the module's tests are done."""
    model = TrainableModel("m", "p", BASE)
    backend = LocalBackend(tmp_path_factory.mktemp("step-one"))
    await model.register(backend)
    try:
        name_at_start = model.get_inference_name()
        async with httpx.AsyncClient(base_url=model.inference_base_url, timeout=120) as http:
            listed_at_start = (await http.get("/models")).json()["data"]
        group = await rollouts(model)
        row = await model.train([group], TrainConfig(learning_rate=1e-3))
        yield SimpleNamespace(model=model, group=group, row=row, name_at_start=name_at_start,
                              listed_at_start=listed_at_start, backend=backend)
    finally:
        await backend.close()


async def test_a_registered_model_is_served_as_step_zero(step_one):
    assert step_one.name_at_start == "m@0" and step_one.model.inference_base_url.endswith("/v1")
    assert [d["id"] for d in step_one.listed_at_start] == ["m", "m@0"] and step_one.listed_at_start[0]["step"] == 0


async def test_the_trainers_model_runs_block_attention_by_default(step_one):
    from ruler_rl.trainer.attention import BLOCK_ATTENTION
    from ruler_rl.trainer.training import _attention_implementation

    run = step_one.backend._runs["m"]
    assert _attention_implementation(run.peft_model) == BLOCK_ATTENTION and "block_rows" in step_one.row


async def test_rollouts_carry_served_token_ids_and_sampled_logprobs_without_asking(step_one):
    choice = step_one.group.trajectories[0].messages_and_choices[-1]
    assert len(step_one.group) == 4
    assert len(choice.model_extra["token_logprobs"]) == len(choice.model_extra["token_ids"]) > 0


async def test_litellm_with_arts_parameters_brings_the_served_tokens_to_the_trainer(step_one):
    import litellm

    from ruler_rl.trainer.sequences import served_turn, training_sequences
    from ruler_rl.trajectory import convert_litellm_choice_to_openai

    model = step_one.model
    params = model.litellm_completion_params()
    assert params["model"] == "hosted_vllm/m@1" and params["temperature"] == 1 and model.trainable
    via = await litellm.acompletion(messages=MSGS, max_tokens=4, **params)
    turn = served_turn(convert_litellm_choice_to_openai(via.choices[0]))
    assert len(turn.completion) == len(turn.logprobs) == via.usage.completion_tokens
    assert turn.prompt == step_one.group.trajectories[0].messages_and_choices[-1].model_extra["prompt_token_ids"]
    # a litellm choice kept as it is in a trajectory is converted with its served tokens
    (seq,) = training_sequences(Trajectory(messages_and_choices=[*MSGS, via.choices[0]]))
    assert seq.token_ids == turn.prompt + turn.completion and sum(seq.trained) == len(turn.completion)


async def test_the_model_keeps_one_openai_client_as_art_does(step_one):
    assert step_one.model.openai_client() is step_one.model.openai_client()


async def test_a_step_trains_on_exactly_what_was_sampled(step_one):
    row = step_one.row
    assert row["trained"] and row["step"] == 1 and await step_one.model.get_step() == 1
    sampled = sum(len(t.messages_and_choices[-1].model_extra["token_ids"]) for t in step_one.group.trajectories)
    assert row["sequences"] == 4 and row["trained_tokens"] == sampled and row["grad_norm"] > 0
    # the ratio of fresh sampled logprobs to training logprobs is 1: training saw what was sampled
    assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-3)


async def served_by_step_one(model) -> dict:
    async with httpx.AsyncClient(base_url=model.inference_base_url, timeout=120) as http:
        r = await http.post("/chat/completions", json={"model": "m@1", "messages": MSGS, "max_tokens": 6,
                                                       "temperature": 0, "logprobs": True,
                                                       "return_tokens_as_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()


async def test_the_trained_adapter_is_served_under_its_step_with_token_ids(step_one):
    reply = await served_by_step_one(step_one.model)
    assert reply["model"] == "m@1"
    served = reply["choices"][0]["logprobs"]["content"]
    assert [int(e["token"].split(":")[1]) for e in served] == reply["choices"][0]["token_ids"]
    assert step_one.model.get_inference_name() == "m@1" and step_one.model.get_inference_name(0) == "m@0"


@pytest.mark.parametrize("bad,status", [({"model": "m@0"}, 404), ({"model": "other"}, 404), ({"n": 0}, 400),
                                        ({"stop": ["\n"]}, 400), ({"messages": []}, 400)])
async def test_requests_the_server_cannot_serve_get_an_openai_error(step_one, bad, status):
    async with httpx.AsyncClient(base_url=step_one.model.inference_base_url, timeout=120) as http:
        res = await http.post("/chat/completions", json={"model": "m", "messages": MSGS, **bad})
    assert res.status_code == status and res.json()["error"]["message"], res.text


async def test_the_checkpoint_is_a_plain_peft_adapter_that_reproduces_the_served_logprobs(step_one):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ruler_rl.trainer.backend import resolve_base_model

    where = ckpt.checkpoint_dir(step_one.model.run_dir, 1)
    assert sorted(p.name for p in where.iterdir()) == ["README.md", "adapter_config.json",
                                                       "adapter_model.safetensors", "optimizer.pt",
                                                       "trainer_state.json"]
    reply = await served_by_step_one(step_one.model)
    served = reply["choices"][0]["logprobs"]["content"]
    base = AutoModelForCausalLM.from_pretrained(resolve_base_model(BASE), dtype=torch.float32)
    prompt = reply["choices"][0]["prompt_token_ids"]
    ids = prompt + [int(e["token"].split(":")[1]) for e in served]
    with torch.no_grad():
        base_lp = torch.log_softmax(base(torch.tensor([ids])).logits[0, len(prompt) - 1:-1], -1)
        tuned = PeftModel.from_pretrained(base, str(where)).eval()
        tuned_lp = torch.log_softmax(tuned(torch.tensor([ids])).logits[0, len(prompt) - 1:-1], -1)
    picked = torch.tensor(ids[len(prompt):])[:, None]
    got = torch.tensor([e["logprob"] for e in served])
    assert torch.allclose(tuned_lp.gather(1, picked).squeeze(1), got, atol=1e-3)
    assert not torch.allclose(base_lp.gather(1, picked).squeeze(1), got, atol=1e-5)  # the adapter matters


async def test_a_group_without_signal_takes_no_step_but_logs_why(step_one):
    flat = TrajectoryGroup([Trajectory(messages_and_choices=t.messages_and_choices, reward=1.0)
                            for t in step_one.group.trajectories])
    row = await step_one.model.train([flat])
    assert row["trained"] is False and row["skipped"] == {"group with all-equal rewards": 1}
    assert await step_one.model.get_step() == 1 and ckpt.list_checkpoints(step_one.model.run_dir) == [1]
    assert load_run_log(step_one.model.run_dir)["trained"].tolist()[-1] is False


@pytest.fixture(scope="module")
async def resumed(tmp_path_factory):
    """Two steps (the second dapo with a KL term, on rollouts rewarded 10 higher), a crash while saving step 3
    (its leftover folders made by hand), a new backend registering the model again, and a third step."""
    root = tmp_path_factory.mktemp("resumed")
    model = TrainableModel("m", "p", BASE)
    backend = LocalBackend(root)
    await model.register(backend)
    try:
        await model.train([await rollouts(model)], TrainConfig(learning_rate=1e-3))
        dapo = await model.train([await rollouts(model, seed=2, reward_base=10.0)],
                                 TrainConfig(loss="dapo", kl_coef=0.05, learning_rate=1e-3))
    finally:
        await backend.close()
    # a crash while saving step 3 leaves a partial folder that is never taken for a checkpoint
    (model.run_dir / "checkpoints" / ".tmp-0003-999").mkdir()
    (model.run_dir / "checkpoints" / "0003").mkdir()
    latest_with_leftovers = ckpt.latest_checkpoint(model.run_dir)
    again = TrainableModel("m", "p", BASE)
    backend = LocalBackend(root)
    await again.register(backend)
    try:
        step_on_register = await again.get_step()
        folders_on_register = sorted(p.name for p in (model.run_dir / "checkpoints").iterdir())
        third = await again.train([await rollouts(again, seed=3)])
        yield SimpleNamespace(model=again, dapo=dapo, third=third, latest_with_leftovers=latest_with_leftovers,
                              step_on_register=step_on_register, folders_on_register=folders_on_register,
                              checkpoints_after_third=ckpt.list_checkpoints(model.run_dir))
    finally:
        await backend.close()


async def test_a_dapo_step_with_a_kl_term_trains_and_is_checkpointed(resumed):
    row = resumed.dapo
    assert row["trained"] and row["step"] == 2 and row["loss_kind"] == "dapo" and row["kl"] > 0


async def test_half_written_checkpoints_are_never_taken_and_are_removed_on_register(resumed):
    assert resumed.latest_with_leftovers == 2
    assert resumed.step_on_register == 2 and resumed.folders_on_register == ["0001", "0002"]


async def test_training_continues_after_a_restart_and_the_run_log_keeps_every_step(resumed):
    assert resumed.third["trained"] and resumed.third["step"] == 3
    assert resumed.checkpoints_after_third == [1, 2, 3]
    history = load_run_log(resumed.model.run_dir)
    assert list(history["step"]) == [1, 2, 3] and {"reward_mean", "loss", "grad_norm", "clip_fraction", "kl",
                                                    "rollout_s", "train_s"} <= set(history.columns)
    assert plot_train_report(resumed.model.run_dir).stat().st_size > 10_000


async def test_deleting_checkpoints_keeps_the_latest_and_the_best(resumed):
    # step 2's row scores the rollouts of step 1's policy, rewarded 10 higher: checkpoint 1 is the best
    assert load_run_log(resumed.model.run_dir)["reward_mean"].tolist() == [1.5, 11.5, 1.5]
    assert await resumed.model.delete_checkpoints() == [2]
    assert ckpt.list_checkpoints(resumed.model.run_dir) == [1, 3]


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

    from ruler_rl.trainer import training

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
    from ruler_rl.trainer.backend import _check_lora

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
    with pytest.raises(TooManyExceptions, match="1 of 2") as raised:
        await gather_trajectory_groups([TrajectoryGroup([ok(1), boom()])], pbar_desc=None)
    assert "RuntimeError" in str(raised.value) and "rollout failed" in str(raised.value)  # the first, named
    assert "in boom" in str(raised.value)  # with its traceback
    half = await gather_trajectory_groups([TrajectoryGroup([ok(1), boom()])], max_exceptions=0.5, pbar_desc=None)
    assert [len(g) for g in half] == [1] and len(half[0].exceptions) == 1
    with pytest.raises(TypeError):
        await gather_trajectory_groups([["not a group"]], pbar_desc=None)
