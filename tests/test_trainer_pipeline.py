"""Rollouts overlapping training, with bounded staleness: every served choice says which policy step sampled it,
training refuses trajectories older than `TrainConfig.max_off_policy_steps`, and the pipelined loop runs with
the transformers engine's dedicated placement (its server in a second process, on the CPU) — step k+1's
rollouts are sampled by the step-k policy while step k trains."""

import math
import os

import pytest
from openai.types.chat.chat_completion import Choice

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
from ruler_rl.trainer import checkpoints as ckpt
from ruler_rl.trainer.pipeline import train_pipelined
from ruler_rl.trainer.sequences import StalePolicyError, training_sequences
from ruler_rl.trainer.training import prepare

BASE = "local/smollm2-135m-instruct"
MSGS = [{"role": "system", "content": "Answer with one word."}, {"role": "user", "content": "Capital of France?"}]
STALE = TrainConfig(max_off_policy_steps=1, sampler_correction="tis")


def choice(policy_step, prompt=(1, 2, 3), tokens=(7, 8), constrained=False) -> Choice:
    data = {"index": 0, "finish_reason": "stop", "logprobs": None, "message": {"role": "assistant", "content": "x"},
            "prompt_token_ids": list(prompt), "token_ids": list(tokens), "token_logprobs": [-1.0] * len(tokens)}
    if policy_step is not None:
        data["policy_step"] = policy_step
    if constrained:  # sampled under a grammar: the middleware marks it, its logprobs are not the policy's
        data["constrained"] = True
    return Choice.model_validate(data)


def group(*steps, reward=(0.0, 1.0)) -> TrajectoryGroup:
    """One trajectory per entry: a policy step (one turn) or a tuple of steps (one turn each, extending)."""
    trajs = []
    for s, r in zip(steps, reward):
        items: list = [{"role": "user", "content": "q"}]
        prompt = [1, 2, 3]
        for k, step in enumerate(s if isinstance(s, tuple) else (s,)):
            if k:
                items.append({"role": "user", "content": "more"})
                prompt = prompt + [7, 8, 4]
            items.append(choice(step, prompt))
        trajs.append(Trajectory(messages_and_choices=items, reward=r))
    return TrajectoryGroup(trajs)


def test_a_trajectory_is_as_old_as_its_oldest_turn():
    (seq,) = training_sequences(group((4, 5), 5).trajectories[0])
    assert seq.turns == 2 and seq.policy_step == 4
    assert training_sequences(group(None, 5).trajectories[0])[0].policy_step is None


def test_trajectories_older_than_the_bound_are_refused_naming_them_and_newer_ones_too():
    # on-policy (the default bound, 0): accepted, nothing stale
    seqs, stats = prepare([group(5, 5)], None, TrainConfig(), 512, policy_step=5)
    assert len(seqs) == 2 and (stats["policy_lag_max"], stats["stale_trajectories"]) == (0, 0)
    # one step behind: refused at the default bound, accepted with max_off_policy_steps=1
    with pytest.raises(StalePolicyError, match=r"group 0 trajectory 1 was sampled by policy step 4; the trainer is "
                                               r"at step 5, 1 step\(s\) later, beyond .*max_off_policy_steps=0"):
        prepare([group(5, 4)], None, TrainConfig(), 512, policy_step=5)
    seqs, stats = prepare([group(5, 4)], None, STALE, 512, policy_step=5)
    assert len(seqs) == 2 and (stats["policy_lag_max"], stats["stale_trajectories"]) == (1, 1)
    # a multi-turn trajectory is as old as its oldest turn
    with pytest.raises(StalePolicyError, match="group 1 trajectory 0 was sampled by policy step 3; .* 2 step"):
        prepare([group(5, 5), group((3, 5), 5)], None, STALE, 512, policy_step=5)
    with pytest.raises(StalePolicyError, match="sampled by policy step 6, newer than the trainer's step 5"):
        prepare([group(5, 6)], None, STALE, 512, policy_step=5)
    # turns that do not say (a hand-made or API choice) are not checked, and counted
    _, stats = prepare([group(None, 5)], None, TrainConfig(), 512, policy_step=5)
    assert stats["turns_without_policy_step"] == 1 and stats["policy_lag_max"] == 0
    # no trainer step given: no check (a batch prepared outside a run)
    assert len(prepare([group(1, 9)], None, TrainConfig(), 512)[0]) == 2
    with pytest.raises(ValueError, match="policy_step must be an int >= 0"):
        prepare([group(5, 5)], None, TrainConfig(), 512, policy_step=-1)


def test_a_turn_newer_than_the_trainer_is_refused_wherever_it_sits_in_the_trajectory():
    """Turns of steps [1, 3] with the trainer at 2: the oldest is within the bound, the newest is ahead."""
    with pytest.raises(StalePolicyError, match="group 0 trajectory 0 has a turn sampled by policy step 3, newer "
                                               "than the trainer's step 2"):
        prepare([group((1, 3), 2)], None, STALE, 512, policy_step=2)
    with pytest.raises(StalePolicyError, match="policy step 3, newer"):
        prepare([group((3, 1), 2)], None, STALE, 512, policy_step=2)
    seqs, _ = prepare([group((1, 2), 2)], None, STALE, 512, policy_step=2)
    assert len(seqs) == 2 and seqs[0].newest_policy_step == 2 and seqs[0].policy_step == 1


