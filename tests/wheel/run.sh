#!/usr/bin/env bash
# The wheel tier: make wheel's build (scripts/build-wheel.sh), installed into
# a fresh venv with no compiler on the PATH and the -dev headers and the
# jansson, liburing and OpenSSL libraries out of sight (tests/wheel/inside.sh),
# then the Python suite (tests/python) against the installed package and its
# fst command, not the source tree. Exit 77 (skip) when the wheel toolchain
# is not installed (scripts/install-deps.sh installs it; FST_WHEEL=0 skips it).
# Usage: tests/wheel/run.sh BUILD_DIR [pytest args...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
shift
wb=${FST_WHEEL_BUILD:-$repo/build-wheel}
tools=${FST_WHEEL_VENV:-/opt/fst-wheel}

# The wheel, as make wheel builds it (incrementally), into a folder of its own.
out=$wb/test-dist
rm -rf "$out"
mkdir -p "$wb"
log=$wb/test-build.log
rc=0
bash "$repo/scripts/build-wheel.sh" "$out" >"$log" 2>&1 || rc=$?
cat "$log"
if [ "$rc" = 77 ]; then
	echo "wheel: skipped (no wheel toolchain)"
	exit 77
fi
[ "$rc" = 0 ] || exit "$rc"
whl=$(tail -1 "$log")

# A fresh venv, with the suite's own tools (scripts/install-deps.sh's list,
# installed by it into this venv); the package itself comes only from the
# wheel, installed inside the sandbox.
venv=$wb/test-venv
rm -rf "$venv"
"$tools/bin/python" -m venv "$venv"
PYTHON=$venv/bin/python FST_ENGINES=0 FST_WHEEL=0 bash "$repo/scripts/install-deps.sh"

# Commands the sandbox keeps: those of the usual folders but compilers,
# linkers, assemblers and build tools.
bin=$wb/test-bin
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
			rustc | cargo | go | nvcc | cython* | dpkg-source | dpkg-buildpackage | x86_64-linux-gnu-*) continue ;;
		esac
		ln -s "$f" "$bin/$n"
	done
done

env_vars=(PATH="$venv/bin:$bin" VENV="$venv" WHEEL="$whl" REPO="$repo" TOOLS="$tools"
	FST_CUDA_DOUBLE="${FST_CUDA_DOUBLE:-$build/tests/libfst_cuda_double.so}" HOME="$HOME"
	LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" PYTHONUNBUFFERED=1)
if unshare -m --propagation private true 2>/dev/null; then
	exec unshare -m --propagation private env -i "${env_vars[@]}" FST_SANDBOX=mount \
		bash "$here/inside.sh" "$@"
fi
echo "wheel: no mount namespace here (unshare -m): the headers and libraries stay on the disk," \
	"but no compiler is on the PATH"
exec env -i "${env_vars[@]}" FST_SANDBOX=path bash "$here/inside.sh" "$@"
