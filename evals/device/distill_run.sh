#!/usr/bin/env bash
# On the GPU host (issue #36, table 2), after `evals/device/judge_run.sh --meta-only` in the same session: distil
# the judge it served (Qwen2.5-Coder-1.5B, `hosted_vllm/qwen15`) into SmolLM2-135M from the judgments it made
# on PandaLM (its judge cache, from the PandaLM stage's start on: the LLMBar judgments stay out of training, so
# LLMBar measures the student outside its training data), with evals.distill_bench's gpu mode: SFT, the untrained
# and distilled students' agreement with the teacher on held-out PandaLM groups (paired), and LLMBar's four sets.
# Results: /tmp/distill/out (report.json, README.md, vLLM's log), packed as $OUT/distill.tgz.
#   usage: bash evals/device/distill_run.sh [evals.distill_bench gpu arguments ...]   (later ones override)
# DISTILL_DRY_RUN=1 prints the arguments, one a line, and starts nothing (with a placeholder --since).
set -uo pipefail
root=$PWD; meta=/tmp/judge/qwen15
if [ "${DISTILL_DRY_RUN:-0}" = 1 ]; then
  since=2026-01-01T00:00:00+00:00
else
  since=$(python3 -c 'import json, sys
stages = json.load(open(sys.argv[1])).get("stages", [])
print(next(s["started"] for s in stages if s["dataset"] == "pandalm"))' "$meta/run.json") || {
    echo "distill_run.sh: no PandaLM stage in $meta/run.json: run judge_run.sh --meta-only first" >&2; exit 2; }
fi
cmd=(gpu --teacher hosted_vllm/qwen15 --teacher-cache "$meta/judge-cache" --since "$since" --holdout 0.2 \
  --out /tmp/distill/out --judge-dir /tmp/distill/judge --model-dir /tmp/models/SmolLM2-135M-Instruct \
  --budget-s 480 --steps 300 --batch-size 8 --lr 2e-4 --gpu-memory-utilization 0.3 --enforce-eager \
  --llmbar-limit 200 --llmbar-root "$(dirname "$root")/shared/data/judge-meta" \
  --llmbar-sets llmbar-natural llmbar-faireval llmbar-llmeval2 llmbar-mtbench "$@")
[ "${DISTILL_DRY_RUN:-0}" = 1 ] && { printf '%s\n' "${cmd[@]}"; exit 0; }
export PYTHONPATH=/tmp/site:/tmp/ruler-rl:$root VLLM_USE_FLASHINFER_SAMPLER=0 LITELLM_LOCAL_MODEL_COST_MAP=True \
  PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p /tmp/distill/out
python3 -m evals.distill_bench "${cmd[@]}" 2>&1 | tee /tmp/distill/out/run.log | tail -30
rc=${PIPESTATUS[0]}
tar czf "$OUT/distill.tgz" -C /tmp/distill out 2>/dev/null
exit $rc
