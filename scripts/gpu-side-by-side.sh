#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: the whole side-by-side of
# bench/peers.py (fst and every peer, warm and cold, alternating rounds, on
# both checkpoints of bench/make_checkpoints.py) in steps, one device call
# each, called back to back on one machine (its /tmp keeps the
# checkpoints, the installed wheel and the runs' JSON between calls):
#   STEP=1  the wheel installed (WHEEL_CHECK=1: scripts/gpu-wheel.sh, its
#           checks too), the machine, both checkpoints, warm on both (2
#           rounds each); with MODEL=gpt-oss-20b or MODEL=llama3-8b, warm on
#           that one only, in a call of its own (where a warm pass takes
#           longer than 15 s, both do not fit one call: run STEP=1 once per
#           model; each warm round also runs `fst bench` twice, for the
#           limits at its start and its end; with PASSES=N, before each sweep
#           after the first too). On a bare H200 machine one round on both
#           with PASSES=3 and three loaders took 303 s with the install;
#           two rounds on gpt-oss-20b with four loaders, 227 s
#   STEP=2  one more cold round on both (run it once per round: each round
#           after the first runs the loaders in the other round's order
#           reversed; MODEL=NAME, that model only), then, with
#           ALSO_FIRST_LOAD=1, step 3; on a bare
#           machine (fst not installed) the wheel and both checkpoints
#           first; GPU_SUITE=.dev/test_gpu runs the GPU suite first
#           (gpu-suite.txt); COLD_ALSO adds loaders to the round
#   STEP=3  gpt-oss-20b read into the page cache, then two streamed loads in
#           one process (first-load.txt: when each share of the bytes was
#           ready, bench/first_load.py), and fst.load's set-up and pinning,
#           first and later loads of fresh processes (first-load.txt too:
#           bench/first_load.py loads, FST_LOG=debug)
#   STEP=4  cold replicas (replicas.txt): `fst load` of gpt-oss-20b onto
#           cuda:0, one process and three at once, with io=auto (O_DIRECT
#           alone, the page cache where another load reads the files), O_DIRECT
#           whatever else reads (--readahead off), the same requests through
#           the page cache (FST_URING_PAGE_CACHE=random) and readahead
#           (--readahead 1G), scrubbed by llama3-8b (bench/cold_cli.py, two
#           alternating rounds)
#   STEP=5  one cold round on both into host memory (--device cpu:
#           peers-MODEL-cold-cpu.*), the loaders of COLD_CPU (run it once per
#           round, as STEP=2); GPU_SUITE as in STEP=2
#   STEP=6  the side-by-side in one call, for a session whose device time
#           holds one call and no more: STEP=1 with one warm round
#           (WARM_ROUNDS=1 unless set) in the call's first 300 s (WARM_S),
#           then STEP=2 in what is left; both steps' files in one archive
#           (sbs.tar.gz: two folders, warm/ and cold/, written after each
#           step), as a call brings back at most 8 files; MODEL=NAME
#           (as in STEP=1) runs both steps on that model only, for every
#           warm loader in one call's time. On a bare machine
#           the whole of it took 450 s with CALL_S=560 WARM_S=330 and three
#           warm loaders (WARM=fst.load,fst.iter_into_params,
#           instanttensor.buffered); a 348 s call held only the install,
#           the checkpoints and one model's warm round
#   STEP=7  the warm pipeline taken apart on gpt-oss-20b in the page cache
#           (pipeline.txt: scripts/gpu-pipeline.sh, bench/pipeline_probe.c);
#           on a bare machine the wheel and gpt-oss-20b first
#   STEP=8  copies in phase (FST_ALIGN_COPIES) on gpt-oss-20b in the page
#           cache: `fst load` with FST_ALIGN_COPIES=0, 1 and 2 in
#           alternating processes (phase-ab.txt, AB_ROUNDS rounds, default
#           4, each in another order), the bare pipeline's copies in and out
#           of phase (pipeline.txt, ROWS=phase), then one warm
#           peers.py round of WARM_PHASE (fst.load each way) in the time
#           left; on a bare machine the wheel and gpt-oss-20b first
# Each step stays inside one call's 10 minutes on the H200 machine (a warm
# pass took 10-15 s there, a cold one about 25 s: bench/results/
# h200-2026-12-02-sbs); a cold round is one peers.py run continued with
# --append, so a step cut short loses only its last pass. Every loader's bytes
# are checked in its first warm pass, fst's also in its first cold pass. Each
# step copies what it touched to OUT (at most 8 files).
set -uo pipefail
STEP=${STEP:?STEP=1 to 8}
OUT=${OUT:-/tmp/fst-sbs-out}
WORK=${WORK:-/tmp/fst-cold-work}
RES=$WORK/sbs # the runs' files, kept between steps
# WARM and WARM_ROUNDS (default 2) pick the warm step's loaders and rounds;
# SETTLE=S has every loader's process wait S seconds before its clock;
# PASSES=N runs each warm round as N sweeps over the loaders, each loader's
# figure the median of its N passes (peers.py --passes)
WARM=${WARM:-fst.load,fst.iter_into_params,safetensors,fastsafetensors,instanttensor.buffered,runai}
# the read pattern: the page cache with readahead, the best pattern of every
# H200 disk so far (16 x 512 KiB O_DIRECT, read:direct-small, was below it in
# every round of h200-2026-12-04-sbs and -04b, and below fst). COLD_ALSO adds
# loaders or patterns to the cold step, e.g. read:direct-small or
# fst.load:io=pread (the former cold default beside the current one).
# COLD= replaces the list (a sweep of patterns beside the peers that led).
COLD="${COLD:-fst.load,fastsafetensors,instanttensor,runai,safetensors,read:willneed}${COLD_ALSO:+,$COLD_ALSO}"
# into host memory: InstantTensor loads onto CUDA devices only; fst's former
# default (readahead) beside its O_DIRECT one, and both patterns (O_DIRECT
# into buffers of huge pages, as fst's landing slots are)
COLD_CPU="${COLD_CPU:-fst.load,fst.load:readahead_bytes=1073741824,fastsafetensors,runai,safetensors,read:willneed,read:direct-small-huge}"
mkdir -p "$OUT" "$RES"
export WORK
# CALL_S: the seconds this call may run before its files are copied back (the
# device call's limit less a margin); the last model of a step gets what is
# left of it, so a slow first model or install does not cut the second short
# by a fixed share
CALL_S=${CALL_S:-570}
left() { # left MIN: the seconds left of CALL_S, at least MIN
	local l=$((CALL_S - SECONDS))
	echo $((l > $1 ? l : $1))
}

