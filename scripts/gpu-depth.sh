#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, in one short call: does
# delivering a pread slot as soon as it is read (the default since
# 2026-12-07) beat holding it back for the worker's next read
# (FST_READS_IN_FLIGHT=2, the way before)? The wheel installed, gpt-oss-20b
# written (bench/make_checkpoints.py --only) and read into the page cache,
# then in alternating rounds: bench/pipeline_probe's bare pipeline both ways,
# and `fst bench --no-cold` onto cuda:0 both ways (fst's warm load, best of
# RUNS, beside the pread and pinned copy limits measured in the same process).
# GEN_SIZE=4GiB writes `fst gen`'s checkpoint of that size instead, for a call
# too short for the model-shaped one. Writes OUT/depth.txt as it goes (and
# OUT/machine.txt, OUT/wheel.txt).
set -uo pipefail
OUT=${OUT:?OUT}
WORK=${WORK:-/tmp/fst-cold-work}
ROUNDS=${ROUNDS:-3}
RUNS=${RUNS:-3}
. scripts/gpu-cached-ck.sh
probe=$WORK/pipeline_probe
cc -std=c11 -O2 -I"${CUDA_INC:-/usr/local/cuda/include}" bench/pipeline_probe.c -o "$probe" \
	-ldl -lpthread || { echo "gpu-depth: the probe did not build" >&2; exit 3; }
{
	echo "# $(date -u +%FT%TZ) $ck: ${#files[@]} files"
	for r in $(seq "$ROUNDS"); do
		# the other order in every other round
		order="1 2"
		[ $((r % 2)) = 0 ] && order="2 1"
		for d in $order; do
			deferred=""
			[ "$d" = 2 ] && deferred=--deferred
			echo "\$ pipeline_probe --runs 5 $deferred pipeline  # round $r"
			timeout 60 "$probe" --runs 5 $deferred pipeline "${files[@]}" | tail -1
		done
		for d in $order; do
			echo "\$ FST_READS_IN_FLIGHT=$d fst bench --device cuda:0 --no-cold --no-reference --runs $RUNS  # round $r"
			FST_READS_IN_FLIGHT=$d timeout 90 "$fst" bench "$ck" --device cuda:0 --no-cold \
				--no-reference --runs "$RUNS" 2>&1 | grep -E 'limit|fst load|ratios'
		done
	done
	echo "# $(date -u +%FT%TZ) done"
} >"$OUT/depth.txt" 2>&1
cat "$OUT/depth.txt"
