#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: fst from the cp312 wheel
# in dist/ (built here with `make wheel WHEEL_ARCH=x86_64`), installed offline
# into python3 with no build step, and what the machine is (cores, memory,
# the disk's queue, the GPU). Writes OUT/wheel.txt and OUT/machine.txt.
# WHEEL_CHECK=1 runs scripts/gpu-wheel.sh instead (its checks too).
set -uo pipefail
OUT=${OUT:?OUT: where wheel.txt and machine.txt go}
WORK=${WORK:-/tmp/fst-cold-work}
mkdir -p "$OUT"
if [ "${WHEEL_CHECK:-0}" = 1 ]; then
	OUT=$WORK/wheel timeout 150 bash scripts/gpu-wheel.sh >"$OUT/wheel.txt" 2>&1
	cat "$WORK/wheel/wheel.txt" >>"$OUT/wheel.txt" 2>/dev/null
else
	py=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
	whl=$(ls dist/fst_loader-*-"$py"-"$py"-*manylinux_2_28_x86_64.whl | tail -1)
	{
		sha256sum "$whl"
		python3 -m pip install -q --no-index --no-deps --force-reinstall "$whl" 2>&1
		"$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/fst" --version
	} >"$OUT/wheel.txt" 2>&1
fi
{
	nproc
	lscpu | grep -E '^(Model name|Socket|Core|Thread|NUMA node\(s\)|L[23] cache)'
	free -g
	lsblk -o NAME,SIZE,ROTA,TYPE,MOUNTPOINT
	for f in nr_requests max_sectors_kb read_ahead_kb scheduler; do
		echo "$f $(cat /sys/block/vda/queue/$f 2>/dev/null)"
	done
	# huge pages decide what faulting in a CPU load's destination costs
	echo "transparent_hugepage $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
	uname -r
	nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current \
		--format=csv
} >"$OUT/machine.txt" 2>&1
