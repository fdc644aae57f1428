#!/usr/bin/env bash
# The GPU kit for the trainer's device runs (evals/device/one_gpu_split.sh), in as few parts as the device tool can
# carry: ../shared/gpu-kit/build.sh's wheels without the TRL peer and boto (datasets, multiprocess, boto3, botocore,
# s3transfer; --with-trl keeps them), plus any extra pip specs given, in parts as large as a call can carry beside
# the working tree (64 MiB a call). jmespath stays: vLLM's own server imports it.
#   usage (from the repository root): bash evals/device/kit.sh [--with-trl] [extra-spec ...]   e.g. "ray==2.60.0"
# Then one `run` call per part, back to back (the machine goes back after 30 s idle), each carrying .gpukit/kI:
#   mkdir -p /tmp/gpukit && cp .gpukit/kI/part /tmp/gpukit/pI     (the first call also: cp .gpukit/k0/install.sh /tmp/gpukit/)
# and, in the last part's call, `bash /tmp/gpukit/install.sh` before the measurement (2026-12-05: 8 parts of 56 MB,
# the install 80 s).
set -euo pipefail
root="$(git rev-parse --show-toplevel)"; cd "$root"
drop="trl datasets multiprocess boto3 botocore s3transfer"
if [ "${1:-}" = "--with-trl" ]; then drop=""; shift; fi
stage="$(mktemp -d)"; trap 'rm -rf "$stage"' EXIT
cp ../shared/gpu-kit/build.sh ../shared/gpu-kit/install.sh "$stage/"
grep -vxF -f <(printf '%s\n' $drop) ../shared/gpu-kit/wheels.txt > "$stage/wheels.txt" || true
grep -qx 'jmespath' "$stage/wheels.txt" || echo jmespath >> "$stage/wheels.txt"
part_mb=$(bash evals/device/part_mb.sh)  # as large as a call can carry beside the working tree
sed -i "s/split -b 48m/split -b ${part_mb}m/" "$stage/build.sh"
bash "$stage/build.sh" "$@"
