#!/usr/bin/env bash
# On the GPU host (issue #36, table 2), after `evals/device/judge_run.sh --meta-only` in the same session: distil
# the judge it served (Qwen2.5-Coder-1.5B; its litellm name read from the run's run.json, `hosted_vllm/qwen15`)
# into SmolLM2-135M from the judgments it made on PandaLM (its judge cache, from the PandaLM stage's start to the
# next stage's start, if any: the other sets' judgments stay out of training, so LLMBar measures the student
# outside its training data), with evals.distill_bench's gpu mode: SFT, then GRPO from the SFT adapter (reward:
# agreement with the teacher), each student's agreement with the teacher on held-out PandaLM groups (paired with
# the untrained student's), and LLMBar Natural for all three (100 pairs: on 2026-12-07 the untrained SmolLM2 took
# 71 s for 278 prompts on an H200, so four sets for three students would not fit; give --llmbar-sets for more). Joins the parts if not done yet (join_parts.sh) and
# dequantizes the kit's SmolLM2 GGUF (/tmp/gpukit/*.gguf) to /tmp/models/SmolLM2-135M-Instruct first
# (evals.gguf_to_hf, once; on 2026-12-07 the kit's install.sh, which did it before, was not on the host).
# Results: /tmp/distill/out (report.json, README.md, run.log, vLLM's log), packed as $OUT/distill.tgz.
#   usage: bash evals/device/distill_run.sh [--detach] [evals.distill_bench gpu arguments ...]   (later ones override)
# The 720-s budget: serving about 100-140 s, then the SFT (at most 300 steps; 95 took 68 s on an H200) until only
# the room for what follows is left (evals.distill_bench.room_after_sft: two later students' measures of about 200
# held-out prompts each, `--max-eval`, whole groups; the untrained one's time plus a quarter each, ~75 s on an H100,
# where all 485 took 142 s on 2026-12-08; GRPO's 150 s + 30; LLMBar Natural, 45 s a student): about 120 s of SFT;
# GRPO (its own vLLM's start included), the three students' measures. With judge_run.sh (~380 s) before it, two
# device calls:
#   1: bash evals/device/judge_run.sh ...; bash evals/device/distill_run.sh --detach
#      bash evals/device/distill_run.sh --collect $((585 - SECONDS))
#   2: bash evals/device/distill_run.sh --collect 585
#          bash evals/device/distill_run.sh --collect WATCH_S   # a later call: wait for a detached run, pack it
# --detach starts the run in the background and returns (its log /tmp/distill/detached.log): a run longer than one
# device call (600 s) is watched and packed by `--collect`, in the same call for what is left of it and again in the
# next, which waits at most WATCH_S seconds for it to end and packs what there is either way (out/, the logs).
# --collect's exit status: the run's own when it ended, 124 while it still runs, 1 when no run left a status.
# DISTILL_ROOT (default /tmp/distill) is where the run writes (out/, its pid, its exit status, the logs).
# Run judge_run.sh once per host: a second run's PandaLM judgments come from the cache with their first times,
# before the second run.json's start, and --since would leave them out.
# DISTILL_DRY_RUN=1 prints the arguments, one a line, and starts nothing; DISTILL_META (default /tmp/judge/qwen15)
# is the judge run's folder (run.json, judge-cache).
set -uo pipefail
root=$PWD; meta=${DISTILL_META:-/tmp/judge/qwen15}; base=${DISTILL_ROOT:-/tmp/distill}; pidfile=$base/running.pid
alive() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2> /dev/null; }
pack() {  # out/ and the logs, as $OUT/distill.tgz
  local logs=(); for f in detached.log convert.log; do [ -f "$base/$f" ] && logs+=("$f"); done
  [ -n "${OUT:-}" ] && [ -d "$OUT" ] && tar czf "$OUT/distill.tgz" -C "$base" out ${logs[@]+"${logs[@]}"} 2>/dev/null
}
if [ "${1:-}" = --collect ]; then
  [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "distill_run.sh: WATCH_S '${2:-}' is not a non-negative integer" >&2; exit 2; }
  end=$((SECONDS + $2))
  while alive && [ $SECONDS -lt $end ]; do sleep 5; done
  tail -30 "$base/out/run.log" 2>/dev/null; pack
  if alive; then echo "distill_run.sh: still running after $2 s; packed what there is"; exit 124; fi
  [ -f "$base/rc" ] || { echo "distill_run.sh: no run left an exit status in $base" >&2
                         tail -5 "$base/detached.log" 2>/dev/null; exit 1; }
  exit "$(cat "$base/rc")"
