#!/usr/bin/env bash
# Measures `fst load --check` against the unchecked load on the CPU target,
# on a generated checkpoint (SIZE, 4 shards, misaligned) in the page cache:
#  1. `fst bench --check`: in one process, into memory already faulted in,
#     best of RUNS each;
#  2. N pairs of separate `fst load` and `fst load --check` processes
#     (fresh memory each), interleaved; medians and their ratio.
# Results go to OUT. BIN: the build folder (default build).
set -uo pipefail
BIN=${BIN:-build}
OUT=${OUT:-/tmp/fst-check-out}
WORK=${WORK:-/tmp/fst-check-work}
SIZE=${SIZE:-2GiB}
RUNS=${RUNS:-5}
N=${N:-9}
FST="$BIN/fst"
M="$WORK/model"
mkdir -p "$OUT" "$WORK"
[ -f "$M/model.safetensors.index.json" ] || "$FST" gen "$M" --size "$SIZE" --shards 4 --misaligned >/dev/null
"$FST" verify "$M" --manifest "$WORK/manifest.json" >/dev/null || exit 1
{
	echo "== machine"; nproc; grep -m1 'model name' /proc/cpuinfo
	grep -o -w 'avx2\|avx512f' /proc/cpuinfo | sort | uniq -c
	echo "== fst bench --check (in-process, fresh and reused memory, best of $RUNS)"
	"$FST" bench "$M" --check "$WORK/manifest.json" --no-cold --no-reference --runs "$RUNS"
} 2>&1 | tee "$OUT/bench-check.txt"
"$FST" bench "$M" --check "$WORK/manifest.json" --no-cold --no-reference --runs "$RUNS" --json \
	>"$OUT/bench-check.json"
echo "== $N pairs of processes (fresh memory): unchecked s, checked s" | tee "$OUT/pairs.txt"
for i in $(seq "$N"); do
	a=$("$FST" load "$M" --json --no-progress | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
	b=$("$FST" load "$M" --json --no-progress --check "$WORK/manifest.json" |
		python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["checked_tensors"] == d["tensors"]; print(d["seconds"])')
	echo "$a $b"
done | tee -a "$OUT/pairs.txt"
python3 - "$OUT/pairs.txt" <<'PY' | tee -a "$OUT/pairs.txt"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l[0].isdigit()]
a = statistics.median(float(r[0]) for r in rows)
b = statistics.median(float(r[1]) for r in rows)
print(f"median unchecked {a:.3f} s, checked {b:.3f} s: checked runs at {a / b:.2f}x the unchecked speed")
PY
