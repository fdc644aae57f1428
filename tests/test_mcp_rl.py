"""MCP·RL end to end on the CPU: the shipped ART·E MCP server over stdio (and streamable HTTP), a scripted task
writer and judge (`FakeJudge` on loopback), the embedded SmolLM2 as the policy on the CPU server, one training
step; and the bad input: a server that fails to start, tools that raise or hang, a task writer that returns
junk, an agent that throws mid-rollout."""

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI
from typer.testing import CliRunner

from evals.art_e.mcp_server import resolve_inbox
from evals.art_e.tools import InboxTools
from ruler_rl import TrajectoryGroup, gather_trajectory_groups
from ruler_rl.errors import TooManyExceptions
from ruler_rl.testing import FakeJudge, free_port
from ruler_rl.trainer.mcp_client import STDERR_KEEP_BYTES, MCPServerError, MCPToolbox, openai_tool_schema
from ruler_rl.trainer.mcp_rl import MCPRLConfig, train_mcp_rl
from ruler_rl.trainer.mcp_rollout import rollout
from ruler_rl.trainer.mcp_tasks import MCPTask, TaskSet, TaskWriterError, write_tasks

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
FAULTS_SCRIPT = str(ROOT / "tests" / "mcp_fault_server.py")
FAULTS = f"{sys.executable} {FAULTS_SCRIPT}"
TOOLS = [{"type": "function", "function": {"name": "search_emails", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "read_email", "parameters": {"type": "object"}}}]


def inbox_server(db) -> str:
    return f"{sys.executable} -m evals.art_e.mcp_server --db {db}"


def reply(tasks) -> dict:
    return {"content": json.dumps({"tasks": tasks})}


def call(i, name, args) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


@pytest.fixture
def writer():
    w = FakeJudge()
    yield w
    w.close()


# ---- the whole loop ----------------------------------------------------------------------------------------

