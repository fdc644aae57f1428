#!/usr/bin/env bash
# On the GPU host: join the parts in /tmp/gpukit/p* (from kit.sh or pack.sh) under /tmp and install their wheels
# into /tmp/site, once (skipped when /tmp/site/vllm is there); then, if `pack.sh --after-kit`'s parts are in
# /tmp/gpukit/d*, join them too and install their extra wheels, once. Exit 3: no parts or a broken join; 4: pip.
#   usage: bash evals/device/join_parts.sh
set -uo pipefail
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$@"; }
if [ ! -d /tmp/site/vllm ]; then
  compgen -G '/tmp/gpukit/p*' > /dev/null || { echo 'no parts in /tmp/gpukit' >&2; exit 3; }
  cat $(ls /tmp/gpukit/p* | sort -V) | tar xf - -C /tmp || exit 3
  install /tmp/gpukit/wheels/*.whl || exit 4
  if compgen -G '/tmp/gpukit/extra/*.whl' > /dev/null; then install /tmp/gpukit/extra/*.whl || exit 4; fi
fi
if compgen -G '/tmp/gpukit/d[0-9]*' > /dev/null && [ ! -f /tmp/gpukit/after-kit.done ]; then
  cat $(ls /tmp/gpukit/d[0-9]* | sort -V) | tar xf - -C /tmp || exit 3
  install /tmp/gpukit/extra/*.whl || exit 4
  touch /tmp/gpukit/after-kit.done
fi
