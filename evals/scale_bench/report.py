"""`report` and `pipeline-report`: markdown tables from the JSON files the parts write."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def _peak(row: dict) -> str:
    """The device's peak during a train call; runs before this field existed only recorded the rise above the
    call's start (vLLM awake), which sleeping vLLM hides: shown as not measured."""
    v = row.get("peak_gpu_gib_device_during")
    mine = row.get("trainer_peak_allocated_gib")
    return ("not measured" if v is None else f"{v:.1f}") + ("" if mine is None else f" (trainer's torch: {mine:.1f})")


def report(out: Path) -> str:
    """Markdown tables from the JSON files in `out`."""
    lines = []
    for f in sorted(out.glob("ours-*.json")):
        a = json.loads(f.read_text())
        shape = a["shape"]
        lines.append(f"\n### {shape} ({a['params'] / 1e9:.2f}B parameters), ours\n")
        lines.append("| measure | value |\n|---|---|")
        lines.append(f"| register (trainer build + vLLM server start, s) | {a.get('register_s', float('nan')):.0f} |")
        lines.append(f"| peak GPU memory over the whole run (GiB, NVML, device) | {a.get('peak_gpu_gib', 0):.1f} |")
        p = a.get("prefix")
        if p:
            lines.append(f"| prefix: rollout s (4x8, {statistics.mean(p['prompt_tokens']):.0f}-token prompts, "
                         f"{p['sampled_tokens']} sampled), base model | "
                         f"{' / '.join(f'{x:.2f}' for x in p['rollout_s'])} |")
            if p.get("rollout_adapter_s"):
                lines.append("| prefix: rollout s before each train call (with the latest adapter) | "
                             f"{' / '.join(f'{x:.2f}' for x in p['rollout_adapter_s'])} |")
            for key in ("share", "no_share"):
                for row in p.get(key, []):
                    if "error" in row:
                        lines.append(f"| prefix {key}: train | {row['error'][:200]} |")
                        continue
                    lines.append(f"| prefix {key}: train s / sequence tokens / forward tokens / rows / device peak "
                                 f"GiB in the train call | {row['train_s']:.2f} / {row['sequence_tokens']} / "
                                 f"{row['forward_tokens']} / {row['rows']} / {_peak(row)} |")
                    lines.append(f"| prefix {key}: sleep+wake s / adapter load s / step s | "
                                 f"{row['sleep_wake_s']:.2f} / {row['adapter_swap_s']:.2f} / {row['step_s']:.2f} |")
        ag = a.get("agent")
        if ag:
            for i, row in enumerate(ag["steps"]):
                if "error" in row:
                    lines.append(f"| agent step {i + 1} | {row['error'][:300]} |")
                    continue
                pad = 0.0  # rows are batches of one: no padding token is ever run
                offload = f" + {row['offload_s']:.2f}" if "offload_s" in row else ""
                lines.append(f"| agent step {i + 1}: wall s = rollout + train + sleep/wake + adapter"
                             f"{' + offload' if offload else ''} | {row['wall_s']:.1f} = {row['rollout_wall_s']:.1f} + "
                             f"{row['train_s']:.1f} + {row['sleep_wake_s']:.2f} + {row['adapter_swap_s']:.2f}{offload} "
                             "(+ rest) |")
                lines.append(f"| agent step {i + 1}: rollout tok/s / train tok/s (sequence tokens) | "
                             f"{row['rollout_tokens_per_s']:.0f} / {row['train_tokens_per_s']:.0f} |")
                lines.append(f"| agent step {i + 1}: sequences / sequence tokens / forward tokens / rows / "
                             f"context breaks / padding | {row['sequences']} / {row['sequence_tokens']} / "
                             f"{row['forward_tokens']} / {row['rows']} / {row['context_breaks']} / {pad:.0%} |")
                lines.append(f"| agent step {i + 1}: device peak GiB in the train call | {_peak(row)} |")
        for e in a.get("errors", []):
            lines.append(f"| error | {e.splitlines()[-1][:300] if e else ''} |")
    for f in sorted(out.glob("raw-*.json")):
        if f.name.startswith("raw-server-"):  # below
            continue
        r = json.loads(f.read_text())
        lines.append(f"\nraw vLLM {r['shape']}: " + ", ".join(f"{x['s']:.2f}s {x['tokens_per_s']:.0f} tok/s"
                                                             for x in r["runs"]))
        ours_file = out / f"ours-{r['shape']}.json"
        mine = json.loads(ours_file.read_text()).get("prefix", {}) if ours_file.is_file() else {}
        if len(mine.get("rollout_tokens_per_s", [])) > 1 and len(r["runs"]) > 1:  # the first of each warms up
            ours_best = max(mine["rollout_tokens_per_s"][1:])
            raw_best = max(x["tokens_per_s"] for x in r["runs"][1:])
            lines.append(f"rollout throughput, ours / raw vLLM (best after the first run of each): "
                         f"{ours_best:.0f} / {raw_best:.0f} = {ours_best / raw_best:.2f}x")
            ours_med = statistics.median(mine["rollout_tokens_per_s"][1:])
            raw_med = statistics.median(x["tokens_per_s"] for x in r["runs"][1:])
            lines.append(f"rollout throughput, ours / raw vLLM (median after the first run of each; "
                         f"{len(mine['rollout_tokens_per_s']) - 1} and {len(r['runs']) - 1} runs): "
                         f"{ours_med:.0f} / {raw_med:.0f} = {ours_med / raw_med:.2f}x")
    for f in sorted(out.glob("raw-server-*.json")):
        r = json.loads(f.read_text())
        for kind, runs in r["kinds"].items():
            if runs:
                med = statistics.median(x["tokens_per_s"] for x in runs)
                lines.append(f"vLLM's own server ({kind}), {r['shape']}: " + ", ".join(f"{x['s']:.2f}s" for x in runs)
                             + f"; median {med:.0f} tok/s")
    for f in sorted(out.glob("trl-*.json")):
        t = json.loads(f.read_text())
        lines.append(f"\nTRL {t['shape']} ({t.get('workload', 'prefix')} workload): steps {t.get('step_s')}, "
                     f"peak {t.get('peak_gpu_gib', 0):.1f} GiB, "
                     f"errors {len(t.get('errors', []))}")
    return "\n".join(lines)