fi
detach=0; rest=()
for a in "$@"; do [ "$a" = --detach ] && detach=1 || rest+=("$a"); done
set -- ${rest[@]+"${rest[@]}"}
read -r teacher since until < <(python3 -c 'import json, sys
run = json.load(open(sys.argv[1]))
stages = run.get("stages", [])
i = next(i for i, s in enumerate(stages) if s["dataset"] == "pandalm")
print(run["judge"], stages[i]["started"], stages[i + 1]["started"] if i + 1 < len(stages) else "")' \
  "$meta/run.json" 2> /dev/null) || true
[ -n "${since:-}" ] || { echo "distill_run.sh: no PandaLM stage in $meta/run.json: run judge_run.sh --meta-only" \
                              "first" >&2; exit 2; }
bound=(); [ -n "${until:-}" ] && bound=(--until "$until")
cmd=(gpu --teacher "$teacher" --teacher-cache "$meta/judge-cache" --since "$since" ${bound[@]+"${bound[@]}"} \
  --holdout 0.2 --out "$base/out" --judge-dir "$base/judge" --model-dir /tmp/models/SmolLM2-135M-Instruct \
  --budget-s 720 --steps 300 --batch-size 8 --lr 2e-4 --grpo-steps 60 --grpo-group-size 4 --grpo-budget-s 150 \
  --gpu-memory-utilization 0.3 --enforce-eager --max-eval 200 \
  --llmbar-limit 100 --llmbar-root "$(dirname "$root")/shared/data/judge-meta" --llmbar-sets llmbar-natural "$@")
[ "${DISTILL_DRY_RUN:-0}" = 1 ] && { printf '%s\n' "${cmd[@]}"; exit 0; }
if [ $detach = 1 ]; then
  alive && { echo "distill_run.sh: a detached run is still going (pid $(cat "$pidfile"))" >&2; exit 3; }
  mkdir -p "$base"; rm -rf "$base/rc" "$base/out"  # --collect packs this run's results, not an earlier one's
  setsid nohup bash "$0" "$@" > "$base/detached.log" 2>&1 < /dev/null &
  echo $! > "$pidfile"; echo "distill_run.sh: detached (pid $!, log $base/detached.log)"; exit 0
fi
mkdir -p "$base"; rm -f "$base/rc"
trap 'echo $? > "$base/rc"' EXIT  # the run's exit status for --collect, also when it stops before the bench
bash "$root/evals/device/join_parts.sh" || exit $?
bash "$root/evals/device/link_package.sh" /tmp/ruler-rl  # the checkout as ruler_rl (no pip install there)
export PYTHONPATH=/tmp/site:/tmp/ruler-rl:$root VLLM_USE_FLASHINFER_SAMPLER=0 LITELLM_LOCAL_MODEL_COST_MAP=True \
  PYTHONUNBUFFERED=1 TQDM_DISABLE=1
student=/tmp/models/SmolLM2-135M-Instruct
if [ ! -f $student/config.json ]; then
  gguf=$(ls /tmp/gpukit/*.gguf 2> /dev/null | head -1)
  [ -n "$gguf" ] || { echo "distill_run.sh: no SmolLM2 GGUF in /tmp/gpukit (the kit's parts, kit.sh)" >&2; exit 5; }
  python3 -m evals.gguf_to_hf "$gguf" $student > "$base/convert.log" 2>&1 || { tail -20 "$base/convert.log"
                                                                                exit 5; }
fi
mkdir -p "$base/out"
python3 -m evals.distill_bench "${cmd[@]}" 2>&1 | tee "$base/out/run.log" | tail -30
rc=${PIPESTATUS[0]}
pack
exit $rc
