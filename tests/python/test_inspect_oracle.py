"""`fst inspect` against the reference safetensors reader.

Valid files: `fst inspect --json` must agree exactly with the reference about
names, dtypes, shapes, data_offsets and metadata. Invalid files: both must
reject, fst with exit code 2 and a message naming the file (and the tensor at
fault). Where the two knowingly disagree, the test says so explicitly.
"""
import json
import struct

import numpy as np
import pytest
import safetensors.numpy as stnp
from safetensors import safe_open

from fsttest import (
    DTYPE_BITS,
    NUMPY_DTYPES,
    Header,
    check_entry,
    fst,
    inspect_json,
    inspect_ok,
    random_array,
    reference_rejects,
    reference_view,
    tensor_nbytes,
    write_raw,
    write_safetensors,
)

NUMPY_TO_NAME = {np.dtype(v): k for k, v in NUMPY_DTYPES.items()}


def inspect_one(path, compare_bytes="all"):
    doc = inspect_ok(path)
    assert len(doc) == 1
    return check_entry(doc[0], path, compare_bytes=compare_bytes)


# ------------------------------------------------------------ valid files

def test_every_numpy_dtype(tmp_path):
    rng = np.random.default_rng(1)
    shapes = [(7,), (3, 5), (2, 3, 4), (1, 1, 1, 9)]
    tensors = {}
    for i, (name, dt) in enumerate(sorted(NUMPY_DTYPES.items())):
        for j, shape in enumerate(shapes):
            tensors[f"{name.lower()}.{j}"] = random_array(rng, dt, shape)
    path = tmp_path / "dtypes.safetensors"
    stnp.save_file(tensors, str(path), metadata={"format": "np", "note": "every dtype"})
    by_name = inspect_one(path)
    for name, arr in tensors.items():
        assert by_name[name]["dtype"] == NUMPY_TO_NAME[arr.dtype], name
        assert by_name[name]["shape"] == list(arr.shape)
    # the names numpy's dtypes get in the file are the format's spellings
    assert {t["dtype"] for t in by_name.values()} == set(NUMPY_DTYPES)


def test_scalars_and_empty_tensors(tmp_path):
    rng = np.random.default_rng(2)
    tensors = {}
    for name, dt in NUMPY_DTYPES.items():
        tensors[f"scalar.{name}"] = random_array(rng, dt, ())
        tensors[f"empty.{name}"] = np.zeros((0,), dtype=dt)
        tensors[f"empty2.{name}"] = np.zeros((3, 0, 2), dtype=dt)
    tensors["empty.00"] = np.zeros((0, 0), dtype=np.float32)
    path = tmp_path / "odd-shapes.safetensors"
    stnp.save_file(tensors, str(path))
    by_name = inspect_one(path)
    for name, t in by_name.items():
        if name.startswith("scalar."):
            assert t["shape"] == []
            b, e = t["data_offsets"]
            assert e - b == DTYPE_BITS[t["dtype"]] // 8
        else:
            assert 0 in t["shape"]
            assert t["data_offsets"][0] == t["data_offsets"][1]


def test_only_empty_tensors_and_no_tensors(tmp_path):
    p1 = tmp_path / "all-empty.safetensors"
    stnp.save_file({"a": np.zeros((0,), np.float32), "b": np.zeros((4, 0), np.int8)}, str(p1))
    inspect_one(p1)
    p2 = write_raw(tmp_path / "no-tensors.safetensors", "{}")
    assert inspect_one(p2) == {}
    p3 = write_raw(tmp_path / "only-meta.safetensors", '{"__metadata__":{"a":"b"}}')
    doc = inspect_ok(p3)
    assert doc[0]["tensors"] == [] and doc[0]["metadata"] == {"a": "b"}
    check_entry(doc[0], p3)


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        {},
        {"format": "pt"},
        {"empty": "", "unicode": "na\u00efve \u65e5\u672c \U0001f600", "quote": 'a"b\\c\n\t',
         "z-last-key": "1", "a-not-first": "2"},
        {f"key{i:04d}": str(i) * (i % 7) for i in range(300)},
    ],
    ids=["none", "empty", "format", "strings", "many"],
)
def test_metadata(tmp_path, metadata):
    path = tmp_path / "meta.safetensors"
    stnp.save_file({"x": np.arange(6, dtype=np.int16).reshape(2, 3)}, str(path), metadata=metadata)
    doc = inspect_ok(path)
    check_entry(doc[0], path)
    if metadata:
        assert doc[0]["metadata"] == metadata
    else:
        assert doc[0]["metadata"] is None


