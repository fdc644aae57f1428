#!/usr/bin/env bash
# Cut the parts already under .gpukit/PREFIX0 … PREFIXn (kit.sh's k, pack.sh's x or d) again, at the size
# part_mb.sh gives for today's working tree: a tree that grew since they were cut makes a call of part + tree pass
# the device tool's 64 MiB (2026-12-07: 57-MiB parts beside an 8.2-MiB tree were refused), and cutting again
# costs no download. The joined bytes are unchanged (join_parts.sh concatenates the parts in order). Nothing is
# replaced unless the new parts join to the same bytes as the old. Files beside the first part (kit.sh's
# .gpukit/k0/install.sh) stay in the first folder (on 2026-12-07 a cut dropped install.sh, and the GPU host had no
# SmolLM2 folder for the distillation run).
#   usage (from the repository root): bash evals/device/resplit.sh PREFIX [PREFIX ...]   e.g. resplit.sh k d
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: resplit.sh PREFIX [PREFIX ...] (k, d or x)" >&2; exit 2; }
mb=${PART_MB:-$(bash evals/device/part_mb.sh)}  # PART_MB: a size of one's own, in MiB
for p in "$@"; do
  [[ "$p" =~ ^[a-z]$ ]] || { echo "resplit.sh: prefix '$p' is not one letter" >&2; exit 2; }
  old=(); i=0; while [ -f ".gpukit/$p$i/part" ]; do old+=(".gpukit/$p$i/part"); i=$((i+1)); done
  [ ${#old[@]} -gt 0 ] || { echo "resplit.sh: no parts at .gpukit/${p}0/part" >&2; exit 3; }
  stage=$(mktemp -d .gpukit/.resplit.XXXXXX)
  cat "${old[@]}" | split -b "${mb}m" -d -a 3 - "$stage/x."
  [ "$(cat "${old[@]}" | sha256sum)" = "$(cat $(ls "$stage"/x.* | sort -V) | sha256sum)" ] \
    || { rm -rf "$stage"; echo "resplit.sh: the new parts of $p do not join to the old bytes" >&2; exit 4; }
  mkdir "$stage/keep"; find ".gpukit/${p}0" -maxdepth 1 -type f ! -name part -exec cp -p {} "$stage/keep/" \;
  rm -rf .gpukit/"$p"[0-9]*
  n=0; for f in $(ls "$stage"/x.* | sort -V); do mkdir -p ".gpukit/$p$n"; mv "$f" ".gpukit/$p$n/part"; n=$((n+1)); done
  find "$stage/keep" -maxdepth 1 -type f -exec mv {} ".gpukit/${p}0/" \;
  rmdir "$stage/keep" "$stage"
  echo "$p: ${#old[@]} parts -> $n parts of at most $mb MiB"
done
