#!/usr/bin/env bash
# make wheel: fst-loader's binary wheel for x86-64 Linux, tagged
# manylinux_2_28, that needs nothing at install time (docs/design.md,
# "Distribution"). Everything is compiled by zig (the ziglang package, in the
# venv scripts/install-deps.sh makes) for glibc 2.28 through the project's own
# CMake build: libfst (FST_SOURCES), the fst command, and the extension
# (setup.py, CC and LDSHARED the zig wrappers below). jansson and liburing are
# built from their Debian sources (downloaded by scripts/install-deps.sh) as
# position-independent archives; OpenSSL's libcrypto.a and xxhash.h are the
# system's (libssl-dev, libxxhash-dev). auditwheel checks and tags the wheel.
#
# Usage: scripts/build-wheel.sh [OUT_DIR]   (default dist/; the wheel's path
# is the last line printed). PYTHON: the interpreter the extension is for
# (default the toolchain venv's, the version of python3). FST_WHEEL_BUILD:
# the build folder (default build-wheel/). Exit 77 when the toolchain is not
# installed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "${1:-$repo/dist}"
out=$(cd "${1:-$repo/dist}" && pwd)
wb=${FST_WHEEL_BUILD:-$repo/build-wheel}
venv=${FST_WHEEL_VENV:-/opt/fst-wheel}
target=x86_64-linux-gnu.2.28
plat=manylinux_2_28_x86_64
multiarch=x86_64-linux-gnu

if [ "$(uname -m)" != x86_64 ]; then
	echo "build-wheel: the wheel is built on x86-64 (it links the system's x86-64 libcrypto.a)" >&2
	exit 77
fi
dscs=("$wb"/deb-src/jansson_*.dsc "$wb"/deb-src/liburing_*.dsc)
if [ ! -f "$venv/.fst-wheel" ] || [ ! -f "${dscs[0]}" ] || [ ! -f "${dscs[1]}" ]; then
	echo "build-wheel: the wheel toolchain ($venv) or the Debian sources ($wb/deb-src) are" \
		"missing: scripts/install-deps.sh installs them" >&2
	exit 77
fi
mkdir -p "$wb"
wb=$(cd "$wb" && pwd)
export ZIG_GLOBAL_CACHE_DIR="$wb/zig-cache" ZIG_LOCAL_CACHE_DIR="$wb/zig-cache"

# The compiler, archiver and indexer CMake, configure scripts and setuptools
# are given: zig through the ziglang package, for glibc 2.28.
zig=$wb/zig
mkdir -p "$zig"
printf '#!/bin/sh\nexec %q -m ziglang cc -target %s "$@"\n' "$venv/bin/python" "$target" >"$zig/cc"
printf '#!/bin/sh\nexec %q -m ziglang ar "$@"\n' "$venv/bin/python" >"$zig/ar"
printf '#!/bin/sh\nexec %q -m ziglang ranlib "$@"\n' "$venv/bin/python" >"$zig/ranlib"
chmod +x "$zig/cc" "$zig/ar" "$zig/ranlib"

