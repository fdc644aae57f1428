"""evals/device/art_e_run.sh builds the arguments of the GPU host's ART·E runs: every combination the reports use
must pass examples/email_agent.py's own parser. On 2026-12-06 the script passed a RULER-only flag to an ART-rubric
run, which refused it on the GPU host after 200 s of device time; a dry run here catches that. The same holds for
evals/device/judge_run.sh's arguments against evals.gpu_judge_meta's parser."""

import json
import os
import subprocess

import pytest

from tests.test_email_agent_example import load_example

RUNS = [["--reward", "art", "--seed", "0", "--gpu-memory-utilization", "0.3"],
        ["--reward", "ruler", "--judge", "self", "--seed", "1"],
        ["--reward", "ruler", "--judge", "self", "--judge-sees-reference", "--seed", "0"],
        ["--reward=ruler", "--judge", "self"], ["--reward", "ruler", "--reward", "art"]]


def dry(script: str, *argv: str, var: str = "ART_E_DRY_RUN") -> subprocess.CompletedProcess:
    """evals/device/SCRIPT run with its dry-run variable set: it prints its arguments and starts nothing."""
    return subprocess.run(["bash", f"evals/device/{script}", *argv], check=False, capture_output=True, text=True,
                          env={**os.environ, var: "1"}, timeout=60)


