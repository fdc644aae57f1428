# Sourced by art_e_seeds.sh and collect.sh: where art_e_seeds.sh's chain of seeds keeps its pid while it runs, and
# whether that chain lives (the pid is a process of art_e_seeds.sh, not a pid reused by another program).
marker=${ART_E_CHAIN_MARKER:-/tmp/art_e_chain.running}
chain_alive() { [ -f "$marker" ] && grep -qs art_e_seeds "/proc/$(cat "$marker")/cmdline"; }
