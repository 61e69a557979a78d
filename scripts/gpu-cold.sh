#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-wheel.sh
# (fst from the wheel installed into PY, its command FST): writes the two benchmark checkpoints
# (bench/make_checkpoints.py), then
#   BEFORE=PATH  the discrete path before and after a change: `fst load` onto
#                cuda:0, files in the page cache, the two binaries alternating
#                (ROUNDS rounds), on the Llama-3-8B-shaped checkpoint;
#   SWEEP=1      bench/cold_patterns.py on the gpt-oss-shaped checkpoint: access
#                patterns, fst's read paths (--variant) and the peers, cold;
#   PEERS=1      bench/peers.py on each of PEER_MODELS (default both), warm and
#                cold (PEER_ARGS adds options, e.g. "--no-cold --rounds 1");
#                SCRUB=other: before each cold pass of one checkpoint, the other
#                one is read with O_DIRECT (peers.py --scrub), so no cache below
#                the guest holds the blocks of the one being read. TAG names the
#                result files (peers-MODEL-TAG.txt and .json).
# Each checkpoint is written the first time a step needs it.
# The peers' wheels come from WHL. Results go to OUT. DEVICE (default cuda:0) and
# CK_ARGS (e.g. "--layers 2": small checkpoints) let the steps be tried on a CPU.
set -uo pipefail
OUT=${OUT:-/tmp/fst-cold-out}
WORK=${WORK:-/tmp/fst-cold-work}
PY=${PY:-python3}
FST=${FST:-$($PY -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/fst}
WHL=${WHL:-.whl}
ROUNDS=${ROUNDS:-3}
SWEEP=${SWEEP:-1}
PEERS=${PEERS:-0}
PEER_ARGS=${PEER_ARGS:-}
PEER_MODELS=${PEER_MODELS:-gpt-oss-20b llama3-8b}
BEFORE=${BEFORE:-}
SCRUB=${SCRUB:-}
DEVICE=${DEVICE:-cuda:0}
CK_ARGS=${CK_ARGS:-}
mkdir -p "$OUT" "$WORK"
py=$PY fst=$FST peers=$WORK/peers
"$py" -m pip install -q --no-index --no-deps --target "$peers" "$WHL"/*.whl >"$OUT/peers-install.txt" 2>&1
for m in $([ "$PEERS" = 1 ] && echo "$PEER_MODELS") $([ "$SWEEP" = 1 ] && echo gpt-oss-20b) \
	$([ "$SCRUB" = other ] && echo gpt-oss-20b llama3-8b) \
	$([ -n "$BEFORE" ] && echo llama3-8b); do
	[ -d "$WORK/ck/$m" ] || "$py" bench/make_checkpoints.py "$WORK/ck" --only "$m" $CK_ARGS 2>&1 |
		tee -a "$OUT/checkpoints.txt"
done
# The checkpoints just written are still being written back: the first warm
# round of h200-2026-12-02-side-by-side ran beside that and measured low.
sync

if [ -n "$BEFORE" ]; then
	m=$WORK/ck/llama3-8b
	cat "$m"/*.safetensors >/dev/null
	for r in $(seq "$ROUNDS"); do
		for b in "$BEFORE" "$fst"; do
			name=after
			[ "$b" = "$BEFORE" ] && name=before
			printf 'round %s %s: ' "$r" "$name"
			"$b" load "$m" --device cuda:0 --json --no-progress |
				"$py" -c 'import json, sys; j = json.load(sys.stdin); print("%.3f s %.2f GB/s %s" % (j["seconds"], j["gbps"], j["path_chosen"]))'
		done
	done 2>&1 | tee "$OUT/before-after.txt"
fi

if [ "$SWEEP" = 1 ]; then
	"$py" bench/cold_patterns.py "$WORK/ck/gpt-oss-20b" --rounds "${SWEEP_ROUNDS:-2}" --peer-site "$peers" \
		--only "${SWEEP_ONLY:-direct 16x64MiB,buffered 16x64MiB,willneed,fst,fastsafetensors,instanttensor}" \
		--fst-cli "$fst" \
		--variant "uring=--io uring" \
		--variant "uring staging 1G=--io uring --staging 1G" \
		--variant "pread readahead off=--io pread --readahead off" \
		--variant "pread readahead 1G=--io pread" \
		--variant "pread readahead 4G=--io pread --readahead 4G" \
		--variant "pread readahead 1G staging 256M=--io pread --staging 256M" \
		--json "$OUT/cold-sweep.json" 2>&1 | tee "$OUT/cold-sweep.txt"
fi

if [ "$PEERS" = 1 ]; then
	for m in $PEER_MODELS; do
		scrub=
		if [ "$SCRUB" = other ]; then
			scrub="--scrub $WORK/ck/gpt-oss-20b"
			[ "$m" = gpt-oss-20b ] && scrub="--scrub $WORK/ck/llama3-8b"
		fi
		"$py" bench/peers.py "$WORK/ck/$m" --device "$DEVICE" --peer-site "$peers" --fst-bin "$fst" \
			$PEER_ARGS $scrub --json "$OUT/peers-$m${TAG:+-$TAG}.json" 2>&1 |
			tee "$OUT/peers-$m${TAG:+-$TAG}.txt"
	done
fi
