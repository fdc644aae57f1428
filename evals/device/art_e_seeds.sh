#!/usr/bin/env bash
# On the GPU host: several seeds of one ART·E learning run on one GPU, each started once the one before it serves
# (a vLLM starting beside another that is still profiling its memory fails: 2026-12-05), then watched until the
# call's end. Each seed is evals/device/art_e_run.sh PREFIX-seedS BUDGET_S ARGS --seed S.
#   usage: bash evals/device/art_e_seeds.sh PREFIX BUDGET_S WATCH_S SEED [SEED ...] -- [email_agent.py arguments]
#   e.g.   bash evals/device/art_e_seeds.sh ruler-ref 900 560 0 1 -- --reward ruler --judge self \
#              --judge-sees-reference --gpu-memory-utilization 0.3
# WATCH_S: seconds from this script's start after which it collects (evals/device/collect.sh) and returns, within
# the device tool's 600-s call. Send the next `bash evals/device/collect.sh 590` calls in the same message as
# this one, so that no pause of the caller falls between calls (the machine goes back after 30 s idle, and with it
# every run: 2026-12-06). ART_E_DRY_RUN=1 prints each seed's arguments, one run a line, and starts nothing.
set -uo pipefail
root=$PWD; prefix=$1; budget=$2; watch=$3; shift 3
seeds=(); while [ $# -gt 0 ] && [ "$1" != -- ]; do seeds+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the --
[ ${#seeds[@]} -gt 0 ] || { echo "art_e_seeds.sh: no seed given" >&2; exit 2; }
for s in "${seeds[@]}"; do
  [[ "$s" =~ ^[0-9]+$ ]] || { echo "art_e_seeds.sh: seed '$s' is not a non-negative integer" >&2; exit 2; }
done
if [ "${ART_E_DRY_RUN:-0}" = 1 ]; then
  for s in "${seeds[@]}"; do bash "$root/evals/device/art_e_run.sh" "$prefix-seed$s" "$budget" "$@" --seed "$s" | paste -sd' '; done
  exit 0
fi
t0=$SECONDS
for i in "${!seeds[@]}"; do
  s=${seeds[$i]}; name="$prefix-seed$s"
  bash "$root/evals/device/art_e_run.sh" "$name" "$budget" "$@" --seed "$s" || exit $?
  [ $i -eq $((${#seeds[@]} - 1)) ] && break
  # serving: its untrained evaluation is written (vLLM is up and its memory settled); at most 400 s
  for _ in $(seq 1 80); do [ -f "/tmp/report/$name/before.parquet" ] && break
    pgrep -f "name $name " > /dev/null || { echo "$name ended before serving:"; tail -5 "/tmp/run-$name.log"; break; }
    sleep 5; done
  echo "$name serving at $((SECONDS - t0)) s"
done
bash "$root/evals/device/collect.sh" $((watch - (SECONDS - t0)))
