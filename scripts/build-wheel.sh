#!/usr/bin/env bash
# make wheel: fst-loader's binary wheels for Linux on x86-64 and aarch64,
# tagged manylinux_2_28, that need nothing at install time (docs/design.md,
# "Distribution"). Everything is compiled by zig (the ziglang package, in the
# venv scripts/install-deps.sh makes) for glibc 2.28 through the project's own
# CMake build: libfst (FST_SOURCES), the fst command, and the extension
# (setup.py, CC and LDSHARED the zig wrappers below). jansson and liburing are
# built from their Debian sources (downloaded by scripts/install-deps.sh) as
# position-independent archives. OpenSSL's libcrypto.a and headers are
# Debian's for the wheel's architecture: the system's (libssl-dev) on x86-64,
# for aarch64 the libssl-dev:arm64 package scripts/install-deps.sh downloads,
# with libpython3.X-dev:arm64 for the aarch64 Python headers; xxhash.h is the
# system's. auditwheel checks and tags each wheel.
#
# Usage: scripts/build-wheel.sh [OUT_DIR]   (default dist/; the last wheel's
# path is the last line printed). WHEEL_ARCH: x86_64, aarch64 or all (the
# default: both). PYTHON: the interpreter the extension is for (default the
# toolchain venv's, the version of python3; for aarch64 Debian must have its
# version's libpython3.X-dev:arm64). FST_WHEEL_BUILD: the build folder
# (default build-wheel/, one folder in it for each architecture). Exit 77
# when the toolchain is not installed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "${1:-$repo/dist}"
out=$(cd "${1:-$repo/dist}" && pwd)
wb=${FST_WHEEL_BUILD:-$repo/build-wheel}
venv=${FST_WHEEL_VENV:-/opt/fst-wheel}
py=${PYTHON:-$venv/bin/python}
case ${WHEEL_ARCH:-all} in
all) arches=(x86_64 aarch64) ;;
x86_64 | aarch64) arches=("$WHEEL_ARCH") ;;
*) echo "build-wheel: WHEEL_ARCH is x86_64, aarch64 or all, not '$WHEEL_ARCH'" >&2; exit 1 ;;
esac

if [ "$(uname -m)" != x86_64 ]; then
	echo "build-wheel: the wheels are built on x86-64 (the x86-64 one links the system's libcrypto.a)" >&2
	exit 77
fi
dscs=("$wb"/deb-src/jansson_*.dsc "$wb"/deb-src/liburing_*.dsc)
if [ ! -f "$venv/.fst-wheel" ] || [ ! -f "${dscs[0]}" ] || [ ! -f "${dscs[1]}" ]; then
	echo "build-wheel: the wheel toolchain ($venv) or the Debian sources ($wb/deb-src) are" \
		"missing: scripts/install-deps.sh installs them" >&2
	exit 77
fi
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
debs=("$wb"/deb-arm64/libssl-dev_*_arm64.deb "$wb"/deb-arm64/libpython"$pyver"-dev_*_arm64.deb)
if [[ " ${arches[*]} " == *" aarch64 "* ]] && { [ ! -f "${debs[0]}" ] || [ ! -f "${debs[1]}" ]; }; then
	echo "build-wheel: the aarch64 wheel's libssl-dev:arm64 or libpython$pyver-dev:arm64 is" \
		"missing from $wb/deb-arm64: scripts/install-deps.sh downloads them (for python3's" \
		"version; WHEEL_ARCH=x86_64 builds the x86-64 wheel alone)" >&2
	exit 77
fi
mkdir -p "$wb"
wb=$(cd "$wb" && pwd)
export ZIG_GLOBAL_CACHE_DIR="$wb/zig-cache" ZIG_LOCAL_CACHE_DIR="$wb/zig-cache"

