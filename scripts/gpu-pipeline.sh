#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: bench/pipeline_probe.c
# built (its warnings are CI's to catch, not this compiler's to refuse) and
# swept over one checkpoint in the page cache (docs/design.md,
# "Past the copy limit"): the CPU's copies out of the page cache alone, the
# copy engine alone (16 MiB copies on one stream, and at the pipeline's
# shape: fst's copies with nothing read), both at once, and fst's warm
# pipeline bare, its shape
# (workers, slots, chunk, streams, event waits, a copy queued at once or
# after the next read as fst's slot loop did) varied one thing at a time,
# the default shape again every few rows to show the machine's drift.
#   bash scripts/gpu-pipeline.sh CKPT_DIR >pipeline.txt
# RUNS (default 5) runs a row, each row's figure their median (JSON line).
# ROWS=phase runs only the rows of copies in and out of phase: fst's copies
# of a checkpoint whose tensors sit at 8 mod 16 in their files went from
# page-aligned slot bytes to device addresses 8 bytes past a boundary
# (--device-skew 8) until FST_ALIGN_COPIES (docs/design.md).
set -uo pipefail
CK=${1:?checkpoint folder}
RUNS=${RUNS:-5}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
probe=${TMPDIR:-/tmp}/pipeline_probe
cc -std=c11 -O2 -I"$CUDA_INC" bench/pipeline_probe.c -o "$probe" \
	-ldl -lpthread || exit 3
files=("$CK"/*.safetensors)
cat "${files[@]}" >/dev/null # in the page cache
# fst's page-cache staging: 128 MiB over 12 workers' 3 slots
def="--threads 12 --slots 3 --chunk 3727360"
rows=(
	"pipeline $def"
	"pipeline $def --deferred"
	"pread --threads 16 --chunk 16777216"
	"pread --threads 12 --chunk 3727360"
	"h2d --seconds 2"
	"copies $def"
	"copies --threads 12 --slots 3 --chunk 16777216"
	"copies $def --shared-stream"
	"pread+h2d --threads 16 --chunk 16777216"
	"pread+h2d --threads 12 --chunk 3727360"
	"slots $def"
	"slots --threads 16 --slots 3 --chunk 2795520"
	"pipeline $def"
	"pipeline --threads 12 --slots 4 --chunk 3727360"
	"pipeline --threads 12 --slots 6 --chunk 1863680"
	"pipeline --threads 12 --slots 2 --chunk 5591040"
	"pipeline --threads 12 --slots 8 --chunk 1396736"
	"pipeline $def"
	"pipeline --threads 16 --slots 3 --chunk 2795520"
	"pipeline --threads 8 --slots 3 --chunk 5591040"
	"pipeline --threads 10 --slots 3 --chunk 3727360"
	"pipeline --threads 14 --slots 3 --chunk 3727360"
	"pipeline $def"
	"pipeline $def --deferred"
	"pipeline $def --shared-stream"
	"pipeline $def --blocking"
	"pipeline --threads 12 --slots 3 --chunk 1863680"
	"pipeline --threads 12 --slots 3 --chunk 16777216"
	"pipeline --threads 12 --slots 4 --chunk 2795520"
	"pipeline $def"
	"pipeline $def --deferred"
)
if [ "${ROWS:-all}" = phase ]; then
	rows=(
		"pipeline $def"
		"pipeline $def --device-skew 8"
		"pipeline $def --slot-skew 8 --device-skew 8"
		"copies $def"
		"copies $def --device-skew 8"
		"copies $def --slot-skew 8 --device-skew 8"
		"slots $def"
		"slots $def --slot-skew 8"
		"slots $def --slot-skew 64"
		"pipeline $def --device-skew 8"
	)
fi
echo "# $(date -u +%FT%TZ) ${#files[@]} files, $(du -cb "${files[@]}" | tail -1 | cut -f1) bytes, $RUNS runs a row"
for row in "${rows[@]}"; do
	mode=${row%% *}
	echo "\$ pipeline_probe --runs $RUNS $row"
	# shellcheck disable=SC2086
	timeout 120 "$probe" --runs "$RUNS" ${row#* } "$mode" "${files[@]}" 2>&1 | tail -1
done
# the default shape's bytes read back and compared, once
# shellcheck disable=SC2086
timeout 120 "$probe" --runs 1 $def --check pipeline "${files[@]}" 2>&1 | tail -1
