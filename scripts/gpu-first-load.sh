#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: where the first load of
# a process loses time (bench/first_load.py) on the gpt-oss-20b-shaped
# checkpoint, with fst from the binary wheel in dist/ (installed into the
# machine's python3, no build step). WHAT lists the parts (default "touch
# loads timeline bench"; also alloc, overlap and driver). Results go to OUT.
set -uo pipefail
OUT=${OUT:-/tmp/fst-first-load-out}
WORK=${WORK:-/tmp/fst-cold-work}
mkdir -p "$OUT" "$WORK"
py=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
whl=$(ls dist/fst_loader-*-"$py"-"$py"-*manylinux_2_28_x86_64.whl | tail -1)
python3 -m pip install -q --no-index --no-deps --force-reinstall "$whl" >"$OUT/install.txt" 2>&1
fst=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/fst
WHAT=${WHAT:-touch loads timeline bench}
ck=$WORK/ck/gpt-oss-20b
[ "$WHAT" = driver ] || [ -d "$ck" ] || python3 bench/make_checkpoints.py "$WORK/ck" --only gpt-oss-20b >"$OUT/checkpoints.txt" 2>&1
sync
cat "$ck"/*.safetensors >/dev/null 2>&1
bytes=$(du -cb "$ck"/*.safetensors 2>/dev/null | tail -1 | cut -f1)
for w in $WHAT; do
	case $w in
	alloc | touch)
		echo "\$ first_load.py $w $bytes"
		timeout 60 python3 bench/first_load.py "$w" "$bytes" 2>&1
		;;
	driver)
		echo "\$ first_load.py driver -  # a fresh process each time"
		for i in 1 2; do timeout 60 python3 bench/first_load.py driver - 2>&1; done
		;;
	loads | overlap | timeline)
		echo "\$ first_load.py $w $ck"
		timeout 180 python3 bench/first_load.py "$w" "$ck" 2>&1
		;;
	bench)
		echo "\$ fst bench $ck --device cuda:0 --runs 1 --no-reference --no-cold"
		timeout 120 "$fst" bench "$ck" --device cuda:0 --runs 1 --no-reference --no-cold 2>&1
		;;
	esac
done >"$OUT/first-load.txt"
cat "$OUT/first-load.txt"