def dry_run(*args: str) -> list[str]:
    done = dry("art_e_run.sh", "run-x", "600", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("extra", RUNS, ids=["art", "ruler", "ruler-reference", "reward=ruler", "last-reward-wins"])
def test_each_run_the_reports_use_passes_the_example_parser(extra):
    argv = dry_run(*extra)
    args = load_example().parse_args(argv)
    reward = "ruler" if "--reward=ruler" in extra else [a for a in extra if a in ("art", "ruler")][-1]
    assert (args.reward, args.name, args.time_budget_s, args.eval_every) == (reward, "run-x", 600.0, 4)
    # the judge's prompt budget goes with RULER only
    assert (args.judge_max_prompt_tokens is not None) == (reward == "ruler")


def test_later_arguments_override_the_fixed_ones():
    args = load_example().parse_args(dry_run("--reward", "art", "--eval-every", "0", "--max-turns", "4"))
    assert (args.eval_every, args.max_turns) == (0, 4)


def test_the_seeds_script_starts_each_seed_with_its_own_name_and_seed():
    done = dry("art_e_seeds.sh", "ruler-ref", "900", "560", "0", "1", "--", "--reward", "ruler", "--judge", "self",
               "--judge-sees-reference")
    assert done.returncode == 0, done.stderr
    example = load_example()
    parsed = [example.parse_args(line.split()) for line in done.stdout.splitlines()]
    assert [(a.name, a.seed, a.report.name, a.judge_sees_reference) for a in parsed] == [
        ("ruler-ref-seed0", 0, "ruler-ref-seed0", True), ("ruler-ref-seed1", 1, "ruler-ref-seed1", True)]
    bad = dry("art_e_seeds.sh", "x", "900", "560", "one", "--")
    assert bad.returncode == 2 and "not a non-negative integer" in bad.stderr


@pytest.mark.slow
def test_seeds_run_one_after_another_and_collect_waits_for_the_chain(tmp_path):
    """Two seeds side by side do not fit one H100 (the trainer's memory plan refused the second, 2026-12-07): each
    starts once the one before it has ended, and collect.sh waits for the chain, not only for a running seed (there
    is a moment between seeds when none runs). art_e_run.sh is replaced by a stand-in whose process carries a run's
    command line for 1.5 s."""
    import shutil
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    root, out, log = tmp_path / "root", tmp_path / "out", tmp_path / "starts.log"
    (root / "evals" / "device").mkdir(parents=True)
    out.mkdir()
    for script in ("collect.sh", "chain.sh"):
        shutil.copy(repo / "evals" / "device" / script, root / "evals" / "device")
    (root / "evals" / "device" / "art_e_run.sh").write_text(
        'name=$1; echo "$name start $(date +%s.%N)" >> "$STARTS"\n'
        '((exec -a "standin-run $name" sleep 1.5); '
        'echo "$name end $(date +%s.%N)" >> "$STARTS"; echo "step 1: reward 0.5" > "/tmp/run-$name.log") '
        '> /dev/null 2>&1 < /dev/null &\n'
        'echo $! > "/tmp/run-$name.pid"\n')
    prefix = f"chaintest{os.getpid()}"
    marker = tmp_path / "chain.running"
    env = {**os.environ, "STARTS": str(log), "OUT": str(out), "ART_E_CHAIN_MARKER": str(marker)}
    started = time.monotonic()
    done = subprocess.run(["bash", str(repo / "evals" / "device" / "art_e_seeds.sh"), prefix, "60", "40", "0", "1",
                           "--", "--steps", "1"], cwd=root, capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr
    events = {" ".join(line.split()[:2]): float(line.split()[2]) for line in log.read_text().splitlines()}
    assert events[f"{prefix}-seed1 start"] >= events[f"{prefix}-seed0 end"]  # one after another
    assert f"{prefix}-seed0 ended" in done.stdout and f"{prefix}-seed1 ended" in done.stdout  # collect waited
    assert time.monotonic() - started < 35 and not marker.exists()
    for name in (f"{prefix}-seed0", f"{prefix}-seed1"):
        Path(f"/tmp/run-{name}.log").unlink(missing_ok=True)
        Path(f"/tmp/run-{name}.pid").unlink(missing_ok=True)

    def start_again():
        return subprocess.run(["bash", str(repo / "evals" / "device" / "art_e_seeds.sh"), prefix, "60", "1", "0",
                               "--"], cwd=root, capture_output=True, text=True, timeout=60, env=env)

    # a chain that still lives (its pid in the marker, a process of art_e_seeds.sh) refuses a second one
    live = subprocess.Popen(["bash", "-c", "exec -a 'bash art_e_seeds.sh chain' sleep 30"])
    try:
        marker.write_text(str(live.pid))
        again = start_again()
        assert again.returncode == 3 and "still running" in again.stderr
    finally:
        live.kill()
        live.wait()
    # a dead chain's marker, its pid gone or reused by another program, does not
    for pid in (live.pid, os.getpid()):
        marker.write_text(str(pid))
        assert start_again().returncode == 0
        for _ in range(60):  # the chain it started ends and takes its marker away
            if not marker.exists():
                break
            time.sleep(0.5)
        assert not marker.exists()
    for name in (f"{prefix}-seed0",):
        Path(f"/tmp/run-{name}.log").unlink(missing_ok=True)
        Path(f"/tmp/run-{name}.pid").unlink(missing_ok=True)


def test_resplit_cuts_the_parts_again_to_the_same_bytes(tmp_path):
    """A working tree that grew makes old parts too large for a device call; resplit.sh cuts them again."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "evals" / "device" / "resplit.sh"
    data = os.urandom(5 * 2**20 + 123)
    for i, (a, b) in enumerate(((0, 3 * 2**20), (3 * 2**20, len(data)))):
        (tmp_path / ".gpukit" / f"d{i}").mkdir(parents=True)
        (tmp_path / ".gpukit" / f"d{i}" / "part").write_bytes(data[a:b])
    (tmp_path / ".gpukit" / "d0" / "install.sh").write_text("echo kit\n")  # kit.sh's, beside the first part

    def resplit(*prefixes: str):
        return subprocess.run(["bash", str(script), *prefixes], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PART_MB": "1"}, timeout=60)

    done = resplit("d")
    assert done.returncode == 0 and "d: 2 parts -> 6 parts of at most 1 MiB" in done.stdout, done.stderr
    parts = [tmp_path / ".gpukit" / f"d{i}" / "part" for i in range(6)]
    assert b"".join(p.read_bytes() for p in parts) == data and max(p.stat().st_size for p in parts) == 2**20
    assert not (tmp_path / ".gpukit" / "d6").exists() and [p.name for p in (tmp_path / ".gpukit").iterdir()
                                                            if p.name.startswith(".")] == []
    assert (tmp_path / ".gpukit" / "d0" / "install.sh").read_text() == "echo kit\n"  # kept in the first folder
    assert resplit("k").returncode == 3 and resplit("kd").returncode == 2 and resplit().returncode == 2


def test_the_judge_run_passes_gpu_judge_meta_and_meta_only_drops_the_two_checks():
    from evals.gpu_judge_meta import parse_args

    def judge_dry_run(*args: str):
        done = dry("judge_run.sh", *args, var="JUDGE_RUN_DRY_RUN")
        assert done.returncode == 0, done.stderr
        return parse_args(done.stdout.splitlines())

    full = judge_dry_run("--limit", "200")
    assert (full.limit, full.answer_accuracy, full.injection_groups, full.enforce_eager) == (200, True, 50, True)
    short = judge_dry_run("--meta-only", "--limit", "100")
    assert (short.limit, short.answer_accuracy, short.injection_groups) == (100, False, 0)
    assert (short.model, short.concurrency) == (full.model, full.concurrency) == ("/tmp/models/qwen15", 256)
    late = judge_dry_run("--limit", "100", "--meta-only")  # recognised wherever it stands
    assert (late.limit, late.answer_accuracy, late.injection_groups) == (100, False, 0)


def test_the_judge_run_takes_a_users_file_and_pandalm_last(tmp_path):
    """Table 1's user-label row and table 2's teacher data in one meta-only run (the file judge_run.sh writes on the
    host is a tmp file here)."""
    from evals.gpu_judge_meta import parse_args

    mine = tmp_path / "llmbar-casestudy.jsonl"
    mine.write_text("{}\n")
    done = dry("judge_run.sh", "--meta-only", "--limit", "1000", "--datasets", str(mine), "pandalm", "--by", "case",
               var="JUDGE_RUN_DRY_RUN")
    assert done.returncode == 0, done.stderr
    args = parse_args(done.stdout.splitlines())
    assert (args.datasets, args.by, args.limit, args.injection_groups) == ([str(mine), "pandalm"], "case", 1000, 0)


def test_the_distillation_run_passes_the_bench_parser(tmp_path):
    """evals/device/distill_run.sh (table 2): its arguments parse with evals.distill_bench's own parser, teacher mode
    (no --data), SFT then GRPO, and later arguments override."""
    from evals.distill_bench import build_parser

    meta = tmp_path / "qwen15"
    meta.mkdir()
    (meta / "run.json").write_text(json.dumps({"judge": "hosted_vllm/qwen15", "stages": [
        {"dataset": "llmbar-natural", "started": "2026-12-07T14:30:00+00:00"},
        {"dataset": "pandalm", "started": "2026-12-07T14:33:10.5+00:00"}]}))
    done = subprocess.run(["bash", "evals/device/distill_run.sh", "--steps", "100"], capture_output=True, text=True,
                          env={**os.environ, "DISTILL_DRY_RUN": "1", "DISTILL_META": str(meta)}, timeout=60)
    assert done.returncode == 0, done.stderr
    args = build_parser().parse_args(done.stdout.splitlines())
    assert (args.cmd, args.teacher, args.data, args.steps) == ("gpu", "hosted_vllm/qwen15", None, 100)
    assert args.teacher_cache == meta / "judge-cache" and args.since == "2026-12-07T14:33:10.5+00:00"  # PandaLM's
    assert (args.llmbar_sets, args.llmbar_limit) == (["llmbar-natural"], 100)
    assert args.until is None  # PandaLM was the last stage
    assert (args.grpo_steps, args.grpo_group_size) == (60, 4)  # SFT, then GRPO
    # the budget leaves the SFT time: serving (140 s on an H100, 2026-12-08), two later students' measures of the
    # 200 held-out prompts kept (485 took 142 s), GRPO's seconds and the LLMBar set for three students come out of
    # it, and the run ends within two device calls after a judge run (first call: the judge ~380 s, ~60 s of setup,
    # then --collect for the rest of it; second call: --collect 585)
    from evals.distill_bench import room_after_sft

    room = room_after_sft(142 * 200 / 485, grpo_steps=args.grpo_steps, grpo_budget_s=args.grpo_budget_s,
                          llmbar_sets=tuple(args.llmbar_sets), llmbar_limit=args.llmbar_limit)
    assert args.max_eval == 200 and args.budget_s - room - 140 >= 100 and args.budget_s + 380 + 60 <= 2 * 585
    (meta / "run.json").write_text(json.dumps({"judge": "hosted_vllm/qwen15", "stages": [
        {"dataset": "pandalm", "started": "2026-12-07T14:33:10.5+00:00"},
        {"dataset": "llmbar-natural", "started": "2026-12-07T14:35:00+00:00"}]}))  # a set judged after PandaLM
    done = subprocess.run(["bash", "evals/device/distill_run.sh", "--grpo-steps", "0"], capture_output=True,
                          text=True, env={**os.environ, "DISTILL_DRY_RUN": "1", "DISTILL_META": str(meta)}, timeout=60)
    args = build_parser().parse_args(done.stdout.splitlines())
    assert (args.since, args.until) == ("2026-12-07T14:33:10.5+00:00", "2026-12-07T14:35:00+00:00")
    assert args.grpo_steps == 0  # later arguments override
    done = subprocess.run(["bash", "evals/device/distill_run.sh", "--collect", "soon"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "WATCH_S" in done.stderr

    (meta / "run.json").write_text(json.dumps({"judge": "hosted_vllm/qwen15", "stages": []}))  # cut before PandaLM
    done = subprocess.run(["bash", "evals/device/distill_run.sh"], capture_output=True, text=True,
                          env={**os.environ, "DISTILL_DRY_RUN": "1", "DISTILL_META": str(meta)}, timeout=60)
    assert done.returncode == 2 and "no PandaLM stage" in done.stderr


def test_collecting_a_detached_distillation_says_how_it_ended(tmp_path):
    """`distill_run.sh --collect` packs out/ and the logs and exits with the run's own status: 124 while it still
    runs, 1 when no run left a status (a run killed before its EXIT trap, or none started), the run's status else."""
    import tarfile
    import time
    from pathlib import Path

    base, out = tmp_path / "distill", tmp_path / "OUT"
    out.mkdir()
    env = {**os.environ, "DISTILL_ROOT": str(base), "OUT": str(out)}

    def collect(watch: str = "0") -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "evals/device/distill_run.sh", "--collect", watch], capture_output=True,
                              text=True, env=env, timeout=60)

    assert collect().returncode == 1  # nothing ran
    (base / "out").mkdir(parents=True)
    (base / "out" / "report.json").write_text("{}")
    (base / "detached.log").write_text("started\n")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (base / "running.pid").write_text(str(sleeper.pid))
        started = time.monotonic()
        assert collect("1").returncode == 124 and time.monotonic() - started < 20  # still running: waited 1 s
    finally:
        sleeper.kill()
        sleeper.wait()
    # a run that stops before the bench (here: no kit parts on this machine, join_parts.sh's exit 3) leaves its status
    meta = tmp_path / "qwen15"
    meta.mkdir()
    (meta / "run.json").write_text(json.dumps({"judge": "hosted_vllm/qwen15", "stages": [
        {"dataset": "pandalm", "started": "2026-12-07T14:33:10.5+00:00"}]}))
    kit = Path("/tmp/gpukit")
    if os.path.exists("/tmp/site/vllm") or (kit.is_dir() and any(kit.glob("p*"))):
        pytest.skip("this machine has the GPU kit installed: the run would start")
    ran = subprocess.run(["bash", "evals/device/distill_run.sh"], capture_output=True, text=True,
                         env={**env, "DISTILL_META": str(meta)}, timeout=60)
    assert ran.returncode == 3 and (base / "rc").read_text().strip() == "3"
    assert collect().returncode == 3
    with tarfile.open(out / "distill.tgz") as tar:
        assert {"out/report.json", "detached.log"} <= set(tar.getnames())
