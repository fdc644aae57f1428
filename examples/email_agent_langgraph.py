"""The ART·E email agent as a LangGraph ReAct agent, trained with RULER through `model.train`.

The agent is plain LangGraph (`create_react_agent`) over ART·E's three tools (`evals/art_e/tools.py`, the same
schemas and functions as `examples/email_agent.py` and `examples/email_agent_agents_sdk.py`); its chat model
comes from `ruler_rl.trainer.record.langchain_chat_model(model)`, and each rollout runs inside `record_trajectory`,
which turns every completion it made into a trainable `Trajectory` (served token ids kept). A RULER judge
ranks each group of rollouts of one question, and `model.train` takes one GRPO step per --steps.

    # a smoke run on the CPU: embedded SmolLM2-135M as the policy and as the RULER judge
    python examples/email_agent_langgraph.py --steps 1 --groups-per-step 1 --group-size 2 --max-turns 2
    # on a GPU (vLLM) with a stronger judge
    python examples/email_agent_langgraph.py --base-model Qwen/Qwen2.5-1.5B-Instruct --engine vllm --steps 40 \\
        --judge hosted_vllm/judge@http://127.0.0.1:8001/v1

Runs from a checkout (the ART·E task lives in `evals/`) with the `agents`, `train` and `eval` extras.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from ruler_rl import Trajectory
from ruler_rl.trainer import TrainableModel, record_trajectory
from ruler_rl.trainer.record import langchain_chat_model

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


def langchain_tools(inbox: InboxTools) -> list:
    """ART·E's tools as LangChain tools: the same JSON schemas, run by `InboxTools.call` (mistakes come back to
    the agent as tool errors). `return_final_answer` ends the ReAct loop."""
    from langchain_core.tools import StructuredTool

    def make(schema: dict) -> StructuredTool:
        name = schema["function"]["name"]

        def run(**kwargs) -> str:
            return inbox.call(name, kwargs).content

        return StructuredTool.from_function(func=run, name=name, description=schema["function"]["description"],
                                            args_schema=schema["function"]["parameters"],
                                            return_direct=name == "return_final_answer")

    return [make(s) for s in TOOL_SCHEMAS]


def policy(model: TrainableModel, args):
    """The chat model every rollout of a step shares (`train` makes one per step and closes its HTTP clients)."""
    return langchain_chat_model(model, max_tokens=args.max_tokens)


async def rollout(chat_model, scenario: Scenario, db: Path, args) -> Trajectory:
    """One LangGraph rollout on `scenario` with `chat_model` (from `policy`), recorded."""
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    inbox = InboxTools(db, scenario.inbox_address, scenario.query_date)
    try:
        agent = create_react_agent(chat_model, langchain_tools(inbox),
                                   prompt=SYSTEM.format(address=scenario.inbox_address, date=scenario.query_date,
                                                        max_turns=args.max_turns))
        async with record_trajectory() as traj:
            try:  # a ReAct step is a model call and a tool call: 2 graph steps per turn
                await agent.ainvoke({"messages": [("user", scenario.question)]},
                                    {"recursion_limit": 2 * args.max_turns})
            except GraphRecursionError:
                traj.metrics["ran_out_of_turns"] = 1
    finally:
        inbox.close()
    return finish(traj, scenario, inbox)


if __name__ == "__main__":
    asyncio.run(train(rollout, "email-agent-langgraph", description=__doc__.splitlines()[0], policy=policy))
