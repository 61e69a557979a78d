"""Tests that run fst inside the engines' own code: vLLM's loader classes and
plugin machinery, transformers' from_pretrained. They need torch, vllm and
transformers, which live in the engines venv that scripts/install-deps.sh
makes (docs/testing.md); tests/engines/run.sh runs them there."""
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def run_ranks():
    """run_ranks(script, world, *args) -> [CompletedProcess] of `world`
    processes of `script` (a path), each given rank, world and args."""

    def run(script, world, *args, timeout=300):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        procs = [subprocess.Popen([sys.executable, script, str(r), str(world), *map(str, args)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for r in range(world)]
        out = []
        for p in procs:
            try:
                o, e = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
            out.append(subprocess.CompletedProcess(p.args, p.returncode, o, e))
        return out

    return run