# peers MODEL MODE LIMIT_S [ARGS...]: one peers.py run through scripts/gpu-cold.sh,
# continuing MODEL's MODE file
peers() {
	local m=$1 mode=$2 limit=$3
	shift 3
	local args device=cuda:0
	case $mode in
	warm) args="--no-cold --rounds ${WARM_ROUNDS:-2} --only $WARM" ;;
	cold) args="--no-warm --check fst.load --only $COLD --rounds 1 --append" ;;
	cold-cpu)
		args="--no-warm --check fst.load --only $COLD_CPU --rounds 1 --append"
		device=cpu
		;;
	esac
	# SETTLE=S: each loader's process waits S seconds, set up, before its clock
	# (peers.py --settle)
	args="$args${SETTLE:+ --settle $SETTLE}"
	[ "$mode" = warm ] && args="$args${PASSES:+ --passes $PASSES}"
	echo "$(date +%T) $m $mode $*" >>"$OUT/times.txt"
	# only cold passes scrub (and so want the other checkpoint written)
	local scrub=other
	[ "$mode" = warm ] && scrub=
	DEVICE=$device PEER_MODELS=$m SCRUB=$scrub SWEEP=0 PEERS=1 TAG=$mode OUT=$RES PEER_ARGS="$args $*" \
		timeout "$limit" bash scripts/gpu-cold.sh >/dev/null 2>&1
	cp "$RES/peers-$m-$mode.json" "$RES/peers-$m-$mode.txt" "$OUT/" 2>/dev/null
}

case $STEP in
1)
	date +%T >"$OUT/times.txt"
	OUT=$OUT bash scripts/gpu-install.sh
	# a call brings back at most 8 files: the wheel's line goes with the machine
	cat "$OUT/wheel.txt" >>"$OUT/machine.txt" && rm -f "$OUT/wheel.txt"
	case ${MODEL:-both} in
	both)
		# at most 300 s, and 60 s of CALL_S left for the second model
		first=$(($(left 120) - 60))
		peers gpt-oss-20b warm $((first < 300 ? first : 300))
		cp "$RES/checkpoints.txt" "$OUT/" 2>/dev/null
		peers llama3-8b warm "$(left 60)"
		;;
	gpt-oss-20b | llama3-8b)
		peers "$MODEL" warm "$(left 60)"
		cp "$RES/checkpoints.txt" "$OUT/" 2>/dev/null
		;;
	*)
		echo "gpu-side-by-side: MODEL=$MODEL: gpt-oss-20b or llama3-8b" >&2
		exit 2
		;;
	esac
	;;
