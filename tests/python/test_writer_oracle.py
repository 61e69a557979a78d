"""Files fst writes must load in the reference safetensors reader with equal
bytes: checkpoints from `fst gen` (seeded, several shard counts, aligned and
misaligned) and, when libfst.so is at hand, files from the writer API called
directly through ctypes."""
import ctypes
import hashlib
import json
import re

import numpy as np
import pytest
from safetensors import safe_open

from fsttest import (
    DTYPE_BITS,
    FST_LIB,
    NUMPY_DTYPES,
    Header,
    check_entry,
    fst,
    inspect_ok,
    random_array,
    reference_raw,
    reference_view,
    tensor_nbytes,
)

CONFIGS = [
    dict(shards=1, seed=0, size="4MiB", misaligned=False),
    dict(shards=3, seed=7, size="8MiB", misaligned=False),
    dict(shards=2, seed=0, size="4MiB", misaligned=True),
    dict(shards=5, seed=11, size="4MiB", misaligned=True),
]
IDS = [f"{c['shards']}shards-seed{c['seed']}-{c['size']}{'-misaligned' if c['misaligned'] else ''}"
       for c in CONFIGS]


def shards_of(d):
    index = json.loads((d / "model.safetensors.index.json").read_text())
    files = sorted(d.glob("*.safetensors"))
    return index, files


def tensors_of(d):
    """{name: (shard Path, Header, tensor info)} over all shards."""
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        h = Header(f)
        for name, info in h.tensors.items():
            assert name not in out, f"{name} in {out[name][0].name} and {f.name}"
            out[name] = (f, h, info)
    return out


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_reference_opens_every_shard(gen_dir, cfg):
    d = gen_dir(**cfg)
    index, files = shards_of(d)
    n = cfg["shards"]
    assert [f.name for f in files] == [f"model-{k:05d}-of-{n:05d}.safetensors"
                                       for k in range(1, n + 1)]
    assert not list(d.glob("*.tmp")), "a temporary file was left behind"
    for f in files:
        h = Header(f)
        view, meta, _ = reference_view(f)
        assert len(view) >= 1, f"{f.name} holds no tensor"
        assert meta == {"format": "pt"}
        assert {k: (v["dtype"], v["shape"]) for k, v in h.tensors.items()} == \
            {k: tuple(v) for k, v in view.items()}
        # the header is one JSON object padded with spaces only
        assert h.text.startswith("{") and h.text.rstrip(" ").endswith("}")


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_index_covers_every_tensor_once(gen_dir, cfg):
    d = gen_dir(**cfg)
    index, files = shards_of(d)
    assert set(index) == {"metadata", "weight_map"}
    all_tensors = tensors_of(d)
    wm = index["weight_map"]
    assert set(wm) == set(all_tensors), "weight_map and the shards name different tensors"
    for name, (f, _, _) in all_tensors.items():
        assert wm[name] == f.name, name
    assert set(wm.values()) == {f.name for f in files}
    total = sum(i["data_offsets"][1] - i["data_offsets"][0] for _, _, i in all_tensors.values())
    assert index["metadata"]["total_size"] == total
    # fst itself reads the index back with the same table
    doc = inspect_ok(d)
    assert sorted(t["name"] for e in doc for t in e["tensors"]) == sorted(wm)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_bytes_equal_in_the_reference(gen_dir, cfg):
    """Every tensor's bytes as the reference reads them are the file's bytes
    at data_offset + begin: F32 and U8 through safe_open(framework="np"),
    every dtype (BF16 included) through safetensors.deserialize."""
    d = gen_dir(**cfg)
    seen_dtypes = set()
    for f in sorted(d.glob("*.safetensors")):
        blob = f.read_bytes()
        h = Header(f)
        raw = reference_raw(f)
        assert set(raw) == set(h.tensors)
        with safe_open(str(f), framework="np") as sf:
            for name, info in h.tensors.items():
                b, e = info["data_offsets"]
                mine = blob[h.data_offset + b:h.data_offset + e]
                dtype, shape, payload = raw[name]
                assert (dtype, shape) == (info["dtype"], info["shape"])
                assert payload == mine, name
                seen_dtypes.add(dtype)
                if dtype in ("F32", "U8"):
                    arr = sf.get_tensor(name)
                    assert arr.dtype == NUMPY_DTYPES[dtype] and list(arr.shape) == shape
                    assert arr.tobytes() == mine, name
                    if dtype == "F32":  # norms near one
                        assert np.all((arr >= 1.0) & (arr < 2.0)), name
                if dtype == "BF16":  # finite values, |v| < 2
                    bits = np.frombuffer(mine, dtype="<u2")
                    exp = (bits >> 7) & 0xFF
                    assert np.all((exp >= 120) & (exp <= 127)), name
    assert seen_dtypes == ({"BF16", "F32", "U8"} if cfg["misaligned"] else {"BF16", "F32"})


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_inspect_agrees_with_reference(gen_dir, cfg):
    d = gen_dir(**cfg)
    for entry in inspect_ok(d):
        check_entry(entry, compare_bytes="numpy")


