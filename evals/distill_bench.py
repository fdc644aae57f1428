"""The distillation measurement (issue #15 part 2): a judge distilled from ART·E's rubric, measured on groups
of inboxes it never saw, and outside its task on LLMBar Natural.

Without a strong LLM the teacher is a verifiable one: ART·E rollouts graded by ART's rubric (correct answer,
sources; `evals.art_e.rewards.grade`), each group's rewards as the labels, rendered as RULER prompts with the
default rubric (`trainer.distill.from_labels`: the rewards min-max scaled as the teacher's scores).

    # 1. sample graded groups (a policy served by vLLM; the embedded model works on a CPU, slowly)
    python -m evals.distill_bench sample --policy hosted_vllm/Qwen/Qwen2.5-7B-Instruct@http://127.0.0.1:8000/v1 \\
        --db runs/art-e-inbox.db --scenarios runs/scenarios.json --split train --groups 400 --group-size 4 \\
        --out runs/distill/train.jsonl
    python -m evals.distill_bench sample ... --split test --groups 100 --out runs/distill/test.jsonl
    # 2. distil and measure: before vs after on the test groups, and LLMBar Natural (needs ../shared/data)
    python -m evals.distill_bench run --train runs/distill/train.jsonl --test runs/distill/test.jsonl \\
        --student local/smollm2-135m-instruct --steps 400 --lr 2e-4 --llmbar-limit 200 --out evals/reports/distill

`run` writes `report.json` (both agreements, the training history, the commands) and `README.md` (a table)
under `--out`, and the judge under `--out/judge`. On a GPU the SFT runs in bf16 on CUDA; the judge itself is
measured through `local/<folder>` (transformers on the CPU, constrained JSON), as `ruler distill` does, so a
prompt longer than the student's context (SmolLM2: 8192 tokens) counts as "no valid answer". Checked on a CPU
at tiny size (`run` with 2 steps on a synthetic file, LLMBar limit 2); `sample` and the full run are not run yet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from pathlib import Path


def _policy(spec: str) -> tuple[str, dict]:
    model, _, url = spec.partition("@")
    return model, ({"api_base": url} if url else {})


async def sample_groups(*, policy: str, db: Path, scenarios: Path, split: str, groups: int, group_size: int,
                        max_turns: int, temperature: float, seed: int, out: Path, concurrency: int = 8) -> dict:
    """Roll out `group_size` times on each of up to `groups` scenarios of `split`, grade every rollout with
    ART's rubric, and save the groups whose rewards differ as TrajectoryGroup JSONL rows (one group a line)."""
    from evals.art_e.agent import run_agent
    from evals.art_e.questions import load_scenarios
    from evals.art_e.rewards import grade
    from ruler import TrajectoryGroup

    if groups < 1 or group_size < 2:
        raise ValueError("need groups >= 1 and group_size >= 2")
    found = load_scenarios(scenarios, split=split)
    if not found:
        raise ValueError(f"{scenarios}: no scenarios of split {split!r}")
    chosen = random.Random(seed).sample(found, min(groups, len(found)))
    model, params = _policy(policy)
    params = {**params, "temperature": temperature}
    sem = asyncio.Semaphore(concurrency)

    async def rollout(sc, k):
        async with sem:
            t = await run_agent(sc, db, model, params={**params, "seed": seed * 1000 + k}, max_turns=max_turns)
            await grade(t, sc, max_turns=max_turns)
            return t

    kept = uniform = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for sc in chosen:
            trajs = await asyncio.gather(*(rollout(sc, k) for k in range(group_size)))
            if len({t.reward for t in trajs}) < 2:
                uniform += 1
                continue
            g = TrajectoryGroup(trajs, metadata={"scenario": sc.id, "inbox": sc.inbox_address, "split": split})
            f.write(g.model_dump_json() + "\n")
            kept += 1
    return {"groups": kept, "skipped_equal_rewards": uniform, "scenarios": len(chosen), "out": str(out)}


