#!/usr/bin/env bash
# bench/pipeline_probe against the libcuda double, whose late copies poison
# their destinations until done: every mode runs (copies too: the copy engine
# at the pipeline's shape, nothing read), the pipeline's bytes read
# back equal the files' (seven shapes, --deferred and skewed slots and
# destinations among them) (a slot reused before its event, or a copy counted
# before it lands, reads poison), and bad usage exits 2.
#   test_pipeline_probe.sh PROBE LIBCUDA_DOUBLE
set -euo pipefail
PROBE=$1
export FST_CUDA_LIBRARY=$2 FST_DOUBLE_DELAY_US=50 FST_DOUBLE_MEM=$((4 << 30))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c 9000001 /dev/urandom >"$dir/a"
head -c 777777 /dev/urandom >"$dir/b"
fail() { echo "FAIL: $*" >&2; exit 1; }

for args in "--threads 3 --chunk 1000000" "--threads 2 --slots 5 --chunk 65536" \
	"--threads 4 --slots 2 --chunk 300000 --shared-stream --blocking" \
	"--threads 3 --slots 4 --chunk 500000 --deferred" \
	"--threads 3 --chunk 1000000 --device-skew 8" \
	"--threads 2 --chunk 300000 --slot-skew 8 --device-skew 8" \
	"--threads 2 --chunk 65536 --slot-skew 4095"; do
	# shellcheck disable=SC2086
	out=$("$PROBE" $args --runs 2 --check pipeline "$dir/a" "$dir/b") ||
		fail "pipeline $args: exit $?: $out"
	grep -q '"check": "bytes equal"' <<<"$out" || fail "pipeline $args: $out"
	grep -q '"bytes": 9777778' <<<"$out" || fail "pipeline $args counted: $out"
done
for mode in pread slots pread+h2d; do
	out=$("$PROBE" --threads 2 --runs 1 "$mode" "$dir/a") || fail "$mode: exit $?"
	grep -q "\"mode\": \"$mode\"" <<<"$out" || fail "$mode: $out"
done
out=$("$PROBE" --runs 1 --seconds 0.2 h2d "$dir/a") || fail "h2d: exit $?"
grep -q '"best_gbps"' <<<"$out" || fail "h2d: $out"
# the copy engine at the pipeline's shape, nothing read: every byte of the
# files is still counted, and the slots' copies still wait for their events
for args in "--threads 3 --chunk 1000000" "--threads 2 --slots 2 --chunk 65536 --shared-stream --blocking"; do
	# shellcheck disable=SC2086
	out=$("$PROBE" $args --runs 1 copies "$dir/a" "$dir/b") || fail "copies $args: exit $?: $out"
	grep -q '"mode": "copies"' <<<"$out" && grep -q '"bytes": 9777778' <<<"$out" ||
		fail "copies $args: $out"
done

rc=0; "$PROBE" nonsense "$dir/a" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "an unknown mode exits $rc, not 2"
rc=0; "$PROBE" --check slots "$dir/a" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--check outside pipeline exits $rc, not 2"
rc=0; "$PROBE" --deferred --slots 2 pipeline "$dir/a" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--deferred with 2 slots exits $rc, not 2"
rc=0; "$PROBE" --blocking slots "$dir/a" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--blocking outside pipeline and copies exits $rc, not 2"
rc=0; "$PROBE" --deferred copies "$dir/a" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--deferred with copies (no reads to defer) exits $rc, not 2"
rc=0; "$PROBE" --check copies "$dir/a" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--check with copies (nothing read to compare) exits $rc, not 2"
for bad in "--slot-skew 4096" "--device-skew -1" "--slot-skew x"; do
	rc=0; "$PROBE" $bad pipeline "$dir/a" 2>/dev/null || rc=$?
	[ "$rc" = 2 ] || fail "$bad exits $rc, not 2"
done
rc=0; "$PROBE" --device-skew 8 pread "$dir/a" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--device-skew with pread (no slots) exits $rc, not 2"
rc=0; "$PROBE" --threads -1 pipeline "$dir/a" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "--threads -1 exits $rc, not 2"
rc=0; "$PROBE" pipeline "$dir/missing" 2>/dev/null || rc=$?
[ "$rc" = 3 ] || fail "a missing file exits $rc, not 3"
echo "pipeline_probe: every mode ran; the pipeline's bytes equal the files'"
