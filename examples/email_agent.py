"""Train the ART·E email agent (GRPO on LoRA) on training inboxes and measure it on inboxes it never saw.

One run: build the inbox database (ART's filters), generate checked questions (train and test splits are
different inboxes), measure the untrained model on the test questions, train for --steps steps, measure
again on the same questions, and write the comparison.

    # (a) ART's rubric as the reward (correctness by the matcher; --correctness-judge adds an LLM judge)
    python examples/email_agent.py --reward art --base-model HuggingFaceTB/SmolLM2-135M-Instruct --engine vllm \\
        --steps 40 --report evals/reports/art_e/smollm2-art
    # (b) RULER: a judge ranks each group of rollouts (here one served by vLLM at :8001)
    python examples/email_agent.py --reward ruler --judge hosted_vllm/judge@http://127.0.0.1:8001/v1 \\
        --base-model HuggingFaceTB/SmolLM2-135M-Instruct --engine vllm --steps 40 --report evals/reports/art_e/smollm2-ruler
    # a smoke run on the CPU (embedded SmolLM2-135M, transformers)
    python examples/email_agent.py --steps 1 --groups-per-step 1 --group-size 2 --max-turns 2 --eval-questions 2

With native tool calls the untrained SmolLM2-135M made no tool call in 12 of 12 CPU rollouts at temperature 1,
so ART's rubric gives every rollout the same -1.7 and GRPO has nothing to learn from; `--tool-mode text` asks
for ART's JSON protocol under a JSON schema, which vLLM's server and the CPU server enforce (on vLLM such turns
train on the trainer's own logprobs: vLLM's are those of the grammar-masked distribution).

The report folder gets before.parquet and after.parquet (every test run, messages included; `ruler eval art-e
--out DIR/before.parquet --show RUN_ID` prints one), eval-stepNNNN.parquet with --eval-every (the same test
questions measured with the policy at step NNNN; `python -m evals.art_e.learning DIR` pairs the latest with before
when after.parquet is missing),
groups.jsonl (each training group: every rollout's reward beside its correctness and ART's reward, with its
step and batch: a refused batch's groups stay, under the step of the batch that replaced it, and run.json's
`batches_refused` names them),
summary.csv (accuracy with its 95% interval, sources, ART's reward, turns, before and after), compare.csv
(after minus before per measure, paired bootstrap 95% interval over the same questions), history.jsonl
and curves.png (the training curves), questions.csv (the mix of question kinds), and run.json (the
arguments, and `steps_run`, `policy_step`, `steps_refused`). A batch the trainer refuses (a non-finite
gradient: nothing of it is applied) is dropped and a new one drawn; MAX_REFUSED_IN_A_ROW refused in a row end
the training loop, and the run still measures the policy as it is; so do MAX_UNSCORED_IN_A_ROW steps in a row
whose every group a judge failed (run.json's `stopped` names the last error, `judge_errors` counts them). Accuracy is the matcher's (plus the
correctness judge's, if given); the RULER judge's scores are rewards for training, never accuracy.

Unlike the other examples this one runs from a checkout of the ruler-rl repository: the ART·E task (inbox
database, tools, questions, ART's rubric) lives in `evals/`, which the ruler-rl wheel does not ship. Set the
checkout up with `bash .ci/setup` (the `all` extras; the venv finds `evals` in the checkout) and run it from there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from ruler_rl import TrajectoryGroup, gather_trajectory_groups, ruler_score_group
from ruler_rl.errors import JudgeError, TrajectoryError
from ruler_rl.judges import DEFAULT_RUBRIC
from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
from ruler_rl.trainer.runlog import plot_train_report, software_versions
from ruler_rl.trainer.vllm_server import resolved_engine

try:
    from evals.art_e import harness
    from evals.art_e.agent import run_agent
    from evals.art_e.annotated import drop_seen_in, load_annotated
    from evals.art_e.inbox import ENRON_DIR, build_inbox_db
    from evals.art_e.questions import generate_scenarios, question_mix
    from evals.art_e.rewards import grade
except ModuleNotFoundError as exc:
    if exc.name != "evals":
        raise
    raise SystemExit("examples/email_agent.py runs from a checkout of the ruler-rl repository: the ART·E task "
                     "lives in evals/, which is not installed here (in the checkout: bash .ci/setup)") from None

MAX_REFUSED_IN_A_ROW = 3  # batches the trainer may refuse in a row before the training loop ends
MAX_UNSCORED_IN_A_ROW = 3  # steps in a row whose every group a judge failed before the training loop ends


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reward", default="art", choices=["art", "ruler"], help="ART's rubric, or RULER's ranking")
    ap.add_argument("--judge", default=None, help="RULER judge, a litellm model or MODEL@http://host/v1, or 'self': "
                    "the policy's own vLLM server with its untrained weights (step 0; --engine vllm; no second "
                    "server, and a judge as weak as the untrained policy) (--reward ruler; default: RULER's default judge)")
    ap.add_argument("--judge-max-prompt-tokens", type=int, default=None, help="--reward ruler: the judge prompt's "
                    "token budget (RULER cuts and splits groups to fit); give it for a served judge whose context "
                    "litellm does not know, e.g. 6000 for SmolLM2's 8192")
    ap.add_argument("--judge-sees-reference", action="store_true", help="--reward ruler: the judge's rubric carries "
                    "the question's reference answer, which the agent never sees (reference_rubric), so a judge too "
                    "weak to find the answer itself can still rank answers against it. Not ART's RULER, whose judge "
                    "reads only the trajectories: name it when reporting")
    ap.add_argument("--correctness-judge", default=None, help="LLM judge for answers the matcher does not accept "
                    "(default: none, match only); MODEL or MODEL@http://host/v1")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--groups-per-step", type=int, default=2, help="training questions per step")
    ap.add_argument("--group-size", type=int, default=4, help="rollouts per question")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--tool-mode", default="native", choices=["native", "text"], help="native tool calls, or ART's "
                    "JSON text protocol (constrained by a JSON schema where the server supports it)")
    ap.add_argument("--tool-choice", default="auto", choices=["auto", "required", "none"], help="--tool-mode native: "
                    "the tool_choice sent each turn, in training and in both measurements (auto, as ART's trained "
                    "policy gets; ART forces required on the prompted models it compares against)")
    ap.add_argument("--idk-reward", type=float, default=0.0, choices=[0.0, -1.0], help="what \"I don't know\" and "
                    "running out of turns score in ART's reward: 0 (ART·E's original) or -1 (as a wrong answer); "
                    "recorded in summary.csv")
    ap.add_argument("--max-tokens", type=int, default=256, help="per agent turn")
    ap.add_argument("--max-seq-length", type=int, default=8192, help="the longest rollout (prompt and all its turns) "
                    "served and trained; a rollout that outgrows it fails (ART's 10 turns of 1,024 tokens with "
                    "emails read need 32768 on Qwen2.5)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--loss", default="grpo", choices=["grpo", "dr_grpo", "dapo"])
    ap.add_argument("--eval-questions", type=int, default=200, help="test questions measured before and after")
    ap.add_argument("--eval-set", default="generated", choices=["generated", "annotated", "both"],
                    help="test questions: generated ones from the test inboxes, the human-written annotated set, "
                         "or both")
    ap.add_argument("--eval-temperature", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=0, help="also measure the test questions whenever the policy "
                    "reaches a step that is a multiple of N (0: only before and after), each written as "
                    "eval-stepNNNN.parquet in the report folder as it finishes: a run cut before its after-evaluation "
                    "still has a held-out measure; skipped where the after-evaluation would measure the same policy")
    ap.add_argument("--concurrency", type=int, default=16, help="evaluation runs in flight")
    ap.add_argument("--per-inbox", type=int, default=400, help="questions generated per inbox (at most)")
    ap.add_argument("--sender-per-inbox", type=int, default=100, help="'Who emailed me about <subject>?' "
                    "questions per training inbox (at most; 0: none): they practise searching and reading headers, "
                    "not bodies; test inboxes never get them")
    ap.add_argument("--test-inboxes", nargs="*", default=None, help="addresses or mailbox names of the test split "
                    "(default: the second half of the mailboxes)")
    ap.add_argument("--mailbox", type=Path, nargs="*", default=None, help="default: every shared Enron mailbox")
    ap.add_argument("--db", type=Path, default=Path("./runs/art-e-inbox.db"))
    ap.add_argument("--base-model", default="local/smollm2-135m-instruct")
    ap.add_argument("--engine", default="auto", choices=["auto", "transformers", "vllm"])
    ap.add_argument("--gpu-memory-utilization", type=float, default=None, help="vLLM's share of the GPU")
    ap.add_argument("--no-sleep", action="store_true", help="keep vLLM awake during training steps (EngineConfig.enable_sleep_mode=False): it keeps its memory and serves the previous adapter meanwhile; for a GPU shared with other vLLM processes, whose start-up memory profiling a sleeping neighbour would upset")
    ap.add_argument("--name", default=None, help="model name (default: email-agent-<reward>)")
    ap.add_argument("--out", default="./runs", help="checkpoints and the run log go under OUT/art-e/NAME")
    ap.add_argument("--report", type=Path, default=None, help="report folder (default: the run folder's report/)")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed: training questions drawn, LoRA start, sampling")
    ap.add_argument("--question-seed", type=int, default=0, help="the question generator's seed (kept apart from "
                    "--seed so that runs of several seeds train and measure on the same questions)")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="start no training step after this many seconds from launch; the after-evaluation still "
                         "runs, and the report's run.json records the steps done (for a machine lent by the minute)")
    args = ap.parse_args(argv)
    if args.sender_per_inbox < 0:
        ap.error("--sender-per-inbox must be >= 0")
    if args.eval_every < 0:
        ap.error("--eval-every must be >= 0 (0: only before and after)")
    for name in ("steps", "groups_per_step", "group_size", "max_turns", "max_tokens", "eval_questions",
                 "concurrency", "per_inbox", "max_seq_length"):
        if getattr(args, name) < (0 if name == "steps" else 1):
            ap.error(f"--{name.replace('_', '-')} must be >= {0 if name == 'steps' else 1}")
    if args.time_budget_s is not None and args.time_budget_s <= 0:
        ap.error("--time-budget-s must be > 0")
    if args.judge and args.reward != "ruler":
        ap.error("--judge is the RULER judge: use it with --reward ruler")
    if args.judge == "self" and args.engine != "vllm":  # the CPU server serves only the latest adapter, not step 0
        ap.error("--judge self needs --engine vllm: only vLLM keeps serving the untrained weights (step 0) beside "
                 "the trained adapter")
    if args.judge_max_prompt_tokens is not None and (args.reward != "ruler" or args.judge_max_prompt_tokens < 256):
        ap.error("--judge-max-prompt-tokens goes with --reward ruler and is >= 256")
    if args.judge_sees_reference and args.reward != "ruler":
        ap.error("--judge-sees-reference gives the RULER judge the reference: use it with --reward ruler")
    if args.correctness_judge:
        harness.check_judge(harness.ModelSpec.parse(args.correctness_judge).model)
    return args


def reference_rubric(reference: str) -> str:
    """RULER's default rubric with the question's reference answer added (--judge-sees-reference): the judge ranks
    answers that agree with it above those that do not, and "not found" above a wrong answer (ART·E's order of
    rewards). The agent's own messages are unchanged: only the judge reads this."""
    if not isinstance(reference, str) or not reference.strip():
        raise ValueError("reference must be a non-empty string: the question's reference answer")
    return (f"{DEFAULT_RUBRIC.rstrip()}\n\nThe question's reference answer, which the agent did not see, is: "
            f"{reference.strip()}\nJudge correctness by it: a trajectory whose final answer agrees with the reference "
            "(the same facts, in any wording) ranks above every trajectory whose answer does not; among those, one "
            "that says it could not find the answer ranks above one that gives a wrong answer. Within each kind, "
            "fewer wasted tool calls rank higher.")


