#!/usr/bin/env bash
# Makes this checkout importable as ruler_rl without pip, for a machine where it cannot be installed (the GPU host
# has no package index): DIR/ruler_rl/ gets links to ruler/'s files and to judges/ and trainer/, the folders
# pyproject's package-dir maps to ruler_rl, ruler_rl.judges and ruler_rl.trainer. Put DIR on PYTHONPATH. (The docs
# build links them the same way for mkdocstrings: docs/hooks.py.)
#   usage: bash evals/device/link_package.sh DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${1:?usage: link_package.sh DIR}"
rm -rf "$dir/ruler_rl"
mkdir -p "$dir/ruler_rl"
for f in "$root"/ruler/*; do ln -s "$f" "$dir/ruler_rl/$(basename "$f")"; done
ln -s "$root/judges" "$dir/ruler_rl/judges"
ln -s "$root/trainer" "$dir/ruler_rl/trainer"
