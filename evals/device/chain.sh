# Sourced by the device scripts that run a chain of GPU runs in the background (art_e_seeds.sh, collect.sh,
# ttt_runs.sh): where the chain keeps its pid while it runs, and whether that chain lives (the pid is a process of
# the chain's own script, not a pid reused by another program). Set chain_script (the script's file name without
# .sh) and chain_marker before sourcing for another chain; the defaults are art_e_seeds.sh's.
chain_script=${chain_script:-art_e_seeds}
marker=${chain_marker:-${ART_E_CHAIN_MARKER:-/tmp/art_e_chain.running}}
chain_alive() { [ -f "$marker" ] && grep -qs "$chain_script" "/proc/$(cat "$marker")/cmdline"; }
