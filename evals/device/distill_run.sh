#!/usr/bin/env bash
# On the GPU host (issue #36, table 2), after `evals/device/judge_run.sh --meta-only` in the same session: distil
# the judge it served (Qwen2.5-Coder-1.5B; its litellm name read from the run's run.json, `hosted_vllm/qwen15`)
# into SmolLM2-135M from the judgments it made on PandaLM (its judge cache, from the PandaLM stage's start on: the
# LLMBar judgments stay out of training, so LLMBar measures the student outside its training data), with
# evals.distill_bench's gpu mode: SFT (no GRPO stage), the untrained and distilled students' agreement with the
# teacher on held-out PandaLM groups (paired), and LLMBar's four sets. Converts SmolLM2 first (/tmp/gpukit/
# install.sh, once). Results: /tmp/distill/out (report.json, README.md, vLLM's log), packed as $OUT/distill.tgz.
#   usage: bash evals/device/distill_run.sh [evals.distill_bench gpu arguments ...]   (later ones override)
# Run judge_run.sh once per host: a second run's PandaLM judgments come from the cache with their first times,
# before the second run.json's start, and --since would leave them out.
# DISTILL_DRY_RUN=1 prints the arguments, one a line, and starts nothing; DISTILL_META (default /tmp/judge/qwen15)
# is the judge run's folder (run.json, judge-cache).
set -uo pipefail
root=$PWD; meta=${DISTILL_META:-/tmp/judge/qwen15}
read -r teacher since < <(python3 -c 'import json, sys
run = json.load(open(sys.argv[1]))
print(run["judge"], next(s["started"] for s in run.get("stages", []) if s["dataset"] == "pandalm"))' \
  "$meta/run.json" 2> /dev/null) || true
[ -n "${since:-}" ] || { echo "distill_run.sh: no PandaLM stage in $meta/run.json: run judge_run.sh --meta-only" \
                              "first" >&2; exit 2; }
cmd=(gpu --teacher "$teacher" --teacher-cache "$meta/judge-cache" --since "$since" --holdout 0.2 \
  --out /tmp/distill/out --judge-dir /tmp/distill/judge --model-dir /tmp/models/SmolLM2-135M-Instruct \
  --budget-s 480 --steps 300 --batch-size 8 --lr 2e-4 --gpu-memory-utilization 0.3 --enforce-eager \
  --llmbar-limit 200 --llmbar-root "$(dirname "$root")/shared/data/judge-meta" \
  --llmbar-sets llmbar-natural llmbar-faireval llmbar-llmeval2 llmbar-mtbench "$@")
[ "${DISTILL_DRY_RUN:-0}" = 1 ] && { printf '%s\n' "${cmd[@]}"; exit 0; }
bash "$root/evals/device/link_package.sh" /tmp/ruler-rl  # the checkout as ruler_rl (no pip install there)
bash /tmp/gpukit/install.sh > /tmp/distill-install.log 2>&1 || { tail -20 /tmp/distill-install.log; exit 5; }
export PYTHONPATH=/tmp/site:/tmp/ruler-rl:$root VLLM_USE_FLASHINFER_SAMPLER=0 LITELLM_LOCAL_MODEL_COST_MAP=True \
  PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p /tmp/distill/out
python3 -m evals.distill_bench "${cmd[@]}" 2>&1 | tee /tmp/distill/out/run.log | tail -30
rc=${PIPESTATUS[0]}
tar czf "$OUT/distill.tgz" -C /tmp/distill out 2>/dev/null
exit $rc