def spec_params(spec: str | None) -> tuple[str | None, dict | None]:
    """A MODEL or MODEL@URL as (litellm model, its litellm parameters)."""
    if spec is None:
        return None, None
    parsed = harness.ModelSpec.parse(spec)
    return parsed.model, parsed.params()


async def evaluate(model: TrainableModel, scenarios, db: Path, args, label: str, correctness):
    """The model's current adapter on every test question (no training): the results table."""
    import torch

    step = await model.get_step()
    on_gpu = args.engine == "vllm" or (args.engine == "auto" and torch.cuda.is_available())
    spec = harness.ModelSpec(model=f"hosted_vllm/{model.get_inference_name(step)}", label=f"{label} (step {step})",
                             api_base=model.inference_base_url, on="gpu" if on_gpu else "cpu",
                             extra={"temperature": args.eval_temperature, "max_tokens": args.max_tokens})
    judge_model, judge_params = correctness
    return await harness.run_benchmark([spec], scenarios, db, judge_model=judge_model, judge_params=judge_params,
                                       concurrency=args.concurrency, max_turns=args.max_turns,
                                       tool_mode=args.tool_mode, tool_choice=args.tool_choice,
                                       idk_reward=args.idk_reward)


def due_for_eval(policy_step: int, evaluated: int, every: int, *, last_pass: bool, budget_spent: bool) -> bool:
    """Whether --eval-every measures the test questions now: the policy has moved on since the last measure (a
    step whose groups all tied leaves it where it was) to a multiple of `every`, and the after-evaluation will not
    measure this same policy next (this is not the loop's last pass, and --time-budget-s is not spent, which ends
    the loop)."""
    return bool(every) and policy_step != evaluated and policy_step % every == 0 and not last_pass \
        and not budget_spent


