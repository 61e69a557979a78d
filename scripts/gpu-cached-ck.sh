# Sourced by the short GPU calls (gpu-depth.sh, gpu-warm-disk.sh), from the
# repository root with OUT and WORK set: installs the wheel (gpu-install.sh),
# writes gpt-oss-20b (bench/make_checkpoints.py --only), or with GEN_SIZE
# `fst gen`'s misaligned checkpoint of that size for a call too short for
# the model-shaped one, and reads it into the page cache. Sets fst (the
# command), ck (the checkpoint) and files (its shards); exits 3 when a step
# fails.
mkdir -p "$OUT" "$WORK/ck"
OUT=$OUT bash scripts/gpu-install.sh
fst=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/fst
ck=$WORK/ck/gpt-oss-20b
if [ -n "${GEN_SIZE:-}" ]; then
	ck=$WORK/ck/gen-$GEN_SIZE
	[ -d "$ck" ] || "$fst" gen "$ck" --size "$GEN_SIZE" --shards 3 --misaligned \
		>>"$OUT/machine.txt" 2>&1 || { echo "$0: fst gen failed" >&2; exit 3; }
fi
[ -d "$ck" ] || python3 bench/make_checkpoints.py "$WORK/ck" --only gpt-oss-20b >>"$OUT/machine.txt" 2>&1 ||
	{ echo "$0: make_checkpoints failed" >&2; exit 3; }
files=("$ck"/*.safetensors)
cat "${files[@]}" >/dev/null
