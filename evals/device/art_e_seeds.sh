#!/usr/bin/env bash
# On the GPU host: several seeds of one ART·E learning run on one GPU, one after another (each starts when the one
# before it has ended: two side by side do not fit an H100 with 32k-token passes, the trainer's memory plan refused
# the second on 2026-12-07, and a vLLM starting beside another still profiling its memory fails: 2026-12-05), then
# watched until WATCH_S. Each seed is evals/device/art_e_run.sh PREFIX-seedS BUDGET_S ARGS --seed S; the chain runs
# in the background (its log: /tmp/art_e_chain.log; $ART_E_CHAIN_MARKER, default /tmp/art_e_chain.running, holds
# its pid while it runs, and a second chain is refused while that one lives).
#   usage: bash evals/device/art_e_seeds.sh PREFIX BUDGET_S WATCH_S SEED [SEED ...] -- [email_agent.py arguments]
#   e.g.   bash evals/device/art_e_seeds.sh ruler-ref 900 560 0 1 -- --reward ruler --judge self \
#              --judge-sees-reference --gpu-memory-utilization 0.3 --steps 6
# WATCH_S: seconds from this script's start after which it collects (evals/device/collect.sh) and returns, within
# the device tool's 600-s call. Send the next `bash evals/device/collect.sh 590` calls in the same message as
# this one, so that no pause of the caller falls between calls (the machine goes back after 30 s idle, and with it
# every run: 2026-12-06). ART_E_DRY_RUN=1 prints each seed's arguments, one run a line, and starts nothing.
set -uo pipefail
root=$PWD; prefix=$1; budget=$2; watch=$3; shift 3
source "$(dirname "$0")/chain.sh"  # $marker, chain_alive, split_seeds
split_seeds "$@" || exit 2
set -- ${rest[@]+"${rest[@]}"}
if [ "${ART_E_DRY_RUN:-0}" = 1 ]; then
  for s in "${seeds[@]}"; do bash "$root/evals/device/art_e_run.sh" "$prefix-seed$s" "$budget" "$@" --seed "$s" | paste -sd' '; done
  exit 0
fi
if [ "${ART_E_CHAIN:-0}" = 1 ]; then  # the chain itself (started detached below): each seed once the one before ended
  echo $$ > "$marker"; trap 'rm -f "$marker"' EXIT
  t0=$SECONDS
  for s in "${seeds[@]}"; do  # a seed that does not start ends the chain: the rest would fail the same way
    name="$prefix-seed$s"
    bash "$root/evals/device/art_e_run.sh" "$name" "$budget" "$@" --seed "$s" || { echo "$name did not start"; break; }
    while kill -0 "$(cat "/tmp/run-$name.pid")" 2> /dev/null; do sleep 5; done
    echo "$name ended at $((SECONDS - t0)) s: $(tr '\r' '\n' < "/tmp/run-$name.log" | grep -E '^step [0-9]+' | tail -1)"
  done
  exit 0
fi
chain_alive && { echo "art_e_seeds.sh: a chain of seeds is still running (pid $(cat "$marker"))" >&2
                 exit 3; }
t0=$SECONDS
ART_E_CHAIN=1 setsid nohup bash "$0" "$prefix" "$budget" "$watch" "${seeds[@]}" -- "$@" > /tmp/art_e_chain.log 2>&1 \
  < /dev/null &
sleep 5  # the chain has written its marker, so collect.sh waits for it
bash "$root/evals/device/collect.sh" $((watch - (SECONDS - t0)))
cat /tmp/art_e_chain.log
