"""The data model: ART's fields, Choice objects, awaitable groups, JSON/JSONL files, bad files."""

import asyncio
import json

import pytest
from openai.types.chat.chat_completion import Choice

from ruler_rl import Trajectory, TrajectoryGroup
from tests.helpers import convo

CHOICE = Choice.model_validate({
    "index": 0, "finish_reason": "tool_calls", "logprobs": None,
    "message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "search_inbox", "arguments": '{"keywords": ["x"]}'}}]},
})


def test_messages_turns_choices_into_assistant_dicts_with_tool_calls():
    t = Trajectory(messages_and_choices=[*convo("hi")[:2], CHOICE], reward=1)
    last = t.messages()[-1]
    assert last["role"] == "assistant" and last["tool_calls"][0]["function"]["name"] == "search_inbox"
    assert isinstance(t.messages_and_choices[-1], Choice)
    assert t.for_logging()["messages"][-1]["trainable"] is True


def test_group_round_trips_through_json_and_jsonl_keeping_choices(tmp_path):
    g = TrajectoryGroup([Trajectory(messages_and_choices=[*convo("a")[:2], CHOICE], reward=0.5,
                                    metrics={"m": 1.0}, metadata={"k": "v"}, logs=["l"]),
                         Trajectory(messages_and_choices=convo("b"))], metadata={"scenario": 3})
    for name in ("g.json", "g.jsonl"):
        back = TrajectoryGroup.load(g.save(tmp_path / name))
        assert [t.model_dump() for t in back] == [t.model_dump() for t in g]
        assert isinstance(back.trajectories[0].messages_and_choices[-1], Choice)
    assert TrajectoryGroup.load(tmp_path / "g.json").metadata == {"scenario": 3}


def test_group_loads_bare_message_lists(tmp_path):
    p = tmp_path / "lists.json"
    p.write_text(json.dumps([convo("a"), convo("b")]))
    assert [len(t.messages()) for t in TrajectoryGroup.load(p)] == [3, 3]


async def test_group_from_awaitables_keeps_exceptions():
    async def ok(x):
        await asyncio.sleep(0)
        return Trajectory(messages_and_choices=convo(x))

    async def boom():
        raise RuntimeError("rollout crashed")

    g = await TrajectoryGroup([ok("a"), boom(), ok("b")], metadata={"s": 1})
    assert len(g) == 2 and g.metadata == {"s": 1}
    assert g.exceptions[0].message == "rollout crashed" and "RuntimeError" in g.exceptions[0].type


def test_group_from_trajectories_and_exceptions():
    g = TrajectoryGroup([Trajectory(messages_and_choices=convo("a")), ValueError("bad")])
    assert len(g) == 1 and g.exceptions[0].message == "bad"


@pytest.mark.parametrize("content,match", [
    (b"\xff\xfe not utf8", "not valid UTF-8"),
    (b"{not json", "not valid JSON"),
    (b'{"foo": 1}', "expected a group object"),
    (b'[1, 2]', "trajectory 1 must be an object"),
    (b'[{"messages_and_choices": [1]}]', "trajectory 1"),
])
def test_bad_group_files_get_clear_errors(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        TrajectoryGroup.load(p)


def test_bad_jsonl_line_is_named(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"messages_and_choices": convo("a")}) + "\n{oops\n")
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        TrajectoryGroup.load(p)


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        TrajectoryGroup.load("/no/such/group.json")
