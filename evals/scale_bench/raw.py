"""`raw`: the prefix workload's rollouts without the trainer: in-process `vllm.LLM`, or (`--raw-via server`)
vLLM's own OpenAI server started with ours' flags but without the training middleware."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

from evals.scale_bench.ours import vllm_fields
from evals.scale_bench.shapes import LORA, make_model_dir
from evals.scale_bench.workloads import prefix_prompts, word_ids


def raw(args) -> dict:
    """In-process vllm.LLM.generate on the same shape (dummy weights), the same prefix-workload prompt
    lengths, n and fixed sampling; to run after `ours` has closed its server."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model_dir = make_model_dir(args.shape, args.models / args.shape, args.tokenizer)
    tok = AutoTokenizer.from_pretrained(model_dir)
    words = word_ids(tok)
    rng = random.Random(0)
    result: dict = {"shape": args.shape}
    started = time.perf_counter()
    llm = LLM(model=str(model_dir), load_format="dummy", gpu_memory_utilization=args.util, max_model_len=args.max_seq,
              enable_lora=True, max_lora_rank=LORA["rank"], max_num_seqs=64, seed=0)
    result["start_s"] = time.perf_counter() - started
    prompts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True)
               for p in prefix_prompts(tok, words, args, rng)]
    prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p for p in prompts]
    params = SamplingParams(n=args.group_size, max_tokens=args.gen, min_tokens=args.gen, ignore_eos=True,
                            temperature=1.0, logprobs=0, allowed_token_ids=words)
    runs = []
    for _ in range(args.rollout_reps):
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        dt = time.perf_counter() - t0
        runs.append({"s": dt, "tokens_per_s": sum(len(o.token_ids) for r in outs for o in r.outputs) / dt})
    result.update(prompt_tokens=[len(p) for p in prompts], runs=runs)
    (args.out / f"raw-{args.shape}.json").write_text(json.dumps(result, indent=1))
    return result


def plain_vllm_server(model_dir: Path, args, log_dir: Path):
    """vLLM's OpenAI server started as `ours` starts it (`ruler_rl.trainer.vllm_server.VLLMServer`: the same flags, dummy
    weights, LoRA, sleep mode, tool parser, the chat template `ruler_rl.trainer.chat.pick_chat_template` picks for the
    tokenizer) but without the training middleware: `raw --raw-via server`."""
    from transformers import AutoTokenizer

    from ruler_rl.trainer.chat import pick_chat_template
    from ruler_rl.trainer.config import EngineConfig
    from ruler_rl.trainer.vllm_server import VLLMServer

    template, tools_ok = pick_chat_template(AutoTokenizer.from_pretrained(model_dir))
    template_file = None
    if template is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        template_file = log_dir / "chat_template.jinja"
        template_file.write_text(template)

    class PlainVLLMServer(VLLMServer):
        name = "vllm-plain"

        def command(self) -> list[str]:
            argv = super().command()
            at = argv.index("--middleware")
            return argv[:at] + argv[at + 2:]

        def environment(self, base=None):
            env = super().environment(base)
            env.pop("RULER_SERVED_NAME", None)
            return env

    config = EngineConfig(engine="vllm", max_seq_length=args.max_seq, gpu_memory_utilization=args.util,
                          max_num_seqs=64, vllm_args={"load_format": "dummy", "seed": 0}, **vllm_fields(args))
    return PlainVLLMServer(str(model_dir), config, served_name="raw", lora_rank=LORA["rank"], log_dir=log_dir,
                           chat_template_file=template_file, tool_parser="hermes", reasoning_parser=None,
                           tools_ok=tools_ok)


REQUEST_KINDS = {  # what a rollout request asks of vLLM's own server, without our middleware
    "plain": {},
    "as_middleware": {"return_token_ids": True, "logprobs": True, "top_logprobs": 0},  # what the middleware adds
}


async def timed_rollout(client, model: str, prompts: list[list[dict]], args, extra: dict) -> dict:
    """One run of the prefix workload's rollout (all prompts at once, n = --group-size, --gen tokens each): its
    seconds, sampled tokens per second and prompt tokens."""
    t0 = time.perf_counter()
    replies = await asyncio.gather(*(client.chat.completions.create(
        model=model, messages=p, n=args.group_size, max_tokens=args.gen, temperature=1.0, extra_body=extra)
        for p in prompts))
    dt = time.perf_counter() - t0
    return {"s": dt, "tokens_per_s": sum(r.usage.completion_tokens for r in replies) / dt,
            "prompt_tokens": [r.usage.prompt_tokens for r in replies]}


async def raw_server(args) -> dict:
    """The prefix workload's rollouts (as `ours --parts rollout` sends them) through vLLM's own OpenAI server
    without our middleware (`plain_vllm_server`), once per `REQUEST_KINDS` entry, alternating run by run:
    with `ours` and `raw` (in-process `vllm.LLM`) it splits ours' overhead over raw vLLM into the OpenAI
    server, the token ids and logprobs vLLM builds, and the middleware with the client's parse.
    `raw-server-<shape>.json`. `--dry-run`: the trainer's CPU server of a tiny random model stands in for vLLM's
    (a check of the script: that server is ours, middleware-like fields included)."""
    from openai import AsyncOpenAI
    from transformers import AutoTokenizer

    model_dir = make_model_dir(args.shape, args.models / args.shape, args.tokenizer)
    tok = AutoTokenizer.from_pretrained(model_dir)
    words = word_ids(tok)
    rng = random.Random(0)  # the prompts of `ours` and `raw`
    prompts = prefix_prompts(tok, words, args, rng)
    fixed = {} if args.dry_run else {"min_tokens": args.gen, "ignore_eos": True, "allowed_token_ids": words}
    result: dict = {"shape": args.shape, "dry_run": args.dry_run, "kinds": {k: [] for k in REQUEST_KINDS},
                    "errors": []}
    path = args.out / f"raw-server-{args.shape}.json"

    def save():
        path.write_text(json.dumps(result, indent=1))

    started = time.perf_counter()
    if args.dry_run:
        from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel
        from ruler_rl.trainer.config import LoRAConfig

        model = TrainableModel("raw", "bench", str(model_dir), ModelConfig(
            lora=LoRAConfig(rank=LORA["rank"], alpha=LORA["alpha"]), seed=0,
            engine=EngineConfig(engine="transformers", max_seq_length=args.max_seq)))
        backend = LocalBackend(args.out / "runs", random_weights=True)
        await model.register(backend)
        base_url, name, close = model.inference_base_url, model.name, backend.close
    else:
        server = plain_vllm_server(model_dir, args, args.out / "runs")
        await server.start()
        base_url, name, close = server.base_url, server.served_name, server.close
    result["start_s"] = time.perf_counter() - started
    save()
    failed: set[str] = set()
    try:
        client = AsyncOpenAI(base_url=base_url, api_key="bench", timeout=1200)
        for rep in range(args.rollout_reps + 1):  # the first round warms up (the prompts' prefix cache): not kept
            for kind, extra in REQUEST_KINDS.items():
                if kind in failed:
                    continue
                try:
                    run = await timed_rollout(client, name, prompts, args, {**fixed, **extra})
                except Exception as exc:  # noqa: BLE001 - one kind refused (or timed out) leaves the other
                    failed.add(kind)
                    result["errors"].append(f"{kind}: {type(exc).__name__}: {exc}"[:600])
                    continue
                if rep:
                    result["kinds"][kind].append(run)
                save()
    finally:
        await close()
    save()
    return result


