#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, in one short call: do
# disk helpers (FST_WARM_DISK=N: N threads reading the end of the plan with
# O_DIRECT while the workers read its front through the page cache) take a
# load from the page cache onto a GPU past what the workers alone reach? The
# wheel installed, gpt-oss-20b written (bench/make_checkpoints.py --only) and
# read into the page cache; the disk's own O_DIRECT rate with the files
# cached (`fst load --io uring`, which reads every byte with O_DIRECT); then
# in alternating rounds `fst bench --no-cold` onto cuda:0 with each helper
# count in HELPERS (fst's warm load, best of RUNS, beside the pread and
# pinned copy limits measured in the same process), and the share of the
# bytes the helpers read. GEN_SIZE=4GiB writes `fst gen`'s checkpoint of
# that size instead, for a call too short for the model-shaped one. Writes
# OUT/warm-disk.txt as it goes (and OUT/machine.txt, OUT/wheel.txt).
set -uo pipefail
OUT=${OUT:?OUT}
WORK=${WORK:-/tmp/fst-cold-work}
ROUNDS=${ROUNDS:-3}
RUNS=${RUNS:-3}
HELPERS=${HELPERS:-0 1 2 4}
. scripts/gpu-cached-ck.sh
{
	echo "# $(date -u +%FT%TZ) $ck: ${#files[@]} files"
	echo "\$ fst load --device cuda:0 --io uring  # every byte with O_DIRECT, files cached"
	timeout 60 "$fst" load "$ck" --device cuda:0 --io uring 2>&1 | head -2
	for r in $(seq "$ROUNDS"); do
		# the other order in every other round
		order=$HELPERS
		[ $((r % 2)) = 0 ] && order=$(echo "$HELPERS" | tr ' ' '\n' | tac | tr '\n' ' ')
		for h in $order; do
			echo "\$ FST_WARM_DISK=$h fst bench --device cuda:0 --no-cold --no-reference --runs $RUNS  # round $r"
			FST_WARM_DISK=$h timeout 90 "$fst" bench "$ck" --device cuda:0 --no-cold \
				--no-reference --runs "$RUNS" 2>&1 | grep -E 'limit|fst load|ratios'
			[ "$h" = 0 ] && continue
			# the bench's table cuts the description short: the helpers' share
			FST_WARM_DISK=$h timeout 60 "$fst" load "$ck" --device cuda:0 2>&1 |
				grep -oE '^loaded.*GB/s\)|[0-9.]+% of the bytes read from the disk'
		done
	done
	echo "\$ FST_WARM_DISK=2 fst verify --device cuda:0"
	FST_WARM_DISK=2 timeout 60 "$fst" verify "$ck" --device cuda:0 2>&1 | tail -1
	echo "# $(date -u +%FT%TZ) done"
} >"$OUT/warm-disk.txt" 2>&1
cat "$OUT/warm-disk.txt"