def test_five_thousand_tensors(tmp_path):
    rng = np.random.default_rng(3)
    dts = list(NUMPY_DTYPES.values())
    tensors = {
        f"layers.{i}.w": random_array(rng, dts[i % len(dts)], (i % 5, 3) if i % 11 else ())
        for i in range(5000)
    }
    path = tmp_path / "many.safetensors"
    stnp.save_file(tensors, str(path), metadata={"count": "5000"})
    by_name = inspect_one(path, compare_bytes="numpy")
    assert len(by_name) == 5000


def test_misaligned_offsets(tmp_path):
    """Odd-sized U8 tensors before wider ones: every later tensor sits at an
    offset that is not a multiple of its element size. The reference accepts
    any offset; so must fst, and report the offsets exactly."""
    rng = np.random.default_rng(4)
    tensors = []
    for i, (name, dt) in enumerate(sorted(NUMPY_DTYPES.items())):
        odd = random_array(rng, np.uint8, (2 * i + 1,))
        tensors.append((f"{i:02d}.scales", "U8", [odd.size], odd.tobytes()))
        arr = random_array(rng, dt, (3, 5))
        tensors.append((f"{i:02d}.{name}", name, list(arr.shape), arr.tobytes()))
    path = write_safetensors(tmp_path / "misaligned.safetensors", tensors,
                             metadata={"layout": "misaligned"})
    by_name = inspect_one(path)
    data_offset = Header(path).data_offset
    misaligned = [
        n for n, t in by_name.items()
        if (data_offset + t["data_offsets"][0]) % (DTYPE_BITS[t["dtype"]] // 8)
    ]
    assert len(misaligned) >= 5, f"the file should misalign most wide tensors: {misaligned}"
    # inspect_one compared every tensor's bytes through the reference; the
    # bytes are also those written here
    blob = path.read_bytes()
    for name, dtype, shape, raw in tensors:
        b, e = by_name[name]["data_offsets"]
        assert blob[data_offset + b:data_offset + e] == raw, name


def test_misaligned_data_section(tmp_path):
    """A header whose length is not a multiple of 8 (legal: only the
    reference writer pads) puts the whole data section at an odd offset."""
    raw = np.arange(12, dtype=np.float64).tobytes()
    hdr = json.dumps({"x": {"dtype": "F64", "shape": [12], "data_offsets": [0, 96]}})
    path = write_raw(tmp_path / "odd-header.safetensors", hdr + " " * ((-len(hdr)) % 8 + 3), raw,
                     pad=False)
    by_name = inspect_one(path)
    assert Header(path).data_offset % 8 == 3
    assert by_name["x"]["data_offsets"] == [0, 96]


def test_every_format_dtype(tmp_path):
    """Dtypes numpy lacks (BF16, FP8s, FP6s, FP4): checked through the
    header, safe_open's slices and deserialize's raw bytes."""
    rng = np.random.default_rng(5)
    tensors = []
    for dtype, bits in sorted(DTYPE_BITS.items()):
        # sub-byte dtypes have no scalar (4 or 6 bits is no whole byte)
        shapes = [[3, 5], []] if bits >= 8 else [[4, 6], [8]]
        for j, shape in enumerate(shapes):
            raw = rng.integers(0, 256, tensor_nbytes(dtype, shape), dtype=np.uint8).tobytes()
            tensors.append((f"{dtype}.{j}", dtype, shape, raw))
    path = write_safetensors(tmp_path / "all-dtypes.safetensors", tensors)
    by_name = inspect_one(path)
    assert {t["dtype"] for t in by_name.values()} == set(DTYPE_BITS)


@pytest.mark.parametrize(
    "case",
    ["leading-whitespace", "tabs-newlines", "trailing-spaces", "extra-fields", "metadata-null",
     "metadata-empty", "unicode-names", "escaped-names", "long-padding", "metadata-like-name",
     "nested-extra"],
)
def test_valid_but_odd(tmp_path, case):
    """Files outside what writers usually produce but inside the rules: the
    reference accepts them and so must fst, with the same view."""
    u8 = lambda b, e: {"dtype": "U8", "shape": [e - b], "data_offsets": [b, e]}  # noqa: E731
    body = {"a": u8(0, 2), "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}
    data = b"\x01\x02" + np.float32(1.5).tobytes()
    compact = json.dumps(body, separators=(",", ":"))
    pad = True
    if case == "leading-whitespace":
        header = "   " + compact
    elif case == "tabs-newlines":
        header, pad = "\n\t " + json.dumps(body, indent="\t") + "\r\n\t ", False
    elif case == "trailing-spaces":
        header, pad = compact + " " * 61, False
    elif case == "extra-fields":
        body["a"]["foo"] = [1, -2, 3.5, None, {"x": "y"}]
        body["b"]["offsets_note"] = "ignored"
        header = json.dumps(body)
    elif case == "metadata-null":
        header = json.dumps({"__metadata__": None, **body})
    elif case == "metadata-empty":
        header = json.dumps({**body, "__metadata__": {}})
    elif case == "unicode-names":
        body = {"\u00e9t\u00e9.\u65e5\u672c": body["a"], "\U0001f600": body["b"]}
        header = json.dumps(body, ensure_ascii=False)
    elif case == "escaped-names":
        body = {'we"ird\\name\u00e9': body["a"], "tab\there/slash": body["b"]}
        header = json.dumps(body, ensure_ascii=True)
    elif case == "long-padding":
        header, pad = compact + " " * 100003, False
    elif case == "metadata-like-name":
        body = {"__metadata": body["a"], "__metadata__x": body["b"]}
        header = json.dumps(body)
    elif case == "nested-extra":
        body["a"]["data_offsets_extra"] = {"dtype": "nonsense", "shape": "x"}
        header = json.dumps(body, indent=2)
    path = write_raw(tmp_path / f"{case}.safetensors", header, data, pad=pad)
    view, meta, _ = reference_view(path)  # the reference accepts it
    assert len(view) == 2
    by_name = inspect_one(path)
    assert set(by_name) == set(view)


# ------------------------------------------------------- fst gen checkpoints

@pytest.mark.parametrize("shards,misaligned", [(1, False), (3, False), (4, True)])
def test_gen_checkpoint(gen_dir, shards, misaligned):
    """Checkpoints by `fst gen`, inspected as a directory, as an index and
    shard by shard: every tensor listed is what the reference reads."""
    d = gen_dir(shards=shards, misaligned=misaligned)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shard_paths = sorted(d.glob("*.safetensors"))
    assert len(shard_paths) == shards

    as_dir = inspect_ok(d)
    as_index = inspect_ok(d / "model.safetensors.index.json")
    as_files = inspect_ok(*shard_paths)
    assert len(as_dir) == len(as_index) == len(as_files) == shards
    for a, b, c in zip(as_dir, as_index, as_files):
        assert a["tensors"] == b["tensors"] == c["tensors"]
        assert a["metadata"] == b["metadata"] == c["metadata"] == {"format": "pt"}

    seen = {}
    for entry in as_dir:
        path = d / entry["path"].rsplit("/", 1)[-1]
        by_name = check_entry(entry, path, compare_bytes="numpy")
        with safe_open(str(path), framework="np") as f:
            assert set(f.keys()) == set(by_name)
        for name in by_name:
            assert name not in seen
            seen[name] = path.name
    assert seen == index["weight_map"]


def test_gen_index_relative_path(gen_dir, monkeypatch):
    """An index given without a directory part resolves shards next to it."""
    d = gen_dir(shards=2)
    monkeypatch.chdir(d)
    doc = inspect_ok("model.safetensors.index.json")
    assert [e["path"] for e in doc] == [f"./model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    for e in doc:
        check_entry(e, d / e["path"], compare_bytes=None)


# ------------------------------------------------------------ invalid files

def T(dtype, shape, offsets):  # noqa: N802
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def J(obj):  # noqa: N802
    return json.dumps(obj, separators=(",", ":"))


U2 = T("U8", [2], [0, 2])

# id -> (header (str: padded to 8 with spaces; bytes: as is), data, tensor at
# fault or None, words expected in fst's message, raw file bytes or None)
INVALID = {
    "empty-file": (None, None, None, "header too small", b""),
    "seven-bytes": (None, None, None, "header too small", b"\x01\x00\x00\x00\x00\x00\x00"),
    "header-too-large": (None, None, None, "header too large",
                         struct.pack("<Q", 100_000_001) + b"{}" + b" " * 6),
    "header-length-u64-max": (None, None, None, "header too large",
                              struct.pack("<Q", 2**64 - 1) + b"{}"),
    "header-past-eof": (None, None, None, "invalid header length",
                        struct.pack("<Q", 64) + b'{"a":1}'),
    "empty-header": (b"", b"", None, "not valid JSON", None),
    "truncated-data": (J({"w": T("F32", [4, 4], [0, 64])}), bytes(40), "w", "truncated", None),
    "truncated-one-byte": (J({"a": U2, "w": T("F32", [4], [2, 18])}), bytes(17), "w", "truncated",
                           None),
    "trailing-bytes": (J({"a": U2}), bytes(3), None, "trailing", None),
    "data-but-no-tensors": ("{}", b"\x00", None, "trailing", None),
    "bad-json": ('{"a":{"dtype":"U8",', b"", None, "not valid JSON", None),
    "trailing-garbage": (J({"a": U2}) + " x", bytes(2), None, "not valid JSON", None),
    "nul-padding": (J({"a": U2}).encode() + b"\x00" * 5, bytes(2), None, "not valid JSON", None),
    "bom": (b"\xef\xbb\xbf" + J({"a": U2}).encode() + b"   ", bytes(2), None, "not valid JSON",
            None),
    "not-utf8": (b'{"\xff":' + J(U2).encode() + b"     ", bytes(2), None, "UTF-8", None),
    "lone-surrogate": ('{"\\ud800":' + J(U2) + "}", bytes(2), None, "not valid JSON", None),
    "not-an-object": ("[]", b"", None, "JSON object", None),
    "tensor-not-an-object": ('{"a":[1,2]}', b"", "a", "expected an object", None),
    "missing-dtype": (J({"a": {"shape": [2], "data_offsets": [0, 2]}}), bytes(2), "a", "dtype",
                      None),
    "missing-shape": (J({"a": {"dtype": "U8", "data_offsets": [0, 2]}}), bytes(2), "a", "shape",
                      None),
    "missing-offsets": (J({"a": {"dtype": "U8", "shape": [2]}}), bytes(2), "a", "data_offsets",
                        None),
    "unknown-dtype": (J({"a": T("Q8", [2], [0, 2])}), bytes(2), "a", 'unknown dtype "Q8"', None),
    "lowercase-dtype": (J({"a": T("f32", [1], [0, 4])}), bytes(4), "a", 'unknown dtype "f32"',
                        None),
    "dtype-not-string": (J({"a": T(8, [2], [0, 2])}), bytes(2), "a", "dtype", None),
    "shape-null": (J({"a": T("U8", None, [0, 2])}), bytes(2), "a", "shape", None),
    "shape-negative": (J({"a": T("U8", [-2], [0, 2])}), bytes(2), "a", "shape", None),
    "shape-float": ('{"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}}', bytes(2), "a",
                    "shape", None),
    "shape-exponent": ('{"a":{"dtype":"U8","shape":[2e0],"data_offsets":[0,2]}}', bytes(2), "a",
                       "shape", None),
    "shape-string": (J({"a": T("U8", ["2"], [0, 2])}), bytes(2), "a", "shape", None),
    "offsets-three": (J({"a": T("U8", [2], [0, 2, 2])}), bytes(2), "a", "data_offsets", None),
    "offsets-one": (J({"a": T("U8", [2], [2])}), bytes(2), "a", "data_offsets", None),
    "offsets-float": ('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2.0]}}', bytes(2), "a",
                      "data_offsets", None),
    "offsets-negative": (J({"a": T("U8", [0], [-1, -1])}), b"", "a", "data_offsets", None),
    "offsets-too-big": ('{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,18446744073709551616]}}',
                        b"", None, "too big integer", None),
    "end-before-begin": (J({"a": T("U8", [0], [2, 0])}), bytes(2), "a", "end before begin", None),
    "size-mismatch": (J({"a": T("F32", [3, 4], [0, 96])}), bytes(96), "a", "needs 48 bytes", None),
    "overlap": (J({"a": U2, "b": T("U8", [2], [1, 3])}), bytes(3), "b", "overlap", None),
    "overlap-same-range": (J({"a": U2, "b": U2}), bytes(2), "b", "overlap", None),
    "hole": (J({"a": U2, "b": T("U8", [2], [3, 5])}), bytes(5), "b", "gap", None),
    "hole-at-start": (J({"a": T("U8", [2], [1, 3])}), bytes(3), "a", "gap", None),
    "numel-overflow": (J({"a": T("F64", [2**62, 4], [0, 0])}), b"", "a", "64 bits", None),
    "bits-overflow": (J({"a": T("F64", [2**61], [0, 0])}), b"", "a", "64 bits", None),
    "sub-byte-remainder": (J({"a": T("F4", [3], [0, 2])}), bytes(2), "a", "whole number of bytes",
                           None),
    "f6-remainder": (J({"a": T("F6_E2M3", [3], [0, 3])}), bytes(3), "a", "whole number of bytes",
                     None),
    "metadata-int": (J({"__metadata__": {"k": 1}, "a": U2}), bytes(2), None, '"k"', None),
    "metadata-list": (J({"__metadata__": [], "a": U2}), bytes(2), None, "__metadata__", None),
    "metadata-nested": (J({"__metadata__": {"k": {"x": "y"}}, "a": U2}), bytes(2), None, '"k"',
                        None),
    "metadata-as-tensor": (J({"__metadata__": U2}), bytes(2), None, "__metadata__", None),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_file(tmp_path, case):
    header, data, tensor, words, raw = INVALID[case]
    path = tmp_path / f"{case}.safetensors"
    if raw is not None:
        path.write_bytes(raw)
    else:
        write_raw(path, header, data)
    reference_rejects(path)

    r = fst("inspect", path)
    assert r.returncode == 2, f"exit {r.returncode}, stderr {r.stderr!r}"
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    msg = lines[0]
    assert msg.startswith("fst inspect: "), msg
    assert str(path) in msg, msg
    if tensor is not None:
        assert f'"{tensor}"' in msg, msg
    if words is not None:
        assert words in msg, msg

    rc, doc, err = inspect_json(path)
    assert rc == 2 and err.strip() == msg
    assert doc == [{"path": str(path), "ok": False, "error": msg[len("fst inspect: "):]}]


# ------------------------------------------------ known divergences

def test_duplicate_tensor_key_divergence(tmp_path):
    """The spec forbids duplicate keys; the reference's JSON parser keeps the
    last one and accepts the file. fst rejects it, naming the key."""
    header = '{"a":%s,"a":%s}' % (J(T("U8", [2], [0, 2])), J(T("I16", [1], [0, 2])))
    path = write_raw(tmp_path / "dup.safetensors", header, b"\x01\x02")
    view, _, _ = reference_view(path)
    assert view == {"a": ("I16", [1])}, "the reference keeps the last duplicate"
    r = fst("inspect", path)
    assert r.returncode == 2
    assert str(path) in r.stderr and 'duplicate key "a"' in r.stderr


def test_duplicate_key_with_overlap_both_reject(tmp_path):
    header = '{"a":%s,"a":%s,"b":%s}' % (J(U2), J(T("U8", [2], [2, 4])), J(T("U8", [2], [2, 4])))
    path = write_raw(tmp_path / "dup2.safetensors", header, bytes(4))
    reference_rejects(path)
    r = fst("inspect", path)
    assert r.returncode == 2 and 'duplicate key "a"' in r.stderr


def test_duplicate_metadata_key_divergence(tmp_path):
    """Duplicate keys inside __metadata__: the reference keeps the last;
    fst rejects the header."""
    header = '{"__metadata__":{"k":"1","k":"2"},"a":%s}' % J(U2)
    path = write_raw(tmp_path / "dupmeta.safetensors", header, bytes(2))
    _, meta, _ = reference_view(path)
    assert meta == {"k": "2"}
    r = fst("inspect", path)
    assert r.returncode == 2 and str(path) in r.stderr and 'duplicate key "k"' in r.stderr


def test_duplicate_field_in_tensor_info(tmp_path):
    """A repeated dtype/shape/data_offsets field: both reject. A repeated
    field the reference ignores: the reference accepts, fst rejects."""
    header = '{"t":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    path = write_raw(tmp_path / "dup-field.safetensors", header, bytes(2))
    reference_rejects(path)
    r = fst("inspect", path)
    assert r.returncode == 2 and 'duplicate key "dtype"' in r.stderr

    header = '{"t":{"x":1,"x":2,"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    path = write_raw(tmp_path / "dup-extra.safetensors", header, bytes(2))
    view, _, _ = reference_view(path)
    assert view == {"t": ("U8", [2])}
    r = fst("inspect", path)
    assert r.returncode == 2 and 'duplicate key "x"' in r.stderr


def test_deeply_nested_extra_field_divergence(tmp_path):
    """Nesting in an ignored field: the reference's JSON parser stops at a
    recursion limit of 128, fst's at 2048."""
    def nested(depth):
        return ('{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":'
                + "[" * depth + "]" * depth + "}}")

    shallow = write_raw(tmp_path / "nest-100.safetensors", nested(100), bytes(2))
    inspect_one(shallow)
    middle = write_raw(tmp_path / "nest-200.safetensors", nested(200), bytes(2))
    reference_rejects(middle)
    assert fst("inspect", middle).returncode == 0
    deep = write_raw(tmp_path / "nest-3000.safetensors", nested(3000), bytes(2))
    reference_rejects(deep)
    r = fst("inspect", deep)
    assert r.returncode == 2 and "depth" in r.stderr


def test_nul_in_tensor_name_divergence(tmp_path):
    """A tensor name with U+0000: the reference accepts it; fst cannot hold
    it in a C string and rejects the header."""
    header = '{"a\\u0000b":%s}' % J(U2)
    path = write_raw(tmp_path / "nul.safetensors", header, bytes(2))
    view, _, _ = reference_view(path)
    assert list(view) == ["a\x00b"]
    r = fst("inspect", path)
    assert r.returncode == 2 and str(path) in r.stderr and "NUL" in r.stderr


def test_dimension_above_int64_divergence(tmp_path):
    """A dimension above 2^63-1 next to a 0 (an empty tensor): the reference
    (usize) accepts it; fst's JSON parser stops at 2^63-1 and rejects."""
    header = '{"a":{"dtype":"U8","shape":[0,9223372036854775808],"data_offsets":[0,0]}}'
    path = write_raw(tmp_path / "huge-dim.safetensors", header, b"")
    view, _, _ = reference_view(path)
    assert view == {"a": ("U8", [0, 2**63])}
    r = fst("inspect", path)
    assert r.returncode == 2 and str(path) in r.stderr
    ok = write_raw(tmp_path / "int64-max.safetensors",
                   header.replace("9223372036854775808", "9223372036854775807"), b"")
    inspect_one(ok)


def test_negative_zero_divergence(tmp_path):
    """`-0` as a dimension: the reference's JSON parser reads it as a float
    and rejects the file; fst's reads it as the integer 0 and accepts."""
    header = '{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}'
    path = write_raw(tmp_path / "neg-zero.safetensors", header, b"")
    reference_rejects(path)
    doc = inspect_ok(path)
    assert doc[0]["tensors"] == [{"name": "a", "dtype": "U8", "shape": [0], "data_offsets": [0, 0]}]


# ---------------------------------------------------------- index rules

def _index_dir(tmp_path, gen_dir, mutate):
    """A copy of a 2-shard gen checkpoint whose index mutate() changes."""
    src = gen_dir(shards=2, size="1MiB")
    d = tmp_path / "ckpt"
    d.mkdir()
    for p in src.iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    text = mutate(index, d)
    index_path.write_text(text if isinstance(text, str) else json.dumps(index))
    return d, index_path


@pytest.mark.parametrize("case", ["missing-shard", "wrong-shard", "escaping-shard", "bad-json",
                                  "no-weight-map", "tensor-in-two-shards"])
def test_invalid_index(tmp_path, gen_dir, case):
    """Index rules are fst's own (the reference has no index reader): each
    broken index is rejected with exit 2, naming the index or the shard."""
    def mutate(index, d):
        wm = index["weight_map"]
        names = sorted(wm)
        if case == "missing-shard":
            wm[names[0]] = "model-00009-of-00009.safetensors"
        elif case == "wrong-shard":
            first = wm[names[0]]
            other = next(n for n in names if wm[n] != first)
            wm[names[0]] = wm[other]
        elif case == "escaping-shard":
            wm[names[0]] = "../" + wm[names[0]]
        elif case == "bad-json":
            return '{"weight_map": {'
        elif case == "no-weight-map":
            del index["weight_map"]
        elif case == "tensor-in-two-shards":
            # a third shard, listed in the map, holding a name of shard 1
            shard1 = d / "model-00001-of-00002.safetensors"
            first = Header(shard1)
            name, info = next(iter(first.tensors.items()))
            raw = shard1.read_bytes()[first.data_offset + info["data_offsets"][0]:
                                      first.data_offset + info["data_offsets"][1]]
            write_safetensors(d / "extra.safetensors",
                              [(name, info["dtype"], info["shape"], raw),
                               ("extra.only", "U8", [1], b"\x00")])
            wm["extra.only"] = "extra.safetensors"
        return None

    d, index_path = _index_dir(tmp_path, gen_dir, mutate)
    for target in (d, index_path):
        r = fst("inspect", target)
        assert r.returncode == 2, (case, target, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
        if case == "tensor-in-two-shards":
            assert "two files" in r.stderr and "extra.safetensors" in r.stderr
        else:
            assert str(index_path) in r.stderr, r.stderr


def test_index_omits_tensors_warns(tmp_path, gen_dir):
    """Tensors in shards but not in weight_map are kept, with a warning
    (FST_LOG=error silences it)."""
    def mutate(index, d):
        del index["weight_map"][sorted(index["weight_map"])[0]]

    d, index_path = _index_dir(tmp_path, gen_dir, mutate)
    r = fst("inspect", "--json", d)
    assert r.returncode == 0
    assert "not in weight_map" in r.stderr and "kept" in r.stderr
    full = sum(len(e["tensors"]) for e in json.loads(r.stdout))
    assert full == len(json.loads(index_path.read_text())["weight_map"]) + 1
    quiet = fst("inspect", "--json", d, env={"FST_LOG": "error"})
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_directory_without_files(tmp_path):
    r = fst("inspect", tmp_path)
    assert r.returncode == 2 and str(tmp_path) in r.stderr


def test_shard_that_is_a_directory(tmp_path):
    """A directory named like a shard is an invalid checkpoint (2), not a
    usage error."""
    (tmp_path / "x.safetensors").mkdir()
    r = fst("inspect", tmp_path)
    assert r.returncode == 2 and "x.safetensors" in r.stderr and "directory" in r.stderr


# ------------------------------------------------------------- exit codes

def _valid(tmp_path, name):
    path = tmp_path / name
    stnp.save_file({"x": np.ones((2, 2), np.float32)}, str(path))
    return path


def test_exit_several_inputs(tmp_path):
    good1 = _valid(tmp_path, "good1.safetensors")
    good2 = _valid(tmp_path, "good2.safetensors")
    bad1 = write_raw(tmp_path / "bad1.safetensors", J({"a": U2}), bytes(5))
    bad2 = write_raw(tmp_path / "bad2.safetensors", J({"a": T("X9", [2], [0, 2])}), bytes(2))

    r = fst("inspect", good1, good2)
    assert r.returncode == 0 and r.stderr == ""
    assert "summary: 2 files, 2 tensors" in r.stdout

    r = fst("inspect", good1, bad1, good2)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad1) in lines[0]
    assert str(good1) in r.stdout and str(good2) in r.stdout

    r = fst("inspect", bad1, good1, bad2, good2)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2
    assert str(bad1) in lines[0] and str(bad2) in lines[1] and '"a"' in lines[1]

    rc, doc, err = inspect_json(bad1, good1, bad2, good2)
    assert rc == 2 and len(err.strip().splitlines()) == 2
    assert [e["ok"] for e in doc] == [False, True, False, True]
    assert [e["path"] for e in doc] == [str(p) for p in (bad1, good1, bad2, good2)]
    check_entry(doc[1], good1)
    check_entry(doc[3], good2)


def test_exit_unreadable_input(tmp_path):
    """A path that cannot be opened is an I/O failure (4), not an invalid
    file; mixed with an invalid file, the first failing input decides."""
    missing = tmp_path / "missing.safetensors"
    bad = write_raw(tmp_path / "bad.safetensors", J({"a": U2}), bytes(5))
    good = _valid(tmp_path, "good.safetensors")
    r = fst("inspect", missing)
    assert r.returncode == 4 and str(missing) in r.stderr
    r = fst("inspect", good, missing, bad)
    assert r.returncode == 4 and len(r.stderr.strip().splitlines()) == 2
    r = fst("inspect", bad, missing)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 2


@pytest.mark.parametrize("args", [["inspect"], ["inspect", "--json"], ["inspect", "--bogus", "x"],
                                  ["inspect", "-q", "x"], [], ["frobnicate"], ["gen"],
                                  ["gen", "a", "b"], ["gen", "x", "--size", "lots"],
                                  ["gen", "x", "--size", "0"], ["gen", "x", "--shards", "0"],
                                  ["gen", "x", "--shards", "100000"], ["gen", "x", "--seed", "-1"],
                                  ["gen", "--bogus", "x"]])
def test_exit_usage(tmp_path, args):
    args = [a if a not in ("x", "a", "b") else str(tmp_path / a) for a in args]
    r = fst(*args)
    assert r.returncode == 1, (args, r.stdout, r.stderr)
    assert r.stderr.strip(), "a usage error says why on stderr"
    assert r.stdout == ""
    assert not any((tmp_path / n).exists() for n in ("x", "a", "b"))


@pytest.mark.parametrize("args,words", [(["--help"], "usage: fst"), (["-h"], "usage: fst"),
                                        (["help"], "usage: fst"),
                                        (["inspect", "--help"], "usage: fst inspect"),
                                        (["inspect", "-h"], "usage: fst inspect"),
                                        (["gen", "--help"], "usage: fst gen"),
                                        (["--version"], "fst 0."), (["-V"], "fst 0.")])
def test_exit_help_version(args, words):
    r = fst(*args)
    assert r.returncode == 0 and r.stdout.startswith(words) and r.stderr == ""


def test_version_format():
    r = fst("--version")
    parts = r.stdout.split()  # fst VERSION (DISTRIBUTION)
    assert len(parts) == 3 and parts[0] == "fst" and parts[2] == "(fst-loader)"
    assert all(p.isdigit() for p in parts[1].split(".")) and parts[1].count(".") == 2


@pytest.mark.parametrize("spec,code,words", [("open:1", 4, "cannot open"),
                                             ("open:1:EACCES", 4, "Permission denied"),
                                             ("read:1", 4, "cannot read"),
                                             ("alloc:1+", 5, "out of memory")])
def test_exit_fault_injection(tmp_path, spec, code, words):
    """FST_FAULT makes system calls fail on purpose: the exit code follows
    the failure (4 I/O, 5 out of memory)."""
    good = _valid(tmp_path, "good.safetensors")
    r = fst("inspect", good, env={"FST_FAULT": spec})
    assert r.returncode == code, r.stderr
    assert words in r.stderr
    assert fst("inspect", good, env={"FST_FAULT": ""}).returncode == 0


def test_bad_fault_spec_is_reported_and_ignored(tmp_path):
    good = _valid(tmp_path, "good.safetensors")
    r = fst("inspect", good, env={"FST_FAULT": "nosuchsite:1"})
    assert r.returncode == 0
    assert "unknown fault site" in r.stderr


def test_text_output(tmp_path):
    """The human-readable listing names each tensor with its file offset and
    alignment, then a summary."""
    tensors = [("odd", "U8", [3], b"abc"), ("w", "F32", [2], np.ones(2, np.float32).tobytes())]
    path = write_safetensors(tmp_path / "t.safetensors", tensors, metadata={"k": "v"})
    r = fst("inspect", path)
    assert r.returncode == 0, r.stderr
    off = Header(path).data_offset
    lines = r.stdout.splitlines()
    assert lines[0] == f"{path}: 2 tensors, data at offset {off}"
    assert "metadata k = v" in lines[1]
    row = next(x for x in lines if x.split()[0:1] == ["w"])
    assert row.split()[1:] == ["F32", "[2]", "8", str(off + 3), "1"]
    assert "summary: 1 file, 2 tensors, 11 bytes" in r.stdout
    assert "F32=1" in r.stdout and "U8=1" in r.stdout
    assert "misaligned in the file: 1 for their dtype" in r.stdout
