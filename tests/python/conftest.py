"""pytest configuration for the oracle tests of fst.

The oracle is the reference `safetensors` package (with numpy; torch is not
needed). The fst command comes from $FST_BIN (ctest sets it), else
<repo>/build/fst; libfst.so from $FST_LIB, else next to the command. When the
command is missing every test is skipped with the reason.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fsttest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _require_fst_bin():
    if not fsttest.fst_bin_ok():
        pytest.skip(
            f"fst command not found or not executable at {fsttest.FST_BIN} "
            "(build it with `make`, or set FST_BIN to its path)"
        )


@pytest.fixture(autouse=True)
def _skip_uring_cases(request):
    """A case parametrized with io="uring" skips where io_uring cannot load
    (fsttest.uring_unavailable); loops over readers use fsttest.io_cases."""
    spec = getattr(request.node, "callspec", None)
    if spec is not None and spec.params.get("io") == "uring" and fsttest.uring_unavailable():
        pytest.skip(f"io_uring unavailable: {fsttest.uring_unavailable()}")


def pytest_terminal_summary(terminalreporter):
    why = fsttest.uring_unavailable()
    if why:
        terminalreporter.write_line(f"io_uring unavailable ({why}): uring cases left out")


@pytest.fixture(scope="session")
def gen_dir(tmp_path_factory):
    """gen_dir(shards=..., seed=..., size=..., misaligned=...) -> Path of a
    checkpoint written by `fst gen`; each distinct set of options is written
    once per session."""
    cache = {}

    def make(shards=3, seed=0, size="4MiB", misaligned=False, tag=""):
        key = (shards, seed, size, misaligned, tag)
        if key not in cache:
            name = f"gen-s{shards}-seed{seed}-{size}{'-mis' if misaligned else ''}{tag}"
            out = tmp_path_factory.mktemp(name)
            args = ["gen", str(out), "--size", size, "--shards", str(shards), "--seed", str(seed)]
            if misaligned:
                args.append("--misaligned")
            r = fsttest.fst(*args)
            assert r.returncode == 0, f"fst {' '.join(args)} failed ({r.returncode}): {r.stderr}"
            cache[key] = out
        return cache[key]

    return make


# ---------------------------------------------------------------- fst package

@pytest.fixture(scope="session")
def fst_pkg():
    """The installed `fst` Python package (`make python`), or a skip saying
    how to get it."""
    try:
        import fst as pkg
    except ImportError as e:
        pytest.skip(f"the fst Python package is not installed ({e}); run `make python`")
    return pkg


@pytest.fixture(scope="session")
def cuda_double():
    """Path of the libcuda test double (tests/doubles/cuda_double.c), built
    next to the fst command: $FST_CUDA_DOUBLE, else <FST_BIN dir>/tests/."""
    p = os.environ.get("FST_CUDA_DOUBLE") or str(fsttest.FST_BIN.parent / "tests" /
                                                 "libfst_cuda_double.so")
    if not os.path.isfile(p):
        pytest.skip(f"CUDA test double not built at {p} (cmake --build the tree of FST_BIN)")
    return p


@pytest.fixture(scope="session")
def run_python():
    """run_python(code, env={...}, timeout=60) -> CompletedProcess: `code` in a
    fresh interpreter (for what is decided once per process, such as which
    libcuda is loaded, or for code that may crash). FST_CUDA_LIBRARY,
    FST_FAULT and FST_LOG are cleared unless env sets them."""
    import subprocess
    import textwrap

    def run(code, env=None, timeout=60):
        full = dict(os.environ)
        for k in ("FST_CUDA_LIBRARY", "FST_FAULT", "FST_LOG"):
            full.pop(k, None)
        full.update(env or {})
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                              text=True, env=full, timeout=timeout)

    return run
