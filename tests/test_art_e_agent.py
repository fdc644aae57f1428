"""A full ART·E rollout with the real embedded model, recorded as a Trajectory and graded with ART's rubric."""

import pytest

from evals.art_e.agent import run_agent
from evals.art_e.questions import generate_scenarios
from evals.art_e.rewards import Rubric, art_reward, grade
from ruler_rl import TrajectoryGroup
from ruler_rl.judges import EMBEDDED_JUDGE

pytestmark = pytest.mark.slow


async def test_embedded_model_rollout_is_recorded_as_a_trajectory(inbox_db, embedded_model):
    db, _ = inbox_db
    scenario = generate_scenarios(db, per_inbox=1, seed=3)[0]
    traj = await run_agent(scenario, db, EMBEDDED_JUDGE, max_turns=2)
    m = traj.metrics
    assert traj.metadata["tool_mode"] == "text" and 1 <= m["turns"] <= 2
    assert m["prompt_tokens"] > 100 and m["completion_tokens"] > 0 and m["latency_s"] > 0
    assert traj.messages()[0]["role"] == "system" and traj.messages()[1]["content"] == scenario.question
    assert any(msg["role"] == "assistant" for msg in traj.messages())
    # the episode ended one of ART's ways, and the rubric says which
    ended = [m["attempted_answer"], m["returned_i_dont_know"], m["ran_out_of_turns"], m["failed_format_validation"]]
    assert sum(ended[:3]) == 1 or ended[3] == 1
    assert m["ran_out_of_turns"] == (traj.metadata["answer"] is None and not m["failed_format_validation"])
    g = await grade(traj, scenario, max_turns=2)
    assert traj.reward == g.reward == art_reward(Rubric.from_metrics(traj.metrics), 2)
    # the trajectory is ready for RULER and the trainer: it round-trips as JSON in a group
    group = TrajectoryGroup([traj])
    assert TrajectoryGroup.model_validate_json(group.model_dump_json()).trajectories[0].metrics == traj.metrics


async def test_a_text_mode_rollout_on_the_trainers_server_gives_sequences_to_train(inbox_db, tmp_path):
    """The text tool mode (the default for models without a tool parser) keeps each served choice, with its prompt
    and sampled token ids, in the trajectory: the trainer finds sequences to train. (It once kept a plain assistant
    message instead: every group of a GPU run was skipped with "no generated tokens".)"""
    from openai.types.chat.chat_completion import Choice

    from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel
    from ruler_rl.trainer.sequences import training_sequences

    db, _ = inbox_db
    scenario = generate_scenarios(db, per_inbox=1, seed=3)[0]
    model = TrainableModel("agent", "art-e", "local/smollm2-135m-instruct",
                           ModelConfig(engine=EngineConfig(engine="transformers", max_seq_length=4096)))
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    try:
        params = model.litellm_completion_params()
        name = params.pop("model")
        traj = await run_agent(scenario, db, name, params={**params, "max_tokens": 32}, max_turns=2,
                               tool_mode="text")
        run = backend._runs["agent"]
        choices = [m for m in traj.messages_and_choices if isinstance(m, Choice)]
        assert len(choices) == traj.metrics["turns"] >= 1
        seqs = training_sequences(traj, run.tokenizer)
        assert seqs and sum(sum(s.trained) for s in seqs) == traj.metrics["completion_tokens"]
    finally:
        await backend.close()
