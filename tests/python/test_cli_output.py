"""The CLI never reports success for output it lost, and never drops an
entry from its JSON: writes to a full disk (/dev/full) and to a pipe whose
reader left (SIGPIPE ignored) are exit 4 with the reason; manifests are
written whole or not at all; paths that are not UTF-8 are escaped in every
--json output (docs/cli.md, "Checked output"). Also the messages and exit
codes the issue "Never silently wrong" lists: the file of a --check
mismatch, a manifest that cannot be read, bench's option checks before any
measurement, cold rows when the page cache cannot be evicted, the progress
bar's leftovers, injected faults named as such, and a file changed during
verify's comparison."""
import json
import os
import shlex
import shutil
import subprocess

import pytest

import fsttest
from fsttest import fst

DEV_FULL = "/dev/full"


@pytest.fixture(scope="module")
def small(gen_dir):
    return gen_dir(shards=2, seed=21, size="1MiB", tag="-output")


def run_shell(script, timeout=120):
    """bash -c script with FST=the command; stdout and stderr captured."""
    env = dict(os.environ)
    env.pop("FST_FAULT", None)
    env.pop("FST_LOG", None)
    env["FST"] = str(fsttest.FST_BIN)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                          timeout=timeout)


def to_dev_full(*args, env=None):
    """Run fst with stdout on /dev/full (every write: ENOSPC)."""
    if not os.path.exists(DEV_FULL):
        pytest.skip("no /dev/full")
    full_env = dict(os.environ)
    full_env.pop("FST_FAULT", None)
    full_env.update(env or {})
    with open(DEV_FULL, "w") as out:
        return subprocess.run([str(fsttest.FST_BIN), *map(str, args)], stdout=out,
                              stderr=subprocess.PIPE, text=True, env=full_env, timeout=120)


# ------------------------------------------------------------- A. lost output

def output_commands(small, tmp_path):
    man = tmp_path / "m.json"
    assert fst("verify", small, "--manifest", man).returncode == 0
    return [
        ("inspect", ["inspect", small]),
        ("inspect", ["inspect", "--json", small]),
        ("load", ["load", small, "--no-progress"]),
        ("load", ["load", small, "--json"]),
        ("load", ["load", small, "--check", man, "--no-progress"]),
        ("verify", ["verify", small]),
        ("verify", ["verify", small, "--hash"]),
        ("bench", ["bench", small, "--runs", "1", "--no-cold", "--no-reference"]),
        ("bench", ["bench", small, "--runs", "1", "--no-cold", "--no-reference", "--json"]),
        ("doctor", ["doctor", "--no-copy-test"]),
        ("doctor", ["doctor", "--no-copy-test", "--json"]),
        ("gen", ["gen", tmp_path / "g", "--size", "64K", "--shards", "1"]),
        ("help", ["--help"]),
        ("version", ["--version"]),
    ]


def test_full_disk_is_exit_4(small, tmp_path):
    for cmd, args in output_commands(small, tmp_path):
        r = to_dev_full(*args)
        assert r.returncode == 4, (args, r.returncode, r.stderr)
        assert f"fst {cmd}: writing standard output: No space left on device" in r.stderr, \
            (args, r.stderr)


def test_output_error_keeps_an_earlier_failure(small, tmp_path):
    """A failing input (exit 2) stays exit 2 when stdout is lost too; both
    are reported."""
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      x")
    r = to_dev_full("inspect", "--json", small, bad)
    assert r.returncode == 2, r.stderr
    assert "writing standard output: No space left on device" in r.stderr
    assert str(bad) in r.stderr


def to_closed_pipe(*args):
    """Run fst with stdout on a pipe whose read end is already closed, and
    SIGPIPE ignored (inherited: restore_signals=False keeps Python's
    SIG_IGN), so every write fails with EPIPE."""
    r_end, w_end = os.pipe()
    os.close(r_end)
    env = dict(os.environ)
    env.pop("FST_FAULT", None)
    try:
        return subprocess.run([str(fsttest.FST_BIN), *map(str, args)], stdout=w_end,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=120,
                              restore_signals=False)
    finally:
        os.close(w_end)


def test_closed_pipe_with_sigpipe_ignored_is_exit_4(small, tmp_path):
    for cmd, args in output_commands(small, tmp_path):
        r = to_closed_pipe(*args)
        assert r.returncode == 4, (args, r.returncode, r.stderr)
        assert f"fst {cmd}: writing standard output: Broken pipe" in r.stderr, (args, r.stderr)