def test_stale_turns_without_sampled_logprobs_are_counted_as_uncorrected():
    """A constrained turn's old policy is the trainer's own (importance weight 1): when it is stale, nothing
    corrects for that, and the step says how many such turns it trained."""
    def one(step, constrained, reward):
        return Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice(step, constrained=constrained)],
                          reward=reward)

    batch = TrajectoryGroup([one(4, True, 0.0), one(4, False, 1.0), one(5, True, 3.0)])
    _, stats = prepare([batch], None, STALE, 512, policy_step=5)
    assert stats["stale_turns_uncorrected"] == 1 and stats["turns_without_logprobs"] == 2
    assert stats["stale_trajectories"] == 2 and stats["policy_lag_max"] == 1
    _, on_policy = prepare([TrajectoryGroup([one(5, True, 0.0), one(5, False, 1.0)])], None, STALE, 512, policy_step=5)
    assert on_policy["stale_turns_uncorrected"] == 0
    _, cut = prepare([batch], None, STALE, 3, policy_step=5)  # the turns cut off by max_seq_length train nothing
    assert cut["stale_turns_uncorrected"] == 0 and cut["truncated"] == 3


def test_rewards_are_split_by_the_policy_step_that_sampled_them():
    seqs, stats = prepare([group(5, 4, reward=(2.0, 6.0)), group(None, 4, reward=(1.0, 3.0))], None, STALE, 512,
                          policy_step=5)
    # a trajectory without a label counts as the trainer's step (on-policy)
    assert stats["reward_by_policy_step"] == {"4": 4.5, "5": 1.5}
    assert stats["rollouts_by_policy_step"] == {"4": 2, "5": 2}


def test_checkpoints_are_credited_with_the_rewards_of_the_rollouts_they_sampled():
    """Pipelined with lag 1, step 3 trains on rollouts of policy 1: they are checkpoint 1's, not checkpoint 2's.
    Rows logged before the split (no `reward_by_policy_step`) keep the on-policy reading (row step - 1)."""
    from ruler_rl.trainer.backend import _credit_by_policy_step

    rows = [{"step": 1, "trained": True, "reward_mean": 0.5, "reward_by_policy_step": {"0": 0.5},
             "rollouts_by_policy_step": {"0": 8}},
            {"step": 2, "trained": True, "reward_mean": 0.6, "reward_by_policy_step": {"0": 0.6},
             "rollouts_by_policy_step": {"0": 8}},
            {"step": 3, "trained": True, "reward_mean": 0.9, "reward_by_policy_step": {"1": 0.9},
             "rollouts_by_policy_step": {"1": 8}, "loss": 0.25},
            {"step": 4, "trained": True, "reward_mean": 0.2, "reward_by_policy_step": {"2": 0.1, "1": 0.3},
             "rollouts_by_policy_step": {"2": 6, "1": 2}, "loss": 0.75},
            {"step": 5, "trained": False, "reward_mean": 9.0, "reward_by_policy_step": {"3": 9.0}},
            {"step": 6, "trained": True, "reward_mean": 0.4, "loss": 0.5}]  # an older log line: no split
    credit = _credit_by_policy_step(rows, "reward_mean")
    assert credit[0] == pytest.approx((0.5 * 8 + 0.6 * 8, 16)) and 3 not in credit
    assert credit[1] == pytest.approx((0.9 * 8 + 0.3 * 2, 10)) and credit[2] == pytest.approx((0.1 * 6, 6))
    assert credit[5] == pytest.approx((0.4, 1))
    # another metric goes whole to the step that sampled most of the row's rollouts
    assert _credit_by_policy_step(rows, "loss") == {1: pytest.approx((0.25, 1)), 2: pytest.approx((0.75, 1)),
                                                    5: pytest.approx((0.5, 1))}


async def test_the_pipeline_helper_validates_its_input():
    class Model:
        async def get_step(self):
            return 0

    async def gather(step):
        return []

    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        await train_pipelined(Model(), gather, steps=0)
    with pytest.raises(TypeError, match="gather must be"):
        await train_pipelined(Model(), None, steps=1)
    with pytest.raises(TypeError, match="config must be"):
        await train_pipelined(Model(), gather, steps=1, config={"max_off_policy_steps": 1})
    with pytest.raises(TypeError, match="async def"):
        await train_pipelined(Model(), lambda step: [], steps=1)


async def rollouts(model, seed: int, reward_base: float = 0.0) -> TrajectoryGroup:
    reply = await model.openai_client().chat.completions.create(model=model.name, messages=MSGS, n=4, max_tokens=8,
                                                                temperature=1.0, seed=seed)
    return TrajectoryGroup([Trajectory(messages_and_choices=[*MSGS, c], reward=reward_base + i)
                            for i, c in enumerate(reply.choices)])