@pytest.mark.slow
async def test_the_loop_end_to_end_on_the_inbox_server_over_stdio(inbox_db, judge, writer, tmp_path):
    from ruler_rl.trainer import LocalBackend, TrainableModel, TrainConfig

    db, _ = inbox_db
    writer.script = [
        # every valid task names one keyword the inbox holds, so a forced search finds real mail
        reply([{"task": "Search my emails for the keyword budget and tell me who sent the newest one.",
                "tools": ["search_emails"]},
               {"task": "search my emails for the keyword BUDGET, and tell me who sent the newest one",
                "tools": ["search_emails"]},
               {"task": "Delete every email from John.", "tools": ["delete_email"]},
               {"task": "Hi", "tools": ["read_email"]},
               {"task": "Search my emails for the keyword trading and summarize the newest one.",
                "tools": ["search_emails", "read_email"]}]),
        reply([{"task": "Search my emails for the keyword meeting and tell me when the next one is.",
                "tools": ["search_emails", "read_email"]},
               {"task": "Search my emails for the keyword Houston and list who wrote them.",
                "tools": ["search_emails"]}]),
    ]
    async with MCPToolbox(inbox_server(db), env=ENV, cwd=ROOT, tool_timeout=20) as box:
        assert box.tool_names == ["search_emails", "read_email"] and "inbox" in box.instructions
        # the tools really run on the server
        hits = json.loads((await box.call("search_emails", {"keywords": ["meeting"], "max_results": 2})).text)
        assert len(hits) == 2 and all(h["message_id"].startswith("<") for h in hits)
        email = await box.call("read_email", {"message_id": hits[0]["message_id"]})
        assert not email.is_error and json.loads(email.text)["message_id"] == hits[0]["message_id"]
        missing = await box.call("read_email", {"message_id": "<nope>"})
        assert missing.is_error and "Email not found" in missing.text

        tasks = await write_tasks(box.openai_tools, "openai/task-writer", n=4, test_fraction=0.25, seed=1,
                                  params=writer.params, instructions=box.instructions)
        assert (tasks.report.attempts, tasks.report.written, tasks.report.kept) == (2, 7, 4)
        assert tasks.report.rejected == {"duplicate": 1, "tools missing or naming a tool the server does not have": 1,
                                         "task is not a text of 12-2000 characters": 1}
        assert (len(tasks.train), len(tasks.test)) == (3, 1) and tasks.test[0].split == "test"
        assert "Do not repeat these tasks" in writer.requests[1]["messages"][0]["content"]
        assert writer.requests[0]["response_format"]["type"] == "json_schema"
        saved = TaskSet.load(tasks.save(tmp_path / "tasks.json"))
        assert [t.task for t in saved.train] == [t.task for t in tasks.train]

        model = TrainableModel("mcp-agent", "mcp", "local/smollm2-135m-instruct")
        backend = LocalBackend(tmp_path / "runs")
        await model.register(backend)
        judge.first_bonus = 0.4  # the scripted judge scores the first trajectory higher: a learning signal
        # SmolLM2 rarely calls a tool on its own: the first turn is forced to call search_emails (constrained
        # decoding on the CPU server), so the agent really runs a tool on the inbox server through MCP
        forced = {"type": "function", "function": {"name": "search_emails"}}
        try:
            result = await train_mcp_rl(model, box, tasks, judge="openai/fake-judge", judge_params=judge.params,
                                        config=MCPRLConfig(steps=1, groups_per_step=1, group_size=2, max_turns=2,
                                                           max_tokens=64, temperature=0.3, seed=0,
                                                           tool_choice=forced, eval_rollouts=1),
                                        train_config=TrainConfig(learning_rate=1e-4))
            # `steps` is a total: the model is at step 1 already, so steps=1 takes none (and evaluates nothing)
            again = await train_mcp_rl(model, box, tasks, judge="openai/fake-judge", judge_params=judge.params,
                                       config=MCPRLConfig(steps=1, group_size=2, tool_choice=forced))
            assert (again.rows, again.evaluation, await model.get_step()) == ([], None, 1)
        finally:
            await backend.close()
    (row,) = result.rows
    assert row["trained"] is True and row["step"] == 1 and row["sequences"] >= 2
    (group,) = result.groups[0]
    assert len(group) == 2 and not group.exceptions and len(judge.requests) == 2  # a training and an eval group
    task_text = group.trajectories[0].metadata["task"]
    assert task_text in [t.task for t in tasks.train] and task_text in FakeJudge.user_text(judge.requests[0])
    inbox = InboxTools(db, resolve_inbox(db, None))
    found = []
    for t in group:
        served = [m for m in t.messages_and_choices if not isinstance(m, dict)]
        assert served and all(len(c.model_extra["token_ids"]) > 0 for c in served)  # trainable
        assert [x["function"]["name"] for x in t.tools] == ["search_emails", "read_email"]
        assert 1 <= t.metrics["turns"] <= 2 and "ruler_score" in t.metrics and t.metrics["tool_calls"] >= 1
        (first_call, *_) = served[0].message.tool_calls
        assert first_call.function.name == "search_emails"
        tool_msgs = [m for m in t.messages_and_choices if isinstance(m, dict) and m["role"] == "tool"]
        assert tool_msgs[0]["tool_call_id"] == first_call.id
        for m in tool_msgs:  # the inbox server's answer: hits whose message ids are in the inbox
            try:
                hits = json.loads(m["content"])
            except ValueError:
                continue
            for hit in hits if isinstance(hits, list) else []:
                assert inbox.read_email(hit["message_id"]) is not None
                found.append(hit["message_id"])
    assert found, [m for t in group for m in t.messages_and_choices if isinstance(m, dict)]
    # the judge ranked what the agent read: a real email snippet reached the judge's prompt
    assert any(mid in FakeJudge.user_text(judge.requests[0]) for mid in found)
    # the test split: the policy before and after the step, ranked together in one group by the judge
    ev = result.evaluation
    assert (ev.tasks, ev.groups_scored) == (1, 1) and len(ev.groups[0]) == 2
    assert [t.metadata["eval"] for t in ev.groups[0]] == ["before", "after"]
    assert tasks.test[0].task in FakeJudge.user_text(judge.requests[1])
    before, after = ev.groups[0].trajectories
    assert (ev.before_mean, ev.after_mean) == pytest.approx((before.reward, after.reward))
    assert all("ruler_score" in t.metrics for t in ev.groups[0])


