#!/usr/bin/env bash
# Sweeps threads and staging budget for loads onto cuda:0 with `fst bench`
# (in-process timings: the CUDA context exists before the clock starts),
# warm (best of RUNS) and cold (files evicted with posix_fadvise), on a
# checkpoint in WORK/model. One line per setting.
set -uo pipefail
BIN=${BIN:-build}
WORK=${WORK:-/tmp/fst-gpu-work}
RUNS=${RUNS:-3}
FST="$BIN/fst"
M="$WORK/model"
[ -f "$M/model.safetensors.index.json" ] || "$FST" gen "$M" --size "${SIZE:-8GiB}" --shards 4 --misaligned >/dev/null
echo "setting | fst warm GB/s | pread limit | copy limit | fst cold GB/s | O_DIRECT limit"
for t in ${THREADS:-16}; do
	for s in ${STAGING:-64MiB 128MiB 256MiB}; do
		"$FST" bench "$M" --device cuda:0 --threads "$t" --staging "$s" --runs "$RUNS" \
			--no-reference --json ${EXTRA:-} | python3 -c "
import json, sys
d = json.load(sys.stdin); r = {x['name']: x['gbps'] for x in d['rows']}
print('threads=$t staging=$s | %.2f | %.2f | %.2f | %.2f | %.2f' % (r.get('fst load (warm)', 0),
  r.get('parallel pread limit (warm)', 0), r.get('pinned host-to-device copy limit', 0),
  r.get('fst load (cold)', 0), r.get('O_DIRECT read limit (cold)', 0)))"
	done
done
