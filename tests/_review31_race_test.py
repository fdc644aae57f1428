"""Scratch: the in-process CPU engine samples with a failed step's (rolled-back) weights, labelled the old step."""
import asyncio, errno, time
import torch
from ruler import Trajectory, TrajectoryGroup
from tests.test_trainer_engine import MSGS
from trainer import LocalBackend, TrainableModel, TrainConfig, StepFailedError
from trainer import checkpoints as ckpt

BASE = "local/smollm2-135m-instruct"

async def test_race(tmp_path, monkeypatch):
    model = TrainableModel("r", "p", BASE)
    backend = LocalBackend(tmp_path)
    await model.register(backend)
    client = model.openai_client()
    try:
        async def ask():
            return await client.chat.completions.create(model=model.name, messages=MSGS, n=2, max_tokens=6,
                                                        temperature=1.0, seed=5)
        reply = await ask()
        batch = [TrajectoryGroup([Trajectory(messages_and_choices=[*MSGS, c], reward=r)
                                  for c, r in zip(reply.choices, (0.0, 1.0))])]
        real_save = ckpt.save_checkpoint
        def slow_fail(*a, **k):
            time.sleep(1.5)  # the rollout request is now waiting on the training lock
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(ckpt, "save_checkpoint", slow_fail)
        train = asyncio.create_task(model.train(batch, TrainConfig(learning_rate=5e-2)))
        await asyncio.sleep(0.5)
        during = asyncio.create_task(ask())
        try:
            await train
        except StepFailedError as e:
            print("train:", str(e)[:100])
        during = await during
        monkeypatch.setattr(ckpt, "save_checkpoint", real_save)
        after = await ask()
        for name, r in (("before", reply), ("during", during), ("after", after)):
            print(name, [c.model_extra["policy_step"] for c in r.choices],
                  [[round(x, 4) for x in c.model_extra.get("token_logprobs") or [t.logprob for t in c.logprobs.content]] for c in r.choices])
        assert [c.model_extra["policy_step"] for c in during.choices] == [0, 0]
        lp = lambda r: [t.logprob for c in r.choices for t in c.logprobs.content] if r.choices[0].logprobs else [x for c in r.choices for x in c.model_extra["token_logprobs"]]
        assert lp(during) != lp(after), "the rolled-back weights sampled, labelled step 0"
    finally:
        await backend.close()
