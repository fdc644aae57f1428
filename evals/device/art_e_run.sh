#!/usr/bin/env bash
# On the GPU host, after every part of evals/device/pack.sh is in /tmp/gpukit/p* (or kit.sh's in p* and
# `pack.sh --after-kit`'s in d*): install the wheels into
# /tmp/site, dequantize the GGUF to /tmp/models/qwen15, put the Enron folder beside the checkout, and start one
# ART·E learning run in the background (its log: /tmp/run-NAME.log, its report: /tmp/report/NAME).
#   usage: bash evals/device/art_e_run.sh NAME BUDGET_S [examples/email_agent.py arguments ...]
#   e.g.   bash evals/device/art_e_run.sh ruler-seed0 720 --reward ruler --judge self --seed 0
# The fixed arguments are the 2026-12-05 run's (evals/reports/art_e/README.md) with a held-out measure every 4
# policy steps (eval-stepNNNN.parquet: a run the machine is taken from before its end still has one; the untrained
# model's 108 questions took 19-27 s on the H100 on 2026-12-06);
# later ones override them.
set -uo pipefail
root=$PWD; name=$1; budget=$2; shift 2
reward=art; prev=""  # the run's reward: the last --reward given (argparse's rule), as `--reward X` or `--reward=X`
for a in "$@"; do
  case "$a" in --reward=*) reward=${a#--reward=} ;; *) [ "$prev" = --reward ] && reward=$a ;; esac; prev=$a
done
ruler_only=(); [ "$reward" = ruler ] && ruler_only=(--judge-max-prompt-tokens 24000)  # a flag of RULER runs only
cmd=(examples/email_agent.py --engine vllm --base-model /tmp/models/qwen15 --tool-mode native \
  --tool-choice required --eval-set both ${ruler_only[@]+"${ruler_only[@]}"} --max-turns 10 --max-tokens 1024 \
  --max-seq-length 32768 --steps 200 --groups-per-step 6 --group-size 6 --eval-questions 400 --concurrency 64 \
  --lr 1e-4 --gpu-memory-utilization 0.35 --no-sleep --eval-every 4 --time-budget-s "$budget" --name "$name" \
  --db "/tmp/runs/inbox-$name.db" --out "/tmp/runs/$name" --report "/tmp/report/$name" "$@")
# ART_E_DRY_RUN=1: print the run's arguments, one a line, and stop (tests/test_device_scripts.py parses them with
# examples/email_agent.py's own parser, so a wrong combination fails here, not after minutes of device time)
[ "${ART_E_DRY_RUN:-0}" = 1 ] && { printf '%s\n' "${cmd[@]:1}"; exit 0; }
bash "$root/evals/device/join_parts.sh" || exit $?
bash "$root/evals/device/link_package.sh" /tmp/ruler-rl  # the checkout as ruler_rl (no pip install there)
export PYTHONPATH=/tmp/site:/tmp/ruler-rl:$root VLLM_USE_FLASHINFER_SAMPLER=0 LITELLM_LOCAL_MODEL_COST_MAP=True
mkdir -p "$(dirname "$root")/shared/data/enron" && cp -n /tmp/gpukit/enron/* "$(dirname "$root")/shared/data/enron/"
[ -f /tmp/models/qwen15/config.json ] || python3 -m evals.gguf_to_hf /tmp/gpukit/qwen/qwen.gguf /tmp/models/qwen15 \
  > /tmp/convert.log 2>&1 || { tail -20 /tmp/convert.log; exit 5; }
mkdir -p /tmp/report /tmp/runs
setsid nohup python3 "${cmd[@]}" > "/tmp/run-$name.log" 2>&1 < /dev/null &
echo $! > "/tmp/run-$name.pid"  # art_e_seeds.sh waits on it (a pgrep right after the fork may not see the run yet)
echo "started $name (pid $!) at $(date +%T)"
