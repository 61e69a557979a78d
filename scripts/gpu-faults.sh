#!/usr/bin/env bash
# Runs on a GPU machine with prebuilt binaries (BIN, default build): the GPU
# fault-injection matrix. (a) The GPU suite, whose "fault sites" test fails
# every GPU site on the real device, then that test again with FST_GDS_TRY=1
# for the cuFile sites. (b) The suite built with ASan+UBSan (ASAN_BIN,
# default $BIN-asan/tests/test_gpu), with leaks checked (NVIDIA's libraries
# suppressed by tests/gpu/lsan-cuda.supp).
# (c) `fst load` with FST_FAULT=SITE:1 for every GPU site, as a table in
# faults-cli.txt, an unknown site, then a load and `fst verify` without faults,
# on a checkpoint of SIZE (default 1GiB) in 4 shards with misaligned tensors.
# ONLY (e.g. "fault sites") runs only the suite tests whose name contains it.
# Results go to OUT; exits 0 only when everything went as expected.
set -uo pipefail
BIN=${BIN:-build}
OUT=${OUT:-/tmp/fst-gpu-out}
SIZE=${SIZE:-1GiB}
WORK=${WORK:-/tmp/fst-gpu-work}
ONLY=${ONLY:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT" "$WORK"
FST="$BIN/fst"
MODEL="$WORK/model"
unset FST_FAULT FST_GDS FST_GDS_TRY
bad=0
note() { echo "UNEXPECTED: $*" | tee -a "$OUT/gpu-faults-summary.txt"; bad=1; }
: > "$OUT/gpu-faults-summary.txt"

# run_suite NAME FILE BINARY [VAR=VALUE...]: the suite must pass (exit 0); 77
# means it saw no GPU, which on this machine is a failure too.
run_suite() {
	local name=$1 file=$2 bin=$3
	shift 3
	echo "== $name" | tee "$OUT/$file"
	env FST_GPU_TMP="$WORK" FST_GPU_ONLY="$ONLY" "$@" "$bin" 2>&1 | tee -a "$OUT/$file"
	local rc=${PIPESTATUS[0]}
	echo "exit $rc" | tee -a "$OUT/$file"
	[ "$rc" -eq 0 ] || note "$name: exit $rc (see $file)"
}

# (a) the suite, then the fault sites with the cuFile driver opened anyway
run_suite "GPU suite" gpu-faults-suite.txt "$BIN/tests/test_gpu"
ONLY_SAVED=$ONLY
ONLY="fault sites"
run_suite "fault sites, FST_GDS_TRY=1" gpu-faults-gds-try.txt "$BIN/tests/test_gpu" FST_GDS_TRY=1
ONLY=$ONLY_SAVED

# (b) the same suite under AddressSanitizer and LeakSanitizer
ASAN_BIN=${ASAN_BIN:-$BIN-asan/tests/test_gpu}
if [ ! -x "$ASAN_BIN" ]; then
	echo "== ASan suite: skipped, no $ASAN_BIN" | tee "$OUT/gpu-faults-asan.txt"
elif missing=$(ldd "$ASAN_BIN" 2>&1 | grep 'not found'); then
	echo "== ASan suite: skipped, $ASAN_BIN lacks libraries here: $missing" |
		tee "$OUT/gpu-faults-asan.txt"
	note "ASan suite could not run (link it with -static-libasan -static-libubsan)"
else
	run_suite "ASan suite" gpu-faults-asan.txt "$ASAN_BIN" \
		ASAN_OPTIONS="protect_shadow_gap=0:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
		LSAN_OPTIONS="suppressions=$ROOT/tests/gpu/lsan-cuda.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}" \
		UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
	grep -q 'ERROR: \(Address\|Leak\)Sanitizer\|runtime error:' "$OUT/gpu-faults-asan.txt" &&
		note "ASan suite: a sanitizer report (see gpu-faults-asan.txt)"
fi

# (c) the CLI, one faulted `fst load` per row
if [ ! -f "$MODEL/model.safetensors.index.json" ]; then
	"$FST" gen "$MODEL" --size "$SIZE" --shards 4 --misaligned 2>&1 | tee "$OUT/gen.txt"
fi
CLI="$OUT/faults-cli.txt"
table_row() { printf '%-18s %-4s %-24s %-8s %-4s %-5s %s\n' "$@"; }
{
	echo "== fst load $MODEL --device cuda:0 with FST_FAULT (fired: the site's debug line seen)"
	table_row site N env expected exit fired message
} | tee "$CLI"
# row SITE N EXPECTED [VAR=VALUE...] [-- LOAD OPTIONS...]: EXPECTED lists the
# accepted exit codes, e.g. "6" or "4 7".
row() {
	local site=$1 n=$2 expected=$3
	shift 3
	local vars=() opts=()
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do vars+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	opts=("$@")
	local err rc fired msg
	err=$(env FST_FAULT="$site:$n" FST_LOG=debug ${vars[@]+"${vars[@]}"} "$FST" load \
		"$MODEL" --device cuda:0 --no-progress ${opts[@]+"${opts[@]}"} 2>&1 >/dev/null)
	rc=$?
	fired=$(grep -c "injected fault at site $site\$" <<<"$err")
	if [ "$fired" -gt 0 ]; then fired=yes; else fired=no; fi
	# the CLI's error, else the first warning or error the library logged
	msg=$(grep -m1 '^fst load: ' <<<"$err" || grep -m1 '^fst: \(error\|warning\): ' <<<"$err")
	local env_desc="${vars[*]-} ${opts[*]-}"
	env_desc=${env_desc# }
	table_row "$site" "$n" "${env_desc:--}" "${expected// /|}" "$rc" "$fired" "${msg:--}" |
		tee -a "$CLI"
	case " $expected " in
	*" $rc "*) ;;
	*) note "FST_FAULT=$site:$n${env_desc:+ $env_desc}: exit $rc, expected $expected" ;;
	esac
}
# the staging path: each fails the load with a GPU error (exit 6)
row device_alloc 1 6
row pin 1 6
row h2d 1 6
row event 1 6
row h2d 1+ 6
row event 3 6
# gds=auto without nvidia-fs never touches cuFile, and fst load never calls
# NCCL: these load (exit 0) and the "fired" column says no
row cufile_register 1 0
row cufile_read 1 0
row nccl 1 0
# the cuFile driver opened anyway: gds=on fails at the first registration
# (exit 7); a read fault is reached only where a file registers (exit 4)
row cufile_register 1 7 FST_GDS_TRY=1 -- --gds on
row cufile_read 1 "4 7" FST_GDS_TRY=1 -- --gds on
row cufile_register 1+ 0 FST_GDS_TRY=1 -- --gds auto
# an unknown site is refused before anything is loaded
err=$(FST_FAULT=bogus:1 "$FST" load "$MODEL" --device cuda:0 --no-progress 2>&1 >/dev/null)
rc=$?
table_row bogus 1 - 1 "$rc" - "$(head -1 <<<"$err")" | tee -a "$CLI"
if [ "$rc" -ne 1 ] || ! grep -q 'unknown fault site "bogus"' <<<"$err"; then
	note "FST_FAULT=bogus:1: exit $rc, message: $err"
fi
printf '\n== without faults\n' | tee -a "$CLI"
for cmd in load verify; do
	extra=()
	[ "$cmd" = load ] && extra=(--no-progress)
	out=$("$FST" "$cmd" "$MODEL" --device cuda:0 ${extra[@]+"${extra[@]}"} 2>&1)
	rc=$?
	printf '%s\nexit %d\n' "$out" "$rc" | tee -a "$CLI"
	[ "$rc" -eq 0 ] || note "fst $cmd without faults: exit $rc (see faults-cli.txt)"
done

if [ "$bad" -eq 0 ]; then
	echo "gpu-faults: everything as expected" | tee -a "$OUT/gpu-faults-summary.txt"
else
	echo "gpu-faults: unexpected results above" | tee -a "$OUT/gpu-faults-summary.txt"
fi
exit "$bad"