def test_tensor_contents_are_distinct(gen_dir):
    """The generator mixes the tensor's index into every value: no two
    tensors (even of one shape) hold the same bytes."""
    d = gen_dir(**CONFIGS[1])
    digests = {}
    for f in sorted(d.glob("*.safetensors")):
        for name, (_, _, data) in reference_raw(f).items():
            digests.setdefault(hashlib.sha256(data).hexdigest(), []).append(name)
    dups = [v for v in digests.values() if len(v) > 1]
    assert not dups


def _file_hashes(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("misaligned", [False, True])
def test_same_seed_same_bytes(gen_dir, misaligned):
    a = gen_dir(shards=3, seed=42, size="2MiB", misaligned=misaligned)
    b = gen_dir(shards=3, seed=42, size="2MiB", misaligned=misaligned, tag="-again")
    assert a != b
    ha, hb = _file_hashes(a), _file_hashes(b)
    assert len(ha) == 4 and ha == hb


def test_different_seed_different_bytes(gen_dir):
    a = gen_dir(shards=3, seed=42, size="2MiB")
    b = gen_dir(shards=3, seed=43, size="2MiB")
    # same layout: the headers and the index are identical ...
    assert (a / "model.safetensors.index.json").read_bytes() == \
        (b / "model.safetensors.index.json").read_bytes()
    for fa in sorted(a.glob("*.safetensors")):
        fb = b / fa.name
        ha, hb = Header(fa), Header(fb)
        assert ha.text == hb.text
        # ... but every tensor's data differs
        ra, rb = reference_raw(fa), reference_raw(fb)
        for name in ra:
            assert ra[name][2] != rb[name][2], name


def test_seed_zero_is_the_default(gen_dir, tmp_path):
    a = gen_dir(shards=2, seed=0, size="1MiB")
    out = tmp_path / "default"
    r = fst("gen", out, "--size", "1MiB", "--shards", "2")
    assert r.returncode == 0, r.stderr
    assert _file_hashes(a) == _file_hashes(out)


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c["misaligned"]],
                         ids=[i for c, i in zip(CONFIGS, IDS) if c["misaligned"]])
def test_misaligned_layout(gen_dir, cfg):
    """--misaligned: each data section starts at 8 mod 16, every
    `.mlp.scales` tensor is U8 of odd size, and the tensor after it in the
    file is at an odd offset."""
    d = gen_dir(**cfg)
    scales = 0
    odd_after = 0
    for f in sorted(d.glob("*.safetensors")):
        h = Header(f)
        assert h.data_offset % 16 == 8, f.name
        order = sorted(h.tensors.items(), key=lambda kv: kv[1]["data_offsets"])
        for i, (name, info) in enumerate(order):
            if name.endswith(".mlp.scales"):
                scales += 1
                assert info["dtype"] == "U8" and len(info["shape"]) == 1
                b, e = info["data_offsets"]
                assert (e - b) % 2 == 1 and e - b == info["shape"][0]
                if i + 1 < len(order):
                    nb = order[i + 1][1]["data_offsets"][0]
                    odd_after += (h.data_offset + nb) % 2
    layers = len({m.group(1) for m in (re.match(r"model\.layers\.(\d+)\.", n)
                                       for n in json.loads((d / "model.safetensors.index.json")
                                                           .read_text())["weight_map"]) if m})
    assert scales == layers >= 1
    assert odd_after >= 1


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if not c["misaligned"]],
                         ids=[i for c, i in zip(CONFIGS, IDS) if not c["misaligned"]])
