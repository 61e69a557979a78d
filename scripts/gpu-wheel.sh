#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: the binary wheel made
# here (`make wheel WHEEL_PYTHON=python3.12`, carried in dist/) installed
# offline into a venv of the machine's Python, with no build step: then
# `fst --version`, `fst doctor`, `fst load` onto cuda:0 and a Python load onto
# cuda:0 checked byte for byte against safetensors, all from the installed
# package. SUITE=1 also runs the Python suite (tests/python) against it.
# Results go to OUT; the venv (VENV) is left for later steps.
set -uo pipefail
OUT=${OUT:-/tmp/fst-wheel-out}
WORK=${WORK:-/tmp/fst-wheel-work}
VENV=${VENV:-$WORK/venv}
SUITE=${SUITE:-0}
mkdir -p "$OUT" "$WORK"
py=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
whl=$(ls dist/fst_loader-*-"$py"-"$py"-*manylinux_2_28_x86_64.whl 2>/dev/null | tail -1)
[ -n "$whl" ] || { echo "gpu-wheel: no $py x86-64 wheel in dist/" | tee "$OUT/wheel.txt"; exit 1; }
{
	echo "\$ sha256sum $whl"
	sha256sum "$whl"
	echo "\$ python3 -m venv --system-site-packages $VENV   # torch is the machine's"
	python3 -m venv --system-site-packages "$VENV"
	echo "\$ $VENV/bin/pip install --no-index --no-deps $whl"
	"$VENV/bin/pip" install --no-index --no-deps "$whl" 2>&1
	echo "\$ command -v gcc cc nvcc; ls /usr/include/jansson.h /usr/include/liburing.h"
	command -v gcc cc nvcc
	ls /usr/include/jansson.h /usr/include/liburing.h 2>&1
	echo "\$ fst --version"
	"$VENV/bin/fst" --version
	echo "\$ fst doctor"
	"$VENV/bin/fst" doctor 2>&1
	echo "\$ fst gen $WORK/model --size 4GiB --misaligned"
	[ -f "$WORK/model/model.safetensors.index.json" ] ||
		"$VENV/bin/fst" gen "$WORK/model" --size 4GiB --misaligned 2>&1
	echo "\$ fst load $WORK/model --device cuda:0 --no-progress"
	"$VENV/bin/fst" load "$WORK/model" --device cuda:0 --no-progress 2>&1
	echo "\$ fst verify $WORK/model --device cuda:0 --no-progress"
	"$VENV/bin/fst" verify "$WORK/model" --device cuda:0 --no-progress 2>&1
	echo "\$ python: fst.load(model, device='cuda:0') against safetensors.torch.load_file"
	(cd "$WORK" && "$VENV/bin/python" - "$WORK/model" <<'EOF'
import glob, os, sys, time
import torch, fst
from safetensors.torch import load_file
print("fst from", os.path.dirname(fst.__file__), fst.__version__)
t0 = time.perf_counter()
d = fst.load(sys.argv[1], device="cuda:0")
torch.cuda.synchronize()
dt = time.perf_counter() - t0
n = sum(t.numel() * t.element_size() for t in d.values())
print(f"{len(d)} tensors, {n / 1e9:.2f} GB onto cuda:0 in {dt:.2f} s")
bad = 0
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.safetensors"))):
    for k, v in load_file(f, device="cuda:0").items():
        t = d[k]
        if t.device.type != "cuda" or t.dtype != v.dtype or t.shape != v.shape or \
                not torch.equal(t.view(torch.uint8), v.view(torch.uint8)):
            bad += 1
print("bytes equal" if not bad else f"{bad} tensors differ")
sys.exit(1 if bad else 0)
EOF
	) 2>&1
	echo "rc=$?"
} 2>&1 | tee "$OUT/wheel.txt"
[ "$SUITE" = 1 ] || exit 0
# The suite against the installed package and command (tests/wheel/inside.sh
# does the same here); the CUDA double, when carried, for its GPU-less tests.
export FST_BIN=$VENV/bin/fst FST_LIB=$VENV/libfst.so
[ -f build/tests/libfst_cuda_double.so ] && export FST_CUDA_DOUBLE=$PWD/build/tests/libfst_cuda_double.so
timeout 300 "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/python 2>&1 | tail -25 |
	tee "$OUT/suite.txt"
