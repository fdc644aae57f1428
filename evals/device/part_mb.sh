#!/usr/bin/env bash
# Print the size in MiB of the parts that kit.sh and pack.sh cut: a device call carries at most 64 MiB, the part
# plus what travels with every call (the tracked tree and the untracked files git does not ignore), less 2 MiB of
# room. Exit 2 when that leaves under 16 MiB.   usage (from the repository root): bash evals/device/part_mb.sh
set -euo pipefail
tree_mb=$(( ( $( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null \
           | tail -1 | cut -f1) + 1048575 ) / 1048576 ))
part_mb=$(( 64 - tree_mb - 2 ))
[ "$part_mb" -ge 16 ] || { echo "the working tree takes ${tree_mb} MiB: too little room for parts" >&2; exit 2; }
echo "$part_mb"
