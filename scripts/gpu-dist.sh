#!/usr/bin/env bash
# Tensor-parallel checks and benchmark on a machine with NGPU GPUs (run as
# root on the GPU machine, with the Python package installed): correctness,
# a rank that fails to read, a rank that vanishes, and the benchmark; with
# node communicators (nodes of NODE_SIZE ranks standing for hosts), where
# there are several nodes: correctness and the bytes each node reads, a rank
# that fails to read, and a rank that vanishes. SAME_GPU=1 runs NGPU ranks
# on cuda:0, each rank a host of its own to NCCL (tests/gpu/dist_check.py).
# SKIP_CHECK / SKIP_BENCH leave out the first and the last step.
set -uo pipefail
M=${1:?checkpoint}
NGPU=${NGPU:-2}
export SAME_GPU=${SAME_GPU:-0} NODE_SIZE=${NODE_SIZE:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run() { timeout 300 torchrun --nproc_per_node "$NGPU" tests/gpu/dist_check.py "$M" "$1" 2>&1 |
	grep -v "^W1\|OMP_NUM_THREADS\|^\*\*\*\*" ; }
[ -z "${SKIP_CHECK:-}" ] && { echo "== check"; run check; }
echo "== fail (rank 1 cannot read)"; run fail
echo "== nccl (rank 1's NCCL call fails; both load again; TIMEOUT_MS=5000)"; TIMEOUT_MS=5000 run nccl
echo "== vanish (rank 1 leaves; TIMEOUT_MS=15000)"; TIMEOUT_MS=15000 run vanish
# nodes of NODE_SIZE ranks need at least two nodes to say anything
if [ "$NGPU" -ge 4 ] || { [ "$NGPU" -ge 2 ] && [ "$NODE_SIZE" = 1 ]; }; then
	echo "== nodes (nodes of $NODE_SIZE ranks: each reads every broadcast tensor once)"; run nodes
	echo "== nodes-fail (rank 1 cannot read, with node communicators)"; run nodes-fail
	echo "== nodes-vanish (rank 1 leaves, with node communicators; TIMEOUT_MS=15000)"
	TIMEOUT_MS=15000 run nodes-vanish
fi
[ -z "${SKIP_BENCH:-}" ] && { echo "== bench"; run bench; }
