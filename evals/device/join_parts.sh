#!/usr/bin/env bash
# On the GPU host: join the parts in /tmp/gpukit/p* (from kit.sh or pack.sh) under /tmp and install their wheels
# into /tmp/site, once (nothing to do when /tmp/site/vllm is there). Exit 3: no parts or a broken join; 4: pip.
#   usage: bash evals/device/join_parts.sh
set -uo pipefail
[ -d /tmp/site/vllm ] && exit 0
compgen -G '/tmp/gpukit/p*' > /dev/null || { echo 'no parts in /tmp/gpukit' >&2; exit 3; }
cat $(ls /tmp/gpukit/p* | sort -V) | tar xf - -C /tmp || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  /tmp/gpukit/wheels/*.whl || exit 4
