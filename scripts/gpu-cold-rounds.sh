#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: cold rounds of
# bench/peers.py on one checkpoint (MODEL, default gpt-oss-20b) with the
# loaders and read patterns of LOADERS, the other checkpoint read with
# O_DIRECT before each pass (SCRUB=other in scripts/gpu-cold.sh), one round a
# call, called back to back on one machine (its /tmp keeps the checkpoints,
# the installed wheel and the rounds' JSON between calls):
#   STEP=1  the wheel installed and the machine (scripts/gpu-install.sh), both
#           checkpoints, round 1
#   STEP=N  round N, continuing the JSON (--append; odd rounds run the
#           loaders in reverse order)
# A round of 14 loaders takes about 260 s on the H200 machine (a cold pass with
# its scrub 16-20 s: bench/results/h200-2026-12-02-sbs). Results: OUT/
# cold-rounds-MODEL.txt and .json, times.txt.
set -uo pipefail
STEP=${STEP:?STEP=1, 2, ...}
OUT=${OUT:-/tmp/fst-cold-rounds-out}
WORK=${WORK:-/tmp/fst-cold-work}
MODEL=${MODEL:-gpt-oss-20b}
LIMIT=${LIMIT:-540}
STREAMS=268435456
LOADERS=${LOADERS:-fst.load,fst.load:io=uring:chunk_bytes=524288:stream_bytes=$STREAMS,fst.load:io=uring:chunk_bytes=1048576:stream_bytes=$STREAMS,fst.load:io=uring:stream_bytes=$STREAMS,fst.load:io=uring,fst.load:stream_bytes=$STREAMS,fst.load:io=uring:chunk_bytes=524288,fst.load:readahead_bytes=67108864,fastsafetensors,runai,read:willneed,read:direct-streams,read:direct-small,read:buffered-streams}
RES=$WORK/rounds
mkdir -p "$OUT" "$RES"
export WORK
date +%T >>"$OUT/times.txt"
[ "$STEP" = 1 ] && OUT=$OUT bash scripts/gpu-install.sh
PEER_MODELS=$MODEL SCRUB=other SWEEP=0 PEERS=1 TAG=cold-rounds OUT=$RES \
	PEER_ARGS="--no-warm --rounds 1 --append --check fst.load,fst.load:io=uring:chunk_bytes=524288:stream_bytes=$STREAMS --only $LOADERS" \
	timeout "$LIMIT" bash scripts/gpu-cold.sh >"$RES/log-$STEP.txt" 2>&1
cp "$RES/peers-$MODEL-cold-rounds.json" "$RES/peers-$MODEL-cold-rounds.txt" "$RES/checkpoints.txt" \
	"$OUT/" 2>/dev/null
date +%T >>"$OUT/times.txt"
grep -v '^round' "$OUT/peers-$MODEL-cold-rounds.txt" 2>/dev/null || tail -20 "$RES/log-$STEP.txt"
