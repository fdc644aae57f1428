#!/usr/bin/env bash
# On the GPU host (issue #36 part 1, #33's correctness judge), with every part of evals/device/pack.sh in
# /tmp/gpukit/p* (or kit.sh's in p* and `pack.sh --after-kit`'s in d*): join and install them (join_parts.sh,
# once), dequantize Qwen2.5-Coder-1.5B to /tmp/models/qwen15, serve it with vLLM and run the injection check over
# 50 groups, ART·E's labelled answer pairs with it as the correctness judge, then the judge meta-evaluation
# (LLMBar's four sets and PandaLM, k=1 and k=3, saved per set); results packed as $OUT/judge.tgz every 20 s, the
# judge cache as $OUT/judge-cache.tgz at the end.
#   usage: bash evals/device/judge_run.sh [--meta-only] [evals.gpu_judge_meta arguments ...]   e.g. --limit 200
# --meta-only: the meta-evaluation alone (no injection check, no answer pairs), for a call too short for all three.
# LLMBar's case-study pairs are written to /tmp/judge/llmbar-casestudy.jsonl first, in the labelled-pairs format
# users give `ruler eval judge --dataset` (table 1's user-label row): name it in `--datasets` (with `--by case`).
#   e.g. table 1's user-label row and table 2's teacher data, PandaLM last (distill_run.sh reads its judgments):
#   bash evals/device/judge_run.sh --meta-only --limit 1000 --datasets /tmp/judge/llmbar-casestudy.jsonl pandalm \
#        --by case
set -uo pipefail
root=$PWD
checks=(--answer-accuracy --injection-groups 50); rest=()
for a in "$@"; do [ "$a" = --meta-only ] && checks=() || rest+=("$a"); done  # --meta-only anywhere
set -- ${rest[@]+"${rest[@]}"}
res=/tmp/judge/qwen15
cmd=(evals.gpu_judge_meta --model /tmp/models/qwen15 --out $res --enforce-eager ${checks[@]+"${checks[@]}"} \
  --gpu-memory-utilization 0.85 --concurrency 256 "$@")
# JUDGE_RUN_DRY_RUN=1: print gpu_judge_meta's arguments, one a line, and stop (tests/test_device_scripts.py parses
# them with its own parser)
[ "${JUDGE_RUN_DRY_RUN:-0}" = 1 ] && { printf '%s\n' "${cmd[@]:1}"; exit 0; }
bash "$root/evals/device/join_parts.sh" || exit $?
bash "$root/evals/device/link_package.sh" /tmp/ruler-rl  # the checkout as ruler_rl (no pip install there)
export PYTHONPATH=/tmp/site:/tmp/ruler-rl:$root VLLM_USE_FLASHINFER_SAMPLER=0 LITELLM_LOCAL_MODEL_COST_MAP=True \
  PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p "$(dirname "$root")/shared/data" && cp -rn /tmp/gpukit/judge-meta "$(dirname "$root")/shared/data/"
python3 -m evals.judge_meta casestudy /tmp/judge/llmbar-casestudy.jsonl \
  --root "$(dirname "$root")/shared/data/judge-meta" || exit 5
[ -f /tmp/models/qwen15/config.json ] || python3 -m evals.gguf_to_hf /tmp/gpukit/qwen/qwen.gguf /tmp/models/qwen15 \
  > /tmp/convert.log 2>&1 || { tail -20 /tmp/convert.log; exit 5; }
mkdir -p $res
pack() { (cd /tmp/judge && tar czf "$OUT/judge.part" --exclude judge-cache qwen15 && mv "$OUT/judge.part" "$OUT/judge.tgz") 2>/dev/null; }
(while sleep 20; do pack; done) &
packer=$!
python3 -m "${cmd[@]}" 2>&1 | tee $res/run.log
rc=${PIPESTATUS[0]}
kill $packer 2>/dev/null; pack
# the judge cache too, once at the end (every judgment with its prompt: table 2's teacher data, so a distillation
# can also run off the GPU host with `ruler distill --teacher ... --cache`; on 2026-12-07 it stayed on the host)
(cd $res && tar czf "$OUT/judge-cache.tgz" judge-cache) 2>/dev/null
exit $rc
