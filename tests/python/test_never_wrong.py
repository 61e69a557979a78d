"""Never silently wrong: partial checkpoints, files overwritten in place with
their modification time restored, and interrupted `fst gen` runs, seen from
the command line and the Python package."""
import os
import shutil
import signal
import subprocess
import time

import pytest

import fsttest


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def overwrite_keep_mtime(path, offset, n):
    """Write other bytes at [offset, offset + n) and put atime/mtime back."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xA5 for b in old))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


# ---------------------------------------------------------- partial checkpoints


def test_partial_directory_is_invalid(gen_dir, tmp_path):
    ck = _copy(gen_dir(shards=4), tmp_path / "ck")
    (ck / "model.safetensors.index.json").unlink()
    (ck / "model-00003-of-00004.safetensors").unlink()
    (ck / "model-00004-of-00004.safetensors").unlink()
    for cmd in ("load", "inspect", "verify"):
        r = fsttest.fst(cmd, str(ck))
        assert r.returncode == 2, (cmd, r.returncode, r.stderr)
        assert "model-00003-of-00004.safetensors" in r.stderr
        assert "model-00004-of-00004.safetensors" in r.stderr
        assert "incomplete checkpoint" in r.stderr


def test_empty_weight_map_is_invalid(gen_dir, tmp_path):
    ck = _copy(gen_dir(shards=2), tmp_path / "ck")
    (ck / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    r = fsttest.fst("inspect", str(ck))
    assert r.returncode == 2
    assert '"weight_map" is empty' in r.stderr
    assert r.stdout == ""


def test_shard_outside_index_is_reported(gen_dir, tmp_path):
    ck = _copy(gen_dir(shards=2), tmp_path / "ck")
    shutil.copy(ck / "model-00001-of-00002.safetensors", ck / "stray.safetensors")
    r = fsttest.fst("load", str(ck))
    assert r.returncode == 0, r.stderr
    assert "stray.safetensors" in r.stderr and "not in the index" in r.stderr


def test_partial_directory_python(fst_pkg, gen_dir, tmp_path):
    ck = _copy(gen_dir(shards=3), tmp_path / "ck")
    (ck / "model.safetensors.index.json").unlink()
    (ck / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(fst_pkg.FormatError, match="model-00002-of-00003.safetensors"):
        fst_pkg.load(ck, framework="numpy")


# ---------------------------------------------------------- in-place overwrites


def _data_offset(path):
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_overwrite_mtime_restored_cli(gen_dir, tmp_path, run_python):
    """The CLI loads through the library: an overwrite before the load is
    exit 8 on every read path, naming the file and what moved."""
    ck = _copy(gen_dir(shards=2), tmp_path / "ck")
    shard = ck / "model-00002-of-00002.safetensors"
    for io in ("pread", "uring", "mmap"):
        # a checkpoint opened, then overwritten, then loaded: in one process
        code = f"""
import os, sys, fst
c = fst.Checkpoint({str(ck)!r})
st = os.stat({str(shard)!r})
with open({str(shard)!r}, "r+b") as f:
    f.seek({_data_offset(shard)})
    b = f.read(64); f.seek({_data_offset(shard)}); f.write(bytes(x ^ 1 for x in b))
os.utime({str(shard)!r}, ns=(st.st_atime_ns, st.st_mtime_ns))
try:
    fst.load(c, framework="numpy", io={io!r})
except fst.FileChangedError as e:
    print("changed:", e); sys.exit(0)
print("loaded"); sys.exit(1)
"""
        r = run_python(code)
        assert r.returncode == 0, (io, r.stdout, r.stderr)
        assert "status change time" in r.stdout and str(shard) in r.stdout
        shutil.rmtree(ck)
        ck = _copy(gen_dir(shards=2), tmp_path / "ck")


def test_iter_tensors_stops_at_change(fst_pkg, gen_dir, tmp_path):
    """A consumer that stops early learns of the change at its next tensor:
    nothing is handed out from a file known to have changed."""
    ck = _copy(gen_dir(shards=1, size="8MiB"), tmp_path / "ck")
    shard = ck / "model-00001-of-00001.safetensors"
    ref = fst_pkg.load(ck, framework="numpy")
    it = fst_pkg.iter_tensors(ck, framework="numpy", threads=1)
    name, first = next(it)
    assert first.tobytes() == ref[name].tobytes()
    overwrite_keep_mtime(shard, os.path.getsize(shard) - 32, 32)
    with pytest.raises(fst_pkg.FileChangedError, match="status change time"):
        for name, t in it:
            # whatever still comes before the check is the opened file's
            assert t.tobytes() == ref[name].tobytes()
            pytest.fail(f"{name} handed out after the file changed")


# ---------------------------------------------------------- fst gen, atomically


def test_gen_interrupted_leaves_nothing(tmp_path):
    out = tmp_path / "ck"
    p = subprocess.Popen([str(fsttest.FST_BIN), "gen", str(out), "--size", "3GiB",
                          "--shards", "6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # interrupt once the first shard is being written
    deadline = time.time() + 60
    while time.time() < deadline:
        staged = [p for p in out.glob(".fst-gen-*/*")] if out.exists() else []
        if staged:
            break
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 9, err
    assert b"interrupted" in err
    # the run made OUTDIR: it is gone again, as it was
    assert not out.exists(), os.listdir(out)
    # an OUTDIR that was there stays, with nothing in it
    out.mkdir()
    p = subprocess.Popen([str(fsttest.FST_BIN), "gen", str(out), "--size", "3GiB",
                          "--shards", "6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not list(out.glob(".fst-gen-*/*")):
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 9 and b"interrupted" in err, err
    assert sorted(os.listdir(out)) == [], os.listdir(out)


def test_gen_replaces_a_checkpoint_whole(tmp_path):
    out = tmp_path / "ck"
    assert fsttest.fst("gen", str(out), "--size", "4MiB", "--shards", "3").returncode == 0
    first = sorted(os.listdir(out))
    assert first == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                     "model-00003-of-00003.safetensors", "model.safetensors.index.json"]
    r = fsttest.fst("gen", str(out), "--size", "4MiB", "--shards", "3", "--seed", "7")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == first  # no temporary left behind
    assert fsttest.fst("verify", str(out)).returncode == 0