2 | 3 | 5 | 7 | 8)
	# A machine given back since STEP=1 comes back bare: the wheel and the
	# checkpoints again, before the timed parts (machine.txt says so)
	if ! python3 -c 'import fst' 2>/dev/null; then
		mkdir -p "$WORK/install"
		OUT=$WORK/install bash scripts/gpu-install.sh
		cat "$WORK/install/wheel.txt" "$WORK/install/machine.txt" >"$OUT/machine.txt"
		only=() # STEP=7 and 8 read gpt-oss-20b only
		[ "$STEP" = 7 ] || [ "$STEP" = 8 ] && only=(--only gpt-oss-20b)
		python3 bench/make_checkpoints.py "$WORK/ck" "${only[@]}" >>"$OUT/machine.txt" 2>&1
		sync
	fi
	# GPU_SUITE=PATH: the GPU suite built here (build/tests/test_gpu, copied
	# into a carried folder) run first, into gpu-suite.txt
	if [ -n "${GPU_SUITE:-}" ]; then
		mkdir -p "$WORK/gpu-suite"
		FST_GPU_TMP=$WORK/gpu-suite timeout 150 "$GPU_SUITE" >"$OUT/gpu-suite.txt" 2>&1
		echo "exit $?" >>"$OUT/gpu-suite.txt"
		rm -rf "$WORK/gpu-suite"
	fi
	if [ "$STEP" = 2 ] || [ "$STEP" = 5 ]; then
		mode=cold
		[ "$STEP" = 5 ] && mode=cold-cpu
		case ${MODEL:-both} in
		both)
			peers gpt-oss-20b $mode 260
			peers llama3-8b $mode "$(left 60)"
			;;
		*) peers "$MODEL" $mode "$(left 60)" ;;
		esac
	fi
	if [ "$STEP" = 7 ]; then
		timeout "$(left 30)" bash scripts/gpu-pipeline.sh "$WORK/ck/gpt-oss-20b" \
			>"$OUT/pipeline.txt" 2>&1
	fi
	if [ "$STEP" = 8 ]; then
		ck=$WORK/ck/gpt-oss-20b
		fst=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/fst
		# into the page cache first: cold rounds before this step (STEP=2 on
		# this machine) leave the files out of it, and the A/B is a warm one
		# (h100-2026-12-07g-cold's ran cold)
		cat "$ck"/*.safetensors >/dev/null
		# each round the three ways in another order: 0 1 2, 1 2 0, 2 0 1, ...
		for r in $(seq "${AB_ROUNDS:-4}"); do
			for k in 0 1 2; do
				v=$(((r - 1 + k) % 3))
				printf 'round %s FST_ALIGN_COPIES=%s: ' "$r" "$v"
				FST_ALIGN_COPIES=$v timeout 60 "$fst" load "$ck" --device cuda:0 --json \
					--no-progress | python3 -c 'import json, sys; j = json.load(sys.stdin); print("%.3f s %.2f GB/s; %s" % (j["seconds"], j["gbps"], j["path_chosen"]))'
			done
		done >"$OUT/phase-ab.txt" 2>&1
		ROWS=phase timeout "$(left 30)" bash scripts/gpu-pipeline.sh "$ck" >"$OUT/pipeline.txt" 2>&1
		WARM=${WARM_PHASE:-fst.load,fst.load+FST_ALIGN_COPIES=1,fst.load+FST_ALIGN_COPIES=2} \
			WARM_ROUNDS=${WARM_ROUNDS:-1} peers gpt-oss-20b warm "$(left 30)"
	fi
	if [ "$STEP" = 3 ] || [ "${ALSO_FIRST_LOAD:-0}" = 1 ]; then
		# where a process's first load loses time against its later ones:
		# when each share of the bytes was ready, two streamed loads in one
		# process, from the page cache (a cold pass just scrubbed it)
		cat "$WORK"/ck/gpt-oss-20b/*.safetensors >/dev/null
		timeout 40 python3 bench/first_load.py timeline "$WORK/ck/gpt-oss-20b" \
			>"$OUT/first-load.txt" 2>&1
		timeout 90 python3 bench/first_load.py loads "$WORK/ck/gpt-oss-20b" \
			>>"$OUT/first-load.txt" 2>&1
	fi
	;;
6)
	mkdir -p "$RES/one-call"
	rm -rf "$RES/one-call/warm" "$RES/one-call/cold"
	OUT=$RES/one-call/warm STEP=1 WARM_ROUNDS=${WARM_ROUNDS:-1} CALL_S=${WARM_S:-300} bash "$0"
	# archived after each step: a call stopped at its limit brings back
	# what $OUT holds, not what a step still running would have written
	tar czf "$OUT/sbs.tar.gz" -C "$RES/one-call" warm
	# the cold step stops with CALL_S, whatever its first model's own limit
	cold_s=$(left 60)
	OUT=$RES/one-call/cold STEP=2 CALL_S=$cold_s timeout $((cold_s + 10)) bash "$0"
	# each step printed its tables
	tar czf "$OUT/sbs.tar.gz" -C "$RES/one-call" warm cold
	exit 0
	;;
4)
	fst=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/fst
	for p in 1 3; do
		echo "## PROCS=$p"
		PROCS=$p ROUNDS=2 timeout 270 python3 bench/cold_cli.py "$WORK/ck/gpt-oss-20b" \
			"$WORK/ck/llama3-8b" "auto=@$fst" "direct=@$fst --readahead off" \
			"cache=@$fst +FST_URING_PAGE_CACHE=random" "readahead=@$fst --readahead 1G" \
			--device cuda:0
	done >"$OUT/replicas.txt" 2>&1
	;;
*)
	echo "gpu-side-by-side: STEP=$STEP: 1 to 8" >&2
	exit 2
	;;
esac
date +%T >>"$OUT/times.txt"
cat "$OUT"/peers-*.txt 2>/dev/null | grep -v '^round'