@pytest.mark.slow
def test_the_command_writes_and_saves_the_tasks_and_registers_the_model(inbox_db, writer, tmp_path):
    from ruler_rl.cli import app

    db, _ = inbox_db
    writer.script = [reply([{"task": "Find the email about the budget meeting and tell me its date.",
                             "tools": ["search_emails"]},
                            {"task": "Who wrote to me about the Houston office move?", "tools": ["search_emails"]}])]
    env = {**ENV, "OPENAI_API_KEY": "sk-test"}
    res = CliRunner().invoke(app, ["mcp-rl", "--server", inbox_server(db), "--task-model", "openai/task-writer",
                                   "--task-api-base", writer.base, "--n-tasks", "2", "--test-fraction", "0.5",
                                   "--steps", "0", "--engine", "transformers", "--out", str(tmp_path), "--name", "a"],
                             env=env)
    assert res.exit_code == 0, res.output
    assert "2 tools (search_emails, read_email)" in res.output and "1 training and 1 test tasks" in res.output
    assert "test evaluation: none (no test tasks, --eval-rollouts 0 or no step taken)" in res.output
    saved = TaskSet.load(tmp_path / "mcp-rl" / "a" / "tasks.json")
    assert {t.task for t in saved.train + saved.test} == {
        "Find the email about the budget meeting and tell me its date.",
        "Who wrote to me about the Houston office move?"}


