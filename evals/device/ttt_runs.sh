#!/usr/bin/env bash
# On the GPU host (issue #36, table 3): tic-tac-toe runs of examples/tic_tac_toe.py with the hand reward and with
# RULER (the policy's untrained weights as judge: the best judge reachable there) for each seed given, side by side
# on one GPU. Each run starts once the one before it serves (its untrained measure written: a vLLM starting beside
# another still profiling its memory fails, 2026-12-05), in a chain in the background (log /tmp/ttt_chain.log;
# each run's log /tmp/run-ttt-REWARD-seedS.log, its report /tmp/report/ttt-REWARD-seedS). Then it watches until
# WATCH_S seconds from its start and collects: $OUT/ttt.tgz (the reports) and $OUT/ttt-logs.tgz.
#   usage: bash evals/device/ttt_runs.sh BUDGET_S WATCH_S SEED [SEED ...] [-- tic_tac_toe.py arguments]
#          bash evals/device/ttt_runs.sh --collect WATCH_S      # a later call: watch and collect again
# Every part of evals/device/pack.sh must be in /tmp/gpukit (join_parts.sh installs them once). BUDGET_S is each
# run's --time-budget-s (from its own launch): a safety stop; give --steps so that every run ends by its steps, so
# that both rewards run the same number of steps (RULER's steps are slower: on 2026-12-07 a shared budget stopped
# them at 13-15 steps against the hand reward's 40). Later arguments override the fixed ones below.
# TTT_REWARDS: the rewards run for each seed, in order (default "hand ruler"; each one of hand, ruler).
# TTT_DRY_RUN=1 prints each run's arguments, one run a line, and starts nothing. A run whose report folder exists
# (a second call on the same host) is refused by the example itself: use other seeds, or --collect.
set -uo pipefail
root=$PWD
collect() {  # watch until $1 seconds from now, then bring the reports back
  local end=$((SECONDS + $1))
  while [ $SECONDS -lt $end ] && { pgrep -f examples/tic_tac_toe.py > /dev/null || chain_alive; }; do sleep 10; done
  for f in /tmp/run-ttt-*.log; do
    [ -f "$f" ] && { echo "== $f"; tr '\r' '\n' < "$f" | grep -E "^held-out|^step [0-9]+ |Error|error:" | tail -4; }
  done
  tar czf "$OUT/ttt.tgz" -C /tmp report 2>/dev/null
  tar czf "$OUT/ttt-logs.tgz" /tmp/run-ttt-*.log /tmp/ttt_chain.log 2>/dev/null
  echo "still running: $(pgrep -f examples/tic_tac_toe.py | wc -l)$(chain_alive && echo ', the chain too')"
}
chain_script=ttt_runs chain_marker=/tmp/ttt_chain.running
source "$(dirname "$0")/chain.sh"  # $marker, chain_alive, split_seeds
int() { [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "ttt_runs.sh: $1 '${2:-}' is not a non-negative integer" >&2; exit 2; }; }
if [ "${1:-}" = --collect ]; then int WATCH_S "${2:-}"; collect "$2"; exit 0; fi
int BUDGET_S "${1:-}"; int WATCH_S "${2:-}"
budget=$1; watch=$2; shift 2
read -r -a rewards <<< "${TTT_REWARDS:-hand ruler}"
for r in "${rewards[@]}"; do
  [ "$r" = hand ] || [ "$r" = ruler ] || { echo "ttt_runs.sh: TTT_REWARDS holds '$r': each is hand or ruler" >&2
                                          exit 2; }
done
split_seeds "$@" || exit 2
set -- ${rest[@]+"${rest[@]}"}
args() {  # one run's arguments: reward $1, seed $2, then the caller's
  local reward=$1 seed=$2 name="ttt-$1-seed$2" judge=(); [ "$1" = ruler ] && judge=(--judge self)
  shift 2
  printf '%s\n' examples/tic_tac_toe.py --engine vllm --base-model /tmp/models/qwen15 --reward "$reward" \
    ${judge[@]+"${judge[@]}"} --seed "$seed" --steps 20 --groups 4 --group-size 8 --lr 1e-4 \
    --max-seq-length 8192 --eval-games 200 --eval-temperatures 0 1 --eval-every 5 --gpu-memory-utilization 0.12 \
    --no-sleep --enforce-eager --time-budget-s "$budget" --name "$name" --out "/tmp/runs/$name" --report "/tmp/report/$name" "$@"
}
if [ "${TTT_DRY_RUN:-0}" = 1 ]; then
  for s in "${seeds[@]}"; do for r in "${rewards[@]}"; do args "$r" "$s" "$@" | paste -sd' '; done; done
  exit 0
fi
if [ "${TTT_CHAIN:-0}" = 1 ]; then  # the chain itself (started detached below)
  echo $$ > "$marker"; trap 'rm -f "$marker"' EXIT
  t0=$SECONDS
  for s in "${seeds[@]}"; do for r in "${rewards[@]}"; do
    name="ttt-$r-seed$s"; mapfile -t cmd < <(args "$r" "$s" "$@")
    setsid nohup python3 "${cmd[@]}" > "/tmp/run-$name.log" 2>&1 < /dev/null &
    pid=$!; echo "started $name (pid $pid) at $((SECONDS - t0)) s"
    until grep -qs "^held-out at policy step 0" "/tmp/run-$name.log" || ! kill -0 $pid 2> /dev/null; do sleep 3; done
    kill -0 $pid 2> /dev/null || { echo "$name ended before it served: the rest would fail the same way"
                                   tail -5 "/tmp/run-$name.log"; exit 1; }
    echo "$name serves at $((SECONDS - t0)) s"
  done; done
  exit 0
fi
chain_alive && { echo "ttt_runs.sh: a chain is still running (pid $(cat "$marker"))" >&2; exit 3; }
t0=$SECONDS
bash "$root/evals/device/join_parts.sh" || exit $?
bash "$root/evals/device/link_package.sh" /tmp/ruler-rl  # the checkout as ruler_rl (no pip install there)
export PYTHONPATH=/tmp/site:/tmp/ruler-rl:$root VLLM_USE_FLASHINFER_SAMPLER=0 LITELLM_LOCAL_MODEL_COST_MAP=True \
  PYTHONUNBUFFERED=1 TQDM_DISABLE=1
[ -f /tmp/models/qwen15/config.json ] || python3 -m evals.gguf_to_hf /tmp/gpukit/qwen/qwen.gguf /tmp/models/qwen15 \
  > /tmp/convert.log 2>&1 || { tail -20 /tmp/convert.log; exit 5; }
mkdir -p /tmp/report /tmp/runs
TTT_CHAIN=1 setsid nohup bash "$0" "$budget" "$watch" "${seeds[@]}" -- "$@" > /tmp/ttt_chain.log 2>&1 < /dev/null &
for _ in $(seq 30); do [ -f "$marker" ] && break; sleep 1; done  # the chain has written its marker
collect $((watch - (SECONDS - t0)))
cat /tmp/ttt_chain.log