def test_aligned_layout(gen_dir, cfg):
    """Without --misaligned every tensor sits at a multiple of its element
    size in the file, and no scales are written."""
    d = gen_dir(**cfg)
    for f in sorted(d.glob("*.safetensors")):
        h = Header(f)
        assert h.data_offset % 8 == 0
        for name, info in h.tensors.items():
            assert not name.endswith(".mlp.scales")
            assert (h.data_offset + info["data_offsets"][0]) % (DTYPE_BITS[info["dtype"]] // 8) == 0


def test_shard_count_clamped_to_tensor_count(gen_dir):
    """More shards than tensors: one tensor per file, named -of-<count>."""
    d = gen_dir(shards=1000, size="1MiB")
    index, files = shards_of(d)
    n = len(index["weight_map"])
    assert len(files) == n
    assert files[-1].name == f"model-{n:05d}-of-{n:05d}.safetensors"
    for f in files:
        view, _, _ = reference_view(f)
        assert len(view) == 1


def test_model_shape(gen_dir):
    """The decoder-LLM layout: embedding, per-layer norms/attention/MLP in
    BF16 and F32, final norm and lm_head; total near --size."""
    d = gen_dir(**CONFIGS[1])
    all_tensors = tensors_of(d)
    names = set(all_tensors)
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= names
    per_layer = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                 "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                 "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                 "mlp.down_proj.weight"]
    layers = sorted({int(n.split(".")[2]) for n in names if n.startswith("model.layers.")})
    assert layers == list(range(len(layers))) and layers
    for layer in layers:
        for suffix in per_layer:
            name = f"model.layers.{layer}.{suffix}"
            assert name in names
            want = "F32" if "norm" in suffix else "BF16"
            assert all_tensors[name][2]["dtype"] == want, name
    total = json.loads((d / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    assert 0.5 * 8 * 2**20 <= total <= 1.5 * 8 * 2**20


def test_gen_output_message_and_existing_dir(gen_dir, tmp_path):
    out = tmp_path / "g"
    out.mkdir()  # an existing directory is fine
    r = fst("gen", out, "--size", "1MiB", "--shards", "2", "--seed", "5")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith(f"wrote {out}: 2 shards, ")
    r = fst("gen", out / "new-parent" / "x", "--size", "1MiB")  # parents are made
    assert r.returncode == 0 and (out / "new-parent" / "x" / "model.safetensors.index.json").exists()
    (out / "a-file").write_bytes(b"")
    r = fst("gen", out / "a-file" / "x", "--size", "1MiB")  # a file where a directory must be
    assert r.returncode == 4 and "cannot create directory" in r.stderr


# ------------------------------------------------ the writer API via ctypes

class FstError(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("sys_errno", ctypes.c_int),
                ("backend_code", ctypes.c_int), ("message", ctypes.c_char * 1024)]


class WriterOpts(ctypes.Structure):
    # struct fst_writer_opts of include/fst.h
    _fields_ = [("struct_size", ctypes.c_size_t), ("data_align", ctypes.c_uint32),
                ("header_extra", ctypes.c_uint32), ("order", ctypes.c_int)]


@pytest.fixture(scope="module")
def lib():
    if not FST_LIB.is_file():
        pytest.skip(f"libfst.so not found at {FST_LIB} (set FST_LIB)")
    lib = ctypes.CDLL(str(FST_LIB))
    lib.fst_dtype_from_name.argtypes = [ctypes.c_char_p]
    lib.fst_dtype_from_name.restype = ctypes.c_int
    lib.fst_writer_opts_init.argtypes = [ctypes.POINTER(WriterOpts)]
    lib.fst_writer_new.argtypes = [ctypes.POINTER(WriterOpts), ctypes.POINTER(ctypes.c_void_p),
                                   ctypes.POINTER(FstError)]
    lib.fst_writer_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                   ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64),
                                   ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(FstError)]
    lib.fst_writer_metadata.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                        ctypes.POINTER(FstError)]
    lib.fst_writer_finish.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(FstError)]
    lib.fst_writer_free.argtypes = [ctypes.c_void_p]
    return lib


def write_with_lib(lib, path, tensors, metadata=(), data_align=8, header_extra=0, order=0):
    opts = WriterOpts()
    lib.fst_writer_opts_init(ctypes.byref(opts))
    assert opts.struct_size == ctypes.sizeof(WriterOpts), "fst_writer_opts changed"
    opts.data_align, opts.header_extra, opts.order = data_align, header_extra, order
    err = FstError()
    w = ctypes.c_void_p()
    assert lib.fst_writer_new(ctypes.byref(opts), ctypes.byref(w), ctypes.byref(err)) == 0, \
        err.message
    keep = []
    try:
        for k, v in metadata:
            assert lib.fst_writer_metadata(w, k.encode(), v.encode(), ctypes.byref(err)) == 0
        for name, dtype, shape, raw in tensors:
            dims = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
            buf = ctypes.create_string_buffer(raw, max(len(raw), 1))
            keep.append(buf)
            code = lib.fst_dtype_from_name(dtype.encode())
            rc = lib.fst_writer_add(w, name.encode(), code, len(shape), dims, buf, len(raw),
                                    ctypes.byref(err))
            assert rc == 0, err.message
        rc = lib.fst_writer_finish(w, str(path).encode(), ctypes.byref(err))
        assert rc == 0, err.message
    finally:
        lib.fst_writer_free(w)
    return path


