"""Integrity: `fst verify --hash` prints each file's SHA-256 (checked with
hashlib) and each tensor's XXH3-128 (checked with the xxhash package over the
file's bytes), the same with every XXH3 kernel; `fst verify --manifest` writes
them and each tensor's block tree (checked with a Python implementation of
the definition in docs/cli.md); `fst load --check` passes on the manifest
with every reader and block size, and fails with exit 3, naming the tensor,
when a digest differs, when the manifest misses a tensor or lists one too
many; manifests without trees are checked on plain digests; a file that is
not a manifest (its digests not digests too) is a usage error (exit 1)."""
import hashlib
import json
import platform

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


@pytest.fixture(scope="module")
def big_ckpt(gen_dir):
    """Tensors of several 256 KiB blocks, at misaligned offsets."""
    return gen_dir(shards=2, seed=12, size="24MiB", misaligned=True, tag="-integrity-big")


def tensor_bytes(ckpt):
    for f in sorted(ckpt.glob("*.safetensors")):
        start, tensors = header_tensors(f)
        data = f.read_bytes()
        for name, info in tensors.items():
            b, e = info["data_offsets"]
            yield name, data[start + b:start + e]


def tree(data, block):
    """The block tree of docs/cli.md, written from its definition."""
    blocks = [xxhash.xxh3_128_digest(data[i:i + block]) for i in range(0, len(data), block)]
    if len(blocks) <= 1:
        return xxhash.xxh3_128_hexdigest(data)
    return xxhash.xxh3_128_hexdigest(b"".join(blocks), seed=len(data))


def check(ckpt, manifest, *args):
    return fsttest.fst("load", ckpt, "--check", manifest, "--no-progress", *args)


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


def kernels():
    """The XXH3 kernels this CPU runs (FST_HASH_KERNEL), generic first."""
    flags = open("/proc/cpuinfo").read().split() if platform.machine() == "x86_64" else []
    return ["generic"] + [k for k, f in (("avx2", "avx2"), ("avx512", "avx512f")) if f in flags]


def test_every_kernel_hashes_alike(big_ckpt):
    outs = {k: fsttest.fst("verify", big_ckpt, "--hash", env={"FST_HASH_KERNEL": k})
            for k in kernels()}
    for k, r in outs.items():
        assert r.returncode == 0, (k, r.stderr)
        assert r.stdout.split("\n", 1)[1] == outs["generic"].stdout.split("\n", 1)[1], k
    want = {name: xxhash.xxh3_128_hexdigest(data) for name, data in tensor_bytes(big_ckpt)}
    got = {p[2]: p[1] for p in (l.split(" ") for l in outs["generic"].stdout.splitlines())
           if p[0] == "xxh3-128"}
    assert got == want
    r = fsttest.fst("verify", big_ckpt, "--hash", env={"FST_HASH_KERNEL": "sse9"})
    assert r.returncode == 1 and "FST_HASH_KERNEL" in r.stderr


def test_manifest_trees_match_the_definition(big_ckpt, tmp_path):
    man = tmp_path / "manifest.json"
    r = fsttest.fst("verify", big_ckpt, "--manifest", man)
    assert r.returncode == 0, r.stderr
    m = json.loads(man.read_text())
    assert m["tree_block"] == 256 << 10
    data = dict(tensor_bytes(big_ckpt))
    assert max(len(d) for d in data.values()) > 1 << 20  # trees of several blocks exist
    assert m["trees"] == {name: tree(d, 256 << 10) for name, d in data.items()}
    assert m["tensors"] == {name: xxhash.xxh3_128_hexdigest(d) for name, d in data.items()}


@pytest.mark.parametrize("block", [4096, 65536, 256 << 10, 1 << 20])
def test_check_every_reader_and_block(big_ckpt, tmp_path, block):
    """Blocks hashed as they land, whole or gathered from the pieces of two
    reads (small chunks and O_DIRECT landing slots split many), or after the
    load (mmap): all agree with the definition."""
    data = dict(tensor_bytes(big_ckpt))
    m = {"format": "fst-manifest-1", "files": {}, "tree_block": block,
         "tensors": {n: xxhash.xxh3_128_hexdigest(d) for n, d in data.items()},
         "trees": {n: tree(d, block) for n, d in data.items()}}
    man = tmp_path / "m.json"
    man.write_text(json.dumps(m))
    for args in fsttest.io_cases(["--io", "pread"], ["--io", "uring"], ["--io", "mmap"],
                                 ["--io", "pread", "--chunk", "12KiB"],
                                 ["--io", "uring", "--chunk", "64KiB"], ["--threads", "1"]):
        r = check(big_ckpt, man, *args)
        assert r.returncode == 0, (args, r.stderr)
        assert f"checked {len(data)} tensors against {man}" in r.stdout
    name = max(data, key=lambda n: len(data[n]))
    bad = dict(m, trees=dict(m["trees"], **{name: "0" * 32}))
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    r = check(big_ckpt, tmp_path / "bad.json", "--io", fsttest.io_cases("uring", "pread")[0])
    assert r.returncode == 3 and f'tensor "{name}"' in r.stderr and "0" * 32 in r.stderr


