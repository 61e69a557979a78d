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
