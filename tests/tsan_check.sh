#!/usr/bin/env bash
# Description: `fst load --check` built with ThreadSanitizer (BIN: the
# build-tsan folder): reader threads hashing blocks as they land, blocks
# gathered from two reads, and checking threads, on every read path. Any
# TSan report fails (halt_on_error).
set -euo pipefail
BIN=${1:?build folder}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
"$BIN/fst" gen "$DIR/m" --size 48MiB --shards 3 --misaligned >/dev/null
"$BIN/fst" verify "$DIR/m" --manifest "$DIR/m.json" >/dev/null
export TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}"
for args in "--io pread" "--io pread --chunk 12KiB --threads 4" "--io uring --chunk 64KiB" "--io mmap"; do
	# shellcheck disable=SC2086
	"$BIN/fst" load "$DIR/m" --check "$DIR/m.json" --no-progress $args | head -1
done
