"""MCP·RL: train an agent on the tools of any MCP server, with RULER as the reward (no reward function written).

    async with MCPToolbox("python -m evals.art_e.mcp_server --db inbox.db") as box:     # or url="http://…/mcp"
        tasks = await write_tasks(box.openai_tools, "openai/gpt-4.1", n=16, instructions=box.instructions,
                                  resources=box.resources, guidance="Tasks a sales assistant would get.")
        result = await train_mcp_rl(model, box, tasks, judge="openai/o4-mini", config=MCPRLConfig(steps=10))

or, from the command line, `ruler mcp-rl --server "CMD ARGS" --task-model MODEL --judge MODEL`.

The loop, a module per job:

1. `MCPToolbox` (`ruler_rl.trainer.mcp_client`) connects with the official `mcp` SDK (a command run over stdio, or a
   streamable HTTP URL), lists the server's tools (every page) and converts them to OpenAI tool schemas. A server
   that cannot be started or reached raises `MCPServerError`, naming the command (or URL) and, for a command,
   the end of what it wrote to stderr.
2. `write_tasks` (`ruler_rl.trainer.mcp_tasks`): a litellm model (any model string) writes realistic tasks that need
   those tools, answered under a JSON schema; each task is checked (a non-empty text of bounded length, naming only
   tools the server has) and deduplicated (case and spacing ignored), more are asked for until `n` are kept or
   the attempts run out (`TaskWriterError`, with the count of each kind of rejection), and they are split into
   train and test with a seed (`TaskSet`).
3. `rollout` (`ruler_rl.trainer.mcp_rollout`): the policy (an OpenAI-compatible client: `model.openai_client()` for a
   `TrainableModel`) is given the tools natively; each of its tool calls runs on the server through MCP
   `call_tool` with a per-call timeout. A tool that fails (an MCP tool error, a protocol error, bad JSON
   arguments, an unknown tool name) or runs past the timeout becomes a tool message the agent reads, and is
   counted in the trajectory's metrics (`tool_errors`, `tool_timeouts`). The served `Choice`s are kept whole in
   the trajectory, so the trainer gets their token ids. A policy or connection that fails raises: as a rollout
   of a `TrajectoryGroup` it is recorded in `group.exceptions` and counted by `gather_trajectory_groups`.
4. `train_mcp_rl` (this module): each step, `groups_per_step` training tasks are rolled out `group_size` times,
   each group is scored by `ruler_score_group` (a group the judge cannot score is dropped) and `model.train`
   takes one step, until the model has taken `steps` steps in total. The test tasks are rolled out before the
   first step and after the last, and RULER ranks the two together (`MCPRLResult.evaluation`).

`MCPToolbox` and `write_tasks` are importable from here too, as the example above does.

Needs the `mcp` extra (`pip install 'ruler-rl[mcp]'`) beside `train`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Any

import pydantic

from ruler_rl.gather import gather_trajectory_groups
from ruler_rl.scoring import ruler_score_group
from ruler_rl.trainer.mcp_client import MCPToolbox
from ruler_rl.trainer.mcp_rollout import check_tool_choice, rollout
from ruler_rl.trainer.mcp_tasks import MCPTask, TaskSet, write_tasks
from ruler_rl.trajectory import Trajectory, TrajectoryGroup

__all__ = ["MCPRLConfig", "MCPRLEvaluation", "MCPRLResult", "MCPToolbox", "train_mcp_rl", "write_tasks"]

log = logging.getLogger("ruler")


class MCPRLConfig(pydantic.BaseModel):
    """The loop's settings.

    `steps` is the total number of training steps of the model, not a count added to it: a model at step
    `k` (a resumed run) takes `steps - k` more, none when `steps <= k` (as the examples count to a total).
    Each step rolls out `groups_per_step` training tasks (drawn with `seed`) `group_size` times;
    `max_exceptions` (a count, or a fraction < 1 of the step's rollouts) may raise before the step fails
    with `TooManyExceptions`. `tool_choice` is the first turn's (see `rollout`). `eval_rollouts`: rollouts
    of each test task before and after training for the evaluation (0: no evaluation). The rest go to
    `rollout`."""

    model_config = pydantic.ConfigDict(extra="forbid")

    steps: int = pydantic.Field(1, ge=0)
    groups_per_step: int = pydantic.Field(2, ge=1)
    group_size: int = pydantic.Field(4, ge=2)
    max_turns: int = pydantic.Field(6, ge=1)
    max_tokens: int = pydantic.Field(256, ge=1)
    temperature: float = pydantic.Field(1.0, ge=0, le=2)
    max_exceptions: float = pydantic.Field(0.25, ge=0)
    tool_choice: str | dict = "auto"
    eval_rollouts: int = pydantic.Field(2, ge=0, le=64)
    seed: int = 0

    @pydantic.field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value):
        check_tool_choice(value)
        return value


@dataclass
class MCPRLEvaluation:
    """The policy on the test tasks before and after training, judged by RULER relative within groups: for
    each test task, `eval_rollouts` rollouts of the policy before training and as many after it form one
    group that the judge ranks together. `before_mean` and `after_mean` are the mean RULER scores of the two
    halves over the groups the judge scored (`groups_scored` of `tasks`; None when it scored none); an
    after-mean above the before-mean says the judge preferred the trained policy. `groups`: the scored
    groups (each trajectory's `metadata["eval"]` is "before" or "after")."""

    tasks: int
    groups_scored: int
    before_mean: float | None
    after_mean: float | None
    groups: list[TrajectoryGroup] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"tasks": self.tasks, "groups_scored": self.groups_scored, "before_mean": self.before_mean,
                "after_mean": self.after_mean}


@dataclass
class MCPRLResult:
    """What `train_mcp_rl` did: each step's run-log row, its scored groups, and the test-split evaluation
    (None when there are no test tasks, `eval_rollouts` is 0 or no step was taken)."""

    rows: list[dict] = field(default_factory=list)
    groups: list[list[TrajectoryGroup]] = field(default_factory=list)
    evaluation: MCPRLEvaluation | None = None


async def train_mcp_rl(model: Any, toolbox: MCPToolbox, tasks: TaskSet, *, judge: str | None = None,
                       judge_params: dict | None = None, config: MCPRLConfig | None = None,
                       train_config: Any = None) -> MCPRLResult:
    """Train registered `model` (a `ruler_rl.trainer.TrainableModel`) on `tasks.train` with the tools of `toolbox`,
    RULER (`judge`, any litellm model; RULER's default when None) as the reward, until the model's step is
    `config.steps` (a total; see `MCPRLConfig`); `train_config` is the `ruler_rl.trainer.TrainConfig` of every step.
    Groups the judge cannot score are dropped (logged), rollouts that raise are counted against
    `config.max_exceptions`. When there are test tasks (and `config.eval_rollouts` > 0 and a step is taken),
    the policy is rolled out on them before the first step and after the last, and RULER ranks the two
    together (`MCPRLResult.evaluation`, see `MCPRLEvaluation`)."""
    from ruler_rl.trainer.config import TrainConfig

    config = config or MCPRLConfig()
    if not isinstance(config, MCPRLConfig):
        raise TypeError(f"config must be an MCPRLConfig, got {type(config).__name__}")
    if train_config is not None and not isinstance(train_config, TrainConfig):
        raise TypeError(f"train_config must be a ruler_rl.trainer.TrainConfig, got {type(train_config).__name__}")
    if not isinstance(tasks, TaskSet) or not tasks.train:
        raise ValueError("tasks must be a TaskSet with at least one training task (write_tasks)")
    if not isinstance(toolbox, MCPToolbox) or not toolbox.openai_tools:
        raise ValueError("toolbox must be a connected MCPToolbox (inside `async with`)")
    if not callable(getattr(model, "openai_client", None)) or not callable(getattr(model, "train", None)):
        raise TypeError(f"model must be a registered ruler_rl.trainer.TrainableModel, got {type(model).__name__}")
    check_tool_choice(config.tool_choice, toolbox.tool_names)
    rng = random.Random(config.seed)
    result = MCPRLResult()
    max_exceptions = config.max_exceptions if config.max_exceptions < 1 else int(config.max_exceptions)

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if len(group.trajectories) < 2:  # every rollout (or all but one) raised: nothing to rank
            return None
        return await ruler_score_group(group, judge, judge_params, swallow_exceptions=True)

    def rollouts(task: MCPTask, n: int) -> list:
        return [rollout(task, toolbox, client, model.get_inference_name(), max_turns=config.max_turns,
                        max_tokens=config.max_tokens, temperature=config.temperature,
                        tool_choice=config.tool_choice) for _ in range(n)]

    async def eval_rollouts(label: str) -> list[list[Trajectory]]:
        groups = await gather_trajectory_groups(
            [TrajectoryGroup(rollouts(t, config.eval_rollouts), metadata={"task_id": t.id}) for t in tasks.test],
            max_exceptions=max_exceptions, pbar_desc=f"mcp-rl eval {label}")
        for g in groups:
            for t in g.trajectories:
                t.metadata["eval"] = label
        return [list(g.trajectories) for g in groups]

    client = model.openai_client()
    start = await model.get_step()
    evaluate = bool(tasks.test) and config.eval_rollouts > 0 and start < config.steps
    before = await eval_rollouts("before") if evaluate else []
    for step in range(start, config.steps):
        picked = rng.sample(tasks.train, min(config.groups_per_step, len(tasks.train)))
        groups = await gather_trajectory_groups(
            [TrajectoryGroup(rollouts(t, config.group_size), metadata={"task_id": t.id}) for t in picked],
            after_each=score, max_exceptions=max_exceptions, pbar_desc=f"mcp-rl step {step}")
        if len(groups) < len(picked):
            log.warning("step %d: the judge scored %d of %d groups", step, len(groups), len(picked))
        row = await model.train(groups, train_config or TrainConfig())
        result.rows.append(row)
        result.groups.append(groups)
    if evaluate:
        after = await eval_rollouts("after")
        mixed = [TrajectoryGroup(b + a, metadata={"task_id": t.id, "eval": True})
                 for t, b, a in zip(tasks.test, before, after, strict=True)]
        scored = [g for g in await asyncio.gather(*(score(g) for g in mixed)) if g is not None]
        halves = {label: [t.reward for g in scored for t in g.trajectories if t.metadata.get("eval") == label]
                  for label in ("before", "after")}
        result.evaluation = MCPRLEvaluation(
            tasks=len(tasks.test), groups_scored=len(scored),
            before_mean=sum(halves["before"]) / len(halves["before"]) if halves["before"] else None,
            after_mean=sum(halves["after"]) / len(halves["after"]) if halves["after"] else None, groups=scored)
    return result
