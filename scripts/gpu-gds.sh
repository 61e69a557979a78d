#!/usr/bin/env bash
# GPUDirect Storage behaviour on a GPU machine, with real libcufile: what
# auto, on and off do, with and without FST_GDS_TRY=1 (which opens the cuFile
# driver even where the probe rules GDS out, to exercise the per-file
# fallback). M is a checkpoint directory.
set -uo pipefail
BIN=${BIN:-build}
M=${1:?checkpoint}
FST="$BIN/fst"
echo "== fst doctor (the probe)"; "$FST" doctor --no-copy-test
echo; echo "== gds=auto"; FST_LOG=info "$FST" verify "$M" --device cuda:0 --gds auto; echo "exit $?"
echo; echo "== gds=on"; "$FST" load "$M" --device cuda:0 --gds on --no-progress; echo "exit $?"
echo; echo "== gds=auto, FST_GDS_TRY=1"
FST_GDS_TRY=1 FST_LOG=info "$FST" verify "$M" --device cuda:0 --gds auto; echo "exit $?"
echo; echo "== gds=on, FST_GDS_TRY=1"
FST_GDS_TRY=1 "$FST" load "$M" --device cuda:0 --gds on --no-progress; echo "exit $?"
echo; echo "== gds=off: is libcufile ever loaded? (LD_DEBUG=libs lines naming it)"
echo "off:  $(LD_DEBUG=libs "$FST" load "$M" --device cuda:0 --gds off --no-progress 2>&1 | grep -c 'calling init:.*libcufile')"
echo "auto: $(LD_DEBUG=libs "$FST" load "$M" --device cuda:0 --gds auto --no-progress 2>&1 | grep -c 'calling init:.*libcufile')"