async def main(argv=None) -> None:
    launched = time.monotonic()  # --time-budget-s counts from here
    args = parse_args(argv)
    rng = random.Random(args.seed)
    if not args.db.is_file():
        args.db.parent.mkdir(parents=True, exist_ok=True)
        report = build_inbox_db(args.mailbox or sorted(ENRON_DIR.glob("*.tar.gz")), args.db)
        print(f"built {args.db}: {report.emails} emails, skipped {dict(report.skipped)}", flush=True)
    annotated = []
    if args.eval_set in ("annotated", "both"):  # adds its emails to the database, so before generating
        annotated, _, skipped = load_annotated(ENRON_DIR / "enron_annotated.json", args.db)
        print(f"annotated questions: {len(annotated)} kept, skipped {dict(skipped)}", flush=True)
    scenarios = generate_scenarios(args.db, per_inbox=args.per_inbox, test_inboxes=args.test_inboxes,
                                   seed=args.question_seed, sender_per_inbox=args.sender_per_inbox)
    train = [s for s in scenarios if s.split == "train"]
    if annotated:  # held out means unseen: an annotated email also filed in a training inbox is dropped
        annotated, seen = drop_seen_in(annotated, args.db, {s.inbox_address for s in train})
        if seen:
            print(f"annotated questions: {seen} dropped, their email is in a training inbox too", flush=True)
    test = (annotated if args.eval_set != "generated" else []) + \
           ([s for s in scenarios if s.split == "test"] if args.eval_set != "annotated" else [])
    if not train or not test:
        raise SystemExit(f"{len(train)} training and {len(test)} test questions: nothing to train or measure on")
    test = rng.sample(test, min(args.eval_questions, len(test)))
    twice = sorted({s.id for s in test if sum(t.id == s.id for t in test) > 1})
    if twice:  # checked before the model loads: the harness names each run by its scenario id
        raise SystemExit(f"test question ids appear more than once: {twice[:5]}")
    print(f"{len(train)} training questions; measuring on {len(test)} test questions", flush=True)

    name = args.name or f"email-agent-{args.reward}"
    model = TrainableModel(name, "art-e", args.base_model,
                           ModelConfig(engine=EngineConfig(engine=args.engine, max_seq_length=args.max_seq_length,
                                                           **({"gpu_memory_utilization": args.gpu_memory_utilization}
                                                              if args.gpu_memory_utilization is not None else {}),
                                                           **({"enable_sleep_mode": False} if args.no_sleep else {})),
                                       seed=args.seed))
    backend = LocalBackend(args.out)
    await model.register(backend)
    report_dir = args.report or model.run_dir / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    run_info = dict(vars(args))  # written now, at each refused batch, and with the steps run once they are done
    engine = model.config.engine
    run_info.update(software_versions(),  # what a run's numbers depend on beyond its arguments
                    compact_json=engine.compact_json if resolved_engine(engine) == "vllm" else None)

    def save_run_info() -> None:
        (report_dir / "run.json").write_text(json.dumps(run_info, indent=2, default=str))  # paths as text

    save_run_info()
    question_mix(train + test).to_csv(report_dir / "questions.csv", index=False)
    correctness = spec_params(args.correctness_judge)
    if args.judge == "self":  # the base weights on the policy's own server: step 0 stays served however far it trains
        ruler_judge = f"hosted_vllm/{model.get_inference_name(0)}"
        ruler_params = {"api_base": model.inference_base_url, "api_key": model.inference_api_key}
    else:
        ruler_judge, ruler_params = spec_params(args.judge)

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if not group.trajectories:  # every rollout raised (they are counted against --max-exceptions)
            return None
        scenario = by_id[group.trajectories[0].metadata["scenario_id"]]
        for traj in group.trajectories:  # ART's reward and correctness, recorded in every run (RULER's too)
            try:
                g = await grade(traj, scenario, max_turns=args.max_turns, judge_model=correctness[0],
                                judge_params=correctness[1], idk_reward=args.idk_reward)
            except JudgeError as exc:  # no reward can be trusted for this group: it is not trained on
                judge_errors.append(f"{type(exc).__name__}: {exc}")
                print(f"group dropped, the correctness judge failed: {exc}", flush=True)
                return None
            traj.metrics["art_reward"], traj.metrics["correct"] = g.reward, int(g.correct)
        if args.reward == "ruler":  # None (the group is dropped) when the judge fails
            budget = {"max_prompt_tokens": args.judge_max_prompt_tokens} if args.judge_max_prompt_tokens else {}
            rubric = reference_rubric(scenario.answer) if args.judge_sees_reference else DEFAULT_RUBRIC
            try:
                scored = await ruler_score_group(group, ruler_judge, ruler_params, rubric=rubric, **budget)
            except (JudgeError, TrajectoryError) as exc:
                judge_errors.append(f"{type(exc).__name__}: {exc}")
                print(f"group dropped, the RULER judge failed: {judge_errors[-1]}", flush=True)
                scored = None
        else:
            scored = group
        log_group(scenario, scored if scored is not None else group, scored is not None)
        return scored

    def log_group(scenario, group: TrajectoryGroup, scored: bool) -> None:
        """One line per group in groups.jsonl: each rollout's reward beside its correctness and ART's reward, so
        how well the reward ranks right answers above wrong ones can be read after the run."""
        rows = [{"reward": t.reward if scored else None, "correct": t.metrics.get("correct"),
                 "art_reward": t.metrics.get("art_reward"), "answer": t.metadata.get("answer"),
                 "turns": t.metrics.get("turns")} for t in group.trajectories]
        with open(report_dir / "groups.jsonl", "a") as f:
            f.write(json.dumps({"step": current_step[0], "batch": batch[0], "scenario_id": scenario.id,
                                "reference": scenario.answer,
                                "reward": args.reward, "scored": scored, "rollouts": rows}, default=str) + "\n")

    current_step = [0]
    judge_errors: list[str] = []  # every judge failure (RULER's or the correctness judge's), as text
    batch = [0]  # the batches drawn so far, refused ones included (a refused step's replacement has the same step)

    def budget_spent() -> bool:
        return args.time_budget_s is not None and time.monotonic() - launched > args.time_budget_s

    by_id = {s.id: s for s in train}
    try:
        start = await model.get_step()
        steps_run = 0
        if not (report_dir / "before.parquet").is_file():
            if start > 0:
                raise SystemExit(f"{model.run_dir} is at step {start} and {report_dir} has no before.parquet: the "
                                 "untrained model can no longer be measured in this run; start a new --name")
            before = await evaluate(model, test, args.db, args, "before", correctness)
            before.to_parquet(report_dir / "before.parquet", index=False)
        evaluated = start  # the policy step last measured on the test questions (before: the start)
        refused: list[int] = []  # batches the trainer refused (a non-finite gradient), by their loop step
        unscored = 0  # steps in a row whose every group a judge failed
        step = start
        while step < args.steps:
            if budget_spent():
                print(f"--time-budget-s {args.time_budget_s:g} spent: stopping after {step} of {args.steps} steps",
                      flush=True)
                break
            picked = rng.sample(train, min(args.groups_per_step, len(train)))
            current_step[0] = step
            batch[0] += 1
            target = model.litellm_completion_params()
            agent_model = target.pop("model")
            groups = await gather_trajectory_groups(
                [TrajectoryGroup(run_agent(s, args.db, agent_model, params={**target, "max_tokens": args.max_tokens},
                                           max_turns=args.max_turns, tool_mode=args.tool_mode,
                                           tool_choice=args.tool_choice)
                                 for _ in range(args.group_size)) for s in picked],
                after_each=score, pbar_desc=f"step {step}", max_exceptions=0.25)
            unscored = 0 if groups else unscored + 1  # every group dropped: a judge failed them all
            if unscored >= MAX_UNSCORED_IN_A_ROW:  # a judge that cannot work stops the run, not 200 empty steps
                run_info["stopped"] = (f"a judge failed every group of {unscored} steps in a row; the last error: "
                                       f"{judge_errors[-1] if judge_errors else 'none recorded'}")
                print(f"stopping: {run_info['stopped']}; measuring the policy as it is", flush=True)
                break
            try:
                row = await model.train(groups, TrainConfig(learning_rate=args.lr, loss=args.loss))
            except FloatingPointError as exc:  # refused and rolled back by the trainer: nothing of it was applied
                refused.append(step)
                run_info["batches_refused"] = [*run_info.get("batches_refused", []), batch[0]]
                save_run_info()
                print(f"step {step + 1} refused ({exc}): its groups are dropped, the policy stays at step "
                      f"{await model.get_step()}, and a new batch is drawn", flush=True)
                if len(refused) >= MAX_REFUSED_IN_A_ROW and refused[-MAX_REFUSED_IN_A_ROW] == refused[-1]:
                    print(f"{MAX_REFUSED_IN_A_ROW} batches in a row refused: stopping, and measuring the policy as "
                          "it is", flush=True)
                    break
                continue
            steps_run += 1
            step += 1
            print(f"step {row['step']}: reward {row['reward_mean']:.3f} ({args.reward}), trained on "
                  f"{row['sequences']} sequences", flush=True)
            policy = await model.get_step()  # unchanged when every group tied (no update)
            if due_for_eval(policy, evaluated, args.eval_every, last_pass=step >= args.steps,
                            budget_spent=budget_spent()):
                held_out = await evaluate(model, test, args.db, args, "during training", correctness)
                held_out.to_parquet(report_dir / f"eval-step{policy:04d}.parquet", index=False)
                evaluated = policy
                print(f"held-out at policy step {policy}: {int(held_out['correct'].sum())}/{len(held_out)} right",
                      flush=True)
        after = await evaluate(model, test, args.db, args, "after", correctness)
        after.to_parquet(report_dir / "after.parquet", index=False)
        run_info.update(steps_run=steps_run, steps_refused=refused, policy_step=await model.get_step(),
                        judge_errors=len(judge_errors), seconds=round(time.monotonic() - launched, 1))
        save_run_info()
    finally:
        await backend.close()

    import pandas as pd

    before = pd.read_parquet(report_dir / "before.parquet")
    summary = pd.concat([harness.summarize(before), harness.summarize(after)], ignore_index=True)
    summary.to_csv(report_dir / "summary.csv", index=False)
    compare = harness.compare_runs(before, after)
    compare.to_csv(report_dir / "compare.csv", index=False)
    if (model.run_dir / "history.jsonl").is_file():
        shutil.copy(model.run_dir / "history.jsonl", report_dir / "history.jsonl")
        plot_train_report(model.run_dir, report_dir / "curves.png")
    print(summary[["model", "runs", "accuracy", "accuracy_low", "accuracy_high", "accuracy_by", "sources_correct",
                   "mean_reward", "reward_ci95", "mean_turns"]].to_string(index=False))
    print(compare.to_string(index=False))
    print(f"report: {report_dir}")


if __name__ == "__main__":
    asyncio.run(main())
