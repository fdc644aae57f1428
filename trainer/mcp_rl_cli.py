"""`ruler mcp-rl`: train an agent on the tools of an MCP server with RULER (`ruler_rl.trainer.mcp_rl`). `ruler_rl.cli` loads
`app` by name when the command is run (see `ruler_rl.cli.PLUGIN_COMMANDS`); it needs the `mcp` and `train` extras.

    ruler mcp-rl --server "python -m evals.art_e.mcp_server --db runs/art-e-inbox.db" \\
        --task-model openai/gpt-4.1 --judge openai/o4-mini --n-tasks 24 --steps 10
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from ruler_rl.cli import console
from ruler_rl.judges.extras import require

require("mcp", "`ruler mcp-rl`")
require("train", "`ruler mcp-rl`")

app = typer.Typer(help="MCP·RL.")


def _params(api_base: str | None) -> dict | None:
    return {"api_base": api_base} if api_base else None


@app.command("mcp-rl")
def mcp_rl(
    server: Annotated[str | None, typer.Option(
        "--server", help="The MCP server's command line, run over stdio "
                         "(e.g. \"python -m evals.art_e.mcp_server --db inbox.db\").")] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", help="KEY=VALUE: an environment variable for the --server command (repeatable). The command gets "
                      "only the MCP SDK's short list of safe variables (HOME, PATH, ...) plus these, unless "
                      "--inherit-env.")] = None,
    inherit_env: Annotated[bool, typer.Option(
        "--inherit-env", help="Pass this shell's whole environment to the --server command (--env wins over "
                              "it). Off by default: the environment may hold API keys.")] = False,
    cwd: Annotated[Path | None, typer.Option(
        "--cwd", exists=True, file_okay=False, dir_okay=True,
        help="Working directory of the --server command (default: the current one).")] = None,
    server_url: Annotated[str | None, typer.Option(
        "--server-url", help="A streamable HTTP MCP endpoint instead (e.g. http://127.0.0.1:8765/mcp).")] = None,
    task_model: Annotated[str | None, typer.Option(
        "--task-model", help="The litellm model that writes the tasks (needed unless --tasks is given).")] = None,
    task_api_base: Annotated[str | None, typer.Option(
        "--task-api-base", help="API base URL of the task model.")] = None,
    instructions: Annotated[str | None, typer.Option(
        "--instructions", help="Your instructions to the task writer (what tasks to write): a text, or the path "
                               "of a file holding it.")] = None,
    tasks_file: Annotated[Path | None, typer.Option(
        "--tasks", help="Tasks saved by an earlier run (tasks.json) instead of writing new ones.")] = None,
    n_tasks: Annotated[int, typer.Option("--n-tasks", min=2, help="Tasks to write (train and test).")] = 16,
    test_fraction: Annotated[float, typer.Option(
        "--test-fraction", min=0.0, max=0.9, help="Share of the tasks kept for test.")] = 0.25,
    judge: Annotated[str | None, typer.Option(
        "--judge", help="The RULER judge, a litellm model (default: RULER's default judge).")] = None,
    judge_api_base: Annotated[str | None, typer.Option("--judge-api-base", help="API base URL of the judge.")] = None,
    base_model: Annotated[str, typer.Option(
        "--base-model", help="The policy's base model.")] = "local/smollm2-135m-instruct",
    engine: Annotated[str, typer.Option("--engine", help="auto, transformers or vllm.")] = "auto",
    name: Annotated[str, typer.Option("--name", help="Model (run) name.")] = "mcp-agent",
    project: Annotated[str, typer.Option("--project", help="Project name.")] = "mcp-rl",
    out: Annotated[Path, typer.Option("--out", help="Runs go under OUT/PROJECT/NAME.")] = Path("./runs"),
    steps: Annotated[int, typer.Option(
        "--steps", min=0, help="Total training steps of the model: a resumed run (same --out, --project, --name) "
                               "trains until its step reaches this.")] = 1,
    groups_per_step: Annotated[int, typer.Option("--groups-per-step", min=1, help="Training tasks per step.")] = 2,
    group_size: Annotated[int, typer.Option("--group-size", min=2, help="Rollouts per task.")] = 4,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="Model calls per rollout.")] = 6,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Tokens per model call.")] = 256,
    eval_rollouts: Annotated[int, typer.Option(
        "--eval-rollouts", min=0, max=64, help="Rollouts of each test task before and after training, ranked "
                                               "together by the judge (0: no evaluation).")] = 2,
    learning_rate: Annotated[float, typer.Option("--lr", min=0.0, help="Learning rate.")] = 5e-5,
    tool_timeout: Annotated[float, typer.Option(
        "--tool-timeout", min=0.001, help="Seconds one tool call may take.")] = 30.0,
    connect_timeout: Annotated[float, typer.Option(
        "--connect-timeout", min=0.001, help="Seconds to start the server and list its tools (one deadline).")] = 60.0,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the task split and the tasks drawn each step.")] = 0,
) -> None:
    """Train an agent on the tools of an MCP server with RULER as the reward.

    Connects to the server, lists its tools, has --task-model write --n-tasks tasks that need them (checked,
    deduplicated, split train/test; saved as tasks.json in the run folder), then trains until the model has
    taken --steps steps (a total: a resumed run continues to it): each step rolls out --groups-per-step
    training tasks --group-size times, scores every group with RULER and takes one GRPO step. Before the first
    step and after the last, the policy is rolled out on the test tasks (--eval-rollouts each) and RULER
    ranks the two together; the mean scores before and after are printed.
    """
    if (server is None) == (server_url is None):
        raise typer.BadParameter("give exactly one of --server and --server-url", param_hint="--server")
    if tasks_file is None and not task_model:
        raise typer.BadParameter("give --task-model (or --tasks with saved tasks)", param_hint="--task-model")
    if (env or inherit_env or cwd is not None) and server is None:
        raise typer.BadParameter("--env, --inherit-env and --cwd are for a --server command", param_hint="--env")
    env_vars = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not key.strip() == key:
            raise typer.BadParameter(f"must be KEY=VALUE, got {item!r}", param_hint="--env")
        env_vars[key] = value
    if instructions is not None:
        text = instructions
        try:
            is_file = Path(instructions).is_file()
        except (OSError, ValueError):  # a text too long (or odd) to be a path
            is_file = False
        if is_file:
            try:
                text = Path(instructions).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise typer.BadParameter(f"cannot read {instructions}: {exc}", param_hint="--instructions") from None
        if not text.strip() or len(text) > 20000:
            raise typer.BadParameter("must be a non-empty text (or file) of at most 20000 characters",
                                     param_hint="--instructions")
        instructions = text
    if engine not in ("auto", "transformers", "vllm"):
        raise typer.BadParameter(f"must be auto, transformers or vllm, got {engine!r}", param_hint="--engine")
    asyncio.run(_run(locals()))


async def _run(a: dict) -> None:
    from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
    from ruler_rl.trainer.mcp_client import MCPToolbox
    from ruler_rl.trainer.mcp_rl import MCPRLConfig, train_mcp_rl
    from ruler_rl.trainer.mcp_tasks import TaskSet, write_tasks

    config = MCPRLConfig(steps=a["steps"], groups_per_step=a["groups_per_step"], group_size=a["group_size"],
                         max_turns=a["max_turns"], max_tokens=a["max_tokens"], eval_rollouts=a["eval_rollouts"],
                         seed=a["seed"])
    model = TrainableModel(a["name"], a["project"], a["base_model"],
                           ModelConfig(engine=EngineConfig(engine=a["engine"]), seed=a["seed"]))
    command = {"env": a["env_vars"] or None, "cwd": a["cwd"], "inherit_env": a["inherit_env"]} if a["server"] else {}
    async with MCPToolbox(a["server"], url=a["server_url"], tool_timeout=a["tool_timeout"],
                          connect_timeout=a["connect_timeout"], **command) as box:
        console.print(f"{box.label}: {len(box.openai_tools)} tools ({', '.join(box.tool_names)})", soft_wrap=True)
        if a["tasks_file"] is not None:
            tasks = TaskSet.load(a["tasks_file"])
        else:
            tasks = await write_tasks(box.openai_tools, a["task_model"], n=a["n_tasks"],
                                      test_fraction=a["test_fraction"], seed=a["seed"],
                                      params=_params(a["task_api_base"]), instructions=box.instructions,
                                      guidance=a["instructions"], resources=box.resources)
        console.print(f"{len(tasks.train)} training and {len(tasks.test)} test tasks; rejected: "
                      f"{tasks.report.rejected or 'none'}", soft_wrap=True)
        backend = LocalBackend(a["out"])
        try:
            await model.register(backend)
            saved = tasks.save(model.run_dir / "tasks.json")
            console.print(f"tasks: {saved}", soft_wrap=True)
            result = await train_mcp_rl(model, box, tasks, judge=a["judge"], judge_params=_params(a["judge_api_base"]),
                                        config=config, train_config=TrainConfig(learning_rate=a["learning_rate"]))
        finally:
            await backend.close()
    for row in result.rows:
        console.print(json.dumps({k: row.get(k) for k in ("step", "trained", "reward_mean", "reward_std", "loss",
                                                          "sequences", "skipped") if k in row}), soft_wrap=True)
    if result.evaluation is not None:
        console.print("test evaluation (mean RULER score, before and after ranked together): "
                      + json.dumps(result.evaluation.as_dict()), soft_wrap=True)
    else:
        console.print("test evaluation: none (no test tasks, --eval-rollouts 0 or no step taken)", soft_wrap=True)
    console.print(f"run: {model.run_dir}", soft_wrap=True)
