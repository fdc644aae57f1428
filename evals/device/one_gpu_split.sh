#!/usr/bin/env bash
# On the GPU host (issue #35): the measurements of evals/reports/scale/one-gpu-split.md named, in order, their JSON
# and logs kept in /tmp/split and everything measured so far brought back as $OUT/split.tgz.
#   usage: bash evals/device/one_gpu_split.sh PART [PART ...]   PART: install | tiny-colocated | tiny-split |
#          agent-colocated | agent-split | tiny-split-ray | report   (e.g. `install tiny-split tiny-colocated report`)
# `install` joins the GPU kit's parts (/tmp/gpukit/p*, from `bash evals/device/kit.sh`, with "ray==2.60.0" for
# tiny-split-ray, or from `bash evals/device/pack.sh`) with join_parts.sh and converts SmolLM2-135M-Instruct; each
# later part starts its own vLLM server and closes it.
set -uo pipefail
bash evals/device/link_package.sh /tmp/ruler-rl  # the checkout as ruler_rl (no pip install there)
export PYTHONPATH=/tmp/site:/tmp/ruler-rl:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 LITELLM_LOCAL_MODEL_COST_MAP=True \
  PYTHONUNBUFFERED=1 TQDM_DISABLE=1
res=/tmp/split; mkdir -p $res
bench() { python3 -m evals.scale_bench pipeline --out $res "$@"; }
pack() {  # the JSON files and logs only: runs/ holds every step's LoRA checkpoint (over the 16 MB a file may have)
  (cd /tmp && find split -maxdepth 1 -type f -print0 | tar czf "$OUT/split.part" --null -T - \
     && mv "$OUT/split.part" "$OUT/split.tgz") 2>/dev/null
}
part() {
  case "$1" in
    install) bash evals/device/join_parts.sh && bash /tmp/gpukit/install.sh && { python3 -c "import ray; print('ray', ray.__version__)" || true; } ;;
    tiny-colocated) bench --task tiny --enforce-eager --placement colocated --phases plain:20 ;;
    tiny-split) bench --task tiny --enforce-eager --placement split --util 0.3 --trainer-share 0.5 --phases overlap:20 ;;
    agent-colocated) bench --task agent --shape qwen2.5-7b --placement colocated --phases plain:3 ;;
    agent-split) bench --task agent --shape qwen2.5-7b --placement split --util 0.45 --trainer-share 0.5 \
                   --phases plain:2,overlap:3 ;;
    tiny-split-ray) bench --task tiny --enforce-eager --placement split --util 0.3 --trainer-share 0.5 --ray-trainer \
                      --phases overlap:5 ;;
    report) python3 -m evals.scale_bench pipeline-report --out $res > $res/tables.md; cat $res/tables.md ;;
    *) echo "unknown part: $1" >&2; return 2 ;;
  esac 2>&1 | tee -a "$res/$1.log"
  local rc=${PIPESTATUS[0]}
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader >> "$res/$1.log" 2>/dev/null
  pack
  return "$rc"
}
# several parts in one call (the device's start and vLLM's are the cost): packed every 20 s as well, so a call cut
# at its time limit still brings back the steps measured so far
(while sleep 20; do pack; done) &
packer=$!
rc=0
for p in "$@"; do part "$p" || rc=$?; done
kill "$packer" 2>/dev/null
pack
exit "$rc"