# One wheel, for $1 (x86_64 or aarch64), built in $wb/$1.
build_one() {
	local arch=$1 target=$1-linux-gnu.2.28 plat=manylinux_2_28_$1 multiarch=$1-linux-gnu
	local ab=$wb/$1 root="" cross=()
	# aarch64: Debian's arm64 OpenSSL and Python headers, unpacked into $ab/root
	# (their libraries never run here); CMake cross-compiles, so that the
	# CPU-specific choices (XXH3's kernels) are aarch64's; setuptools names
	# the extension and tags the wheel for aarch64, not for the Python that
	# runs it.
	if [ "$arch" = aarch64 ]; then
		root=$ab/root
		cross=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64)
	fi

	# The compiler, archiver and indexer CMake, configure scripts and setuptools
	# are given: zig through the ziglang package, for glibc 2.28. pip's
	# isolated build puts its own site setup on PYTHONPATH, which hides the
	# venv's packages from a Python of the same version: cleared here.
	local zig=$ab/zig run='exec env -u PYTHONPATH -u PYTHONHOME'
	mkdir -p "$zig"
	printf '#!/bin/sh\n%s %q -m ziglang cc -target %s "$@"\n' "$run" "$venv/bin/python" "$target" >"$zig/cc"
	printf '#!/bin/sh\n%s %q -m ziglang ar "$@"\n' "$run" "$venv/bin/python" >"$zig/ar"
	printf '#!/bin/sh\n%s %q -m ziglang ranlib "$@"\n' "$run" "$venv/bin/python" >"$zig/ranlib"
	chmod +x "$zig/cc" "$zig/ar" "$zig/ranlib"

	# The dependencies, into $deps (include/, lib/), once per source version.
	local deps=$ab/deps recipe
	recipe="2 $target $(basename -a "${dscs[@]}" | tr '\n' ' ')"
	if [ "$arch" = aarch64 ]; then
		recipe+="$(basename -a "${debs[@]}" | tr '\n' ' ')"
	else
		recipe+="$(stat -c %s /usr/lib/$multiarch/libcrypto.a)"
	fi
	if [ "$(cat "$deps/.stamp" 2>/dev/null)" != "$recipe" ]; then
		echo "build-wheel: building jansson and liburing from Debian's sources with zig for $arch"
		rm -rf "$deps" "$ab/src"
		mkdir -p "$deps/include" "$deps/lib" "$ab/src"
		if [ "$arch" = aarch64 ]; then
			rm -rf "$root"
			for d in "${debs[@]}"; do dpkg-deb -x "$d" "$root"; done
		fi
		dpkg-source -q -x "${dscs[0]}" "$ab/src/jansson" >/dev/null 2>&1
		dpkg-source -q -x "${dscs[1]}" "$ab/src/liburing" >/dev/null 2>&1
		cmake -S "$ab/src/jansson" -B "$ab/src/jansson-build" -G Ninja -Wno-dev "${cross[@]}" \
			-DCMAKE_C_COMPILER="$zig/cc" -DCMAKE_AR="$zig/ar" -DCMAKE_RANLIB="$zig/ranlib" \
			-DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
			-DJANSSON_BUILD_SHARED_LIBS=OFF -DJANSSON_BUILD_DOCS=OFF -DJANSSON_EXAMPLES=OFF \
			-DJANSSON_WITHOUT_TESTS=ON -DCMAKE_INSTALL_PREFIX="$deps" >"$ab/src/jansson.log" 2>&1 ||
			{ cat "$ab/src/jansson.log"; return 1; }
		cmake --build "$ab/src/jansson-build" >>"$ab/src/jansson.log" 2>&1 ||
			{ cat "$ab/src/jansson.log"; return 1; }
		cmake --install "$ab/src/jansson-build" >>"$ab/src/jansson.log" 2>&1
		# liburing's configure compiles its probes and runs none: it works for
		# the cross target as for the native one.
		(cd "$ab/src/liburing" && ./configure --cc="$zig/cc" >"$ab/src/liburing.log" 2>&1 &&
			make -C src CC="$zig/cc" AR="$zig/ar" RANLIB="$zig/ranlib" CFLAGS="-O2 -fPIC" \
				liburing.a >>"$ab/src/liburing.log" 2>&1) || { cat "$ab/src/liburing.log"; return 1; }
		for h in liburing.h liburing/io_uring.h liburing/compat.h liburing/barrier.h; do
			install -D -m 644 "$ab/src/liburing/src/include/$h" "$deps/include/$h"
		done
		install -m 644 "$ab/src/liburing/src/liburing.a" "$deps/lib/"
		# The fst command's: libcrypto.a as Debian builds it (it links against
		# glibc 2.28's symbols as it is, on both architectures), its headers
		# (the arch-specific ones over the common ones) and xxhash.h.
		install -m 644 "$root/usr/lib/$multiarch/libcrypto.a" "$deps/lib/"
		install -m 644 /usr/include/xxhash.h "$deps/include/"
		cp -r "$root/usr/include/openssl" "$deps/include/"
		cp "$root/usr/include/$multiarch/openssl/"*.h "$deps/include/openssl/"
		# The extension's Python headers for aarch64, laid out the same way:
		# the arch's own pyconfig.h over Debian's dispatching one.
		if [ "$arch" = aarch64 ]; then
			cp -r "$root/usr/include/python$pyver" "$deps/include/"
			cp "$root/usr/include/$multiarch/python$pyver/pyconfig.h" "$deps/include/python$pyver/"
		fi
		echo "$recipe" >"$deps/.stamp"
	fi

	# libfst, the fst command and the extension: setup.py over CMake, all zig's.
	local cmake_args=("${cross[@]}" -DCMAKE_C_COMPILER="$zig/cc" -DCMAKE_AR="$zig/ar"
		-DCMAKE_RANLIB="$zig/ranlib" -DCMAKE_EXE_LINKER_FLAGS=-s
		-DJANSSON_INCLUDE="$deps/include" -DURING_INCLUDE="$deps/include"
		-DXXHASH_INCLUDE="$deps/include"
		-DJANSSON_STATIC="$deps/lib/libjansson.a" -DJANSSON_SHARED="$deps/lib/libjansson.a"
		-DURING_STATIC="$deps/lib/liburing.a" -DCRYPTO_STATIC="$deps/lib/libcrypto.a")
	# For aarch64, setuptools is told what the running Python cannot say: the
	# platform (the wheel's tag), the extension's suffix, and the headers,
	# whose -I (CPPFLAGS) comes before the running Python's own.
	local pyvars=()
	if [ "$arch" = aarch64 ]; then
		pyvars=(_PYTHON_HOST_PLATFORM=linux-aarch64
			SETUPTOOLS_EXT_SUFFIX=".cpython-${pyver/./}-aarch64-linux-gnu.so"
			CPPFLAGS="-I$deps/include/python$pyver")
	fi
	local isolation=()
	# the toolchain venv has setuptools: no download; another Python builds isolated
	[ "$py" = "$venv/bin/python" ] && isolation=(--no-build-isolation)
	local raw=$ab/raw
	rm -rf "$raw"
	echo "build-wheel: libfst, the fst command and the extension for $("$py" -c 'import sys; print(sys.implementation.cache_tag)'), with zig for $target"
	env "${pyvars[@]}" CC="$zig/cc" LDSHARED="$zig/cc -shared -s" FST_BUILD_DIR="$ab" FST_CLI=1 \
		FST_CMAKE_ARGS="$(printf '%q ' "${cmake_args[@]}")" PIP_ROOT_USER_ACTION=ignore \
		"$py" -m pip wheel -q --disable-pip-version-check --no-deps "${isolation[@]}" \
		-w "$raw" "$repo"
	local whl
	whl=$(ls "$raw"/*.whl)

	# Checked and tagged: auditwheel refuses a wheel that needs more than the
	# policy's libraries and symbol versions. It reads ELF files of any
	# architecture, but offers --plat only the running machine's platforms:
	# it is told the machine is the wheel's (the same on x86-64).
	FST_WHEEL_MACHINE=$arch PATH="$venv/bin:$PATH" "$venv/bin/python" -c 'import os, platform, sys
platform.machine = lambda: os.environ["FST_WHEEL_MACHINE"]
sys.argv[0] = "auditwheel"
from auditwheel.main import main
sys.exit(main())' repair -w "$out" --plat "$plat" "$whl" >"$ab/repair.log" 2>&1 ||
		{ cat "$ab/repair.log"; return 1; }
	fixed=$(sed -n 's/.*Fixed-up wheel written to \(.*\.whl\).*/\1/p' "$ab/repair.log" | tail -1)
	[ -f "$fixed" ] || { cat "$ab/repair.log"; return 1; }
	"$venv/bin/auditwheel" show "$fixed"
	echo "build-wheel: $(basename "$fixed"): $(du -k "$fixed" | cut -f1) KiB"
}

fixed=
for arch in "${arches[@]}"; do
	build_one "$arch"
done
echo "$fixed"
