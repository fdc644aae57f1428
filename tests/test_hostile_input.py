"""Hostile input: a corpus of bad inputs over the library, the command line and the judging service.

Each case states its exact outcome (exception type and message, exit code and the one error line, or
status code and the field named in the detail) and that nothing reached the judge. Then the attacks
that need more than one request: reading the server's files through a rubric, a poisoned job, cancel,
chunked bodies, a judge that never answers.
"""

import asyncio
import json
import math
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pydantic
import pytest
import uvicorn
from openai.types.chat.chat_completion import Choice
from typer.testing import CliRunner

from ruler_rl import RetryPolicy, Trajectory, TrajectoryGroup, ruler, ruler_score_group
from ruler_rl.cli import app as cli
from ruler_rl.errors import JudgeConfigError, JudgeUnavailableError, TrajectoryError
from ruler_rl.service.app import ServiceConfig, create_app
from ruler_rl.service.connections import ConnectionLimits, uvicorn_options
from ruler_rl.service.store import Store
from ruler_rl.testing import SilentJudge, free_port
from ruler_rl.trajectory import Limits, group_from_data, validate_trajectories
from tests.helpers import SYSTEM, USER, convo

MODEL = "openai/fake-judge"
FAST = RetryPolicy(attempts=2, initial_wait=0.01, max_wait=0.05, timeout=10)
SECRET = "MARKER-7f3a-the-server-must-never-read-this"
CALL = {"id": "c1", "type": "function", "function": {"name": "search_inbox", "arguments": '{"q": "budget"}'}}


# --- building blocks ---------------------------------------------------------------------------

def msgs(*extra: dict, answer: str = "GOOD done") -> list[dict]:
    return [SYSTEM, USER, *extra, {"role": "assistant", "content": answer}]


def traj(messages=None, **fields) -> dict:
    """A trajectory as JSON data (what a file or a request holds)."""
    return {"messages_and_choices": msgs() if messages is None else messages, **fields}


def nested(depth: int):
    value: object = "deep"
    for _ in range(depth):
        value = {"k": value}
    return value


POISON = msgs({"role": "assistant", "content": None, "tool_calls": "search_inbox(q='budget')"},
              {"role": "tool", "tool_call_id": "c1", "content": "3 emails"})