async def two_pipelined_steps(model) -> dict[int, TrajectoryGroup]:
    """Two steps of `train_pipelined` on `model`'s dedicated server, checked: step 0's rollouts by the base
    policy, step 1's sampled while step 0 trained (still policy 0, one step off when step 2 trains). Returns the
    rollouts gathered for each step."""
    gathered: dict[int, TrajectoryGroup] = {}

    async def gather(step):
        gathered[step] = await rollouts(model, seed=step, reward_base=10.0 * step)
        return [gathered[step]]

    rows = await train_pipelined(model, gather, steps=2, config=TrainConfig(learning_rate=1e-3, **STALE_KW))
    labels = {k: {c.model_extra["policy_step"] for t in g for c in t.messages_and_choices
                  if isinstance(c, Choice)} for k, g in gathered.items()}
    assert labels == {0: {0}, 1: {0}}
    assert [r["step"] for r in rows] == [1, 2] and all(r["trained"] for r in rows)
    assert (rows[0]["policy_lag_max"], rows[0]["stale_trajectories"]) == (0, 0)
    assert (rows[1]["policy_lag_max"], rows[1]["stale_trajectories"]) == (1, 4)
    assert [r["reward_by_policy_step"] for r in rows] == [{"0": 1.5}, {"0": 11.5}]
    assert [r["rollouts_by_policy_step"] for r in rows] == [{"0": 4}, {"0": 4}]
    assert await model.get_step() == 2 and ckpt.latest_checkpoint(model.run_dir) == 2
    return gathered


@pytest.mark.slow
async def test_dedicated_cpu_placement_overlaps_rollouts_with_training_one_step_off_policy(tmp_path):
    cfg = ModelConfig(engine=EngineConfig(engine="transformers", placement="dedicated", max_seq_length=256))
    model = TrainableModel("pipe", "p", BASE, cfg)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    try:
        engine = backend._runs["pipe"].engine
        # rollouts are answered by a second process, not by this one's CPU server
        assert backend._server is None and engine.proc.pid != os.getpid() and engine.proc.poll() is None
        assert model.inference_base_url == engine.base_url and not engine.can_sleep
        gathered = await two_pipelined_steps(model)

        # two steps old now: refused, whatever the bound, and nothing is applied
        for config in (TrainConfig(), TrainConfig(learning_rate=1e-3, **STALE_KW)):
            with pytest.raises(StalePolicyError, match="group 0 trajectory 0 was sampled by policy step 0; the "
                                                       "trainer is at step 2"):
                await model.train([gathered[1]], config)
        assert await model.get_step() == 2 and ckpt.latest_checkpoint(model.run_dir) == 2

        # the second process serves exactly the trainer's step-2 weights (its adapter loaded from disk):
        # fresh rollouts carry step 2, and their sampled logprobs are the trainer's own (weights ~1)
        fresh = await rollouts(model, seed=7)
        assert {t.messages_and_choices[-1].model_extra["policy_step"] for t in fresh} == {2}
        # through litellm with ART's parameters too: the label survives the conversion to an OpenAI choice
        import litellm

        from ruler_rl.trajectory import convert_litellm_choice_to_openai

        via = await litellm.acompletion(messages=MSGS, max_tokens=4, **model.litellm_completion_params())
        assert convert_litellm_choice_to_openai(via.choices[0]).model_extra["policy_step"] == 2
        row = await model.train([fresh], TrainConfig(learning_rate=1e-3, **STALE_KW))
        assert row["policy_lag_max"] == 0 and row["step"] == 3
        assert math.isclose(row["sampler_weight_mean"], 1.0, abs_tol=2e-3), row["sampler_weight_mean"]
        # steps 1 and 2 trained on policy 0's rollouts (step 2's rewarded 10 higher), step 3 on policy 2's:
        # checkpoint 1 produced none, so the best checkpoint by reward is 2 (kept with the latest, 3), not 1
        # (what "row step - 1" would credit with step 2's rewards)
        assert row["reward_by_policy_step"] == {"2": 1.5}
        assert await model.delete_checkpoints() == [1] and ckpt.list_checkpoints(model.run_dir) == [2, 3]

        # a step whose adapter reached the server and was then rolled back: dropping it serves step 3 again
        served = await rollouts(model, seed=9)
        await engine.load_adapter(4, ckpt.checkpoint_dir(model.run_dir, 2))  # step 2's weights, as "step 4"
        assert {t.messages_and_choices[-1].model_extra["policy_step"] for t in await rollouts(model, seed=9)} == {4}
        await engine.unload_adapter(4)
        again = await rollouts(model, seed=9)
        assert {t.messages_and_choices[-1].model_extra["policy_step"] for t in again} == {3}
        assert [t.messages_and_choices[-1].model_extra["token_ids"] for t in again] == \
            [t.messages_and_choices[-1].model_extra["token_ids"] for t in served]
    finally:
        await backend.close()
    assert engine.proc is None


STALE_KW = {"max_off_policy_steps": 1, "sampler_correction": "tis"}
