#!/usr/bin/env bash
# The wheel tier: make wheel's build (scripts/build-wheel.sh), installed into
# a fresh venv with no compiler on the PATH and the -dev headers and the
# jansson, liburing and OpenSSL libraries out of sight (tests/wheel/inside.sh),
# then the Python suite (tests/python) against the installed package and its
# fst command, not the source tree. FST_WHEEL_ARCH says which wheel: x86_64
# (the default), or aarch64, which runs under qemu-user in the aarch64 Python
# scripts/install-deps.sh makes (FST_AARCH64_PYTHON): the venv is that
# Python's, the suite's tools are beside it (PYTHONPATH), and the fst command
# is run through qemu (FST_BIN, a wrapper: nothing here runs an aarch64
# program by itself). Exit 77 (skip) when the wheel toolchain or the aarch64
# Python is not installed (FST_WHEEL=0, FST_AARCH64=0 skip installing them).
# Usage: tests/wheel/run.sh BUILD_DIR [pytest args...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
shift
wb=${FST_WHEEL_BUILD:-$repo/build-wheel}
tools=${FST_WHEEL_VENV:-/opt/fst-wheel}
arch=${FST_WHEEL_ARCH:-x86_64}
emu=${FST_AARCH64_PYTHON:-/opt/fst-aarch64-python}
if [ "$arch" = aarch64 ] && [ ! -f "$emu/.fst-aarch64-python" ]; then
	echo "wheel: skipped (no aarch64 Python at $emu: scripts/install-deps.sh makes it)"
	exit 77
fi

# The wheel, as make wheel builds it (incrementally), into a folder of its own.
t=$wb/test-$arch
out=$t/dist
rm -rf "$out"
mkdir -p "$t"
log=$t/build.log
rc=0
WHEEL_ARCH=$arch bash "$repo/scripts/build-wheel.sh" "$out" >"$log" 2>&1 || rc=$?
cat "$log"
if [ "$rc" = 77 ]; then
	echo "wheel: skipped (no wheel toolchain)"
	exit 77
fi
[ "$rc" = 0 ] || exit "$rc"
whl=$(tail -1 "$log")

# A fresh venv, with the suite's own tools (scripts/install-deps.sh's list,
# installed by it into this venv, or for aarch64 beside its Python); the
# package itself comes only from the wheel, installed inside the sandbox.
venv=$t/venv
rm -rf "$venv"
env_vars=()
if [ "$arch" = aarch64 ]; then
	"$emu/bin/python$("$tools/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
		-m venv --without-pip "$venv"
	fst=$t/qemu-fst
	printf '#!/bin/sh\nexec %q -L %q %q "$@"\n' "$(command -v qemu-aarch64)" "$emu/root" \
		"$venv/bin/fst" >"$fst"
	chmod +x "$fst"
	env_vars=(PYTHONPATH="$emu/site" FST_TEST_EMULATOR=qemu-aarch64)
else
	"$tools/bin/python" -m venv "$venv"
	PYTHON=$venv/bin/python FST_ENGINES=0 FST_WHEEL=0 FST_AARCH64=0 bash "$repo/scripts/install-deps.sh"
	fst=$venv/bin/fst
fi

# Commands the sandbox keeps: those of the usual folders but compilers,
# linkers, assemblers and build tools.
bin=$t/bin
rm -rf "$bin"
mkdir -p "$bin"
for d in /usr/local/bin /usr/bin /bin; do
	for f in "$d"/*; do
		n=${f##*/}
		[ -x "$f" ] && [ ! -d "$f" ] && [ ! -e "$bin/$n" ] || continue
		case $n in
		cc | c++ | c89* | c99* | cpp* | gcc* | g++* | *-gcc* | *-g++* | *-cpp* | clang* | *-clang* | \
			ld | ld.* | *-ld | *-ld.* | as | *-as | lld* | ld64* | llvm-* | tcc | zig | cmake | ctest | cpack | \
			ninja | make | gmake | *-config | pkg-config | *-pkg-config | pkgconf | gfortran* | *-gfortran* | \
			rustc | cargo | go | nvcc | cython* | dpkg-source | dpkg-buildpackage | x86_64-linux-gnu-* | \
			aarch64-linux-gnu-*) continue ;;
		esac
		ln -s "$f" "$bin/$n"
	done
done

env_vars+=(PATH="$venv/bin:$bin" VENV="$venv" WHEEL="$whl" REPO="$repo" TOOLS="$tools"
	ARCH="$arch" FST_BIN="$fst"
	FST_CUDA_DOUBLE="${FST_CUDA_DOUBLE:-$build/tests/libfst_cuda_double.so}" HOME="$HOME"
	LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" PYTHONUNBUFFERED=1)
if unshare -m --propagation private true 2>/dev/null; then
	exec unshare -m --propagation private env -i "${env_vars[@]}" FST_SANDBOX=mount \
		bash "$here/inside.sh" "$@"
fi
echo "wheel: no mount namespace here (unshare -m): the headers and libraries stay on the disk," \
	"but no compiler is on the PATH"
exec env -i "${env_vars[@]}" FST_SANDBOX=path bash "$here/inside.sh" "$@"
