# Sourced by the device scripts that run a chain of GPU runs in the background (art_e_seeds.sh, collect.sh,
# ttt_runs.sh): where the chain keeps its pid while it runs, whether that chain lives (the pid is a process of
# the chain's own script, not a pid reused by another program), and split_seeds, their seeds-then-arguments. Set chain_script (the script's file name without
# .sh) and chain_marker before sourcing for another chain; the defaults are art_e_seeds.sh's.
chain_script=${chain_script:-art_e_seeds}
marker=${chain_marker:-${ART_E_CHAIN_MARKER:-/tmp/art_e_chain.running}}
chain_alive() { [ -f "$marker" ] && grep -qs "$chain_script" "/proc/$(cat "$marker")/cmdline"; }
# split_seeds ARG...: the arguments before `--` into $seeds (at least one, each a non-negative integer; else a
# message naming the calling script and status 2), those after it into $rest
split_seeds() {
  seeds=(); rest=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do seeds+=("$1"); shift; done
  [ $# -gt 0 ] && shift  # the --
  rest=("$@")
  [ ${#seeds[@]} -gt 0 ] || { echo "$(basename "$0"): no seed given" >&2; return 2; }
  local s
  for s in "${seeds[@]}"; do
    [[ "$s" =~ ^[0-9]+$ ]] || { echo "$(basename "$0"): seed '$s' is not a non-negative integer" >&2; return 2; }
  done
}
