"""The trainer server's response cost: serialize (server) + parse (OpenAI client) one rollout response of
8 choices x 128 tokens, the old per-token logprobs entries through FastAPI's encoder vs the compact
`token_ids`/`token_logprobs` lists through json.dumps. Run: python evals/server_payload_bench.py"""
import json
import statistics
import time

from fastapi.encoders import jsonable_encoder
from openai.types.chat import ChatCompletion


def body(compact):
    ch = []
    for i in range(8):
        ids = list(range(1000, 1128))
        lps = [-0.123456 - k / 1000 for k in range(128)]
        c = {"index": i, "finish_reason": "length", "message": {"role": "assistant", "content": "x " * 128, "tool_calls": None}}
        if compact:
            c.update(token_ids=ids, token_logprobs=lps, logprobs=None)
        else:
            c["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []} for t, lp in zip(ids, lps, strict=True)]}
        ch.append(c)
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": ch,
            "usage": {"prompt_tokens": 10, "completion_tokens": 1024, "total_tokens": 1034}}

results = {}
for name, compact, encoder in (("per-token logprobs entries, FastAPI encoder", False, True), ("compact token_ids/token_logprobs, json.dumps", True, False)):
    times = []
    for _ in range(20):
        b = body(compact)
        t = time.perf_counter()
        text = json.dumps(jsonable_encoder(b)) if encoder else json.dumps(b, separators=(",", ":"))
        ChatCompletion.model_validate_json(text)
        times.append(time.perf_counter() - t)
    results[name] = statistics.median(times)
    print(f"{name}: {results[name] * 1000:.1f} ms per response of 1,024 tokens ({len(text)} bytes)")
old, new = results.values()
print(f"compact / per-token: {new / old:.3f}x the time ({old / new:.0f}x faster)")
