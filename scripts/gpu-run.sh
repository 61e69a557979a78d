#!/usr/bin/env bash
# Runs on a GPU machine with prebuilt binaries (BIN, default build): the GPU
# suite, fst doctor, and the CUDA benchmark on a generated checkpoint of SIZE
# (default 8GiB) in 4 shards with misaligned tensors. Results go to OUT.
set -uo pipefail
BIN=${BIN:-build}
OUT=${OUT:-/tmp/fst-gpu-out}
SIZE=${SIZE:-8GiB}
WORK=${WORK:-/tmp/fst-gpu-work}
mkdir -p "$OUT" "$WORK"
FST="$BIN/fst"
{
	echo "== machine"; nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
	nproc; free -g | head -2; uname -r
	echo "== fst doctor"; "$FST" doctor
} 2>&1 | tee "$OUT/doctor.txt"
echo "== GPU suite" | tee "$OUT/gpu-suite.txt"
FST_GPU_TMP="$WORK" "$BIN/tests/test_gpu" 2>&1 | tee -a "$OUT/gpu-suite.txt"
if [ ! -f "$WORK/model/model.safetensors.index.json" ]; then
	"$FST" gen "$WORK/model" --size "$SIZE" --shards 4 --misaligned 2>&1 | tee "$OUT/gen.txt"
fi
"$FST" verify "$WORK/model" --device cuda:0 2>&1 | tee "$OUT/verify.txt"
"$FST" doctor "$WORK/model" 2>&1 | tail -2 | tee -a "$OUT/doctor.txt"
FST_LOG=info "$FST" bench "$WORK/model" --device cuda:0 --runs 3 2>&1 | tee "$OUT/bench-cuda.txt"
"$FST" bench "$WORK/model" --device cuda:0 --runs 3 --json > "$OUT/bench-cuda.json" 2>"$OUT/bench-cuda.err"
