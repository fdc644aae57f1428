"""The relay in front of an MCP server command (`trainer/mcp_relay.py`): messages within the limit pass whole,
a longer one is dropped as it arrives and its call answered with an error, whichever end of the message its
request id stands at (Python SDKs write it first, the TypeScript SDK last)."""

import io
import json

from ruler_rl.trainer.mcp_relay import OVERSIZED, Pending, relay_stdout

LIMIT = 1000


def run(*messages: bytes, sent=(1, 2, 3)) -> list[dict]:
    pending = Pending()
    for i in sent:
        pending.sent(json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call"}).encode() + b"\n")
    out = io.BytesIO()
    relay_stdout(io.BufferedReader(io.BytesIO(b"".join(m + b"\n" for m in messages))), out, LIMIT, pending)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def big(text_len: int, *, id_last: bool = False, request_id=2, nested_id=None) -> bytes:
    result = {"content": [{"type": "text", "text": "x" * text_len}]}
    if nested_id is not None:
        result = {"structuredContent": {"id": nested_id}, **result}
    message = {"result": result, "jsonrpc": "2.0", "id": request_id} if id_last else \
        {"jsonrpc": "2.0", "id": request_id, "result": result}
    return json.dumps(message).encode()


def test_messages_within_the_limit_pass_whole_and_longer_ones_become_an_error_for_their_call():
    small = big(100, request_id=1)
    at_limit = big(LIMIT - len(big(0)), request_id=3)
    assert len(at_limit) == LIMIT
    out = run(small, big(50_000), at_limit)
    assert out[0] == json.loads(small) and out[2] == json.loads(at_limit)
    assert out[1]["id"] == 2 and out[1]["error"]["code"] == OVERSIZED
    assert "over 1,000 bytes; MCP·RL stopped reading it" in out[1]["error"]["message"]


def test_the_request_id_is_found_at_either_end_and_only_a_pending_one_is_answered():
    out = run(big(50_000, id_last=True, request_id=3, nested_id=1), sent=(3,))  # an "id" of 1 inside, first
    assert [(m["id"], m["error"]["code"]) for m in out] == [(3, OVERSIZED)]
    notification = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                               "params": {"data": "y" * 50_000}}).encode()
    assert run(notification) == []  # answers nothing: dropped (and logged)