def test_head_leaves_early(small):
    """`fst inspect ... | head -c 10` with SIGPIPE ignored: the listing
    (about 12 KiB a copy, 20 copies) outgrows the pipe, so fst is still
    writing when head has left."""
    paths = " ".join([shlex.quote(str(small))] * 20)
    r = run_shell(f'set -o pipefail; bash -c \'trap "" PIPE; exec "$FST" inspect {paths}\' '
                  f'| head -c 10 >/dev/null; echo "rc=$?"')
    assert "rc=4" in r.stdout, (r.stdout, r.stderr)
    assert "fst inspect: writing standard output: Broken pipe" in r.stderr


def test_sigpipe_default_still_kills(small):
    """With the default disposition fst dies of SIGPIPE, as every Unix
    filter does: the check above is for callers that ignore it."""
    paths = " ".join([shlex.quote(str(small))] * 20)
    r = run_shell(f'set -o pipefail; "$FST" inspect {paths} | head -c 10 >/dev/null; '
                  f'echo "rc=$?"')
    assert "rc=141" in r.stdout, (r.stdout, r.stderr)


def test_manifest_to_dev_full(small):
    """A manifest that is not a regular file is written in place (renaming
    over /dev/full would replace the device): ENOSPC is exit 4."""
    if not os.path.exists(DEV_FULL):
        pytest.skip("no /dev/full")
    r = fst("verify", small, "--manifest", DEV_FULL)
    assert r.returncode == 4, r.stderr
    assert f"{DEV_FULL}: cannot write the manifest: No space left on device" in r.stderr
    assert os.path.exists(DEV_FULL) and not os.path.isfile(DEV_FULL)


def test_failed_manifest_leaves_the_old_one(small, tmp_path):
    """A write that fails midway (the file size limit: EFBIG, SIGXFSZ
    ignored) leaves the earlier manifest whole and no temporary file."""
    man = tmp_path / "m.json"
    man.write_text('{"old": true}\n')
    os.chmod(man, 0o640)
    r = run_shell(f'trap "" XFSZ; ulimit -f 4; exec "$FST" verify {shlex.quote(str(small))} '
                  f'--manifest {shlex.quote(str(man))}')
    assert r.returncode == 4, r.stderr
    assert f"{man}: cannot write the manifest: File too large" in r.stderr
    assert man.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]
    # the same without the limit replaces it, keeping its mode
    r = fst("verify", small, "--manifest", man)
    assert r.returncode == 0, r.stderr
    assert json.loads(man.read_text())["format"] == "fst-manifest-1"
    assert os.stat(man).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_manifest_of_the_longest_file_name(small, tmp_path):
    """A manifest name of NAME_MAX bytes: the temporary beside it (11 bytes
    longer once) is cut to fit, and none is left."""
    man = tmp_path / ("m" * 250 + ".json")
    r = fst("verify", small, "--manifest", man)
    assert r.returncode == 0, r.stderr
    assert json.loads(man.read_text())["format"] == "fst-manifest-1"
    assert [p.name for p in tmp_path.iterdir()] == [man.name]


