#!/usr/bin/env bash
# Run fastsafetensors' own unit tests against fst.compat.fastsafetensors, as
# a measurement of the compatibility of fst's fastsafetensors API. Nothing of
# fastsafetensors is kept in this repository: its tests are taken from a
# checkout (or a bare mirror) into a temporary directory, and a package named
# `fastsafetensors` is made there whose modules ARE fst.compat.fastsafetensors's
# (an import alias: a rename and nothing else), put first on sys.path.
#
#   scripts/peer-tests-fastsafetensors.sh [CHECKOUT]        # fst through the shim
#   scripts/peer-tests-fastsafetensors.sh --real DIR [CHECKOUT]
#       # the same tests against a real fastsafetensors installed in DIR
#       # (pip install --target DIR fastsafetensors==X), for comparison
#
# CHECKOUT: a fastsafetensors work tree or bare repository (default: the
# mirror below). PYTHON: the interpreter (default python3); it needs torch,
# safetensors and pytest, and fst installed (pip install .) unless --real.
# KEEP=1 keeps the temporary directory.
#
# The public-API subset is run: the tests that use only fastsafetensors'
# public names (loaders, buffers, fastsafe_open, st_types, frameworks,
# TensorFrame, SafeTensorsMetadata). Left out, with the reason:
#   internal: the C++ extension and its raw buffers (cpp readers, gds
#     buffers, cuFile registration, memmove, read_buffer monkeypatching,
#     alloc_tensor_memory accounting), the copier classes and their
#     selection policy, the buffers' rank_loaders/gbuf fields, and a lint
#     of fastsafetensors' own source layout;
#   not provided by fst: AutoLoader/LoaderConfig (test_auto_loader.py,
#     test_config.py) and 3FS (threefs/).
# test_multi.py runs twice: one process, and two ranks over gloo on the CPU
# (torchrun), with the CPU as device whatever GPU is there only if none is.
set -u

DEFAULT_REPO=/work/.mirror/foundation-model-stack+fastsafetensors/repo
REAL=""
if [ "${1:-}" = "--real" ]; then
	REAL=$(cd "$2" && pwd) || exit 2
	shift 2
fi
SRC=${1:-$DEFAULT_REPO}
PY=${PYTHON:-python3}

PUBLIC_SINGLE=(
	test_device test_framework test_get_framework_fail
	test_SafeTensorsFileLoader test_SafeTensorsFileLoaderNoGds test_fastsafe_open
	test_int8 test_float8_e5m2 test_float8_e4m3fn test_float8_e4m3fn_to_int8
	test_float4_e2m1fn_x2 test_float4_native_shape_and_slices test_float8_e8m0fnu
	test_tensor_frame_getitem test_from_fd_short_reads
)

tmp=$(mktemp -d)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
if git -C "$SRC" rev-parse --is-bare-repository 2>/dev/null | grep -q true; then
	git -C "$SRC" archive HEAD tests | tar -x -C "$tmp" || exit 2
	rev=$(git -C "$SRC" rev-parse --short HEAD)
elif [ -d "$SRC/tests/unit" ]; then
	cp -r "$SRC/tests" "$tmp/" || exit 2
	rev=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo "?")
else
	echo "no fastsafetensors tests at $SRC" >&2
	exit 2
fi

if [ -n "$REAL" ]; then
	SHIM=$REAL
	target="fastsafetensors $(PYTHONPATH=$REAL "$PY" -c 'import fastsafetensors as f; print(f.__version__)' 2>/dev/null) from $REAL"
else
	SHIM=$tmp/shim
	mkdir -p "$SHIM/fastsafetensors"
	cat >"$SHIM/fastsafetensors/__init__.py" <<'EOF'
"""fastsafetensors renamed: fastsafetensors.X is fst.compat.fastsafetensors.X,
the same module objects (so monkeypatching one patches the other)."""
import importlib
import importlib.abc
import importlib.util
import sys

_OURS = "fst.compat.fastsafetensors"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if not name.startswith(__name__ + "."):
            return None
        ours = _OURS + name[len(__name__):]
        try:
            if importlib.util.find_spec(ours) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return importlib.import_module(_OURS + spec.name[len(__name__):])

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Alias())
sys.modules[__name__] = importlib.import_module(_OURS)
EOF
	target="fst $(PYTHONPATH=$SHIM:${PYTHONPATH:-} "$PY" -c 'import fst; print(fst.__version__)' 2>/dev/null) through fst.compat.fastsafetensors"
fi

export PYTHONPATH=$SHIM:${PYTHONPATH:-}
export TEST_FASTSAFETENSORS_FRAMEWORK=torch
unset RANK WORLD_SIZE
cd "$tmp/tests/unit" || exit 2

summary() {
	local line
	line=$(grep -E "(passed|failed|error|skipped|no tests ran).* in [0-9.]+s" "$1" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
	echo "${line:-no result (see below)}"
}

ids=()
for t in "${PUBLIC_SINGLE[@]}"; do ids+=("test_fastsafetensors.py::$t"); done
"$PY" -m pytest -q -p no:cacheprovider "${ids[@]}" -rfE >"$tmp/single.log" 2>&1
"$PY" -m pytest -q -p no:cacheprovider test_multi.py -rfE >"$tmp/multi1.log" 2>&1
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout 600 "$PY" -m torch.distributed.run --nproc_per_node=2 --master_addr=127.0.0.1 \
	--master_port="$port" test_multi.py -q -p no:cacheprovider -rfE test_multi.py \
	>"$tmp/multi2.log" 2>&1
# the whole of test_fastsafetensors.py, internal tests included, for the record
"$PY" -m pytest -q -p no:cacheprovider test_fastsafetensors.py >"$tmp/all.log" 2>&1

echo "fastsafetensors tests: $SRC at $rev"
echo "against: $target"
echo "python: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>/dev/null)"
echo
echo "public-API subset"
echo "  test_fastsafetensors.py (${#PUBLIC_SINGLE[@]} tests): $(summary "$tmp/single.log")"
echo "  test_multi.py, 1 process:           $(summary "$tmp/multi1.log")"
echo "  test_multi.py, 2 ranks (gloo, CPU), a line a rank:"
grep -oE "[0-9]+ (passed|failed|error|skipped)[^=]* in [0-9.]+s" "$tmp/multi2.log" | sed 's/^/    /'
grep -q "in [0-9.]*s" "$tmp/multi2.log" || { echo "    no result:"; tail -5 "$tmp/multi2.log" | sed 's/^/    /'; }
echo "for the record, all of test_fastsafetensors.py (internal tests included): $(summary "$tmp/all.log")"
for f in single multi1 multi2; do
	if grep -qE "^(FAILED|ERROR)" "$tmp/$f.log"; then
		echo
		echo "$f: failures"
		grep -E "^(FAILED|ERROR)" "$tmp/$f.log" | sort -u | cut -c1-300
	fi
	if grep -q "ImportError\|ModuleNotFoundError" "$tmp/$f.log" && ! grep -qE "[0-9]+ passed" "$tmp/$f.log"; then
		echo
		echo "$f: import failure"
		grep -m3 "ImportError\|ModuleNotFoundError" "$tmp/$f.log" | cut -c1-300
	fi
done
[ "${KEEP:-0}" = 1 ] && echo "logs in $tmp"
exit 0
