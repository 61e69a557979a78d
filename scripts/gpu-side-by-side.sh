#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: the whole side-by-side of
# bench/peers.py (fst and every peer, warm and cold, two alternating rounds
# each, on both checkpoints of bench/make_checkpoints.py) in four steps, one
# device call each, called back to back on one machine (its /tmp keeps the
# checkpoints, the installed wheel and the runs' JSON between calls):
#   STEP=1  the wheel installed (WHEEL_CHECK=1: scripts/gpu-wheel.sh, its
#           checks too), the machine, both checkpoints, gpt-oss-20b warm (2
#           rounds), then two streamed loads in one process (first-load.txt:
#           when each share of the bytes was ready, bench/first_load.py)
#   STEP=2  llama3-8b warm (2 rounds), gpt-oss-20b cold round 1
#   STEP=3  llama3-8b cold round 1, gpt-oss-20b cold round 2
#   STEP=4  llama3-8b cold round 2
# Each step stays inside one call's 10 minutes on the H200 machine (a warm
# pass took 15-45 s there, a cold one about 30 s: bench/results/
# h200-2026-12-02-rounds); a cold round is one peers.py run continued with
# --append, so a step cut short loses only its last pass. Every loader's bytes
# are checked in its first warm pass, fst's also in its first cold pass. Each
# step copies what it touched to OUT (at most 8 files).
set -uo pipefail
STEP=${STEP:?STEP=1, 2, 3 or 4}
OUT=${OUT:-/tmp/fst-sbs-out}
WORK=${WORK:-/tmp/fst-cold-work}
RES=$WORK/sbs # the runs' files, kept between steps
WARM="fst.load,fst.iter_into_params,safetensors,fastsafetensors,instanttensor.buffered,runai"
COLD="fst.load,fastsafetensors,instanttensor,runai,safetensors,read:willneed"
mkdir -p "$OUT" "$RES"
export WORK

# peers MODEL MODE LIMIT_S [ARGS...]: one peers.py run through scripts/gpu-cold.sh,
# continuing MODEL's MODE file
peers() {
	local m=$1 mode=$2 limit=$3
	shift 3
	local args="--rounds 1 --append"
	[ "$mode" = warm ] && args="--no-cold --rounds 2 --only $WARM"
	[ "$mode" = cold ] && args="--no-warm --check fst.load --only $COLD $args"
	echo "$(date +%T) $m $mode $*" >>"$OUT/times.txt"
	PEER_MODELS=$m SCRUB=other SWEEP=0 PEERS=1 TAG=$mode OUT=$RES PEER_ARGS="$args $*" \
		timeout "$limit" bash scripts/gpu-cold.sh >/dev/null 2>&1
	cp "$RES/peers-$m-$mode.json" "$RES/peers-$m-$mode.txt" "$OUT/" 2>/dev/null
}

case $STEP in
1)
	date +%T >"$OUT/times.txt"
	OUT=$OUT bash scripts/gpu-install.sh
	peers gpt-oss-20b warm 420
	cp "$RES/checkpoints.txt" "$OUT/" 2>/dev/null
	# where a process's first load loses time against its later ones: when
	# each share of the bytes was ready, two streamed loads in one process
	timeout 60 python3 bench/first_load.py timeline "$WORK/ck/gpt-oss-20b" >"$OUT/first-load.txt" 2>&1
	;;
2)
	peers llama3-8b warm 330
	peers gpt-oss-20b cold 240
	;;
3)
	peers llama3-8b cold 300
	peers gpt-oss-20b cold 240
	;;
4)
	peers llama3-8b cold 300
	;;
*)
	echo "gpu-side-by-side: STEP=$STEP: 1, 2, 3 or 4" >&2
	exit 2
	;;
esac
date +%T >>"$OUT/times.txt"
cat "$OUT"/peers-*.txt 2>/dev/null | grep -v '^round'
