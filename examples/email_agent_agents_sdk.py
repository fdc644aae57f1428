"""The ART·E email agent as an OpenAI Agents SDK agent, trained with RULER through `model.train`.

The agent is a plain `agents.Agent` run by `Runner.run` over ART·E's three tools (`evals/art_e/tools.py`, the
same schemas and functions as `examples/email_agent_langgraph.py`); its model comes from
`ruler_rl.trainer.record.agents_sdk_model(model)` (an `OpenAIChatCompletionsModel` on the trainer's server), and each
rollout runs inside `record_trajectory`, which turns every completion it made into a trainable `Trajectory`.
A RULER judge ranks each group of rollouts of one question; `model.train` takes one GRPO step per --steps.
The SDK's trace upload to OpenAI is turned off (no key is needed).

    # a smoke run on the CPU: embedded SmolLM2-135M as the policy and as the RULER judge
    python examples/email_agent_agents_sdk.py --steps 1 --groups-per-step 1 --group-size 2 --max-turns 2

Runs from a checkout (the ART·E task lives in `evals/`) with the `agents`, `train` and `eval` extras.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from ruler_rl import Trajectory
from ruler_rl.trainer import TrainableModel, record_trajectory
from ruler_rl.trainer.record import agents_sdk_model

try:
    from evals.art_e.agent import SYSTEM
    from evals.art_e.questions import Scenario
    from evals.art_e.recorded import finish, train
    from evals.art_e.tools import TOOL_SCHEMAS, InboxTools
except ModuleNotFoundError as exc:
    if exc.name != "evals":
        raise
    raise SystemExit("this example runs from a checkout of the ruler-rl repository: the ART·E task lives in "
                     "evals/, which is not installed here (in the checkout: bash .ci/setup)") from None


def agents_sdk_tools(inbox: InboxTools) -> list:
    """ART·E's tools as Agents SDK function tools: the same JSON schemas (not made strict), run by
    `InboxTools.call` (mistakes come back to the agent as tool errors)."""
    from agents import FunctionTool

    def make(schema: dict) -> FunctionTool:
        name = schema["function"]["name"]

        async def run(_context, arguments: str) -> str:
            return inbox.call(name, arguments).content

        return FunctionTool(name=name, description=schema["function"]["description"],
                            params_json_schema=schema["function"]["parameters"], on_invoke_tool=run,
                            strict_json_schema=False)

    return [make(s) for s in TOOL_SCHEMAS]


def policy(model: TrainableModel, args):
    """The SDK model every rollout of a step shares (`train` makes one per step and closes its HTTP client)."""
    return agents_sdk_model(model)


async def rollout(sdk_model, scenario: Scenario, db: Path, args) -> Trajectory:
    """One Agents SDK rollout on `scenario` with `sdk_model` (from `policy`), recorded; `return_final_answer`
    ends it."""
    from agents import Agent, MaxTurnsExceeded, ModelSettings, Runner, StopAtTools, set_tracing_disabled

    set_tracing_disabled(True)
    inbox = InboxTools(db, scenario.inbox_address, scenario.query_date)
    try:
        agent = Agent(name="email agent", model=sdk_model, tools=agents_sdk_tools(inbox),
                      instructions=SYSTEM.format(address=scenario.inbox_address, date=scenario.query_date,
                                                 max_turns=args.max_turns),
                      model_settings=ModelSettings(temperature=1, max_tokens=args.max_tokens),
                      tool_use_behavior=StopAtTools(stop_at_tool_names=["return_final_answer"]))
        async with record_trajectory() as traj:
            try:
                await Runner.run(agent, scenario.question, max_turns=args.max_turns)
            except MaxTurnsExceeded:
                traj.metrics["ran_out_of_turns"] = 1
    finally:
        inbox.close()
    return finish(traj, scenario, inbox)


if __name__ == "__main__":
    asyncio.run(train(rollout, "email-agent-agents-sdk", description=__doc__.splitlines()[0], policy=policy))