@contextlib.contextmanager
def over_http(*argv: str):
    """An MCP server command (its arguments before `--http PORT`) serving streamable HTTP in a subprocess; its
    /mcp URL once it answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, *argv, "--http", str(port)], cwd=ROOT, env={**os.environ, **ENV},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def http_server(inbox_db):
    """The inbox MCP server over streamable HTTP."""
    with over_http("-m", "evals.art_e.mcp_server", "--db", str(inbox_db[0])) as url:
        yield url


async def test_streamable_http_lists_the_tools_and_calls_one(http_server):
    async with MCPToolbox(url=http_server, tool_timeout=20) as box:
        assert box.tool_names == ["search_emails", "read_email"]
        params = box.openai_tools[0]["function"]["parameters"]
        assert params["type"] == "object" and params["required"] == ["keywords"]
        result = await box.call("search_emails", {"keywords": ["meeting"], "max_results": 3})
        assert not result.is_error and len(json.loads(result.text)) == 3


# ---- the server's environment, working directory and resources ----------------------------------------------

async def test_env_inherit_env_and_cwd_reach_the_server_command(tmp_path, monkeypatch):
    monkeypatch.setenv("FAULTS_PARENT_Q", "from-the-parent")
    async with MCPToolbox(FAULTS, env={"FAULTS_NOTE": "hello-q"}, cwd=tmp_path) as box:
        assert (await box.call("getenv", {"name": "FAULTS_NOTE"})).text == "hello-q"
        # the SDK's default: the caller's own variables are not passed on
        assert (await box.call("getenv", {"name": "FAULTS_PARENT_Q"})).text == "<unset>"
        assert (await box.call("getcwd", {})).text == str(tmp_path)
        assert "FAULTS_NOTE: hello-q" in box.instructions
        assert box.resources == [{"uri": "faults://runbook", "name": "runbook",
                                  "description": "What to do when a tool fails."}]
    async with MCPToolbox(FAULTS, env={"FAULTS_NOTE": "wins"}, inherit_env=True) as box:
        assert (await box.call("getenv", {"name": "FAULTS_PARENT_Q"})).text == "from-the-parent"
        assert (await box.call("getenv", {"name": "FAULTS_NOTE"})).text == "wins"
        assert (await box.call("getcwd", {})).text == os.getcwd()
    with pytest.raises(ValueError, match="env must be a dict"):
        MCPToolbox(FAULTS, env={"A=B": "x"})
    with pytest.raises(ValueError, match="is not a directory"):
        MCPToolbox(FAULTS, cwd=tmp_path / "missing")
    with pytest.raises(ValueError, match="for a server command"):
        MCPToolbox(url="http://127.0.0.1:1/mcp", inherit_env=True)


def test_the_command_passes_env_cwd_instructions_and_resources_to_the_server_and_the_writer(writer, tmp_path):
    from ruler_rl.cli import app

    guidance = tmp_path / "guidance.txt"
    guidance.write_text("Only write tasks about failing tools, in French.")
    writer.script = ["prose"] * 3  # the writer fails (no model is trained); its prompt is what is checked
    base = ["mcp-rl", "--server", FAULTS, "--task-model", "openai/task-writer", "--task-api-base", writer.base,
            "--n-tasks", "2"]
    env = {"OPENAI_API_KEY": "sk-test", "FAULTS_NOTE": "from-the-shell"}
    res = CliRunner().invoke(app, [*base, "--env", "FAULTS_NOTE=a=b", "--cwd", str(tmp_path),
                                   "--instructions", str(guidance)], env=env)
    assert res.exit_code == 1 and "gave 0 valid tasks" in res.output, res.output
    prompt = writer.requests[0]["messages"][0]["content"]
    assert f"FAULTS_NOTE: a=b; cwd: {tmp_path})" in prompt  # the server's instructions show its env and cwd
    assert "Only write tasks about failing tools, in French." in prompt
    assert "runbook (faults://runbook): What to do when a tool fails." in prompt
    for flags, note in (([], "<unset>"), (["--inherit-env"], "from-the-shell"),
                        (["--inherit-env", "--env", "FAULTS_NOTE=mine"], "mine")):
        writer.reset()
        writer.script = ["prose"] * 3
        res = CliRunner().invoke(app, [*base, *flags, "--instructions", "Tasks about echo." + " Short ones." * 30], env=env)
        assert res.exit_code == 1, res.output
        prompt = writer.requests[0]["messages"][0]["content"]
        assert f"FAULTS_NOTE: {note};" in prompt and "Tasks about echo." in prompt
    for bad, match in ((["--env", "NOEQUALS"], "KEY=VALUE"), (["--cwd", str(tmp_path / "nope")], "does not exist"),
                       (["--instructions", " "], "non-empty")):
        res = CliRunner().invoke(app, [*base, *bad], env=env)
        assert res.exit_code == 2 and match in res.output, res.output


async def test_a_server_that_never_answers_the_handshake_times_out_at_connect_timeout():
    started = time.monotonic()
    with pytest.raises(MCPServerError) as err:
        async with MCPToolbox(f"{FAULTS} --mode silent", connect_timeout=1):
            pass
    assert time.monotonic() - started < 5  # one deadline for the whole start-up, not one per request
    assert "within connect_timeout=1 s" in str(err.value) and "failed to start" not in str(err.value)


# ---- bad input ---------------------------------------------------------------------------------------------

async def test_a_server_that_fails_to_start_is_named_with_its_stderr():
    code = "import sys; print('cannot open config /etc/mcp-q.yml', file=sys.stderr); sys.exit(3)"
    cmd = f"{sys.executable} -c \"{code}\""
    with pytest.raises(MCPServerError) as err:
        async with MCPToolbox(cmd, connect_timeout=20):
            pass
    assert "-c" in str(err.value) and "cannot open config /etc/mcp-q.yml" in str(err.value)
    with pytest.raises(MCPServerError, match="no-such-mcp-server-q"):
        async with MCPToolbox("no-such-mcp-server-q --port 1"):
            pass


def test_the_command_line_reports_a_server_that_fails_to_start_in_one_line():
    from ruler_rl.cli import app

    res = CliRunner().invoke(app, ["mcp-rl", "--server", "no-such-mcp-server-q", "--task-model", "openai/x"])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "MCP server `no-such-mcp-server-q` failed to start" in res.output
    res = CliRunner().invoke(app, ["mcp-rl", "--task-model", "openai/x"])
    assert res.exit_code == 2 and "exactly one of --server and --server-url" in res.output


async def test_tools_that_raise_or_hang_become_tool_messages(judge):
    policy = AsyncOpenAI(base_url=judge.base, api_key="sk-test", max_retries=0)
    judge.script = [{"tool_calls": [call(1, "boom", {"reason": "disk full"}), call(2, "hang", {}),
                                    call(3, "echo", {"text": "hi"}), call(4, "nope", {}),
                                    {"id": "call_5", "type": "function", "function": {"name": "echo",
                                                                                      "arguments": "{bad json"}}]},
                    {"content": "Done: the echo said hi."}]
    async with MCPToolbox(FAULTS, env=ENV, tool_timeout=1.5) as box:
        assert box.tool_names == ["echo", "boom", "hang", "die", "getenv", "getcwd", "huge", "shout"]
        started = time.monotonic()
        t = await rollout(MCPTask(id="t", task="Echo hi, then try the other tools."), box, policy, "fake-agent")
        assert time.monotonic() - started < 15  # the hanging tool was cut at its timeout
        # the connection is still good after a timed-out call
        assert (await box.call("echo", {"text": "again"})).text == "echo: again"
    tool_msgs = [m["content"] for m in t.messages_and_choices if isinstance(m, dict) and m["role"] == "tool"]
    assert len(tool_msgs) == 5
    assert "boom" in tool_msgs[0] and tool_msgs[0].lower().startswith("error")
    assert "timed out" in tool_msgs[1] and tool_msgs[2] == "echo: hi"
    assert "unknown tool 'nope'" in tool_msgs[3] and "not valid JSON" in tool_msgs[4]
    assert (t.metrics["tool_calls"], t.metrics["tool_errors"], t.metrics["tool_timeouts"]) == (5, 4, 1)
    assert t.metrics["answered"] is True and t.metrics["turns"] == 2
    # the agent saw the tool messages on its second turn
    assert [m["role"] for m in judge.requests[1]["messages"]][-5:] == ["tool"] * 5


class ThrowsOnSecondTurn:
    """An agent whose policy client throws on its second model call (mid-rollout)."""

    def __init__(self, client):
        self.client, self.calls = client, 0
        self.chat = self
        self.completions = self

    async def create(self, **kwargs):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("the agent crashed mid-rollout")
        return await self.client.chat.completions.create(**kwargs)


async def test_an_agent_that_throws_mid_rollout_is_counted_by_gather(judge):
    policy = AsyncOpenAI(base_url=judge.base, api_key="sk-test", max_retries=0)
    task = MCPTask(id="t", task="Echo the word hello.")
    async with MCPToolbox(FAULTS, env=ENV, tool_timeout=5) as box:
        for max_exceptions, expect in ((1, None), (0, TooManyExceptions)):
            judge.reset()
            judge.script = [{"tool_calls": [call(1, "echo", {"text": "hello"})]}] * 2
            thrower = ThrowsOnSecondTurn(policy)
            group = TrajectoryGroup([rollout(task, box, policy, "fake-agent"),
                                     rollout(task, box, thrower, "fake-agent")])
            if expect is None:
                (done,) = await gather_trajectory_groups([group], max_exceptions=max_exceptions, pbar_desc=None)
                assert len(done) == 1 and len(done.exceptions) == 1 and thrower.calls == 2
                assert "crashed mid-rollout" in done.exceptions[0].message
            else:
                with pytest.raises(TooManyExceptions, match="1 of 2 rollouts raised"):
                    await gather_trajectory_groups([group], max_exceptions=max_exceptions, pbar_desc=None)


async def test_a_server_that_dies_mid_rollout_raises_naming_it_and_gather_counts_it(judge):
    policy = AsyncOpenAI(base_url=judge.base, api_key="sk-test", max_retries=0)
    judge.script = [{"tool_calls": [call(1, "die", {})]}]
    async with MCPToolbox(FAULTS, env=ENV, tool_timeout=20) as box:
        group = TrajectoryGroup([rollout(MCPTask(id="t", task="Run the die tool."), box, policy, "fake-agent")])
        (done,) = await gather_trajectory_groups([group], max_exceptions=1, pbar_desc=None)
        assert len(done) == 0 and len(done.exceptions) == 1 and "MCPServerError" in done.exceptions[0].type
        assert "closed the connection during a call of die" in done.exceptions[0].message
        assert "the index is corrupt" in done.exceptions[0].message
        with pytest.raises(MCPServerError, match="closed the connection during a call of echo") as err:
            await box.call("echo", {"text": "anyone?"})
    assert "the index is corrupt" in str(err.value) and "mcp_fault_server.py" in str(err.value)


async def test_a_task_writer_that_returns_junk_fails_clearly_after_its_attempts(writer):
    writer.script = ["prose", {"content": "[1, 2, 3]"},
                     reply([{"task": "Search", "tools": ["search_emails"]}, "not an object",
                            {"task": "Read the email about the merger please.", "tools": ["rm_rf"]}])]
    with pytest.raises(TaskWriterError) as err:
        await write_tasks(TOOLS, "openai/task-writer", n=2, params=writer.params, max_attempts=3)
    msg = str(err.value)
    assert "gave 0 valid tasks of the 2 asked for after 3 attempt(s)" in msg
    assert "reply is not JSON with a tasks list: 2" in msg and "not an object: 1" in msg
    assert err.value.report.rejected["tools missing or naming a tool the server does not have"] == 1
    assert len(writer.requests) == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 0}, "n must be an integer"),
    ({"n": 1, "test_fraction": 0.5}, "leaves no training task"),
    ({"n": 4, "test_fraction": 1.0}, "test_fraction"),
    ({"n": 4, "max_attempts": 0}, "max_attempts"),
])
async def test_write_tasks_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        await write_tasks(TOOLS, "openai/task-writer", **kwargs)
    with pytest.raises(ValueError, match="OpenAI tool schemas"):
        await write_tasks([], "openai/task-writer", n=2)
    with pytest.raises(ValueError, match="guidance"):
        await write_tasks(TOOLS, "openai/task-writer", n=2, guidance=["not", "text"])
    with pytest.raises(ValueError, match="resources"):
        await write_tasks(TOOLS, "openai/task-writer", n=2, resources="faults://runbook")


def test_toolbox_and_schema_conversion_refuse_bad_input():
    with pytest.raises(ValueError, match="exactly one of server"):
        MCPToolbox()
    with pytest.raises(ValueError, match="exactly one of server"):
        MCPToolbox("x", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="http"):
        MCPToolbox(url="ftp://x")
    with pytest.raises(ValueError, match="cannot be split"):
        MCPToolbox("python 'unclosed")
    with pytest.raises(ValueError, match="tool_timeout"):
        MCPToolbox("python", tool_timeout=0)
    with pytest.raises(ValueError, match="not a valid function name"):
        openai_tool_schema({"name": "fs.read", "inputSchema": {"type": "object"}})
    assert openai_tool_schema({"name": "ping"})["function"]["parameters"] == {"type": "object", "properties": {}}
    with pytest.raises(ValueError, match="tool_choice must be"):
        MCPRLConfig(tool_choice="sometimes")
    with pytest.raises(ValueError, match="tool_choice must be"):
        MCPRLConfig(tool_choice={"type": "function", "function": {}})
    assert MCPRLConfig().tool_choice == "auto"


async def test_rollout_refuses_a_tool_choice_naming_no_tool_of_the_server(judge):
    policy = AsyncOpenAI(base_url=judge.base, api_key="sk-test", max_retries=0)
    async with MCPToolbox(FAULTS, tool_timeout=5) as box:
        with pytest.raises(ValueError, match="names 'search_emails', which is not a tool of the server"):
            await rollout(MCPTask(id="t", task="Echo hi."), box, policy, "fake-agent",
                          tool_choice={"type": "function", "function": {"name": "search_emails"}})
        judge.script = [{"tool_calls": [call(1, "echo", {"text": "hi"})]}, {"content": "said hi"}]
        t = await rollout(MCPTask(id="t", task="Echo hi."), box, policy, "fake-agent", tool_choice="required")
    # the first turn carries the forced choice, later turns are "auto" so the agent can answer
    assert [r["tool_choice"] for r in judge.requests] == ["required", "auto"] and t.metrics["answered"] is True


# ---- what the client reads is bounded ------------------------------------------------------------------------


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


async def test_a_50_mb_tool_result_is_not_read_over_stdio_and_the_call_ends_with_an_error():
    async with MCPToolbox(FAULTS, env=ENV, tool_timeout=60) as box:
        before = rss()
        result = await box.call("huge", {"megabytes": 50})
        assert result.is_error and "over 1,048,576 bytes; MCP·RL stopped reading it" in result.text
        assert rss() - before < 40 * 2**20  # the 50 MB never reached this process
        small = await box.call("huge", {"megabytes": 0})  # and the session goes on
        assert not small.is_error
        fits = await box.call("echo", {"text": "y" * 20000})
        assert fits.text.startswith("echo: yyy") and "[... cut:" in fits.text  # under the limit: cut as before


@pytest.fixture
def faults_over_http():
    with over_http(FAULTS_SCRIPT) as url:
        yield url


async def test_a_50_mb_tool_result_is_cut_off_over_streamable_http(faults_over_http):
    async with MCPToolbox(url=faults_over_http, tool_timeout=60, max_message_bytes=64 * 1024) as box:
        before = rss()
        result = await box.call("huge", {"megabytes": 50})
        assert result.is_error and "over 65,536 bytes; MCP·RL stopped reading it" in result.text
        assert rss() - before < 40 * 2**20
        assert (await box.call("echo", {"text": "still here"})).text == "echo: still here"


async def test_a_server_that_floods_its_stderr_leaves_only_the_end_of_it():
    async with MCPToolbox(FAULTS, env=ENV, tool_timeout=60) as box:
        before = rss()
        assert (await box.call("shout", {"megabytes": 30})).text == "shouted"
        tail = box.stderr_tail()
        assert tail.endswith("last words") and len(tail) <= 2000
        assert rss() - before < 20 * 2**20 and len(box._errlog._kept) <= STDERR_KEEP_BYTES  # kept: the end only


def test_the_loops_module_still_offers_the_names_the_readme_imports_from_it():
    import ruler_rl.trainer.mcp_rl as loop

    assert (loop.MCPToolbox, loop.write_tasks) == (MCPToolbox, write_tasks)
    assert {"MCPRLConfig", "MCPToolbox", "train_mcp_rl", "write_tasks"} <= set(loop.__all__)
