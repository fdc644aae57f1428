"""Judge-cost benchmark: our RULER vs OpenPipe ART's `ruler_score_group`, side by side.

Runs `../shared/bench/ruler-peer/run_peer.py` for both implementations on the same corpus and the same
scripted judge, and prints per-group prompt tokens (cl100k), the ratio ours/ART (goal <= 0.60), cache
behaviour on a repeat, each side's outcome under the four judge faults, and CPU time per group.

    .venv/bin/python evals/ruler_peer_bench.py [--groups FILE | --mailbox TARBALL] [--art-venv DIR]

ART (openpipe-art==0.5.18, the newest that runs on Python 3.11) is installed once into a throw-away
venv (default /tmp/ruler-peer-artvenv). `--mailbox` builds a fresh corpus from another Enron mailbox
with the bench's own `make_corpus.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT.parent / "shared" / "bench" / "ruler-peer"
ART_SPEC = "openpipe-art==0.5.18"
FAULTS = ("malformed", "out_of_range", "shuffled", "missing_id")


def ensure_art(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if not py.exists() or subprocess.run([py, "-c", "import art"], capture_output=True).returncode:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", ART_SPEC], check=True)
    return py


def run(py: Path | str, impl: str, groups: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(ROOT)]), "RULER_PEER_GROUPS": str(groups),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "RULER_CACHE_DIR": tempfile.mkdtemp(prefix="ruler-peer-")}
    # run_peer.py (../shared, written before the package was named ruler_rl) imports `ruler`: for ours, this one
    # process gets ruler_rl under that name (the checkout's folder ruler/ refuses to be imported as `ruler`)
    alias = "import ruler_rl; sys.modules['ruler'] = ruler_rl; " if impl == "ours" else ""
    cmd = [str(py), "-c", "import resource, runpy, sys, json; sys.argv=['run_peer.py', %r]; %s"
           "runpy.run_path(%r, run_name='__main__'); r=resource.getrusage(resource.RUSAGE_SELF); "
           "print(json.dumps({'cpu_s': r.ru_utime + r.ru_stime}))" % (impl, alias, str(BENCH / "run_peer.py"))]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=BENCH)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or len(lines) < 2:
        raise SystemExit(f"{impl} failed:\n{out.stderr[-3000:]}")
    result = json.loads(lines[-2])
    result["cpu_s"] = json.loads(lines[-1])["cpu_s"]
    return result


def cpu_per_group(py, impl: str, groups: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(ROOT)]), "RULER_PEER_GROUPS": str(groups),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "RULER_CACHE_DIR": tempfile.mkdtemp(prefix="ruler-peer-cpu-")}
    out = subprocess.run([str(py), str(ROOT / "evals" / "ruler_peer_cpu.py"), impl], env=env, capture_output=True,
                         text=True, cwd=BENCH)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise SystemExit(f"{impl} CPU run failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])["rows"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=Path, default=BENCH / "groups.json")
    ap.add_argument("--mailbox", type=Path, help="build the corpus from this maildir tarball first")
    ap.add_argument("--art-venv", type=Path, default=Path(tempfile.gettempdir()) / "ruler-peer-artvenv")
    args = ap.parse_args()
    if not BENCH.is_dir():
        raise SystemExit(f"benchmark folder not found: {BENCH}")
    groups = args.groups
    if args.mailbox:
        groups = Path(tempfile.mkdtemp()) / "groups.json"
        subprocess.run([sys.executable, str(BENCH / "make_corpus.py"), str(args.mailbox), str(groups)], check=True)
    art_py = ensure_art(args.art_venv)
    art = run(art_py, "art", groups)
    ours = run(sys.executable, "ours", groups)
    cpu = {impl: cpu_per_group(py, impl, groups) for impl, py in (("art", art_py), ("ours", sys.executable))}
    print(f"corpus: {groups}")
    print(f"{'group':>5} {'n':>3} {'ART tok':>8} {'ours tok':>8} {'ratio':>6}  faults ART | ours")
    for a, o in zip(art["rows"], ours["rows"], strict=True):
        faults = " ".join(f"{f}={a[f]}|{o[f]}" for f in FAULTS)
        print(f"{a['group']:>5} {a['n']:>3} {a['tokens']:>8} {o['tokens']:>8} {o['tokens'] / a['tokens']:>6.3f}  {faults}")
    ta, to = sum(r["tokens"] for r in art["rows"]), sum(r["tokens"] for r in ours["rows"])
    print(f"total prompt tokens: ART {ta}, ours {to}, ratio {to / ta:.3f} (goal <= 0.60)")
    print(f"judge calls on a repeat: ART {sum(r['repeat_calls'] for r in art['rows'])}, "
          f"ours {sum(r['repeat_calls'] for r in ours['rows'])}")
    print(f"clean ranking right: ART {sum(r['clean'] == 'right' for r in art['rows'])}/{len(art['rows'])}, "
          f"ours {sum(r['clean'] == 'right' for r in ours['rows'])}/{len(ours['rows'])}")
    print(f"fault outcomes 'right': ART {sum(r[f] == 'right' for r in art['rows'] for f in FAULTS)}, "
          f"ours {sum(r[f] == 'right' for r in ours['rows'] for f in FAULTS)} of {len(FAULTS) * len(ours['rows'])}")

    def cold(rows):
        return sum(r["cold_s"] for r in rows) / len(rows)

    print(f"mean cold wall time per group (scripted judge, loopback): ART {cold(art['rows']):.4f} s, "
          f"ours {cold(ours['rows']):.4f} s")
    print(f"process CPU time (imports + all groups, faults included): ART {art['cpu_s']:.1f} s, ours {ours['cpu_s']:.1f} s")
    per = {k: sorted(r["cpu_s"] for r in v) for k, v in cpu.items()}
    med = {k: v[len(v) // 2] for k, v in per.items()}
    print(f"CPU per group, judge excluded (median of {len(per['ours'])} warm calls): ART {med['art'] * 1000:.1f} ms, "
          f"ours {med['ours'] * 1000:.1f} ms, ratio {med['ours'] / med['art']:.2f}")


if __name__ == "__main__":
    main()