def pipeline_report(out: Path) -> str:
    """Markdown tables of the `pipeline-*.json` files in `out`: per run and phase the steady seconds per step and
    steps/s, the rollout seconds hidden behind training, the adapter hand-over, sleep/wake and policy lag; then
    each run's reward per step side by side (equal curves: the same task, seed and step count)."""
    runs = [json.loads(f.read_text()) for f in sorted(Path(out).glob("pipeline-*.json"))]
    if not runs:
        return f"no pipeline-*.json in {out}"

    def num(v, fmt=".2f"):
        return "" if v is None else format(v, fmt)

    lines = [("| run | phase | steps | first step s | steady step s | steps/s | rollout s (all) | hidden s | hidden "
              "| adapter hand-over s | sleep+wake s | policy lag mean / max | reward last |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for p in run.get("phase_summary", []):
            steady = p.get("steady_step_s")
            lines.append(f"| {run['label']} | {p['kind']} | {p['steps']} | {num(p.get('first_step_s'))} | "
                         f"{num(steady)} | {num(1 / steady if steady else None, '.3f')} | "
                         f"{num(p.get('rollout_total_s'))} | {num(p.get('rollout_hidden_s'))} | "
                         f"{num(p.get('rollout_hidden_frac'), '.0%')} | {num(p.get('adapter_swap_s_mean'), '.3f')} | "
                         f"{num(p.get('sleep_wake_s_mean'))} | {num(p.get('policy_lag_mean'))} / "
                         f"{'' if p.get('policy_lag_max') is None else p['policy_lag_max']} | "
                         f"{num(p.get('reward_last'), '.3f')} |")
        if run.get("errors"):
            lines.append(f"| {run['label']} | error | | | | | | | | | | | {run['errors'][-1].splitlines()[-1][:80]} |")
    steps = max(len(run["steps"]) for run in runs)
    lines += ["", "| step | " + " | ".join(run["label"] for run in runs) + " |",
              "|---" * (len(runs) + 1) + "|"]
    for i in range(steps):
        cells = [num(run["steps"][i].get("reward_mean"), ".3f") if i < len(run["steps"]) else "" for run in runs]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