# The dependencies, into $deps (include/, lib/), once per source version.
deps=$wb/deps
recipe="1 $target $(basename -a "${dscs[@]}" | tr '\n' ' ')$(stat -c %s /usr/lib/$multiarch/libcrypto.a)"
if [ "$(cat "$deps/.stamp" 2>/dev/null)" != "$recipe" ]; then
	echo "build-wheel: building jansson and liburing from Debian's sources with zig"
	rm -rf "$deps" "$wb/src"
	mkdir -p "$deps/include" "$deps/lib" "$wb/src"
	dpkg-source -q -x "${dscs[0]}" "$wb/src/jansson" >/dev/null 2>&1
	dpkg-source -q -x "${dscs[1]}" "$wb/src/liburing" >/dev/null 2>&1
	cmake -S "$wb/src/jansson" -B "$wb/src/jansson-build" -G Ninja -Wno-dev \
		-DCMAKE_C_COMPILER="$zig/cc" -DCMAKE_AR="$zig/ar" -DCMAKE_RANLIB="$zig/ranlib" \
		-DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
		-DJANSSON_BUILD_SHARED_LIBS=OFF -DJANSSON_BUILD_DOCS=OFF -DJANSSON_EXAMPLES=OFF \
		-DJANSSON_WITHOUT_TESTS=ON -DCMAKE_INSTALL_PREFIX="$deps" >"$wb/src/jansson.log" 2>&1 ||
		{ cat "$wb/src/jansson.log"; exit 1; }
	cmake --build "$wb/src/jansson-build" >>"$wb/src/jansson.log" 2>&1 || { cat "$wb/src/jansson.log"; exit 1; }
	cmake --install "$wb/src/jansson-build" >>"$wb/src/jansson.log" 2>&1
	(cd "$wb/src/liburing" && ./configure --cc="$zig/cc" >"$wb/src/liburing.log" 2>&1 &&
		make -C src CC="$zig/cc" AR="$zig/ar" RANLIB="$zig/ranlib" CFLAGS="-O2 -fPIC" \
			liburing.a >>"$wb/src/liburing.log" 2>&1) || { cat "$wb/src/liburing.log"; exit 1; }
	for h in liburing.h liburing/io_uring.h liburing/compat.h liburing/barrier.h; do
		install -D -m 644 "$wb/src/liburing/src/include/$h" "$deps/include/$h"
	done
	install -m 644 "$wb/src/liburing/src/liburing.a" "$deps/lib/"
	# The fst command's: libcrypto.a as Debian builds it (it links against
	# glibc 2.28's symbols as it is), its headers and xxhash.h.
	install -m 644 /usr/lib/$multiarch/libcrypto.a /usr/include/xxhash.h -t "$deps/lib/"
	mv "$deps/lib/xxhash.h" "$deps/include/"
	cp -r /usr/include/openssl "$deps/include/"
	cp /usr/include/$multiarch/openssl/*.h "$deps/include/openssl/"
	echo "$recipe" >"$deps/.stamp"
fi

# libfst, the fst command and the extension: setup.py over CMake, all zig's.
cmake_args=(-DCMAKE_C_COMPILER="$zig/cc" -DCMAKE_AR="$zig/ar" -DCMAKE_RANLIB="$zig/ranlib"
	-DCMAKE_EXE_LINKER_FLAGS=-s
	-DJANSSON_INCLUDE="$deps/include" -DURING_INCLUDE="$deps/include"
	-DXXHASH_INCLUDE="$deps/include"
	-DJANSSON_STATIC="$deps/lib/libjansson.a" -DJANSSON_SHARED="$deps/lib/libjansson.a"
	-DURING_STATIC="$deps/lib/liburing.a" -DCRYPTO_STATIC="$deps/lib/libcrypto.a")
py=${PYTHON:-$venv/bin/python}
isolation=()
# the toolchain venv has setuptools: no download; another Python builds isolated
[ "$py" = "$venv/bin/python" ] && isolation=(--no-build-isolation)
raw=$wb/raw
rm -rf "$raw"
echo "build-wheel: libfst, the fst command and the extension for $("$py" -c 'import sys; print(sys.implementation.cache_tag)'), with zig for $target"
CC="$zig/cc" LDSHARED="$zig/cc -shared -s" FST_BUILD_DIR="$wb" FST_CLI=1 \
	FST_CMAKE_ARGS="$(printf '%q ' "${cmake_args[@]}")" PIP_ROOT_USER_ACTION=ignore \
	"$py" -m pip wheel -q --disable-pip-version-check --no-deps "${isolation[@]}" \
	-w "$raw" "$repo"
whl=$(ls "$raw"/*.whl)

# Checked and tagged: auditwheel refuses a wheel that needs more than the
# policy's libraries and symbol versions.
PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w "$out" --plat "$plat" "$whl" >"$wb/repair.log" 2>&1 ||
	{ cat "$wb/repair.log"; exit 1; }
fixed=$(sed -n 's/.*Fixed-up wheel written to \(.*\.whl\).*/\1/p' "$wb/repair.log" | tail -1)
[ -f "$fixed" ] || { cat "$wb/repair.log"; exit 1; }
"$venv/bin/auditwheel" show "$fixed"
echo "build-wheel: $(du -k "$fixed" | cut -f1) KiB"
echo "$fixed"