def test_manifest_through_a_symlink(small, tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    r = fst("verify", small, "--manifest", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink()
    assert json.loads(real.read_text())["format"] == "fst-manifest-1"


def test_manifest_through_a_dangling_symlink(small, tmp_path):
    """A link to no file yet: the file it names is made, the link stays."""
    link = tmp_path / "link.json"
    link.symlink_to("target.json")  # relative: beside the link
    r = fst("verify", small, "--manifest", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink()
    assert json.loads((tmp_path / "target.json").read_text())["format"] == "fst-manifest-1"


def test_manifest_into_this_stdout(small, tmp_path):
    """--manifest /dev/stdout with stdout a file: the manifest and the text
    both land in it, in order (a rename had sent the text into a deleted
    file)."""
    out = tmp_path / "out.txt"
    r = run_shell(f'exec "$FST" verify {shlex.quote(str(small))} --manifest /dev/stdout '
                  f'>{shlex.quote(str(out))}')
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    at = text.index("{\n")  # the text lines, then the manifest
    assert text.startswith("verified ") and "byte-identical" in text[:at], text[:500]
    manifest, end = json.JSONDecoder().raw_decode(text[at:])
    assert manifest["format"] == "fst-manifest-1" and not text[at + end:].strip(), text[-300:]


def test_new_manifest_mode_follows_umask(small, tmp_path):
    man = tmp_path / "new.json"
    r = run_shell(f'umask 027; exec "$FST" verify {shlex.quote(str(small))} '
                  f'--manifest {shlex.quote(str(man))} >/dev/null')
    assert r.returncode == 0, r.stderr
    assert os.stat(man).st_mode & 0o777 == 0o640


# ------------------------------------------------------- B. JSON drops nothing

def fst_bytes(*args, env=None, timeout=120):
    """Run fst with arguments that may be bytes (paths that are not UTF-8);
    stdout and stderr are bytes."""
    full_env = dict(os.environ)
    full_env.pop("FST_FAULT", None)
    full_env.update(env or {})
    argv = [os.fsencode(str(fsttest.FST_BIN))] + [a if isinstance(a, bytes) else os.fsencode(str(a))
                                                  for a in args]
    return subprocess.run(argv, capture_output=True, env=full_env, timeout=timeout)


@pytest.fixture
def odd_name(small, tmp_path):
    """A copy of a shard under a name with the byte 0xff (not UTF-8), in a
    directory of its own; returns (file, directory) as bytes."""
    d = os.path.join(os.fsencode(str(tmp_path)), b"d\xfe")
    os.mkdir(d)
    f = os.path.join(d, b"x\xff.safetensors")
    shard = sorted(small.glob("*.safetensors"))[0]
    with open(f, "wb") as out:
        out.write(shard.read_bytes())
    return f, d


def assert_path(obj, raw, key="path"):
    """obj[key] is raw with each invalid byte as U+FFFD, and obj[key +
    '_bytes'] gives raw back exactly."""
    assert obj[key] == raw.decode("utf-8", errors="replace"), obj
    assert bytes.fromhex(obj[key + "_bytes"]) == raw, obj


def test_inspect_json_keeps_a_file_whose_path_is_not_utf8(odd_name):
    f, d = odd_name
    for arg in (f, d):
        r = fst_bytes("inspect", "--json", arg)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert len(doc) == 1, doc
        assert doc[0]["ok"] is True and len(doc[0]["tensors"]) > 0
        assert_path(doc[0], f)
    # a UTF-8 path has no path_bytes
    r = fst_bytes("inspect", "--json", os.path.dirname(d))
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc[0]["ok"] is False  # the directory holds no shard itself


def test_inspect_json_keeps_a_failed_input_whose_path_is_not_utf8(tmp_path):
    missing = os.path.join(os.fsencode(str(tmp_path)), b"gone\xff.safetensors")
    r = fst_bytes("inspect", "--json", missing)
    assert r.returncode == 4, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc) == 1 and doc[0]["ok"] is False, doc
    assert_path(doc[0], missing)
    assert doc[0]["error"].endswith("cannot open: No such file or directory")
    assert "\ufffd" in doc[0]["error"]


def test_utf8_paths_have_no_bytes_field(small):
    doc = json.loads(fst("inspect", "--json", small).stdout)
    assert all("path_bytes" not in e for e in doc)
    doc = json.loads(fst("load", "--json", small).stdout)
    assert "path_bytes" not in doc


def test_load_bench_doctor_json_keep_the_path(odd_name):
    f, d = odd_name
    r = fst_bytes("load", "--json", f)
    assert r.returncode == 0, r.stderr
    assert_path(json.loads(r.stdout), f)
    r = fst_bytes("bench", f, "--json", "--runs", "1", "--no-cold", "--no-reference")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert_path(doc, f)
    assert len(doc["rows"]) >= 4
    r = fst_bytes("doctor", d, "--json", "--no-copy-test", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert_path(json.loads(r.stdout)["load"], d)


def test_bench_json_keeps_a_row_whose_note_is_not_utf8(odd_name):
    """A failed load's message names the file: the row stays, escaped."""
    f, _ = odd_name
    r = fst_bytes("bench", f, "--json", "--runs", "1", "--no-cold", "--no-reference",
                  "--io", "pread", env={"FST_FAULT": "read:3"})
    assert r.returncode == 4, r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)["rows"]}
    note = rows["fst load (warm)"]["notes"]
    assert note.startswith("failed: ") and "x\ufffd.safetensors: " in note, note


def test_manifest_refuses_a_file_name_that_is_not_utf8(odd_name):
    f, d = odd_name
    man = os.path.join(d, b"m.json")
    r = fst_bytes("verify", d, "--manifest", man)
    assert r.returncode == 7, r.stderr
    assert b"is not UTF-8" in r.stderr and f in r.stderr
    assert not os.path.exists(man)


def test_manifest_refuses_two_files_of_one_name(small, tmp_path):
    """An index may keep shards in subdirectories; two of one name would be
    one manifest key."""
    shards = sorted(small.glob("*.safetensors"))
    weight_map = {}
    for sub, shard in zip(("a", "b"), shards):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "model.safetensors").write_bytes(shard.read_bytes())
        for name in fsttest.Header(shard).tensors:
            weight_map[name] = f"{sub}/model.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert fst("inspect", tmp_path).returncode == 0
    r = fst("verify", tmp_path, "--manifest", tmp_path / "m.json")
    assert r.returncode == 7, r.stderr
    assert "have the same" in r.stderr
    assert not (tmp_path / "m.json").exists()


# ------------------------------------------------------------ C. messages