def test_check_detects_a_changed_byte(big_ckpt, tmp_path):
    """A copy of the checkpoint with one byte changed in the middle of a
    multi-block tensor fails the check against the original's manifest."""
    man = tmp_path / "manifest.json"
    assert fsttest.fst("verify", big_ckpt, "--manifest", man).returncode == 0
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in big_ckpt.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    f = sorted(copy.glob("*.safetensors"))[0]
    start, tensors = header_tensors(f)
    name, info = max(tensors.items(), key=lambda kv: kv[1]["data_offsets"][1] - kv[1]["data_offsets"][0])
    b, e = info["data_offsets"]
    raw = bytearray(f.read_bytes())
    raw[start + (b + e) // 2] ^= 0x20
    f.write_bytes(bytes(raw))
    for io in fsttest.io_cases("pread", "uring", "mmap"):
        r = check(copy, man, "--io", io)
        assert r.returncode == 3, (io, r.stderr)
        assert f'tensor "{name}": XXH3-128 tree' in r.stderr


def test_manifest_then_check(ckpt, tmp_path):
    man = tmp_path / "manifest.json"
    r = fsttest.fst("verify", ckpt, "--manifest", man)
    assert r.returncode == 0, r.stderr
    m = json.loads(man.read_text())
    assert m["format"] == "fst-manifest-1"
    assert set(m["files"]) == {f.name for f in ckpt.glob("*.safetensors")}
    for io in fsttest.io_cases("pread", "uring", "mmap"):
        r = check(ckpt, man, "--io", io)
        assert r.returncode == 0, r.stderr
        assert f"checked {len(m['tensors'])} tensors against {man}" in r.stdout

    # a manifest without trees is checked on the plain digests
    plain = {k: v for k, v in m.items() if k not in ("trees", "tree_block")}
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    assert check(ckpt, tmp_path / "plain.json").returncode == 0
    name = sorted(m["tensors"])[1]
    bad = dict(plain, tensors=dict(m["tensors"], **{name: "0" * 32}))
    (tmp_path / "bad-plain.json").write_text(json.dumps(bad))
    r = check(ckpt, tmp_path / "bad-plain.json")
    assert r.returncode == 3 and f'tensor "{name}"' in r.stderr and "0" * 32 in r.stderr

    bad = dict(m, trees=dict(m["trees"], **{name: "0" * 32}))
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    r = check(ckpt, tmp_path / "bad.json")
    assert r.returncode == 3 and f'tensor "{name}"' in r.stderr and "0" * 32 in r.stderr

    fewer = dict(m, trees={k: v for k, v in m["trees"].items() if k != name})
    (tmp_path / "fewer.json").write_text(json.dumps(fewer))
    r = check(ckpt, tmp_path / "fewer.json")
    assert r.returncode == 3 and f'tensor "{name}"' in r.stderr and "does not list it" in r.stderr

    more = dict(m, trees=dict(m["trees"], extra_tensor="1" * 32))
    (tmp_path / "more.json").write_text(json.dumps(more))
    r = check(ckpt, tmp_path / "more.json")
    assert r.returncode == 3 and "extra_tensor" in r.stderr

    for junk in ("[1, 2", json.dumps(dict(m, tree_block=3000)), json.dumps(dict(m, trees=[]))):
        (tmp_path / "junk.json").write_text(junk)
        r = check(ckpt, tmp_path / "junk.json")
        assert r.returncode == 1 and ("not a manifest" in r.stderr or "tree_block" in r.stderr)

    # a digest that is not one (a number was printed as "(null)", exit 3)
    for what, digests in (("tree digest", dict(m, trees=dict(m["trees"], **{name: 5}))),
                          ("tree digest", dict(m, trees=dict(m["trees"], **{name: "g" * 32}))),
                          ("digest", dict(plain, tensors=dict(m["tensors"], **{name: None})))):
        (tmp_path / "junk.json").write_text(json.dumps(digests))
        r = check(ckpt, tmp_path / "junk.json")
        assert r.returncode == 1, r.stderr
        assert f'tensor "{name}": the {what} is not 32 lower-case hex digits' in r.stderr
        assert "(null)" not in r.stderr


def test_check_onto_a_gpu_double(big_ckpt, tmp_path, cuda_double):
    """Onto a GPU (the libcuda double): blocks are hashed in pinned staging,
    blocks split between two landing slots are gathered, the rest is copied
    back; the check passes, and a wrong tree fails it naming the tensor."""
    data = dict(tensor_bytes(big_ckpt))
    env = {"FST_CUDA_LIBRARY": cuda_double, "FST_GDS": "off"}
    for block in (4096, 256 << 10):
        m = {"format": "fst-manifest-1", "files": {}, "tree_block": block,
             "tensors": {n: xxhash.xxh3_128_hexdigest(d) for n, d in data.items()},
             "trees": {n: tree(d, block) for n, d in data.items()}}
        man = tmp_path / f"m{block}.json"
        man.write_text(json.dumps(m))
        for args in fsttest.io_cases(["--io", "pread"], ["--io", "uring", "--staging", "1MiB"]):
            r = fsttest.fst("load", big_ckpt, "--check", man, "--no-progress", "--device",
                            "cuda:0", *args, env=env)
            assert r.returncode == 0, (block, args, r.stderr)
            assert f"checked {len(data)} tensors" in r.stdout
        name = max(data, key=lambda n: len(data[n]))
        bad = dict(m, trees=dict(m["trees"], **{name: "f" * 32}))
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        r = fsttest.fst("load", big_ckpt, "--check", tmp_path / "bad.json", "--no-progress",
                        "--device", "cuda:0", env=env)
        assert r.returncode == 3 and f'tensor "{name}"' in r.stderr
