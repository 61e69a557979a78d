"""Integrity: `fst verify --hash` prints each file's SHA-256 (checked with
hashlib) and each tensor's XXH3-128 (checked with the xxhash package over the
file's bytes); `fst verify --manifest` writes them; `fst load --check` passes
on the manifest and fails with exit 3, naming the tensor, when a hash
differs, when the manifest misses a tensor or lists one too many; a file that
is not a manifest is a usage error (exit 1)."""
import hashlib
import json

import pytest

import fsttest

xxhash = pytest.importorskip("xxhash")


def header_tensors(path):
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


@pytest.fixture(scope="module")
def ckpt(gen_dir):
    return gen_dir(shards=2, seed=11, size="2MiB", misaligned=True, tag="-integrity")


def test_verify_hash_matches_hashlib_and_xxhash(ckpt):
    r = fsttest.fst("verify", ckpt, "--hash")
    assert r.returncode == 0, r.stderr
    sha = {}
    xxh = {}
    for line in r.stdout.splitlines():
        parts = line.split(" ")
        if parts[0] == "sha256":
            sha[parts[2]] = parts[1]
        elif parts[0] == "xxh3-128":
            xxh[parts[2]] = parts[1]
    files = sorted(ckpt.glob("*.safetensors"))
    assert set(sha) == {str(f) for f in files}
    n = 0
    for f in files:
        assert sha[str(f)] == hashlib.sha256(f.read_bytes()).hexdigest()
        start, tensors = header_tensors(f)
        data = f.read_bytes()
        for name, info in tensors.items():
            b, e = info["data_offsets"]
            assert xxh[name] == xxhash.xxh3_128_hexdigest(data[start + b:start + e]), name
            n += 1
    assert len(xxh) == n


def test_manifest_then_check(ckpt, tmp_path):
    man = tmp_path / "manifest.json"
    r = fsttest.fst("verify", ckpt, "--manifest", man)
    assert r.returncode == 0, r.stderr
    m = json.loads(man.read_text())
    assert m["format"] == "fst-manifest-1"
    assert set(m["files"]) == {f.name for f in ckpt.glob("*.safetensors")}
    for io in ("pread", "uring", "mmap"):
        r = fsttest.fst("load", ckpt, "--check", man, "--io", io, "--no-progress")
        assert r.returncode == 0, r.stderr
        assert f"checked {len(m['tensors'])} tensors against {man}" in r.stdout

    name = sorted(m["tensors"])[1]
    bad = dict(m, tensors=dict(m["tensors"], **{name: "0" * 32}))
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    r = fsttest.fst("load", ckpt, "--check", tmp_path / "bad.json", "--no-progress")
    assert r.returncode == 3 and f'tensor "{name}"' in r.stderr and "0" * 32 in r.stderr

    fewer = dict(m, tensors={k: v for k, v in m["tensors"].items() if k != name})
    (tmp_path / "fewer.json").write_text(json.dumps(fewer))
    r = fsttest.fst("load", ckpt, "--check", tmp_path / "fewer.json", "--no-progress")
    assert r.returncode == 3 and f'tensor "{name}"' in r.stderr and "does not list it" in r.stderr

    more = dict(m, tensors=dict(m["tensors"], extra_tensor="1" * 32))
    (tmp_path / "more.json").write_text(json.dumps(more))
    r = fsttest.fst("load", ckpt, "--check", tmp_path / "more.json", "--no-progress")
    assert r.returncode == 3 and "extra_tensor" in r.stderr

    (tmp_path / "junk.json").write_text("[1, 2")
    r = fsttest.fst("load", ckpt, "--check", tmp_path / "junk.json", "--no-progress")
    assert r.returncode == 1 and "not a manifest" in r.stderr
