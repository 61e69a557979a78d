# Thin wrapper over CMake; CMake and ctest are the truth.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps test demo fuzz sanitize tsan clean python test-gpu test-engines test-aarch64 \
	wheel sdist test-wheel

all: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

deps:
	@bash scripts/install-deps.sh

# Every test suite: unit tests, Python tests, the unit tests under
# ASan+UBSan and the concurrent ones under TSan, and a short libFuzzer run
# (10 s a target; `make fuzz` runs longer).
test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory python
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory sanitize
	@$(MAKE) --no-print-directory tsan
	@$(MAKE) --no-print-directory fuzz FUZZ_TIME=10
	@$(MAKE) --no-print-directory test-aarch64

# Every test but the Python tiers (labels python, engines, wheel: an uninstrumented
# python3 cannot load instrumented code) built with AddressSanitizer and
# UndefinedBehaviorSanitizer.
sanitize: deps
	cmake -S . -B $(BUILD)-asan -G Ninja -DFST_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ctest --output-on-failure -j $(JOBS) -LE '^(python|engines|wheel)$$'

# The concurrent tests (label concurrent) built with ThreadSanitizer, then
# tests/tsan_check.sh; tests/tsan.supp says what is suppressed and why.
tsan: deps
	cmake -S . -B $(BUILD)-tsan -G Ninja -DFST_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug
	cmake --build $(BUILD)-tsan -j $(JOBS)
	cd $(BUILD)-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $${TSAN_OPTIONS:-}" \
		ctest --output-on-failure -j $(JOBS) -L '^concurrent$$'
	TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $${TSAN_OPTIONS:-}" \
		bash tests/tsan_check.sh $(BUILD)-tsan

# The Python package: pip install . builds libfst with CMake (build/python-lib,
# its fst_static target), the extension over it and the fst command
# (setup.py). The distribution was called fst before it was fst-loader: an
# installed copy under the old name (ours: its summary says so) goes first.
python: deps
	@python3 -m pip show fst 2>/dev/null | grep -q '^Summary: Load safetensors checkpoints' && \
		PIP_ROOT_USER_ACTION=ignore python3 -m pip uninstall -q -y fst || true
	PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check .
	@python3 -c "import fst; print('fst', fst.__version__, 'Python package installed')"

demo: deps
	@$(MAKE) --no-print-directory all
	@bash scripts/demo.sh $(BUILD)

# libFuzzer targets (clang); FUZZ_TIME seconds on each (default 30).
fuzz: deps
	cmake -S . -B $(BUILD)-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DFST_FUZZ=ON -DFST_TESTS=OFF
	cmake --build $(BUILD)-fuzz -j $(JOBS)
	bash tests/fuzz/run.sh $(BUILD)-fuzz $(or $(FUZZ_TIME),30)

# The GPU suite: needs a GPU with its driver (skips, exit 77, elsewhere).
test-gpu: deps
	@$(MAKE) --no-print-directory all
	cd $(BUILD) && ctest --output-on-failure -L '^gpu$$'

# libfst, the CLI and the C tests cross-built for aarch64 Linux
# (cmake/aarch64-linux-gnu.cmake), the unit tests, the module check and the
# fuzz corpora run under qemu-user, and the wheel tier on the aarch64 wheel:
# the Python suite in an aarch64 Python under qemu-user; docs/testing.md says
# what skips there. FST_AARCH64=0 (which also skips installing the cross
# toolchain and the aarch64 Python) skips it.
test-aarch64: deps
	@if [ "$${FST_AARCH64:-1}" = 0 ]; then echo "test-aarch64: skipped (FST_AARCH64=0)"; else \
	set -ex; \
	cmake -S . -B $(BUILD)-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/aarch64-linux-gnu.cmake; \
	cmake --build $(BUILD)-aarch64 -j $(JOBS); \
	cd $(BUILD)-aarch64 && ctest --output-on-failure -j $(JOBS) -L '^(unit|fuzz|wheel)$$'; fi

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz $(BUILD)-tsan $(BUILD)-aarch64 build-wheel

# The engines tier alone (vLLM's and transformers' own classes; needs the
# venv scripts/install-deps.sh makes).
test-engines: deps
	@$(MAKE) --no-print-directory all
	bash tests/engines/run.sh $(BUILD)

# The binary wheels, into dist/: fst-loader for x86-64 and aarch64 Linux,
# manylinux_2_28, libfst, the extension and the fst command compiled by zig
# for glibc 2.28, jansson and liburing from Debian's sources
# (scripts/build-wheel.sh; docs/design.md, "Distribution"). WHEEL_ARCH=x86_64
# or aarch64 builds one (default all). WHEEL_PYTHON=python3.12 builds them
# for another Python (the default: python3's version; aarch64 needs Debian's
# libpython3.X-dev:arm64 of that version).
WHEEL_ARCH ?= all
wheel: deps
	@$(if $(WHEEL_PYTHON),PYTHON=$(WHEEL_PYTHON)) WHEEL_ARCH=$(WHEEL_ARCH) bash scripts/build-wheel.sh dist

# The source distribution, into dist/ (it builds with the system's compiler,
# as `pip install .` does).
sdist: deps
	$${FST_WHEEL_VENV:-/opt/fst-wheel}/bin/python -m build --sdist --no-isolation --outdir dist .

# The wheel tier alone: make wheel's build, installed into a fresh venv with
# no compiler and no -dev headers, and the Python tests against it.
test-wheel: deps
	@$(MAKE) --no-print-directory all
	cd $(BUILD) && ctest --output-on-failure -L '^wheel$$'
