#!/usr/bin/env bash
# The main job: generate a checkpoint once (cached under the build folder),
# then inspect it. (Loading arrives with the engine.)
set -euo pipefail
BUILD=${1:-build}
FST="$BUILD/fst"
MODEL="$BUILD/demo-model"
if [ ! -f "$MODEL/model.safetensors.index.json" ]; then
	"$FST" gen "$MODEL" --size 2GiB --shards 4 --misaligned
fi
"$FST" inspect "$MODEL" | tail -4