def test_check_mismatch_names_the_file(small, tmp_path):
    man = tmp_path / "m.json"
    assert fst("verify", small, "--manifest", man).returncode == 0
    m = json.loads(man.read_text())
    shard = sorted(small.glob("*.safetensors"))[1]
    name = sorted(fsttest.Header(shard).tensors)[0]
    for key in ("trees", "tensors"):
        bad = dict(m, **{key: dict(m[key], **{name: "0" * 32})})
        if key == "tensors":
            bad.pop("trees")
            bad.pop("tree_block")
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        r = fst("load", small, "--check", tmp_path / "bad.json", "--no-progress")
        assert r.returncode == 3, r.stderr
        assert f'fst load: {shard}: tensor "{name}": XXH3-128' in r.stderr, r.stderr
    fewer = dict(m, trees={k: v for k, v in m["trees"].items() if k != name})
    (tmp_path / "fewer.json").write_text(json.dumps(fewer))
    r = fst("load", small, "--check", tmp_path / "fewer.json", "--no-progress")
    assert r.returncode == 3
    assert f'{shard}: tensor "{name}"' in r.stderr and "does not list it" in r.stderr


def test_check_manifest_that_cannot_be_read_is_exit_4(small, tmp_path):
    missing = tmp_path / "missing.json"
    r = fst("load", small, "--check", missing, "--no-progress")
    assert r.returncode == 4, r.stderr
    assert f"{missing}: cannot open the manifest: No such file or directory" in r.stderr
    r = fst("load", small, "--check", tmp_path, "--no-progress")
    assert r.returncode == 4, r.stderr
    assert f"{tmp_path}: cannot read the manifest: Is a directory" in r.stderr
    # a manifest that is not JSON stays a usage error
    (tmp_path / "junk.json").write_text("[1, 2")
    r = fst("load", small, "--check", tmp_path / "junk.json", "--no-progress")
    assert r.returncode == 1 and "not a manifest" in r.stderr


def test_text_output_escapes_control_characters(fst_pkg, tmp_path):
    """A file from anywhere cannot clear the screen, retitle the terminal
    or forge lines through inspect's or verify --hash's text; --json keeps
    the names exact."""
    import numpy as np
    evil = "\x1b[2J\x1b[1;31mFAKE-OK\x1b[0m\nsecond line"
    p = tmp_path / "evil.safetensors"
    fst_pkg.save_file({evil: np.zeros(1, np.uint8)}, str(p),
                      metadata={"format": "pt\x1b]0;pwned\x07"})
    for args in (("inspect", p), ("verify", p, "--hash")):
        r = fst(*args)
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout
        assert not any(line.startswith("second line") for line in r.stdout.splitlines())
        assert "\\x1b[2J\\x1b[1;31mFAKE-OK\\x1b[0m\\x0asecond line" in r.stdout
    assert "metadata format = pt\\x1b]0;pwned\\x07" in fst("inspect", p).stdout
    j = json.loads(fst("inspect", p, "--json").stdout)
    assert [t["name"] for t in j[0]["tensors"]] == [evil]
    assert j[0]["metadata"] == {"format": "pt\x1b]0;pwned\x07"}


