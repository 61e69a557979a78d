#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: the binary wheel made
# here (`make wheel WHEEL_PYTHON=python3.12`, carried in dist/) installed
# offline into a venv of the machine's Python, with no build step: then
# `fst --version`, `fst doctor`, `fst load` onto cuda:0 and a Python load onto
# cuda:0 checked byte for byte against safetensors, all from the installed
# package. SUITE=1 also runs the Python suite (tests/python) against it.
# The wheel goes into the machine's own python3, where torch is (the machine
# is fresh for each session); the fst command into its scripts folder, which
# the last line printed names. Results go to OUT.
set -uo pipefail
OUT=${OUT:-/tmp/fst-wheel-out}
WORK=${WORK:-/tmp/fst-wheel-work}
SUITE=${SUITE:-0}
mkdir -p "$OUT" "$WORK"
py=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
whl=$(ls dist/fst_loader-*-"$py"-"$py"-*manylinux_2_28_x86_64.whl 2>/dev/null | tail -1)
[ -n "$whl" ] || { echo "gpu-wheel: no $py x86-64 wheel in dist/" | tee "$OUT/wheel.txt"; exit 1; }
{
	echo "\$ sha256sum $whl"
	sha256sum "$whl"
	echo "\$ python3 -m pip install --no-index --no-deps $whl"
	python3 -m pip install --no-index --no-deps "$whl" 2>&1 ||
		python3 -m pip install --no-index --no-deps --break-system-packages "$whl" 2>&1
	echo "\$ command -v gcc cc nvcc; ls /usr/include/jansson.h /usr/include/liburing.h"
	command -v gcc cc nvcc
	ls /usr/include/jansson.h /usr/include/liburing.h 2>&1
	bin=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
	echo "\$ fst --version   # $bin/fst"
	"$bin/fst" --version
	echo "\$ fst doctor"
	"$bin/fst" doctor 2>&1
	echo "\$ fst gen $WORK/model --size 4GiB --misaligned"
	[ -f "$WORK/model/model.safetensors.index.json" ] ||
		"$bin/fst" gen "$WORK/model" --size 4GiB --misaligned 2>&1
	echo "\$ fst load $WORK/model --device cuda:0 --no-progress"
	"$bin/fst" load "$WORK/model" --device cuda:0 --no-progress 2>&1
	echo "\$ fst verify $WORK/model --device cuda:0"
	"$bin/fst" verify "$WORK/model" --device cuda:0 2>&1
	echo "\$ python: fst.load(model, device='cuda:0') against safetensors.torch.load_file"
	(cd "$WORK" && python3 - "$WORK/model" <<'EOF'
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
bin=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export FST_BIN=$bin/fst FST_LIB=$bin/libfst.so
[ -f build/tests/libfst_cuda_double.so ] && export FST_CUDA_DOUBLE=$PWD/build/tests/libfst_cuda_double.so
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/python 2>&1 | tail -25 |
	tee "$OUT/suite.txt"
