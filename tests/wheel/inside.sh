#!/usr/bin/env bash
# tests/wheel/run.sh's sandbox: a clean environment (env -i) whose PATH has
# the venv and no compiler; with FST_SANDBOX=mount, in a mount namespace of
# its own where /usr/include and /usr/local/include are empty and the
# jansson, liburing and OpenSSL shared libraries of the wheel's architecture
# are /dev/null. There: the wheel installed offline, what it is checked, then
# the Python suite. ARCH is the wheel's architecture; FST_BIN runs the
# venv's fst (itself on x86-64, through qemu for aarch64).
set -euo pipefail
if [ "$FST_SANDBOX" = mount ]; then
	for d in /usr/include /usr/local/include; do
		if [ -d "$d" ]; then mount -t tmpfs -o ro,size=1m tmpfs "$d"; fi
	done
	# the wheel's architecture's: qemu-aarch64 itself needs the x86-64 liburing
	for f in /usr/lib/$ARCH-linux-gnu/{libjansson,liburing,libcrypto,libssl}.so* \
		/usr/local/lib/{libjansson,liburing,libcrypto}.so*; do
		if [ -f "$f" ]; then mount --bind /dev/null "$f"; fi
	done
	[ ! -e /usr/include/jansson.h ] && [ ! -e /usr/include/liburing.h ] && [ ! -e /usr/include/stdio.h ]
	echo "wheel: sandbox: /usr/include empty; $ARCH libjansson, liburing, libcrypto, libssl hidden"
fi
for c in cc gcc clang c++ g++ ld as cmake ninja make zig; do
	if command -v "$c" >/dev/null; then
		echo "wheel: $c is on the sandbox's PATH ($(command -v "$c"))" >&2
		exit 1
	fi
done

pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
PIP_ROOT_USER_ACTION=ignore pip install -q --no-index --no-deps "$WHEEL"
echo "wheel: installed $(basename "$WHEEL") offline"

# The command: the binary itself on the PATH, saying its distribution.
[ "$(command -v fst)" = "$VENV/bin/fst" ]
v=$("$FST_BIN" --version)
[[ $v == "fst "*" (fst-loader)" ]] || { echo "wheel: fst --version says '$v'" >&2; exit 1; }
echo "wheel: $(command -v fst): $v"

# The package: imported from the venv, with its extras; everything it ships
# is built for ARCH and needs no library beyond glibc's.
cd "$(mktemp -d)"
"$VENV/bin/python" - "$VENV" <<'PY'
import importlib.metadata as md, os, sys
import fst
venv = os.path.realpath(sys.argv[1])
assert os.path.realpath(fst.__file__).startswith(venv), fst.__file__
req = md.requires("fst-loader")
for want in ('numpy; extra == "numpy"', 'ml_dtypes; extra == "numpy"', 'torch; extra == "torch"'):
    assert want in req, (want, req)
assert any(r.startswith("vllm") and 'extra == "vllm"' in r for r in req), req
print("wheel: import fst", fst.__version__, "from", os.path.dirname(fst.__file__))
PY
"$TOOLS/bin/python" - "$VENV" "$ARCH" <<'PY'
import os, sys
from elftools.elf.elffile import ELFFile
from elftools.elf.dynamic import DynamicSection
allowed = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
           "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
machine = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}[sys.argv[2]]
venv = sys.argv[1]
files = [os.path.join(venv, "bin", "fst")]
for root, _, names in os.walk(venv + "/lib"):
    if "/site-packages/fst" in root:
        files += [os.path.join(root, n) for n in names if ".so" in n]
assert len(files) >= 2, files
for path in files:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        assert elf["e_machine"] == machine, (path, elf["e_machine"])
        needed = {t.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                  for t in s.iter_tags() if t.entry.d_tag == "DT_NEEDED"}
    assert needed <= allowed, (path, needed - allowed)
    print("wheel:", os.path.relpath(path, venv), machine, "needs", " ".join(sorted(needed)))
PY

# The suite, against the installed package and command. The wheel ships no
# libfst.so: the tests of libfst's C writer through ctypes skip.
export FST_LIB=$VENV/libfst.so
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$REPO/tests/python" "$@"