def test_errors_and_warnings_are_one_line(tmp_path):
    """A bad tensor whose name holds a newline and an escape sequence: the
    error is one line on stderr, its control characters as \\xNN; so is
    a warning naming such a tensor."""
    import struct
    evil = "evil\nfst inspect: other.safetensors: looks fine\x1b[31m"
    header = json.dumps({evil: {"dtype": "U8", "shape": [3], "data_offsets": [0, 2]}}).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"ab")
    for cmd in ("inspect", "verify", "load"):
        r = fst(cmd, p)
        assert r.returncode == 2, r.stderr
        assert "\x1b" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
        assert 'tensor "evil\\x0afst inspect: other.safetensors: looks fine\\x1b[31m"' in r.stderr
    # a warning (a tensor the index does not map) through the library's log
    good = tmp_path / "ck"
    good.mkdir()
    header = json.dumps({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                         evil: {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}).encode()
    (good / "s.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"ab")
    (good / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s.safetensors"}}))
    r = fst("inspect", good)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert "fst: warning: " in r.stderr and "\\x0a" in r.stderr, r.stderr


def test_gen_refuses_an_empty_outdir():
    r = fst("gen", "")
    assert r.returncode == 1 and "OUTDIR is empty" in r.stderr, r.stderr


def test_gen_refuses_a_path_too_long(tmp_path):
    """An OUTDIR whose staged names would pass PATH_MAX is refused before
    anything is made (it was cut short, and a folder of the cut name made)."""
    long_dir = tmp_path / "/".join(["d" * 200] * 21) / "zz"
    r = fst("gen", long_dir, "--size", "1")
    assert r.returncode == 4 and "File name too long" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


def test_failed_gen_leaves_no_new_folder(tmp_path):
    """A run that fails (here out of memory) removes the folders it made
    for OUTDIR: "leaves OUTDIR as it was" (it left them, empty)."""
    import resource
    if fsttest.EMULATOR:
        pytest.skip(f"an address-space limit binds {fsttest.EMULATOR} itself, not fst")

    def small_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    r = subprocess.run([str(fsttest.FST_BIN), "gen", str(tmp_path / "a" / "b" / "c"),
                        "--size", "8000000T"], capture_output=True, text=True,
                       preexec_fn=small_address_space, timeout=120)
    assert r.returncode == 5 and "out of memory" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda:", "cpu0"])
@pytest.mark.parametrize("cmd", ["load", "verify", "bench", "doctor"])
def test_bad_device_is_usage_everywhere(small, cmd, device):
    """The same parser for every command, before anything is measured."""
    args = [cmd, small, "--device", device]
    if cmd == "bench":
        args += ["--runs", "1", "--no-reference"]
    if cmd == "doctor":
        args += ["--no-copy-test"]
    r = fst(*args)
    assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
    assert f'device "{device}": expected cpu, cuda or cuda:N' in r.stderr + r.stdout
    if cmd == "bench":
        assert r.stdout == "", r.stdout  # no measurement row
    if cmd == "doctor":
        # on stderr too, as every failure is (only the load line had it)
        assert f'cannot load: device "{device}"' in r.stderr, r.stderr
        # without PATH too, where nothing would be loaded
        r = fst("doctor", "--device", device, "--no-copy-test")
        assert r.returncode == 1, r.stderr
        assert f'device "{device}"' in r.stderr


@pytest.mark.parametrize("cmd", ["inspect", "gen", "load", "verify", "bench", "doctor"])
def test_option_errors_name_the_command(cmd):
    """getopt's own errors start as the command's do ("fst load: "), where
    they said "load: "."""
    for args in (["--bogus-option"], ["--threads"] if cmd != "gen" else ["--size"]):
        r = fst(cmd, *args)
        assert r.returncode == 1, (args, r.returncode, r.stderr)
        assert r.stderr.startswith(f"fst {cmd}: "), r.stderr


def test_bench_checks_options_before_measuring(small, tmp_path):
    """A device that cannot be used, a manifest that cannot be read, a
    GPU-only conflict: the error comes before any row."""
    r = fst("bench", small, "--runs", "1", "--no-reference", "--device", "cuda:0",
            env={"FST_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 6, r.stderr
    assert r.stdout == ""
    r = fst("bench", small, "--runs", "1", "--no-reference", "--check", tmp_path / "none.json")
    assert r.returncode == 4, r.stderr
    assert "cannot open the manifest" in r.stderr
    assert r.stdout == ""
    r = fst("bench", small, "--runs", "1", "--no-reference", "--check", tmp_path / "none.json",
            env={"FST_HASH_KERNEL": "bogus"})
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""


def test_bench_on_the_gpu_double(small, cuda_double):
    r = fst("bench", small, "--runs", "1", "--no-cold", "--no-reference", "--device", "cuda:0",
            "--json", env={"FST_CUDA_LIBRARY": cuda_double, "FST_GDS": "off"})
    assert r.returncode == 0, r.stderr
    names = [row["name"] for row in json.loads(r.stdout)["rows"]]
    assert "pinned host-to-device copy limit" in names and "fst load (warm)" in names
    r = fst("bench", small, "--runs", "1", "--no-reference", "--device", "cuda:9",
            env={"FST_CUDA_LIBRARY": cuda_double})
    # no such device: exit 6, as with no driver (docs/cli.md), no row
    assert r.returncode == 6, r.stderr
    assert "device 9 out of range (2 devices)" in r.stderr
    assert r.stdout == ""


def test_bench_many_small_tensors(tmp_path):
    """The reused-memory row has room for every tensor's alignment: a model
    of 80,000 one-byte tensors needs more than its file's bytes."""
    import numpy as np
    import fsttest
    p = tmp_path / "many.safetensors"
    fsttest.write_safetensors(p, [(f"s{i}", "U8", (1,), bytes([i % 256])) for i in range(80000)])
    r = fst("bench", p, "--runs", "1", "--no-cold", "--no-reference", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)["rows"]}
    assert rows["fst load (warm, reused memory)"]["gbps"] > 0, rows


def test_bench_failed_rows_say_why(small, tmp_path):
    """Every row whose load failed says "failed: MESSAGE", the --check rows
    and the reused-memory one too."""
    other = tmp_path / "other"
    r = fst("gen", other, "--size", "2MiB", "--seed", "99")
    assert r.returncode == 0, r.stderr
    man = tmp_path / "other.json"
    assert fst("verify", other, "--manifest", man).returncode == 0
    r = fst("bench", small, "--runs", "1", "--no-cold", "--no-reference", "--json",
            "--check", man, timeout=300)
    assert r.returncode == 3, r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)["rows"]}
    assert rows["fst load --check (warm)"]["notes"].startswith("failed: "), rows


def test_bench_keeps_the_whole_path_chosen(small, cuda_double):
    """The note of a GPU load is the whole path chosen, as fst load gives
    it (it was cut at 199 characters)."""
    env = {"FST_CUDA_LIBRARY": cuda_double}
    r = fst("load", small, "--device", "cuda:0", "--json", env=env)
    assert r.returncode == 0, r.stderr
    chosen = json.loads(r.stdout)["path_chosen"]
    r = fst("bench", small, "--runs", "1", "--no-cold", "--no-reference", "--device", "cuda:0",
            "--json", env=env)
    assert r.returncode == 0, r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)["rows"]}
    note = rows["fst load (warm)"]["notes"]
    assert len(chosen) > 200 and note == chosen, (note, chosen)


