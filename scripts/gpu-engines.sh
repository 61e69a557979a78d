#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: fst inside the engines'
# code on real checkpoints. Builds the Python package (FST_DEPS_PREFIX: the
# jansson and liburing headers unpacked from Debian's -dev packages, as that
# machine has none), writes the two benchmark checkpoints with the reference
# writer, runs bench/engine_iterators.py on each (vLLM's own iterator
# functions from VLLM, made by bench/vllm_extract.py; the peer wheels from
# WHL; PEERS=0 leaves them out), then the transformers tests
# (device_map="cuda" among them; TRANSFORMERS=0 leaves them out).
# Results go to OUT.
set -uo pipefail
OUT=${OUT:-/tmp/fst-engines-out}
WORK=${WORK:-/tmp/fst-engines-work}
VLLM=${VLLM:-.vllm-extract}
WHL=${WHL:-.whl}
ROUNDS=${ROUNDS:-3}
PEERS=${PEERS:-1}
TRANSFORMERS=${TRANSFORMERS:-1}
mkdir -p "$OUT" "$WORK"
site=$WORK/site peers=$WORK/peers
{
	nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
	python3 -c 'import torch, transformers, safetensors; print("torch", torch.__version__, "transformers", transformers.__version__, "safetensors", safetensors.__version__)'
} 2>&1 | tee "$OUT/machine.txt"
FST_DEPS_PREFIX=${FST_DEPS_PREFIX:-$PWD/.gl} python3 -m pip install -q --no-deps \
	--no-build-isolation --target "$site" . >"$OUT/build.txt" 2>&1 || { cat "$OUT/build.txt"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target "$peers" "$WHL"/fastsafetensors-*.whl \
	>>"$OUT/build.txt" 2>&1
export PYTHONPATH=$site
[ -d "$WORK/ck/llama3-8b" ] || python3 bench/make_checkpoints.py "$WORK/ck" 2>&1 | tee "$OUT/checkpoints.txt"
for m in llama3-8b gpt-oss-20b; do
	python3 bench/engine_iterators.py "$WORK/ck/$m" --device cuda:0 --rounds "$ROUNDS" \
		--vllm "$VLLM" $([ "$PEERS" = 1 ] && echo --peer-site "$peers") --json "$OUT/iterators-$m.json" 2>&1 |
		tee "$OUT/iterators-$m.txt"
done
[ "$TRANSFORMERS" = 1 ] || exit 0
python3 -m pytest -q -p no:cacheprovider tests/engines/test_transformers.py -rA 2>&1 |
	tail -15 | tee "$OUT/transformers.txt"