NO_NAME = msgs({"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "3 emails"})
NO_CALL_ID = msgs({"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "content": "3 emails"})
DEEP_ARGS = msgs({"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "search_inbox", "arguments": nested(40)}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "none"})

# (case id, trajectories as JSON data, what a message about it says); shared by all three surfaces
BAD_GROUPS = [
    ("tool_calls-is-a-string", [traj(POISON), traj()],
     "trajectory 1, message 3: tool_calls must be a list of tool calls, got str"),
    ("tool-call-without-name", [traj(NO_NAME), traj()],
     "trajectory 1, message 3: tool_calls[0].function.name is missing"),
    ("tool-message-without-tool_call_id", [traj(), traj(NO_CALL_ID)],
     "trajectory 2, message 4: a tool message needs a tool_call_id"),
    ("misspelled-message-field", [traj(msgs({"role": "user", "contents": "more"})), traj()],
     "trajectory 1, message 3: unknown field 'contents' (did you mean 'content'?) in a message"),
    ("tool-calls-on-a-user-message", [traj(msgs({"role": "user", "content": "x", "tool_calls": [CALL]})), traj()],
     "trajectory 1, message 3: only assistant messages make tool calls, not user messages"),
    ("unknown-role", [traj(msgs({"role": "robot", "content": "beep"})), traj()],
     "trajectory 1, message 3: unknown role 'robot'"),
    ("missing-role", [traj(), traj(msgs({"content": "who am I"}))], "trajectory 2, message 3: role is missing"),
    ("role-is-a-list", [traj(msgs({"role": ["user"], "content": "x"})), traj()],
     "trajectory 1, message 3: unknown role ['user']"),
    ("text-part-not-a-string", [traj(msgs({"role": "user", "content": [{"type": "text", "text": 5}]})), traj()],
     "trajectory 1, message 3: content[0].text must be a string"),
    ("content-is-a-number", [traj(msgs({"role": "user", "content": 42})), traj()],
     "trajectory 1, message 3: content must be a string, a list of content parts or null, got int"),
    ("user-message-without-content", [traj(msgs({"role": "user"})), traj()],
     "trajectory 1, message 3: a user message needs content"),
    ("empty-conversation", [traj([]), traj()], "trajectory 1: the conversation has no messages"),
    ("args-nested-40-deep", [traj(DEEP_ARGS), traj()],
     "trajectory 1, message 3: value nested more than 32 levels deep"),
    ("nan-reward", [traj(), traj(reward=float("nan"))], "trajectory 2: reward is nan: rewards must be finite numbers"),
    ("infinite-reward", [traj(reward=float("inf")), traj()], "trajectory 1: reward is inf"),
    ("nan-metric", [traj(metrics={"turns": float("nan")}), traj()], "trajectory 1: metrics['turns'] is nan"),
    ("infinite-metadata", [traj(), traj(metadata={"score": float("-inf")})], "trajectory 2: metadata['score'] is -inf"),
    ("invalid-choice", [traj(msgs({"index": 0, "finish_reason": "exploded", "message": {"role": "assistant"}})), traj()],
     "trajectory 1, message 3: not a valid Choice: finish_reason"),
]
BAD_IDS = [c[0] for c in BAD_GROUPS]


def group_of(items: list[dict]) -> TrajectoryGroup:
    return TrajectoryGroup([Trajectory.model_validate(t) for t in items])


# --- the library ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case,items,message", BAD_GROUPS, ids=BAD_IDS)
async def test_library_rejects_bad_groups_before_the_judge(judge, case, items, message):
    with pytest.raises(TrajectoryError) as info:
        await ruler_score_group(group_of(items), MODEL, judge.params, retry=FAST)
    assert message in str(info.value)
    assert judge.requests == []


def ok_group() -> TrajectoryGroup:
    return group_of([traj(msgs(answer="GOOD a")), traj(msgs(answer="BAD b"))])


def call(**options):
    """A library call with one option (or argument) replaced."""
    args = {"group": ok_group(), "judge_model": MODEL, "params": None, "rubric": "default"}
    args.update({k: options.pop(k) for k in list(options) if k in args})

    async def run(judge):
        params = args["params"] if args["params"] is not None else judge.params
        return await ruler_score_group(args["group"], args["judge_model"], params, args["rubric"],
                                       retry=options.pop("retry", FAST), **options)
    return run


LIBRARY_OPTIONS = [
    ("empty-judge-model", call(judge_model=""), JudgeConfigError, "judge_model is an empty string"),
    ("blank-judge-model", call(judge_model="   "), JudgeConfigError, "judge_model is an empty string"),
    ("judge-model-a-number", call(judge_model=123), JudgeConfigError, "judge_model must be a litellm model string"),
    ("k-a-million", call(num_permutations=10**6), ValueError, "num_permutations must be an integer from 1 to 32"),
    ("k-zero", call(num_permutations=0), ValueError, "num_permutations must be an integer from 1 to 32, got 0"),
    ("k-a-bool", call(num_permutations=True), ValueError, "num_permutations must be an integer"),
    ("max-prompt-tokens-zero", call(max_prompt_tokens=0), ValueError, "max_prompt_tokens must be None or an integer from 256"),
    ("max-prompt-tokens-negative", call(max_prompt_tokens=-5), ValueError, "got -5"),
    ("rubric-absolute-path", call(rubric="/etc/passwd"), JudgeConfigError, "looks like a file path; files are not read"),
    ("rubric-missing-file-with-space", call(rubric="my rubrics/strict.txt"), JudgeConfigError, "looks like a file path"),
    ("rubric-home-path", call(rubric="~/.ssh/id_rsa"), JudgeConfigError, "looks like a file path"),
    ("rubric-unknown-word", call(rubric="strictest"), JudgeConfigError, "unknown rubric 'strictest'"),
    ("rubric-too-long", call(rubric="Be fair. " * 2500), JudgeConfigError, "rubric text has 22,500 characters"),
    ("rubric-not-a-string", call(rubric=5), JudgeConfigError, "rubric must be a string"),
    ("params-not-a-dict", call(params="api_base=x"), JudgeConfigError, "extra_litellm_params must be a dict"),
    ("max-format-retries-negative", call(max_format_retries=-1), ValueError, "max_format_retries must be an integer from 0"),
    ("limits-not-limits", call(limits={"max_trajectories": 9}), TypeError, "limits must be a ruler_rl.trajectory.Limits"),
    ("tools-not-dicts", lambda judge: ruler([convo("a"), convo("b")], MODEL, judge.params, tools=["search"]),
     TypeError, "tools must be a list of tool schemas"),
    ("not-a-group", call(group=[traj()]), TypeError, "ruler_score_group takes a TrajectoryGroup"),
    ("too-many-trajectories", call(limits=Limits(max_trajectories=1)), TrajectoryError,
     "2 trajectories; the limit is 1 per group"),
    ("message-too-long", call(limits=Limits(max_message_chars=20)), TrajectoryError,
     "trajectory 1, message 1: message has 68 characters; the limit is 20"),
    ("too-many-messages", call(limits=Limits(max_messages=2)), TrajectoryError, "3 messages; the limit is 2 per conversation"),
]


@pytest.mark.parametrize("case,run,exc_type,message", LIBRARY_OPTIONS, ids=[c[0] for c in LIBRARY_OPTIONS])
async def test_library_rejects_bad_options_at_once(judge, case, run, exc_type, message):
    started = time.monotonic()
    with pytest.raises(exc_type) as info:
        await run(judge)
    assert message in str(info.value)
    assert judge.requests == [] and time.monotonic() - started < 2


@pytest.mark.parametrize("make,exc_type,message", [
    (lambda: RetryPolicy(attempts=0), JudgeConfigError, "RetryPolicy.attempts must be an integer from 1 to 20"),
    (lambda: RetryPolicy(deadline=float("nan")), JudgeConfigError, "RetryPolicy.deadline must be a finite number"),
    (lambda: Limits(max_messages=0), ValueError, "Limits.max_messages must be an integer >= 1"),
    (lambda: Trajectory.model_validate(traj(tool=[])), pydantic.ValidationError, "Extra inputs are not permitted"),
    (lambda: group_from_data([traj(tool=[])]), ValueError, "trajectory 1: unknown field 'tool' (did you mean 'tools'?)"),
    (lambda: group_from_data({"trajectories": [traj()], "metdata": {}}), ValueError,
     "unknown field 'metdata' (did you mean 'metadata'?) in the group object"),
    (lambda: validate_trajectories(TrajectoryGroup([Trajectory.model_validate(traj())], metadata={"x": math.nan})),
     TrajectoryError, "the group: metadata['x'] is nan"),
    (lambda: validate_trajectories("not trajectories"), TypeError, "expected trajectories or a TrajectoryGroup"),
    (lambda: asyncio.run(ruler("convo", MODEL)), TypeError, "message_lists must be a list of message lists"),
], ids=["retry-attempts-0", "retry-deadline-nan", "limits-0", "model-unknown-field", "file-unknown-field",
        "group-unknown-field", "group-metadata-nan", "validate-a-string", "ruler-a-string"])
def test_library_constructors_and_loaders_name_the_problem(make, exc_type, message):
    with pytest.raises(exc_type) as info:
        make()
    assert message in str(info.value)


def test_a_json_file_nested_100000_deep_is_an_error_not_a_recursion_crash(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"trajectories": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ValueError, match="JSON nested too deeply to read"):
        TrajectoryGroup.load(path)


def test_choices_with_inference_server_fields_pass_validation_and_round_trip():
    choice = Choice.model_validate({
        "index": 0, "finish_reason": "stop", "logprobs": None, "stop_reason": None,
        "message": {"role": "assistant", "content": "GOOD answer", "tool_calls": [CALL]},
        "prompt_token_ids": [1, 2, 3], "token_ids": [4, 5], "token_logprobs": [-0.1, -0.2],
        "provider_specific_fields": {"token_ids": [4, 5]},
    })
    group = TrajectoryGroup([Trajectory(messages_and_choices=[SYSTEM, USER, choice]),
                             Trajectory(messages_and_choices=convo("BAD"))])
    validate_trajectories(group)
    back = TrajectoryGroup.model_validate_json(group.model_dump_json())
    validate_trajectories(back)
    assert back.trajectories[0].messages_and_choices[-1].model_extra["token_ids"] == [4, 5]


def test_art_only_fields_are_accepted_and_ignored():
    t = Trajectory.model_validate(traj(initial_policy_version=3, final_policy_version=4, auto_metrics={"x": 1}))
    assert "initial_policy_version" not in t.model_dump()


async def test_a_judge_of_unknown_context_gets_a_bounded_prompt_with_a_note(judge):
    """litellm knows nothing of this judge: the prompt is kept under UNKNOWN_CONTEXT_TOKENS, and the notes say so."""
    huge = group_of([traj(msgs(answer="GOOD " + "lorem ipsum " * 80_000)), traj(msgs(answer="BAD b"))])
    scored = await ruler_score_group(huge, MODEL, judge.params, retry=FAST, cache=False)
    assert [t.reward for t in scored] == [0.9, 0.1]
    assert len(judge.requests[0]["messages"][-1]["content"]) < 4 * 131_072
    assert any("litellm does not know this judge's context: 131072 tokens assumed" in line
               for line in scored.trajectories[0].logs)


async def test_a_silent_judge_fails_within_the_deadline():
    with SilentJudge() as silent:
        started = time.monotonic()
        with pytest.raises(JudgeUnavailableError, match="gave no answer within the 1.5 s deadline"):
            await ruler_score_group(ok_group(), MODEL, silent.params, cache=False,
                                    retry=RetryPolicy(attempts=5, initial_wait=0.05, deadline=1.5))
        assert time.monotonic() - started < 3


# --- the command line ----------------------------------------------------------------------------

runner = CliRunner()
ENV = {"OPENAI_API_KEY": "sk-test"}


def write(tmp_path: Path, content, name: str = "group.json") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))  # NaN and Infinity are written as the JSON extensions Python reads
    return path


def assert_one_line_error(res, code: int, message: str) -> None:
    assert res.exit_code == code, res.output
    assert message in res.stderr, res.stderr
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.output


@pytest.mark.parametrize("case,items,message", BAD_GROUPS, ids=BAD_IDS)
def test_cli_rejects_bad_groups_with_one_line(tmp_path, judge, case, items, message):
    path = write(tmp_path, {"trajectories": items})
    res = runner.invoke(cli, ["score", str(path), "--judge", MODEL, "--api-base", judge.base], env=ENV)
    assert_one_line_error(res, 2, f"{path}: {message}")
    assert judge.requests == []


GOOD_FILE = {"trajectories": [traj(msgs(answer="GOOD a")), traj(msgs(answer="BAD b"))]}


def rubric_file(tmp_path: Path, content: bytes | None) -> str:
    if content is None:
        (tmp_path / "rubrics").mkdir()
        return str(tmp_path / "rubrics")
    return str(write(tmp_path, content, "rubric.txt"))


CLI_SCORE = [
    ("missing-file", None, [], 2, "no such group file"),
    ("a-folder", "folder", [], 2, "is a folder, not a group file"),
    ("not-utf8", b"\xff\xfe{}", [], 2, "is not valid UTF-8"),
    ("not-json", "{trajectories: ", [], 2, "not valid JSON"),
    ("empty-file", "", [], 2, "not valid JSON: Expecting value"),
    ("json-100000-deep", "[" * 100_000 + "]" * 100_000, [], 2, "JSON nested too deeply to read"),
    ("zero-trajectories", {"trajectories": []}, [], 2, "holds no trajectories: nothing to score"),
    ("empty-list", [], [], 2, "holds no trajectories: nothing to score"),
    ("misspelled-tools", {"trajectories": [traj(tool=[]), traj()]}, [], 2,
     "trajectory 1: unknown field 'tool' (did you mean 'tools'?)"),
    ("misspelled-group-key", {"trajectories": [traj()], "metdata": {}}, [], 2, "unknown field 'metdata'"),
    ("message-over-1M-chars", {"trajectories": [traj(msgs(answer="x" * 1_000_001)), traj()]}, [], 2,
     "trajectory 1, message 3: message has 1,000,001 characters; the limit is 1,000,000"),
    ("257-trajectories", {"trajectories": [traj()] * 257}, [], 2, "257 trajectories; the limit is 256 per group"),
    ("empty-judge", GOOD_FILE, ["--judge", ""], 2, "Invalid value for --judge: must not be empty"),
    ("blank-judge", GOOD_FILE, ["--judge", "  "], 2, "Invalid value for --judge: must not be empty"),
    ("unknown-judge", GOOD_FILE, ["--judge", "bogus-provider-q/x"], 2, "unknown judge model 'bogus-provider-q/x'"),
    ("empty-api-base", GOOD_FILE, ["--api-base", ""], 2, "Invalid value for --api-base: must not be empty"),
    ("ftp-api-base", GOOD_FILE, ["--api-base", "ftp://judge"], 2, "'ftp://judge' is not an http(s) URL"),
    ("k-a-million", GOOD_FILE, ["-k", "1000000"], 2, "Invalid value for '--permutations' / '-k'"),
    ("k-zero", GOOD_FILE, ["-k", "0"], 2, "Invalid value for '--permutations' / '-k'"),
    ("k-not-a-number", GOOD_FILE, ["-k", "many"], 2, "Invalid value for '--permutations' / '-k'"),
    ("timeout-zero", GOOD_FILE, ["--timeout", "0"], 2, "Invalid value for '--timeout'"),
    ("timeout-nan", GOOD_FILE, ["--timeout", "nan"], 2, "Invalid value for '--timeout'"),
    ("retries-negative", GOOD_FILE, ["--retries", "-1"], 2, "Invalid value for '--retries'"),
    ("max-prompt-tokens-zero", GOOD_FILE, ["--max-prompt-tokens", "0"], 2, "Invalid value for '--max-prompt-tokens'"),
    ("rubric-missing-file-with-space", GOOD_FILE, ["--rubric", "my rubrics/strict.txt"], 2,
     "unknown rubric 'my rubrics/strict.txt': not a rubric name"),
    ("rubric-unknown-name", GOOD_FILE, ["--rubric", "strictest"], 2, "unknown rubric 'strictest'"),
    ("rubric-a-folder", GOOD_FILE, ["--rubric", None], 2, "is not a file"),
    ("rubric-empty-file", GOOD_FILE, ["--rubric", b"  \n"], 2, "is empty"),
    ("rubric-not-utf8", GOOD_FILE, ["--rubric", b"\xff\xfe rubric"], 2, "is not valid UTF-8"),
    ("rubric-file-100kB", GOOD_FILE, ["--rubric", b"Be fair. " * 11_112], 2,
     "is 100,008 bytes; the limit is 20,000 characters"),
    ("unknown-option", GOOD_FILE, ["--judje", MODEL], 2, "No such option: --judje"),
]


@pytest.mark.parametrize("case,content,args,code,message", CLI_SCORE, ids=[c[0] for c in CLI_SCORE])
def test_cli_score_errors_are_one_line(tmp_path, judge, case, content, args, code, message):
    if content is None:
        path = tmp_path / "nowhere.json"
    elif content == "folder":
        path = tmp_path
    else:
        path = write(tmp_path, content)
    args = [rubric_file(tmp_path, a) if i and args[i - 1] == "--rubric" and not isinstance(a, str) else a
            for i, a in enumerate(args)]
    defaults = [] if any(a in args for a in ("--judge", "--judje")) else ["--judge", MODEL]
    defaults += [] if "--api-base" in args else ["--api-base", judge.base]
    started = time.monotonic()
    res = runner.invoke(cli, ["score", str(path), *defaults, *args], env=ENV)
    assert_one_line_error(res, code, message)
    assert judge.requests == [] and time.monotonic() - started < 5


def sqlite_junk(tmp_path: Path) -> str:
    return str(write(tmp_path, "this is not a database\n", "junk.db"))


def bad_rubric_dir(tmp_path: Path) -> str:
    folder = tmp_path / "rubrics"
    folder.mkdir()
    (folder / "Bad Name.txt").write_text("Be strict.")
    return str(folder)


CLI_OTHER = [
    ("keys-create-empty-name", lambda p: ["keys", "create", "", "--db", str(p / "k.db")], 2, "a key needs a name"),
    ("keys-create-blank-name", lambda p: ["keys", "create", "   ", "--db", str(p / "k.db")], 2, "a key needs a name"),
    ("keys-create-db-is-a-folder", lambda p: ["keys", "create", "team", "--db", str(p)], 2,
     "is a folder; give a file path"),
    ("keys-list-db-not-sqlite", lambda p: ["keys", "list", "--db", sqlite_junk(p)], 2, "is not a SQLite database"),
    ("keys-revoke-unknown", lambda p: ["keys", "revoke", "nope", "--db", str(p / "k.db")], 2, "no active key with id 'nope'"),
    ("serve-port-70000", lambda p: ["serve", "--port", "70000", "--db", str(p / "s.db")], 2, "Invalid value for '--port'"),
    ("serve-port-0", lambda p: ["serve", "--port", "0", "--db", str(p / "s.db")], 2, "Invalid value for '--port'"),
    ("serve-db-is-a-folder", lambda p: ["serve", "--db", str(p)], 2, "is a folder; give a file path"),
    ("serve-db-not-sqlite", lambda p: ["serve", "--db", sqlite_junk(p)], 2, "is not a SQLite database"),
    ("serve-empty-judge", lambda p: ["serve", "--judge", "", "--db", str(p / "s.db")], 2,
     "Invalid value for --judge: must not be empty"),
    ("serve-rubric-dir-missing", lambda p: ["serve", "--rubric-dir", str(p / "none"), "--db", str(p / "s.db")], 2,
     "is not a folder"),
    ("serve-rubric-dir-bad-name", lambda p: ["serve", "--rubric-dir", bad_rubric_dir(p), "--db", str(p / "s.db")], 2,
     "rubric file Bad Name.txt: a rubric name is lower-case letters"),
    ("serve-k-cap-100", lambda p: ["serve", "--max-permutations", "100", "--db", str(p / "s.db")], 2,
     "Invalid value for '--max-permutations'"),
    ("serve-body-limit-0", lambda p: ["serve", "--max-body-mb", "0", "--db", str(p / "s.db")], 2,
     "Invalid value for '--max-body-mb'"),
    ("art-e-db-not-sqlite", lambda p: ["eval", "art-e", "--db", sqlite_junk(p), "--questions", "1"], 2,
     "is not a SQLite database"),
    ("art-e-db-is-a-folder", lambda p: ["eval", "art-e", "--db", str(p), "--questions", "1"], 2, "is a folder"),
    ("art-e-empty-judge", lambda p: ["eval", "art-e", "--db", sqlite_junk(p), "--judge", ""], 2,
     "--judge must not be empty"),
    ("demo-empty-judge", lambda p: ["demo", "--judge", ""], 2, "Invalid value for --judge: must not be empty"),
    ("unknown-command", lambda p: ["scroe"], 2, "No such command 'scroe'"),
    ("train-report-missing-run", lambda p: ["train-report", str(p / "none")], 2, "no run log"),
]


@pytest.mark.parametrize("case,make_args,code,message", CLI_OTHER, ids=[c[0] for c in CLI_OTHER])
def test_cli_other_commands_errors_are_one_line(tmp_path, case, make_args, code, message):
    res = runner.invoke(cli, make_args(tmp_path), env=ENV)
    assert_one_line_error(res, code, message)


def test_cli_silent_judge_fails_within_timeout(tmp_path):
    path = write(tmp_path, GOOD_FILE)
    with SilentJudge() as silent:
        started = time.monotonic()
        res = runner.invoke(cli, ["score", str(path), "--judge", MODEL, "--api-base", silent.base, "--no-cache",
                                  "--timeout", "1.5", "--retries", "3"], env=ENV)
        elapsed = time.monotonic() - started
    assert_one_line_error(res, 1, "gave no answer within the 1.5 s deadline for one call")
    assert elapsed < 4


def test_cli_score_gives_a_silent_judge_three_minutes_by_default(tmp_path, monkeypatch):
    """Not the ten minutes of an HTTP client's default: the deadline `_score` hands the judge call."""
    import ruler_rl.cli as cli_module

    asked = {}

    def fake_score(group, judge, api_base, rubric, cache, permutations, timeout, retries, max_prompt_tokens):
        asked.update(timeout=timeout)
        raise JudgeUnavailableError("judge gave no answer")

    monkeypatch.setattr(cli_module, "_score", fake_score)
    res = runner.invoke(cli, ["score", str(write(tmp_path, GOOD_FILE)), "--judge", MODEL], env=ENV)
    assert res.exit_code == 1 and asked == {"timeout": 180.0}
    assert "180" in runner.invoke(cli, ["score", "--help"], env=ENV).output


@pytest.mark.parametrize("retries,code", [(0, 1), (1, 0)])
def test_cli_retries_flag_sets_the_attempts(tmp_path, judge, retries, code):
    judge.script = ["503"]
    path = write(tmp_path, GOOD_FILE)
    res = runner.invoke(cli, ["score", str(path), "--judge", MODEL, "--api-base", judge.base, "--no-cache",
                              "--retries", str(retries)], env=ENV)
    assert res.exit_code == code and len(judge.requests) == retries + 1
    if code:
        assert_one_line_error(res, 1, "still failing after 1 attempt(s)")


def test_cli_max_prompt_tokens_flag_cuts_the_prompt(tmp_path, judge):
    long = {"trajectories": [traj(msgs(answer="GOOD " + "word " * 20_000 + "the end")), traj()]}
    path = write(tmp_path, long)
    res = runner.invoke(cli, ["score", str(path), "--judge", MODEL, "--api-base", judge.base, "--no-cache",
                              "--max-prompt-tokens", "2000"], env=ENV)
    assert res.exit_code == 0, res.output
    sent = judge.requests[0]["messages"][-1]["content"]
    assert "characters cut to fit the judge's context" in sent and len(sent) < 10_000


def test_cli_debug_shows_the_traceback(tmp_path):
    res = runner.invoke(cli, ["--debug", "keys", "create", "", "--db", str(tmp_path / "k.db")], env=ENV)
    assert res.exit_code == 1 and isinstance(res.exception, ValueError) and "a key needs a name" in str(res.exception)


def test_cli_json_output_is_strict_json(tmp_path, judge):
    path = write(tmp_path, GOOD_FILE)
    res = runner.invoke(cli, ["score", str(path), "--judge", MODEL, "--api-base", judge.base, "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))
    assert [s["score"] for s in out["scores"]] == [0.9, 0.1]


# --- the service ---------------------------------------------------------------------------------

class Service:
    """The service on loopback in a thread, served as `ruler serve` serves it (`uvicorn_options`), with
    `limits` (the defaults unless given) or, with `plain=True`, uvicorn's own protocol as it was before them."""

    def __init__(self, cfg: ServiceConfig, limits: ConnectionLimits | None = None, *, plain: bool = False):
        self.cfg = cfg
        self.port = free_port()
        options = {"limit_concurrency": 1024, "timeout_keep_alive": 5} if plain else \
            uvicorn_options(limits or ConnectionLimits())
        self.server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1", port=self.port,
                                                    log_level="critical", **options))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        self.base = f"http://127.0.0.1:{self.port}"
        self.store = Store(cfg.db_path)
        self.key = self.store.create_key("tests")[0]
        self.headers = {"Authorization": f"Bearer {self.key}"}

    def get(self, path: str) -> httpx.Response:
        """A GET on a connection of its own (a kept-alive one could be closed by the connection limits)."""
        return httpx.get(f"{self.base}{path}", timeout=30, headers={**self.headers, "Connection": "close"})

    def post(self, path: str, body, headers: dict | None = None, **kw) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(f"{self.base}{path}", content=content, timeout=30,
                          headers={"content-type": "application/json", **self.headers, **(headers or {})}, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


ALLOWED_API_BASE = "http://127.0.0.1:9/v1"


def service_config(tmp_path: Path, judge, **overrides) -> ServiceConfig:
    rubrics = tmp_path / "rubrics"
    rubrics.mkdir(exist_ok=True)
    (rubrics / "house-style.txt").write_text("- Answers must cite the email they come from.\n")
    (rubrics / "one-word.txt").write_text("Correctness")  # rubric text that reads like a name ...
    (rubrics / "doc-ref.md").write_text("Follow policy.md")  # ... or like a path: text all the same
    return ServiceConfig(**{"db_path": str(tmp_path / "svc.db"), "judge_model": MODEL, "judge_params": judge.params,
                            "cache": False, "max_trajectories": 8, "max_messages": 16, "max_message_chars": 4000,
                            "max_body_bytes": 1_000_000, "rubric_dir": str(rubrics), "max_prompt_tokens": 100_000,
                            "allowed_api_bases": [ALLOWED_API_BASE], **overrides})


@pytest.fixture(scope="module")
def svc(tmp_path_factory, _judge_server):
    service = Service(service_config(tmp_path_factory.mktemp("svc"), _judge_server))
    yield service
    service.stop()


def body(items=None, **options) -> dict:
    return {"trajectories": items if items is not None else GOOD_FILE["trajectories"], **options}


def raw(text: str) -> bytes:
    return text.encode()


SERVICE_CASES = [
    ("rubric-etc-passwd", body(rubric="/etc/passwd"), 422, ["body", "rubric"], "looks like a file path"),
    ("rubric-proc-environ", body(rubric="/proc/self/environ"), 422, ["body", "rubric"], "files are not read here"),
    ("rubric-file-url", body(rubric="file:///etc/passwd"), 422, ["body", "rubric"], "looks like a file path"),
    ("rubric-traversal", body(rubric="../../../etc/passwd"), 422, ["body", "rubric"], "looks like a file path"),
    ("rubric-home", body(rubric="~/.aws/credentials"), 422, ["body", "rubric"], "looks like a file path"),
    ("rubric-relative-no-slash-prefix", body(rubric="proc/self/environ"), 422, ["body", "rubric"],
     "unknown rubric 'proc/self/environ'"),
    ("rubric-too-long", body(rubric="Be fair. " * 2500), 422, ["body", "rubric"], "at most 20000 characters"),
    ("judge-not-offered", body(judge_model="openai/gpt-4o"), 422, ["body", "judge_model"], "is not offered here"),
    ("judge-empty", body(judge_model=""), 422, ["body", "judge_model"], "at least 1 character"),
    ("api-base-not-allowed", body(api_base="http://169.254.169.254/latest"), 422, ["body", "api_base"],
     "is not allowed here"),
    ("k-a-million", body(num_permutations=10**6), 422, ["body", "num_permutations"], "less than or equal to 32"),
    ("k-over-service-cap", body(num_permutations=9), 422, ["body", "num_permutations"], "at most 8 orderings here"),
    ("k-a-bool", body(num_permutations=True), 422, ["body", "num_permutations"], "valid integer"),
    ("k-a-string", body(num_permutations="3"), 422, ["body", "num_permutations"], "valid integer"),
    ("max-prompt-tokens-zero", body(max_prompt_tokens=0), 422, ["body", "max_prompt_tokens"], "greater than or equal to 256"),
    ("max-prompt-tokens-over-service-cap", body(max_prompt_tokens=200_000), 422, ["body", "max_prompt_tokens"],
     "at most 100000 here"),
    ("misspelled-option", body(rubic="efficiency"), 422, ["body", "rubic"], "unknown field 'rubic' (did you mean 'rubric'?)"),
    ("misspelled-tools", body([traj(tool=[]), traj()]), 422, ["body", "trajectories", 0, "tool"],
     "unknown field 'tool' (did you mean 'tools'?)"),
    ("empty-group", body([]), 422, ["body", "trajectories"], "a group needs at least one trajectory"),
    ("too-many-trajectories", body([traj()] * 9), 422, ["body", "trajectories"], "9 trajectories; the limit is 8"),
    ("too-many-messages", body([traj(msgs(*[USER] * 15)), traj()]), 422,
     ["body", "trajectories", 0, "messages_and_choices"], "18 messages; the limit is 16 per conversation"),
    ("message-too-long", body([traj(msgs(answer="x" * 4001)), traj()]), 422,
     ["body", "trajectories", 0, "messages_and_choices", 2, "content"], "message has 4,001 characters; the limit is 4,000"),
    ("nan-reward-literal", raw('{"trajectories": [{"messages_and_choices": [{"role": "user", "content": "q"}], '
                               '"reward": NaN}]}'), 422, ["body", "trajectories", 0, "reward"], "reward is nan"),
    ("group-metadata-infinity", raw('{"trajectories": [{"messages_and_choices": [{"role": "user", "content": "q"}]}], '
                                    '"metadata": {"x": Infinity}}'), 422, ["body", "metadata", "x"],
     "the group: metadata['x'] is inf"),
    ("metadata-not-a-scalar", body([traj(metadata={"a": {"b": 1}})]), 422, None, "valid"),
    ("json-100000-deep", raw('{"trajectories": ' + "[" * 100_000 + "]" * 100_000 + "}"), 422, ["body", 0],
     "invalid JSON: JSON nested too deeply"),
    ("integer-5000-digits", raw('{"trajectories": [], "num_permutations": ' + "9" * 5000 + "}"), 422, ["body", 0],
     "invalid JSON: Exceeds the limit (4300 digits)"),
    ("not-json", raw("{trajectories"), 422, ["body", 1], "invalid JSON"),
    ("a-list-not-an-object", [traj()], 422, ["body"], "valid dictionary"),
    ("idempotency-key-too-long", body(), 422, ["header", "idempotency-key"], "at most 200 characters"),
    ("content-length-over-limit", b"{}", 413, None, "request body over 1000000 bytes"),
    ("text-plain-body", body(), 415, None, "the body must be JSON: the request has Content-Type 'text/plain'"),
    ("form-body", body(), 415, None, "Content-Type 'application/x-www-form-urlencoded'; send it as application/json"),
    ("no-key", body(), 401, None, "missing API key"),
    ("forged-key", body(), 401, None, "unknown or revoked API key"),
] + [
    (f"group-{case}", body(items), 422, None, message) for case, items, message in BAD_GROUPS
]
HEADERS = {"idempotency-key-too-long": {"Idempotency-Key": "k" * 201}, "content-length-over-limit": None,
           "text-plain-body": {"content-type": "text/plain"},
           "form-body": {"content-type": "application/x-www-form-urlencoded"},
           "no-key": {"Authorization": ""}, "forged-key": {"Authorization": "Bearer rk_forged"}}


@pytest.mark.parametrize("case,payload,status,loc,message", SERVICE_CASES, ids=[c[0] for c in SERVICE_CASES])
def test_service_score_rejects_bad_input(svc, judge, case, payload, status, loc, message):
    if case == "content-length-over-limit":  # a client that announces too much is refused before any byte is read
        r = httpx.post(f"{svc.base}/v1/score", content=b"{" + b" " * 1_000_001 + b"}", headers=svc.headers)
    else:
        r = svc.post("/v1/score", payload, HEADERS.get(case))
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    text = json.dumps(detail)
    assert message in text, text
    if loc is not None:
        assert detail[0]["loc"] == loc, detail
    assert judge.requests == []
    assert httpx.get(f"{svc.base}/healthz").status_code == 200


JOB_CASES = [
    ("no-groups", {"groups": []}, ["body", "groups"], "a job needs at least one group"),
    ("poisoned-group", {"groups": [body(), body([traj(POISON), traj()])]},
     ["body", "groups", 1, "trajectories", 0, "messages_and_choices", 2, "tool_calls"], "tool_calls must be a list"),
    ("rubric-path", {"groups": [body()], "rubric": "/etc/hostname"}, ["body", "rubric"], "looks like a file path"),
    ("too-many-groups", {"groups": [body()] * 1001}, ["body", "groups"], "at most 1000 groups"),
    ("misspelled-group-field", {"groups": [{"trajectories": GOOD_FILE["trajectories"], "metdata": {}}]},
     ["body", "groups", 0, "metdata"], "unknown field 'metdata' (did you mean 'metadata'?)"),
]


@pytest.mark.parametrize("case,payload,loc,message", JOB_CASES, ids=[c[0] for c in JOB_CASES])
def test_service_jobs_reject_bad_input_before_queueing(svc, judge, case, payload, loc, message):
    before = svc.store.queue_depth()
    r = svc.post("/v1/jobs", payload)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail[0]["loc"] == loc and message in detail[0]["msg"], detail
    assert svc.store.queue_depth() == before and judge.requests == []


def nested_list(depth: int):
    value: object = "deep"
    for _ in range(depth):
        value = [value]
    return value


DEEP_CHOICE = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "GOOD a"},
               "token_logprobs": nested_list(600)}  # a Choice's extra fields are the server's, but not unbounded


@pytest.mark.parametrize("case,items,loc", [
    ("args-nested-600", [traj(msgs({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": nested_list(600)}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"})), traj()],
     [0, "messages_and_choices", 2, "tool_calls", 0, "function", "arguments", "a"]),
    ("tool-schema-nested-240", [traj(tools=[{"type": "function", "function": {"name": "f", "parameters": nested(240)}}]),
                                traj()], [0, "tools", 0, "function", "parameters"]),
    ("choice-extra-nested-600", [traj(msgs(DEEP_CHOICE)), traj()], [0, "messages_and_choices", 2, "token_logprobs"]),
])
@pytest.mark.parametrize("idempotency_key", [None, "deep-1"])
def test_service_deep_nesting_is_422_with_or_without_an_idempotency_key(svc, judge, case, items, loc, idempotency_key):
    """Checked before anything serialises the request (the idempotency digest, the job's stored copy, the answer)."""
    headers = {"Idempotency-Key": f"{idempotency_key}-{case}"} if idempotency_key else None
    for path, payload, where in (("/v1/score", body(items), ["body", "trajectories"]),
                                 ("/v1/jobs", {"groups": [body(items)]}, ["body", "groups", 0, "trajectories"])):
        r = svc.post(path, payload, headers)
        assert r.status_code == 422, (path, r.text)
        detail = r.json()["detail"][0]
        assert detail["loc"][:len(where) + len(loc)] == where + loc, detail
        assert "value nested more than 32 levels deep" in detail["msg"]
    assert judge.requests == []


def test_service_idempotency_key_replays_by_the_bytes_sent(svc, judge):
    data = json.dumps(body()).encode()
    first = svc.post("/v1/score", data, {"Idempotency-Key": "bytes-1"})
    again = svc.post("/v1/score", data, {"Idempotency-Key": "bytes-1"})
    assert first.status_code == again.status_code == 200 and first.json() == again.json() and len(judge.requests) == 1
    r = svc.post("/v1/score", json.dumps(body(), indent=1).encode(), {"Idempotency-Key": "bytes-1"})
    assert r.status_code == 422 and "already used with a different request body" in r.text
    job = {"groups": [body()]}
    first = svc.post("/v1/jobs", job, {"Idempotency-Key": "bytes-2"})
    assert first.status_code == 202 and svc.post("/v1/jobs", job, {"Idempotency-Key": "bytes-2"}).json() == first.json()


def test_service_unknown_jobs_are_404(svc):
    for method in ("GET", "DELETE"):
        r = httpx.request(method, f"{svc.base}/v1/jobs/../../etc/passwd", headers=svc.headers)
        assert r.status_code == 404
        r = httpx.request(method, f"{svc.base}/v1/jobs/nope", headers=svc.headers)
        assert r.status_code == 404 and "no job 'nope' for this key" in r.json()["detail"]


def test_service_never_reads_a_file_a_client_names(svc, judge, tmp_path):
    """The marker file exists and is readable by the service; no spelling of its path gets it read."""
    marker = tmp_path / "secret.txt"
    marker.write_text(SECRET)
    relative = Path(*([".."] * len(Path.cwd().parts))) / marker.relative_to("/")
    spellings = [str(marker), f"file://{marker}", str(relative), str(marker).replace("/", "//")]
    for rubric in spellings:
        for path, payload in (("/v1/score", body(rubric=rubric)), ("/v1/jobs", {"groups": [body()], "rubric": rubric})):
            r = svc.post(path, payload)
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rubric"], (rubric, r.text)
            assert "looks like a file path" in r.json()["detail"][0]["msg"]
    assert judge.requests == [] and SECRET not in json.dumps(judge.requests)
    # names from the operator's rubric folder and rubric text work; the judge sees exactly that text
    assert svc.post("/v1/score", body(rubric="house-style")).status_code == 200
    assert "Answers must cite the email" in judge.requests[-1]["messages"][0]["content"]
    own = "- Prefer the answer that names the meeting room."
    assert svc.post("/v1/score", body(rubric=own)).status_code == 200
    assert own in judge.requests[-1]["messages"][0]["content"]
    assert SECRET not in json.dumps(judge.requests)


def test_service_never_reads_a_file_a_client_names_even_without_a_path_shape(svc, judge, tmp_path, monkeypatch):
    """Marker files with no extension, in the service's working folder, named by bare relative paths (no `./`,
    no `/`, no suffix): nothing about the value says "path", and still no file is opened."""
    monkeypatch.chdir(tmp_path)  # the service runs in this process: this is its working folder
    (tmp_path / "house").write_text(SECRET)
    (tmp_path / "team notes").mkdir()
    (tmp_path / "team notes" / "house").write_text(SECRET)
    for path in ("/v1/score", "/v1/jobs"):
        make = (lambda rubric: body(rubric=rubric)) if path == "/v1/score" else (
            lambda rubric: {"groups": [body()], "rubric": rubric})
        r = svc.post(path, make("house"))  # one word: no rubric of that name, and too short to be rubric text
        assert r.status_code == 422 and "unknown rubric 'house'" in r.json()["detail"][0]["msg"], r.text
        r = svc.post(path, make("team notes/house"))  # words: rubric text, sent as written
        assert r.status_code in (200, 202), r.text
        if path == "/v1/jobs":
            assert wait_job(svc.base, svc.key, r.json()["job_id"])["results"][0]["status"] == "done"
        assert "team notes/house" in judge.requests[-1]["messages"][0]["content"]
    assert len(judge.requests) == 2 and SECRET not in json.dumps(judge.requests)


def test_service_chunked_body_over_the_limit_gets_413(svc, judge):
    def chunks(total: int = 11_400_000, size: int = 64 * 1024):
        yield b'{"trajectories": [{"messages_and_choices": [{"role": "user", "content": "'
        for _ in range(total // size):
            yield b"x" * size
        yield b'"}]}]}'

    r = httpx.post(f"{svc.base}/v1/score", content=chunks(), timeout=30,
                   headers={**svc.headers, "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["detail"] == "request body over 1000000 bytes"
    assert judge.requests == []
    assert svc.post("/v1/score", body()).status_code == 200  # and the service keeps serving


def trickle(port: int, key: str, chunked: bool, gap_s: float = 0.2, pieces: int = 20) -> tuple[str, float]:
    """POST a valid body a piece every `gap_s` (4 s in all unless cut off); the status line and when it came."""
    import select
    import socket

    data = json.dumps(body()).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"POST /v1/score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                     "Content-Type: application/json\r\n".encode()
                     + (b"Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {len(data)}\r\n\r\n".encode()))
        started = time.monotonic()
        for i in range(pieces):
            if select.select([sock], [], [], gap_s)[0]:
                break  # the server answered (and stopped reading)
            piece = data[i * len(data) // pieces:(i + 1) * len(data) // pieces]
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
        else:
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        answer = sock.recv(4096).decode()
        return answer.split("\r\n")[0], time.monotonic() - started


def test_service_body_timeout_cuts_off_a_trickled_body_at_the_deadline(tmp_path, judge):
    """Each piece arrives well within the deadline, the whole body does not: 408 at the deadline, however paced."""
    service = Service(service_config(tmp_path, judge, body_timeout_s=1.0))
    try:
        for chunked in (False, True):
            status, seconds = trickle(service.port, service.key, chunked)
            assert status == "HTTP/1.1 408 Request Timeout" and 0.9 < seconds < 2.0, (chunked, status, seconds)
        assert service.post("/v1/score", body()).status_code == 200  # a body sent at once is fine; still serving
    finally:
        service.stop()
    assert len(judge.requests) == 1


def test_serve_body_timeout_flag_reaches_the_service(tmp_path, monkeypatch):
    import uvicorn

    from ruler_rl.cli import app as ruler_cli

    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    res = runner.invoke(ruler_cli, ["serve", "--db", str(tmp_path / "svc.db"), "--judge", MODEL, "--body-timeout", "2.5"])
    assert res.exit_code == 0, res.output
    assert started["app"].state.service.cfg.body_timeout_s == 2.5
    assert ServiceConfig().body_timeout_s == 60.0
    res = runner.invoke(ruler_cli, ["serve", "--db", str(tmp_path / "svc.db"), "--body-timeout", "0"])
    assert res.exit_code == 2 and "--body-timeout" in res.output


def test_service_api_base_from_the_allow_list_is_used(tmp_path, judge):
    from ruler_rl.testing import FakeJudge

    other = FakeJudge()
    try:
        service = Service(service_config(tmp_path, judge, allowed_api_bases=[other.base]))
        try:
            r = service.post("/v1/score", body(api_base=other.base + "/"))
            assert r.status_code == 200 and len(other.requests) == 1 and judge.requests == []
            assert service.post("/v1/score", body(api_base=other.base + "/x")).status_code == 422
        finally:
            service.stop()
    finally:
        other.close()


def test_service_silent_judge_is_504_within_the_group_deadline(tmp_path, judge):
    with SilentJudge() as silent:
        service = Service(service_config(tmp_path, judge, judge_params=silent.params, judge_timeout_s=1.5))
        try:
            started = time.monotonic()
            r = service.post("/v1/score", body())
            assert r.status_code == 504 and "did not answer within 1.5 s" in r.json()["detail"]
            assert time.monotonic() - started < 4
        finally:
            service.stop()


@pytest.mark.parametrize("fault,status,says", [
    ("503", 503, "judge failed: the judge is unavailable"),
    ("400", 422, "the judge refused the request or is misconfigured"),
    ("malformed", 503, "judge failed: the judge's answers held no valid scores"),
])
def test_service_errors_name_the_kind_of_failure_not_the_judges_internals(tmp_path, judge, caplog, fault, status,
                                                                             says):
    """The judge's reply names its address: clients get the kind of failure, the operator's log the detail."""
    judge.script = [fault] * 20
    service = Service(service_config(tmp_path, judge, judge_retries=0, max_group_attempts=1))
    try:
        r = service.post("/v1/score", body())
        job = service.post("/v1/jobs", {"groups": [body()]}).json()["job_id"]
        state = wait_job(service.base, service.key, job)
    finally:
        service.stop()
    assert r.status_code == status and says in r.json()["detail"], r.text
    error = state["results"][0]["error"]
    assert state["results"][0]["status"] == "error" and says.removeprefix("judge failed: ") in error, error
    for answer in (r.text, json.dumps(state)):
        assert judge.base.split("/v1")[0] not in answer and "exploded" not in answer
    if fault != "malformed":
        assert f"judge exploded at {judge.base}" in caplog.text  # the operator can still see what happened


def test_service_errors_about_the_request_itself_are_passed_on(svc, judge):
    only_agent = [traj([{"role": "assistant", "content": "GOOD"}]), traj([{"role": "assistant", "content": "BAD"}])]
    r = svc.post("/v1/score", body(only_agent))
    assert r.status_code == 422 and "no trajectory has a system, developer or user message" in r.json()["detail"]
    long = [traj(msgs(USER, answer=f"GOOD {i} " + "word " * 700)) for i in range(2)]
    long[0]["messages_and_choices"][1] = {"role": "user", "content": "When? " + "context " * 450}
    r = svc.post("/v1/score", body(long, max_prompt_tokens=256))
    assert r.status_code == 422 and "the judge's budget of 256 tokens cannot hold even one trajectory" in r.text, r.text
    assert judge.requests == []


# --- the job worker ------------------------------------------------------------------------------

def insert_job(db: Path, groups: list[dict], options: dict | None = None) -> tuple[str, str]:
    """A job written straight into the database, as an older or buggier service might have accepted it."""
    store = Store(db)
    key, key_id = store.create_key("jobs")
    job_id = store.create_job(key_id, groups, options or {"judge_model": MODEL, "rubric": "default"})
    return key, job_id


def wait_job(base: str, key: str, job_id: str, until=lambda s: s["status"] in ("done", "cancelled"), timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        state = httpx.get(f"{base}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"}).json()
        if until(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def attempts(db: Path, job_id: str) -> list[int]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT attempts FROM job_groups WHERE job_id = ? ORDER BY idx", (job_id,))]


def test_poisoned_job_ends_error_at_once_and_a_restart_does_not_resume_it(tmp_path, judge):
    db = tmp_path / "svc.db"
    key, job_id = insert_job(db, [{"trajectories": [traj(POISON), traj()]}, {"trajectories": GOOD_FILE["trajectories"]}])
    for _ in range(2):  # the second pass is the restart
        service = Service(service_config(tmp_path, judge, max_group_attempts=3))
        try:
            state = wait_job(service.base, key, job_id)
            time.sleep(0.6)  # a worker that picked the group again would have done so by now
            again = wait_job(service.base, key, job_id)
        finally:
            service.stop()
        assert state["status"] == "done" and again == state
        poisoned, fine = state["results"]
        assert poisoned["status"] == "error" and fine["status"] == "done"
        assert poisoned["error"] == ("TrajectoryError: trajectory 1, message 3: tool_calls must be a list of tool "
                                     "calls, got str")
        assert attempts(db, job_id) == [1, 1]
    assert len(judge.requests) == 1  # only the good group was ever judged


def test_group_left_running_at_its_budget_is_given_up_on_restart(tmp_path, judge):
    db = tmp_path / "svc.db"
    key, job_id = insert_job(db, [{"trajectories": GOOD_FILE["trajectories"]}])
    store = Store(db)
    for _ in range(3):  # three processes died while judging it
        assert store.mark_running(job_id, 0, 3)
    assert not store.mark_running(job_id, 0, 3)
    service = Service(service_config(tmp_path, judge, max_group_attempts=3))
    try:
        state = wait_job(service.base, key, job_id)
    finally:
        service.stop()
    assert state["status"] == "done" and state["results"][0]["status"] == "error"
    assert state["results"][0]["error"] == ("gave up after 3 attempt(s): the last attempt never finished (the service "
                                            "stopped while judging it)")
    assert attempts(db, job_id) == [3] and judge.requests == []


def test_unavailable_judge_is_retried_with_backoff_then_the_group_is_an_error(tmp_path, judge):
    judge.script = ["503"] * 20
    service = Service(service_config(tmp_path, judge, judge_retries=0, max_group_attempts=3, group_retry_s=0.3))
    try:
        r = service.post("/v1/jobs", {"groups": [body()]})
        state = wait_job(service.base, service.key, r.json()["job_id"])
    finally:
        service.stop()
    result = state["results"][0]
    assert result["status"] == "error" and result["attempts"] == 3
    assert result["error"].startswith("gave up after 3 attempt(s): JudgeUnavailableError:")
    assert len(judge.requests) == 3
    gaps = [b - a for a, b in zip(judge.times, judge.times[1:])]
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6  # the backoff doubles


class BrokenDiskCache:
    """A judge cache whose disk fails: an error the worker has no specific handling for."""

    def get(self, key, default=None):
        raise sqlite3.OperationalError("disk I/O error")

    def set(self, key, value):
        raise sqlite3.OperationalError("disk I/O error")


def test_an_unexpected_exception_ends_the_group_once_and_the_service_keeps_serving(tmp_path, judge):
    service = Service(service_config(tmp_path, judge, cache=BrokenDiskCache(), max_group_attempts=3))
    try:
        r = service.post("/v1/score", body())
        assert r.status_code == 500 and r.json() == {"detail": "internal error"}
        job = service.post("/v1/jobs", {"groups": [body()]}).json()["job_id"]
        state = wait_job(service.base, service.key, job)
        time.sleep(0.6)
        assert wait_job(service.base, service.key, job) == state
        assert httpx.get(f"{service.base}/healthz").status_code == 200
    finally:
        service.stop()
    assert state["results"][0] == {"index": 0, "status": "error", "attempts": 1, "result": None,
                                   "error": "internal error: OperationalError"}


class FlakyStore:
    """The worker's database, failing on demand: `fail[name](*args)` true makes that call raise, as a locked or
    broken SQLite file does."""

    def __init__(self, store: Store):
        self.store, self.fail = store, {}

    def __getattr__(self, name):
        real = getattr(self.store, name)

        def call(*args, **kwargs):
            if name in self.fail and self.fail[name](*args):
                raise sqlite3.OperationalError("disk I/O error")
            return real(*args, **kwargs)
        return call


def health(service) -> httpx.Response:
    return httpx.get(f"{service.base}/healthz", timeout=10)


def wait_health(service, until, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while not until(r := health(service)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return r


def test_the_worker_survives_database_errors_and_healthz_says_when_it_fails_or_dies(tmp_path, judge):
    service = Service(service_config(tmp_path, judge))
    worker = service.server.config.app.state.service.worker
    flaky = worker.store = FlakyStore(worker.store)
    try:
        assert health(service).json() == {"status": "ok", "queue_depth": 0, "worker": "running"}
        flaky.fail["pending_groups"] = lambda *a: True
        r = wait_health(service, lambda r: r.status_code == 503)
        assert r.status_code == 503 and r.json()["worker"] == "failing" and r.json()["error"] == "OperationalError"
        job = service.post("/v1/jobs", {"groups": [body()]}).json()["job_id"]  # accepted: the endpoint's own store
        time.sleep(0.3)
        assert judge.requests == []
        del flaky.fail["pending_groups"]  # the database answers again: the loop carries on
        state = wait_job(service.base, service.key, job)
        assert state["results"][0]["status"] == "done" and len(judge.requests) == 1
        assert wait_health(service, lambda r: r.status_code == 200).json()["worker"] == "running"
        loop = worker._task.get_loop()
        loop.call_soon_threadsafe(worker._task.cancel)  # the loop ends, whatever the reason
        r = wait_health(service, lambda r: r.status_code == 503)
        assert r.status_code == 503 and r.json() == {"status": "error", "queue_depth": 0, "worker": "stopped"}
    finally:
        service.stop()


@pytest.mark.parametrize("both_writes_fail", [False, True])
def test_a_group_whose_result_cannot_be_saved_ends_error_not_running(tmp_path, judge, both_writes_fail):
    service = Service(service_config(tmp_path, judge, max_group_attempts=1))
    worker = service.server.config.app.state.service.worker
    flaky = worker.store = FlakyStore(worker.store)
    broken = {"on": True}
    flaky.fail["finish_group"] = lambda job, idx, result, error: broken["on"] and (both_writes_fail or result is not None)
    if both_writes_fail:  # the database is down for a while
        flaky.fail["give_up_exhausted"] = lambda *a: broken["on"]
    try:
        job = service.post("/v1/jobs", {"groups": [body()]}).json()["job_id"]
        if both_writes_fail:
            time.sleep(1.0)
            assert wait_job(service.base, service.key, job, timeout=0)["results"][0]["status"] == "running"
            broken["on"] = False  # the database answers again
        state = wait_job(service.base, service.key, job)
    finally:
        service.stop()
    assert state["status"] == "done" and state["results"][0]["status"] == "error", state
    assert state["results"][0]["error"] == (
        "gave up after 1 attempt(s): the result of the last attempt could not be saved" if both_writes_fail else
        "internal error: the result could not be saved (OperationalError)")
    assert len(judge.requests) == 1


def test_cancel_stops_groups_in_flight_and_nothing_more_is_judged(tmp_path, judge):
    judge.latency_s = 0.4
    try:
        service = Service(service_config(tmp_path, judge, worker_concurrency=2))
        try:
            job = service.post("/v1/jobs", {"groups": [body()] * 6}).json()["job_id"]
            wait_job(service.base, service.key, job, until=lambda s: s["done"] >= 1)
            r = httpx.delete(f"{service.base}/v1/jobs/{job}", headers=service.headers)
            assert r.json() == {"job_id": job, "cancelled": True}
            seen, tried = len(judge.requests), attempts(tmp_path / "svc.db", job)
            time.sleep(1.5)
            state = wait_job(service.base, service.key, job)
        finally:
            service.stop()
    finally:
        judge.latency_s = 0.0
    assert len(judge.requests) == seen and attempts(tmp_path / "svc.db", job) == tried
    statuses = [g["status"] for g in state["results"]]
    assert state["status"] == "cancelled" and "running" not in statuses and "pending" not in statuses
    assert statuses.count("cancelled") >= 3 and all(s in ("done", "cancelled") for s in statuses)


POLICY_CALLS = {  # tool calls a policy may generate: for the judge to see, not a reason to refuse the group
    "empty-name": {"id": "c1", "type": "function", "function": {"name": "", "arguments": "{budget memo"}},
    "custom-tool": {"id": "c1", "type": "custom", "custom": {"name": "grep_inbox", "input": "budget memo"}},
}


def policy_choice(call: dict, content: str = "GOOD a") -> Choice:
    return Choice.model_validate({"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": content, "tool_calls": [call]}})


def test_a_choice_is_checked_for_size_only():
    choice = policy_choice(POLICY_CALLS["empty-name"], "x" * 100)
    validate_trajectories([Trajectory(messages_and_choices=[SYSTEM, USER, choice])])
    with pytest.raises(TrajectoryError, match="^trajectory 1, message 3: message has 112 characters; the limit is 80$"):
        validate_trajectories([Trajectory(messages_and_choices=[SYSTEM, USER, choice])],
                              limits=Limits(max_message_chars=80))


@pytest.mark.parametrize("case", list(POLICY_CALLS))
async def test_a_choice_is_judged_as_the_policy_wrote_it(svc, judge, case):
    """Checked once: what `validate_trajectories` accepts is judged, by the library, /v1/score and a job."""
    group = TrajectoryGroup([Trajectory(messages_and_choices=[SYSTEM, USER, policy_choice(POLICY_CALLS[case])]),
                             Trajectory(messages_and_choices=msgs(answer="BAD b"))])
    scored = await ruler_score_group(group, MODEL, judge.params, retry=FAST)
    assert [t.reward for t in scored] == [0.9, 0.1]
    assert "budget memo" in judge.requests[-1]["messages"][-1]["content"]  # the call's arguments reach the judge
    data = group.model_dump(mode="json", exclude={"exceptions"})
    r = svc.post("/v1/score", data)
    assert r.status_code == 200 and [s["score"] for s in r.json()["scores"]] == [0.9, 0.1], r.text
    job = svc.post("/v1/jobs", {"groups": [data]}).json()["job_id"]
    state = wait_job(svc.base, svc.key, job)
    assert state["results"][0]["status"] == "done", state
    assert [s["score"] for s in state["results"][0]["result"]["scores"]] == [0.9, 0.1]


async def test_ruler_score_group_still_needs_the_task_and_known_options(judge):
    only_agent = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "assistant", "content": a}])
                                  for a in ("GOOD", "BAD")])
    with pytest.raises(TrajectoryError, match="no trajectory has a system, developer or user message"):
        await ruler_score_group(only_agent, MODEL, judge.params, retry=FAST)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_permutation'"):
        await ruler_score_group(ok_group(), MODEL, judge.params, num_permutation=2)
    assert await ruler_score_group(only_agent, MODEL, judge.params, swallow_exceptions=True) is None
    assert judge.requests == []


@pytest.mark.parametrize("name,text", [("one-word", "Correctness"), ("doc-ref", "Follow policy.md")])
def test_a_folder_rubric_is_judged_by_its_text_whatever_it_reads_like(svc, judge, name, text):
    """The service resolves a rubric once; its text is never taken for a name or a path again (score and jobs)."""
    r = svc.post("/v1/score", body(rubric=name))
    assert r.status_code == 200, r.text
    assert text in judge.requests[-1]["messages"][0]["content"]
    job = svc.post("/v1/jobs", {"groups": [body()], "rubric": name}).json()["job_id"]
    assert wait_job(svc.base, svc.key, job)["results"][0]["status"] == "done"
    assert text in judge.requests[-1]["messages"][0]["content"] and len(judge.requests) == 2


async def test_library_rubric_text_marked_as_text_is_never_taken_for_a_name(judge):
    from ruler_rl.judges import RubricText

    with pytest.raises(JudgeConfigError, match="unknown rubric 'Correctness'"):
        await ruler_score_group(ok_group(), MODEL, judge.params, "Correctness", retry=FAST)
    assert judge.requests == []
    for text in ("Correctness", "Follow policy.md", "efficiency"):
        await ruler_score_group(ok_group(), MODEL, judge.params, RubricText(text), retry=FAST, cache=False)
        assert f"\n{text}\n" in judge.requests[-1]["messages"][0]["content"]  # as written, not looked up


def test_cli_rubric_file_is_judged_by_its_text_whatever_it_reads_like(tmp_path, judge):
    rubric = tmp_path / "mine.txt"
    rubric.write_text("Correctness")
    res = runner.invoke(cli, ["score", str(write(tmp_path, GOOD_FILE)), "--judge", MODEL, "--api-base", judge.base,
                              "--rubric", str(rubric), "--no-cache"], env=ENV)
    assert res.exit_code == 0, res.output
    assert "Correctness" in judge.requests[-1]["messages"][0]["content"]


def test_the_worker_checks_a_stored_job_against_the_service_as_configured_now(tmp_path, judge):
    """Jobs stored by an older or differently configured process: every option is checked again before judging."""
    db = tmp_path / "svc.db"
    stored = {"judge-not-offered": ({"judge_model": "openai/gpt-4o"}, "judge 'openai/gpt-4o' is not offered here"),
              "api-base-not-allowed": ({"api_base": "http://169.254.169.254/v1"}, "is not allowed here"),
              "k-over-cap": ({"num_permutations": 9}, "num_permutations 9: at most 8 orderings here"),
              "prompt-tokens-over-cap": ({"max_prompt_tokens": 200_000}, "max_prompt_tokens 200000: from 256 to 100000"),
              "legacy-rubric-name": ({"rubric": "efficiency"}, None)}
    jobs = {case: insert_job(db, [{"trajectories": GOOD_FILE["trajectories"]}],
                             {"judge_model": MODEL, "rubric": "default", **options})
            for case, (options, _) in stored.items()}
    service = Service(service_config(tmp_path, judge))
    try:
        for case, (key, job_id) in jobs.items():
            result = wait_job(service.base, key, job_id)["results"][0]
            message = stored[case][1]
            if message is None:
                assert result["status"] == "done", result
            else:
                assert result["status"] == "error" and result["error"].startswith("JudgeInputError: ") \
                    and message in result["error"], (case, result)
    finally:
        service.stop()
    assert len(judge.requests) == 1 and "fewer turns" in judge.requests[0]["messages"][0]["content"]


def test_whatever_passes_validation_can_be_rendered_and_serialised():
    """Seeded random messages: each group is either refused with a clear error or renders, truncates and
    serialises to strict JSON (the prompt builder is where a string `tool_calls` used to crash)."""
    import random

    from ruler_rl.budget import truncate_group
    from ruler_rl.judges import DEFAULT_RUBRIC
    from ruler_rl.prompt import build_prompt

    rng = random.Random(19)
    scalars = [None, True, 0, 1.5, math.nan, math.inf, "", "GOOD", "{}", '{"a": 1}', "[1]"]
    keys = ["role", "content", "name", "tool_calls", "tool_call_id", "function", "arguments", "id", "type", "text",
            "index", "finish_reason", "message", "refusal", "junk"]

    def value(depth=0):
        r = rng.random()
        if depth > 3 or r < 0.5:
            return rng.choice(scalars)
        if r < 0.75:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(keys): value(depth + 1) for _ in range(rng.randint(0, 3))}

    def message():
        m = {"role": rng.choice(["user", "assistant", "assistant", "tool", "system", "function"]),
             "content": rng.choice(["GOOD a", None, [{"type": "text", "text": "t"}], value(1)])}
        if rng.random() < 0.2:  # mostly known fields, now and then anything
            m.update({k: value(1) for k in rng.sample(keys, rng.randint(1, 2))})
        for field, choices in (("name", ["f", 5, None]), ("tool_call_id", ["c1", "", 7]), ("refusal", ["no", {}])):
            if rng.random() < 0.3:
                m[field] = rng.choice(choices)
        if rng.random() < 0.5:
            call = {"id": rng.choice(["c1", None, 5]), "type": "function", "function": rng.choice([
                {"name": rng.choice(["f", "", None]), "arguments": rng.choice(["{}", "{bad", {"a": 1}, 5, None])},
                "f()", None, value(2)])}
            m["tool_calls"] = rng.choice([[call], [call, call], [], "f()", call, value(1)])
        return m

    accepted = 0
    for _ in range(3000):
        items = [{"messages_and_choices": [SYSTEM, USER, *(message() for _ in range(rng.randint(0, 4)))],
                  **({"reward": value()} if rng.random() < 0.3 else {})} for _ in range(rng.randint(1, 3))]
        try:
            group = group_from_data(items)
            validate_trajectories(group)
        except ValueError:  # TrajectoryError is one
            continue
        accepted += 1
        conversations = [t.messages() for t in group.trajectories]
        for render in ("compact", "art"):
            build_prompt(conversations, DEFAULT_RUBRIC, render=render)
        truncate_group(conversations, 500)
        json.dumps(group.model_dump(mode="json"), allow_nan=False)
    assert accepted > 150  # the random groups reach the renderer, not only the validation


def test_the_rubric_folder_follows_no_link_out_of_it(tmp_path, monkeypatch):
    import uvicorn

    from ruler_rl.judges.rubrics import load_rubric_folder

    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    folder = tmp_path / "rubrics"
    folder.mkdir()
    (folder / "house.txt").write_text("Cite the email.")
    (folder / "alias.md").symlink_to(folder / "house.txt")  # a link inside the folder is fine
    assert load_rubric_folder(folder) == {"alias": "Cite the email.", "house": "Cite the email."}
    (folder / "leak.txt").symlink_to(secret)
    with pytest.raises(JudgeConfigError, match=r"rubric file leak.txt is a link out of the rubric folder"):
        load_rubric_folder(folder)
    (folder / "leak.txt").unlink()
    (folder / "up.md").symlink_to("../secret.txt")
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app))
    res = runner.invoke(cli, ["serve", "--db", str(tmp_path / "svc.db"), "--rubric-dir", str(folder)])
    assert res.exit_code != 0 and started == {} and "up.md is a link out of the rubric folder" in res.output
    assert SECRET not in res.output


@pytest.mark.slow  # ~20 s
def test_a_body_without_content_type_is_read_as_json_and_a_refused_one_closes_its_connection(svc, judge):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
    conn.request("POST", "/v1/score", body=json.dumps(body()).encode(), headers=svc.headers)  # no Content-Type
    assert conn.getresponse().status == 200
    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
    conn.request("POST", "/v1/score", body=b"x" * 500_000, headers={**svc.headers, "Content-Type": "text/plain"})
    refused = conn.getresponse()
    assert refused.status == 415 and refused.getheader("connection") == "close"