def test_verify_checks_the_hash_kernel_first(tmp_path):
    import numpy as np
    import fsttest
    p = tmp_path / "none.safetensors"
    fsttest.write_safetensors(p, [])
    for args in (("--hash",), ("--manifest", tmp_path / "m.json")):
        r = fst("verify", p, *args, env={"FST_HASH_KERNEL": "bogus"})
        assert r.returncode == 1 and "FST_HASH_KERNEL" in r.stderr, r.stderr
        assert r.stdout == "" and not (tmp_path / "m.json").exists()


def test_doctor_tries_o_direct_beside_a_file_of_any_name(tmp_path):
    import numpy as np
    import fsttest
    p = tmp_path / "weights"
    fsttest.write_safetensors(p, [("a", "U8", (1,), b"x")])
    for target in (p, "http://127.0.0.1:9/x.safetensors"):  # a port that refuses
        r = fst("doctor", target)
        line = [x for x in r.stdout.splitlines() if "O_DIRECT" in x]
        assert line and "cannot create a file" not in line[0], r.stdout


def fs_type(path):
    r = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "?"


def test_bench_cold_rows_skipped_when_the_cache_keeps_the_files(small, tmp_path_factory):
    """tmpfs holds files only in the page cache: posix_fadvise(DONTNEED)
    succeeds and evicts nothing. The cold rows must say so instead of
    timing warm reads, and no cold ratio is printed."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK) or fs_type(shm) != "tmpfs":
        pytest.skip("no writable tmpfs at /dev/shm")
    import tempfile
    d = tempfile.mkdtemp(dir=shm, prefix="fst-bench-")
    try:
        ck = os.path.join(d, "ck")
        shutil.copytree(small, ck)
        r = fst("bench", ck, "--runs", "1", "--no-reference", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        rows = {row["name"]: row for row in doc["rows"]}
        for name in ("O_DIRECT read limit (cold)", "fst load (cold)"):
            assert rows[name]["notes"].startswith("skipped: cannot evict the page cache ("), \
                rows[name]
            assert "still cached after posix_fadvise(DONTNEED)" in rows[name]["notes"]
            assert rows[name]["seconds"] == 0 and rows[name]["gbps"] == 0
        assert "fst_cold_vs_odirect_limit" not in doc["ratios"]
        assert doc["cold_resident"] > 0.5
        assert rows["fst load (warm)"]["gbps"] > 0
        r = fst("bench", ck, "--runs", "1")
        assert r.returncode == 0, r.stderr
        assert "fst_cold_vs_odirect_limit" not in r.stdout
        lines = [ln for ln in r.stdout.splitlines() if "(cold)" in ln]
        assert len(lines) == 3, r.stdout  # the reference's cold row too
        assert all("skipped: cannot evict the page cache" in ln for ln in lines), lines
    finally:
        shutil.rmtree(d)


def run_on_a_pty(*args, timeout=120):
    """Run fst with stderr on a pseudo-terminal (stdout a pipe); returns
    (exit code, stdout, what the terminal received)."""
    import pty
    import select
    master, slave = pty.openpty()
    env = dict(os.environ)
    env.pop("FST_FAULT", None)
    p = subprocess.Popen([str(fsttest.FST_BIN), *map(str, args)], stdout=subprocess.PIPE,
                         stderr=slave, env=env)
    os.close(slave)
    got = b""
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            p.kill()
            raise AssertionError("fst did not finish")
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    out = p.stdout.read().decode()
    return p.wait(), out, got.decode(errors="replace")


def test_progress_bar_on_a_terminal_leaves_nothing_behind(gen_dir):
    """Each redraw covers the one before, so the line never ends in the
    tail of an older, longer one; the bar ends with a newline. (Whether a
    redraw is shorter depends on timing: test_cli_util checks the padding
    itself.)"""
    ck = gen_dir(shards=2, seed=22, size="32MiB", tag="-progress")
    code, out, tty = run_on_a_pty("load", ck, "--io", "pread", "--threads", "1",
                                  "--chunk", "4KiB")
    assert code == 0, tty
    assert out.startswith("loaded "), out
    bar = tty.replace("\r\n", "\n")
    assert bar.startswith("\r[") and bar.endswith("\n"), repr(bar[-200:])
    lines = bar[:-1].split("\r")[1:]
    assert lines and all(ln.startswith("[") for ln in lines), lines
    for before, after in zip(lines, lines[1:]):
        assert len(after) >= len(before.rstrip(" ")), (before, after)
    total = lines[-1].split("] ")[1].split(" / ")[1].split("  ")[0]
    assert lines[-1].split("] ")[1].startswith(f"{total} / {total}  "), lines[-1]
    assert lines[-1].rstrip(" ").endswith(" s left"), lines[-1]


def test_progress_bar_of_a_checked_load(gen_dir, tmp_path):
    """With --check the load is the streaming form under the CLI's checking
    threads (tools/fst/hash.c), not fst_load: the bar still reaches the
    total when every digest is equal, and a bar drawn before a mismatch ends
    its line, so the error starts a line of its own."""
    ck = gen_dir(shards=2, seed=23, size="32MiB", tag="-progress-check")
    man = tmp_path / "m.json"
    assert fst("verify", ck, "--manifest", man).returncode == 0
    load = ["--io", "pread", "--threads", "1", "--chunk", "4KiB", "--check", man]
    code, out, tty = run_on_a_pty("load", ck, *load)
    assert code == 0, tty
    assert "every digest equal" in out and "loaded " in out, out
    bar = tty.replace("\r\n", "\n")
    assert bar.startswith("\r[") and bar.endswith("\n"), repr(bar[-200:])
    last = bar[:-1].split("\r")[-1]
    total = last.split("] ")[1].split(" / ")[1].split("  ")[0]
    assert last.split("] ")[1].startswith(f"{total} / {total}  "), last

    bad = tmp_path / "bad"
    shutil.copytree(ck, bad)
    shard = sorted(bad.glob("*.safetensors"))[-1]
    name, begin, _ = largest_tensor(shard)
    flip_in_place(shard, begin + 100)
    code, out, tty = run_on_a_pty("load", bad, *load)
    assert code == 3, tty
    assert out == "", out
    # the bar shows from the first 100 ms tick: a mismatch may come first
    text = tty.replace("\r\n", "\n")
    at = text.index("fst load: ")
    bar, message = text[:at], text[at + len("fst load: "):]
    assert bar == "" or (bar.startswith("\r[") and bar.endswith("\n")
                         and "\n" not in bar[:-1]), repr(tty[-300:])
    assert message.startswith(f"{shard}: tensor \"{name}\": XXH3-128"), message
    assert "but the manifest says" in message and message.endswith("\n"), message


def test_an_injected_failure_says_so(small):
    r = fst("load", small, "--no-progress", env={"FST_FAULT": "alloc:1"})
    assert r.returncode == 5, r.stderr
    assert r.stderr.rstrip("\n").endswith(
        "out of memory (FST_FAULT injected a failure at site alloc, call 1)"), r.stderr
    r = fst("verify", small, "--io", "pread", env={"FST_FAULT": "host_alloc:1"})
    assert r.returncode == 5, r.stderr
    assert "(FST_FAULT injected a failure at site host_alloc, call 1)" in r.stderr
    # each input of inspect fails at its first allocation: the count grows
    r = fst("inspect", small, small, env={"FST_FAULT": "alloc:1+"})
    lines = r.stderr.splitlines()
    assert r.returncode == 5 and len(lines) == 2, r.stderr
    assert lines[0].endswith("(FST_FAULT injected a failure at site alloc, call 1)"), lines
    assert lines[1].endswith("(FST_FAULT injected 2 failures, the last at site alloc, call 2)"), \
        lines
    # without FST_FAULT, or with a fault that was retried, no note
    r = fst("load", small / "missing.safetensors")
    assert r.returncode == 4 and "FST_FAULT" not in r.stderr
    r = fst("load", small, "--no-progress", "--io", "pread", "--check", small / "none.json",
            env={"FST_FAULT": "read:1:EINTR"})
    assert r.returncode == 4 and "injected" in r.stderr  # the EINTR was injected, and retried


def largest_tensor(shard):
    h = fsttest.Header(shard)
    name, info = max(h.tensors.items(),
                     key=lambda kv: kv[1]["data_offsets"][1] - kv[1]["data_offsets"][0])
    b, e = info["data_offsets"]
    return name, h.data_offset + b, h.data_offset + e


def flip_in_place(path, offset, keep_mtime=True):
    """XOR one byte in place; the modification time is put back (only the
    status change time then tells)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def verify_stopped_before_compare(ck, change, *args):
    """Run fst verify with FST_TEST_STOP=verify-compare: it stops itself
    after the load; change() runs then, and verify continues."""
    import signal
    import time
    env = dict(os.environ)
    env.pop("FST_FAULT", None)
    env["FST_TEST_STOP"] = "verify-compare"
    p = subprocess.Popen([str(fsttest.FST_BIN), "verify", str(ck), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while True:
        with open(f"/proc/{p.pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state == "T":
            break
        if p.poll() is not None or time.monotonic() > deadline:
            out, err = p.communicate()
            raise AssertionError(f"verify never stopped before the comparison "
                                 f"(exit {p.returncode}): {err}")
        time.sleep(0.005)
    try:
        change()
    finally:
        os.kill(p.pid, signal.SIGCONT)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


@pytest.fixture
def copy_of(small, tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    for f in small.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    return d


def test_verify_file_written_after_the_load_is_exit_8(copy_of):
    shard = sorted(copy_of.glob("*.safetensors"))[0]
    name, begin, end = largest_tensor(shard)
    # (with --io mmap the loaded tensors are views of the file: they change
    # with it, and verify rightly finds them equal)
    for io in fsttest.io_cases("pread", "uring"):
        code, out, err = verify_stopped_before_compare(
            copy_of, lambda: flip_in_place(shard, (begin + end) // 2), "--io", io)
        assert code == 8, (io, code, err)
        assert f"{shard}: file changed during the comparison (status change time changed)" in err
        assert f'tensor "{name}" differs at byte' in err
        assert "verified" not in out
    # flipped twice: the original bytes, and a plain verify passes
    r = fst("verify", copy_of)
    assert r.returncode == 0, r.stderr


def test_verify_file_changed_and_touched_after_the_load(copy_of):
    shard = sorted(copy_of.glob("*.safetensors"))[1]
    _, begin, end = largest_tensor(shard)
    code, _, err = verify_stopped_before_compare(
        copy_of, lambda: flip_in_place(shard, begin, keep_mtime=False))
    assert code == 8, err
    assert "modification time changed, status change time changed" in err


def test_verify_file_truncated_after_the_load(copy_of):
    shard = sorted(copy_of.glob("*.safetensors"))[0]
    size = shard.stat().st_size
    code, _, err = verify_stopped_before_compare(copy_of, lambda: os.truncate(shard, size // 2))
    assert code == 8, err
    assert f"size {size} -> {size // 2}" in err


def test_verify_path_replaced_after_the_load(copy_of, tmp_path):
    shard = sorted(copy_of.glob("*.safetensors"))[0]
    _, begin, _ = largest_tensor(shard)
    other = tmp_path / "other"
    raw = bytearray(shard.read_bytes())
    raw[begin] ^= 1
    other.write_bytes(bytes(raw))
    code, _, err = verify_stopped_before_compare(copy_of, lambda: os.rename(other, shard))
    assert code == 8, err
    assert "the path now names another file than the one loaded" in err


def test_verify_no_change_no_stop_effect(copy_of):
    """The stop point itself changes nothing."""
    code, out, err = verify_stopped_before_compare(copy_of, lambda: None)
    assert code == 0, err
    assert out.startswith("verified ")


def test_verify_under_a_writer_never_calls_a_change_a_mismatch(gen_dir, tmp_path):
    """A thread keeps flipping one byte of a tensor in place, putting the
    modification time back each time, while verify runs again and again:
    whenever the loaded bytes and the file's differ, the file changed, so
    the exit is 8 (or 0 when the load and the comparison saw the same
    byte), never 3. The writer sleeps between writes, so two writes never
    share a timestamp tick (ctime is coarse)."""
    import threading
    import time
    src = gen_dir(shards=2, seed=22, size="32MiB", tag="-progress")
    ck = tmp_path / "ck"
    ck.mkdir()
    for f in src.iterdir():
        (ck / f.name).write_bytes(f.read_bytes())
    shard = sorted(ck.glob("*.safetensors"))[0]
    _, begin, end = largest_tensor(shard)
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            flip_in_place(shard, end - 1)
            time.sleep(0.01)

    t = threading.Thread(target=writer)
    t.start()
    codes = []
    try:
        deadline = time.monotonic() + 20
        while len(codes) < 12 and time.monotonic() < deadline:
            r = fst("verify", ck, "--io", "pread")
            codes.append(r.returncode)
            assert r.returncode in (0, 8), (codes, r.stderr)
            if r.returncode == 8:
                assert "changed" in r.stderr, r.stderr
    finally:
        stop.set()
        t.join()
    assert codes