@pytest.mark.parametrize("order", [0, 1], ids=["given", "alignment"])
@pytest.mark.parametrize("align,extra", [(8, 0), (16, 8), (4096, 0), (64, 24)])
def test_writer_api_every_dtype(lib, tmp_path, order, align, extra):
    """Every dtype (scalars, empty and odd-sized tensors too), metadata, in
    the given order or largest-alignment first: the reference reads the
    same names, dtypes, shapes, metadata and bytes."""
    rng = np.random.default_rng(order * 100 + align + extra)
    tensors = []
    for dtype, bits in sorted(DTYPE_BITS.items()):
        shapes = [[5], [2, 3], [0, 4], []] if bits >= 8 else [[8], [4, 4], [0, 4]]
        for j, shape in enumerate(shapes):
            if dtype in NUMPY_DTYPES:
                raw = random_array(rng, NUMPY_DTYPES[dtype], tuple(shape)).tobytes()
            else:
                raw = rng.integers(0, 256, tensor_nbytes(dtype, shape), dtype=np.uint8).tobytes()
            tensors.append((f"{dtype}.{j}", dtype, shape, raw))
    tensors.append(("odd.scales", "U8", [13], bytes(range(13))))
    meta = [("format", "np"), ("\u00e9t\u00e9", "\u65e5\u672c"), ("empty", "")]
    path = write_with_lib(lib, tmp_path / "w.safetensors", tensors, meta, align, extra, order)

    h = Header(path)
    assert h.data_offset % align == extra % align
    assert h.data_offset >= 8 + len(h.text.rstrip(" ")) + extra
    view, ref_meta, _ = reference_view(path)
    assert ref_meta == dict(meta)
    raw = reference_raw(path)
    want = {n: (d, s, b) for n, d, s, b in tensors}
    assert raw == want
    assert view == {n: (d, s) for n, (d, s, _) in want.items()}
    offsets = [h.tensors[n]["data_offsets"][0] for n, *_ in tensors]
    if order == 0:
        assert offsets == sorted(offsets), "FST_ORDER_GIVEN keeps the add order"
    else:
        # largest power-of-two divisor of the size first (empty tensors
        # count as the most aligned), then by name
        def key(t):
            n, nbytes = t[0], len(t[3])
            tz = 64 if nbytes == 0 else (nbytes & -nbytes).bit_length() - 1
            return (-tz, n)
        want_order = [t[0] for t in sorted(tensors, key=key)]
        got_order = [n for n, _ in sorted(h.tensors.items(),
                                          key=lambda kv: (kv[1]["data_offsets"], kv[0]))]
        # empty tensors share offsets with their neighbours: compare the
        # non-empty ones strictly and the empty ones as a set
        assert [n for n in got_order if want[n][2]] == [n for n in want_order if want[n][2]]
        first_nonempty = next(n for n in want_order if want[n][2])
        assert all(h.tensors[n]["data_offsets"] == [0, 0] for n in want_order if not want[n][2])
        assert h.tensors[first_nonempty]["data_offsets"][0] == 0
    doc = inspect_ok(path)
    check_entry(doc[0], path, compare_bytes="all")


def test_writer_api_no_tensors(lib, tmp_path):
    path = write_with_lib(lib, tmp_path / "empty.safetensors", [], [("k", "v")])
    view, meta, _ = reference_view(path)
    assert view == {} and meta == {"k": "v"}
    path = write_with_lib(lib, tmp_path / "nothing.safetensors", [])
    view, meta, _ = reference_view(path)
    assert view == {} and not meta
    assert Header(path).dict == {}


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}], ids=["none", "empty", "one"])
def test_metadata_as_the_reference_writes_and_reads_it(fst_pkg, tmp_path, metadata):
    """save(metadata={}) writes "__metadata__":{} as the reference does (it
    once left it out), and a file's {} reads back as {}, its absence as
    None, through fst.Checkpoint and the safetensors compat layer alike."""
    from safetensors.numpy import save
    from fst.compat.safetensors import safe_open as fst_open
    t = {"a": np.arange(3, dtype=np.float32)}
    want = save(t, metadata=metadata)
    assert fst_pkg.save(t, metadata=metadata) == want
    p = tmp_path / "m.safetensors"
    p.write_bytes(want)
    with safe_open(str(p), "np") as f:
        ref = f.metadata()
    assert ref == metadata
    assert fst_pkg.Checkpoint(str(p)).metadata() == ref
    with fst_open(str(p), "np") as f:
        assert f.metadata() == ref
