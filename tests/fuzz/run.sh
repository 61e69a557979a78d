#!/usr/bin/env bash
# Run each libFuzzer target for SECONDS on a scratch copy of its corpus (the
# checked-in corpus stays as it is) and fail if any finds a crash.
#   usage: tests/fuzz/run.sh BUILD_DIR SECONDS
# Crashing inputs are kept in BUILD_DIR/fuzz-artifacts/NAME/; new inputs
# worth keeping are in BUILD_DIR/fuzz-work/NAME/ after the run (merge them
# into tests/fuzz/corpus/NAME with -merge=1 by hand if wanted).
set -euo pipefail

if [ $# -ne 2 ]; then
	echo "usage: $0 BUILD_DIR SECONDS" >&2
	exit 2
fi
build=$1
seconds=$2
here=$(cd "$(dirname "$0")" && pwd)

# Longest input per target: a header of a few dozen tensors, an index of a
# few dozen entries; longer inputs only slow the search down.
declare -A max_len=([header]=8192 [index]=4096)

status=0
for name in header index; do
	bin=$build/tests/fuzz/fuzz_$name
	if [ ! -x "$bin" ]; then
		echo "fuzz: $bin not built (configure with -DFST_FUZZ=ON)" >&2
		exit 2
	fi
	work=$build/fuzz-work/$name
	artifacts=$build/fuzz-artifacts/$name
	rm -rf "$work"
	mkdir -p "$work" "$artifacts"
	cp "$here/corpus/$name"/* "$work"/
	log=$build/fuzz-$name.log
	stamp=$build/fuzz-$name.start
	touch "$stamp"
	echo "fuzz: $name for ${seconds}s (log: $log)"
	rc=0
	# fuzz_index makes its scratch directory under TMPDIR: keep it in the
	# build tree.
	TMPDIR=$build/fuzz-tmp "$bin" -max_total_time="$seconds" -max_len="${max_len[$name]}" \
		-timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
		-dict="$here/$name.dict" -artifact_prefix="$artifacts/" "$work" >"$log" 2>&1 || rc=$?
	grep -E '^(Done|stat::number_of_executed_units)' "$log" || true
	crashes=$(find "$artifacts" -type f -newer "$stamp" | wc -l)
	if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
		echo "fuzz: $name FAILED (exit $rc, $crashes new artifacts in $artifacts)" >&2
		grep -E -A30 'ERROR|check failed|runtime error' "$log" | head -60 >&2 || true
		status=1
	fi
done
exit $status
