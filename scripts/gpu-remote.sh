#!/usr/bin/env bash
# Remote reads onto a GPU, on a GPU machine with prebuilt binaries (BIN,
# default build) and no network: a checkpoint of SIZE (default 8GiB, 4
# shards, misaligned tensors) generated in WORK, served on loopback by
# tests/remote/server.py (threads, sendfile; nginx is not needed), loaded onto
# DEVICE (default cuda:0) from its URL and from its files, and verified
# byte for byte. Results go to OUT:
#   gpu-remote.txt   the machine, every run, and the summary table
#   gpu-remote.json  one object per run (fst load --json, plus what was asked)
# Knobs: RUNS (3), THREADS ("8 16 32"), CHUNKS ("8MiB 16MiB 32MiB"),
# STAGING (empty: the default), PYTHON (python3, for the server and, when it
# imports fst and torch, one fst.load through the package).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-build}
OUT=${OUT:-/tmp/fst-gpu-remote}
WORK=${WORK:-/tmp/fst-gpu-work}
SIZE=${SIZE:-8GiB}
DEVICE=${DEVICE:-cuda:0}
RUNS=${RUNS:-3}
THREADS=${THREADS:-8 16 32}
CHUNKS=${CHUNKS:-8MiB 16MiB 32MiB}
STAGING=${STAGING:-}
PYTHON=${PYTHON:-python3}
FST="$BIN/fst"
mkdir -p "$OUT" "$WORK"
TXT="$OUT/gpu-remote.txt" JSON="$OUT/gpu-remote.json"
: >"$TXT"
: >"$JSON"
log() { echo "$@" | tee -a "$TXT"; }

{
	echo "== machine"
	nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
	nproc
	free -g | head -2
	uname -r
	"$FST" --version
} 2>&1 | tee -a "$TXT"

MODEL="$WORK/remote-model"
if [ ! -f "$MODEL/model.safetensors.index.json" ]; then
	"$FST" gen "$MODEL" --size "$SIZE" --shards 4 --misaligned 2>&1 | tee -a "$TXT" || exit 1
fi
cat "$MODEL"/*.safetensors >/dev/null # the page cache holds it: the network path is measured

PORTFILE="$WORK/server.port"
"$PYTHON" "$REPO/tests/remote/server.py" --dir "$WORK" >"$PORTFILE" 2>"$OUT/server.err" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 100); do
	[ -s "$PORTFILE" ] && break
	sleep 0.1
done
PORT=$(head -1 "$PORTFILE")
[ -n "$PORT" ] || { log "the server did not start: $(cat "$OUT/server.err")"; exit 1; }
URL="http://127.0.0.1:$PORT/ok/remote-model/model.safetensors.index.json"
log "== served at $URL"

staging=()
[ -n "$STAGING" ] && staging=(--staging "$STAGING")
# one load: its JSON line (with what was asked) into JSON, a line into TXT
run() {
	local what=$1 target=$2
	shift 2
	local out
	if ! out=$("$FST" load --json --device "$DEVICE" "${staging[@]}" "$@" "$target" 2>"$OUT/last.err"); then
		log "$what: FAILED: $(cat "$OUT/last.err")"
		return 1
	fi
	"$PYTHON" - "$what" "$out" "$*" >>"$JSON" <<'EOF'
import json, sys
j = json.loads(sys.argv[2])
j["what"], j["args"] = sys.argv[1], sys.argv[3]
print(json.dumps(j))
EOF
	"$PYTHON" - "$what" "$out" <<'EOF' | tee -a "$TXT"
import json, sys
j = json.loads(sys.argv[2])
load = j["seconds"] - j["open_seconds"]
print(f"{sys.argv[1]:<34} {j['bytes'] / load / 1e9:7.2f} GB/s  load {load:.3f} s, open "
      f"{j['open_seconds']:.3f} s: {j['path_chosen']}")
EOF
}

log "== local files onto $DEVICE"
for r in $(seq "$RUNS"); do run "local (run $r)" "$MODEL"; done
log "== remote onto $DEVICE"
for t in $THREADS; do
	for c in $CHUNKS; do
		for r in $(seq "$RUNS"); do run "remote $t conns $c (run $r)" "$URL" --threads "$t" --chunk "$c"; done
	done
done
for r in $(seq "$RUNS"); do run "remote, defaults (run $r)" "$URL"; done

log "== verify $URL onto $DEVICE"
"$FST" verify --device "$DEVICE" "$URL" 2>&1 | tee -a "$TXT"
log "verify exit ${PIPESTATUS[0]}"

if "$PYTHON" -c "import fst, torch" 2>/dev/null; then
	log "== fst.load through the package onto $DEVICE"
	"$PYTHON" - "$URL" "$DEVICE" <<'EOF' 2>&1 | tee -a "$TXT"
import sys, time
import fst, torch
url, dev = sys.argv[1], sys.argv[2]
for i in range(2):
    t0 = time.perf_counter()
    ts = fst.load(url, device=dev)
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    s = time.perf_counter() - t0
    n = sum(t.numel() * t.element_size() for t in ts.values())
    print(f"fst.load {len(ts)} tensors, {n / s / 1e9:.2f} GB/s ({s:.3f} s, open included)")
    del ts
EOF
fi

log "== summary: best GB/s of each (load part, header GETs left out)"
"$PYTHON" - "$JSON" <<'EOF' | tee -a "$TXT"
import json, re, sys
best = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    key = re.sub(r" \(run \d+\)$", "", j["what"])
    gbps = j["bytes"] / (j["seconds"] - j["open_seconds"]) / 1e9
    best[key] = max(best.get(key, 0), gbps)
local = max((v for k, v in best.items() if k.startswith("local")), default=0)
for k, v in best.items():
    ratio = f"{v / local:.2f}x local" if local else ""
    print(f"{k:<34} {v:7.2f} GB/s  {ratio}")
EOF