async def run_bench(*, train: Path, test: Path, student: str, steps: int, lr: float, batch_size: int, seed: int,
                    out: Path, max_eval: int | None, llmbar_limit: int, llmbar_root: Path | None,
                    max_seq_length: int = 8192) -> dict:
    """Distil `student` on the graded groups of `train`; agreement with the rubric on `test` before and after;
    the distilled judge on LLMBar Natural (`llmbar_limit` pairs; 0 skips it)."""
    from evals.distill import labelled_groups, untrained_judge
    from evals.judge_meta import load_user_dataset
    from judges import DEFAULT_RUBRIC
    from trainer.distill import agreement, from_labels
    from trainer.sft import SFTConfig, SFTExample, load_student, save_adapter, train_sft

    def examples(path: Path):
        pairs, groups, _, _ = load_user_dataset(path)
        return from_labels(labelled_groups([*pairs, *groups]), DEFAULT_RUBRIC, seed=seed)

    train_ex, test_ex = examples(train), examples(test)
    if max_eval:
        test_ex = test_ex[:max_eval]
    config = SFTConfig(steps=steps, learning_rate=lr, batch_size=batch_size, seed=seed, max_seq_length=max_seq_length,
                       max_tokens_per_micro_batch=max(8192, max_seq_length))
    started = time.perf_counter()
    model, tokenizer, full_forward = await asyncio.to_thread(load_student, student, config)
    judge_dir = out / "judge"
    before_judge = untrained_judge(student)
    if not before_judge:
        await asyncio.to_thread(save_adapter, model, tokenizer, out / "untrained", {"base": student, "steps": 0})
        before_judge = f"local/{(out / 'untrained').resolve()}"
    before = await agreement(before_judge, test_ex, cache=False)
    history = await asyncio.to_thread(train_sft, model, tokenizer, [SFTExample(e.messages, e.answer) for e in train_ex],
                                      config, full_forward=full_forward)
    await asyncio.to_thread(save_adapter, model, tokenizer, judge_dir,
                            {"base": student, "teacher": "ART·E rubric", "train": str(train), "steps": steps})
    after = await agreement(f"local/{judge_dir.resolve()}", test_ex, cache=False)
    report = {"train_prompts": len(train_ex), "test_prompts": len(test_ex), "untrained": before.row(),
              "distilled": after.row(), "history": history, "seconds": time.perf_counter() - started,
              "command": "python -m evals.distill_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])}
    if llmbar_limit:
        from evals.judge_meta import DEFAULT_ROOT, evaluate

        summary, _ = await evaluate(["llmbar-natural"], f"local/{judge_dir.resolve()}", limit=llmbar_limit,
                                    root=llmbar_root or DEFAULT_ROOT, progress=False, cache=False)
        base_summary, _ = await evaluate(["llmbar-natural"], before_judge, limit=llmbar_limit,
                                         root=llmbar_root or DEFAULT_ROOT, progress=False, cache=False)
        report["llmbar_natural"] = {"distilled": summary.iloc[0].to_dict(), "untrained": base_summary.iloc[0].to_dict()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    lines = ["# Distilled judge vs the ART·E rubric", "", f"Rerun: `{report['command']}`", "",
             "| student | pairwise accuracy | Kendall tau | ties | pairs | no valid answer |",
             "|---|---|---|---|---|---|"]
    for label in ("untrained", "distilled"):
        r = report[label]
        lines.append(f"| {label} | {r['pairwise_accuracy']:.3f} | {r['kendall_tau']:.3f} | {r['ties']:.3f} | "
                     f"{r['pairs']} | {r['errors']} |")
    if "llmbar_natural" in report:
        lines += ["", "LLMBar Natural accuracy: untrained "
                  f"{report['llmbar_natural']['untrained']['accuracy']:.3f}, distilled "
                  f"{report['llmbar_natural']['distilled']['accuracy']:.3f}"]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.distill_bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="Roll out ART·E groups and grade them with ART's rubric.")
    s.add_argument("--policy", required=True, help="litellm model, MODEL@URL for a served one")
    s.add_argument("--db", type=Path, required=True)
    s.add_argument("--scenarios", type=Path, required=True)
    s.add_argument("--split", default="train")
    s.add_argument("--groups", type=int, default=100)
    s.add_argument("--group-size", type=int, default=4)
    s.add_argument("--max-turns", type=int, default=10)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--concurrency", type=int, default=8)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run", help="Distil on --train groups; measure on --test groups and LLMBar Natural.")
    r.add_argument("--train", type=Path, required=True)
    r.add_argument("--test", type=Path, required=True)
    r.add_argument("--student", default="local/smollm2-135m-instruct")
    r.add_argument("--steps", type=int, default=400)
    r.add_argument("--lr", type=float, default=2e-4)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--max-eval", type=int, default=None)
    r.add_argument("--llmbar-limit", type=int, default=200)
    r.add_argument("--llmbar-root", type=Path, default=None)
    r.add_argument("--max-seq-length", type=int, default=8192, help="longer prompts are skipped in training")
    r.add_argument("--out", type=Path, default=Path("evals/reports/distill"))
    a = p.parse_args(argv)
    if a.cmd == "sample":
        result = asyncio.run(sample_groups(policy=a.policy, db=a.db, scenarios=a.scenarios, split=a.split,
                                           groups=a.groups, group_size=a.group_size, max_turns=a.max_turns,
                                           temperature=a.temperature, seed=a.seed, out=a.out,
                                           concurrency=a.concurrency))
    else:
        report = asyncio.run(run_bench(train=a.train, test=a.test, student=a.student, steps=a.steps, lr=a.lr,
                                       batch_size=a.batch_size, seed=a.seed, out=a.out, max_eval=a.max_eval,
                                       llmbar_limit=a.llmbar_limit, llmbar_root=a.llmbar_root,
                                       max_seq_length=a.max_seq_length))
        result = {k: report[k] for k in ("train_prompts", "test_prompts", "untrained", "distilled")}
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
