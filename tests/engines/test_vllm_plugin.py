"""fst's vLLM plugin through vLLM's own classes: the entry point vLLM's
plugin loader finds, vLLM's register_model_loader and get_model_loader, its
DefaultModelLoader file discovery, its load_weights (with weight tracking),
its argument parser, and its distributed world group (two ranks on gloo)."""
import importlib.metadata
import os
import sys
import types

import pytest

torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")

from safetensors.torch import load_file, save_file  # noqa: E402

import fst  # noqa: E402
from fst.integrations import vllm as plugin  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _loader(extra=None):
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    return get_model_loader(LoadConfig(load_format="fst",
                                       model_loader_extra_config=dict(extra or {})))


def _iterate(ld, path):
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    return list(ld._get_weights_iterator(DefaultModelLoader.Source(str(path), None)))


def _reference(path):
    ref = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            ref.update(load_file(os.path.join(path, f)))
    return ref


def _assert_same(got, ref):
    assert sorted(got) == sorted(ref)
    for k, v in ref.items():
        g = got[k]
        assert g.dtype == v.dtype and tuple(g.shape) == tuple(v.shape), k
        assert g.cpu().reshape(-1).view(torch.uint8).tolist() == \
            v.reshape(-1).view(torch.uint8).tolist(), k


@pytest.fixture
def model_dir(tmp_path):
    """Ten shards named model-K-of-10 (so natural order differs from name
    order: 2 comes before 10), mixed dtypes, odd sizes."""
    d = tmp_path / "model"
    d.mkdir()
    g = torch.Generator().manual_seed(0)
    for k in range(1, 11):
        save_file({
            f"model.layers.{k}.w": torch.randn(33, 7, generator=g).to(torch.bfloat16),
            f"model.layers.{k}.scale": torch.randint(0, 255, (5,), dtype=torch.uint8,
                                                     generator=g),
            f"model.layers.{k}.f8": torch.randn(3, 4, generator=g).to(torch.float8_e4m3fn),
            f"model.layers.{k}.n": torch.tensor(k, dtype=torch.int64),
            f"model.layers.{k}.empty": torch.zeros(0, 3),
            f"model.layers.{k}.mask": torch.tensor([True, False, True]),
        }, str(d / f"model-{k}-of-10.safetensors"))
    return d


def test_entry_point_is_declared():
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    mine = [e for e in eps if e.name == "fst"]
    assert mine and mine[0].value == "fst.integrations.vllm:register"


def test_vllm_plugin_loader_registers_fst():
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    ld = _loader()
    assert isinstance(ld, DefaultModelLoader)
    assert type(ld).__name__ == "FstModelLoader"
    # registering again (vLLM loads plugins in every process, maybe twice)
    assert plugin.register() is type(ld)


def test_load_format_accepted_by_vllm_arguments(monkeypatch):
    # vLLM's argument defaults ask the platform for a device type, which a
    # machine without a GPU does not give: say it is the CPU
    from vllm.platforms import current_platform
    if not current_platform.device_type:
        monkeypatch.setattr(current_platform, "device_type", "cpu", raising=False)
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    p = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = p.parse_args(["--model", "x", "--load-format", "fst",
                         "--model-loader-extra-config", '{"threads": 4, "io": "pread"}'])
    ea = EngineArgs.from_cli_args(args)
    assert ea.load_format == "fst"
    from vllm.model_executor.model_loader import get_model_loader
    # the LoadConfig vLLM itself makes from the command line
    ld = get_model_loader(ea.create_load_config())
    assert type(ld).__name__ == "FstModelLoader"
    assert ld.fst_options == {"threads": 4, "io": "pread"}


def test_iterator_bytes_and_natural_shard_order(model_dir):
    got = _iterate(_loader({"threads": 2}), model_dir)
    _assert_same(dict(got), _reference(model_dir))
    shards = []
    for name, _ in got:
        k = int(name.split(".")[2])
        if not shards or shards[-1] != k:
            shards.append(k)
    assert shards == list(range(1, 11)), shards


def test_load_weights_into_preallocated_parameters(model_dir):
    """vLLM's own load_weights path: the model copies each tensor into its
    parameter, then vLLM checks every parameter was loaded."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    ref = _reference(model_dir)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for k, v in ref.items():
                self.register_parameter(k.replace(".", "_"),
                                        torch.nn.Parameter(torch.zeros_like(v),
                                                           requires_grad=False))

        def load_weights(self, weights):
            loaded = set()
            for name, t in weights:
                getattr(self, name.replace(".", "_")).data.copy_(t)
                loaded.add(name.replace(".", "_"))
            return loaded

    m = Model()
    cfg = types.SimpleNamespace(model=str(model_dir), revision=None, quantization=None,
                                is_moe=False, multimodal_config=None)
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        _loader().load_weights(m, cfg)
    for k, v in ref.items():
        p = getattr(m, k.replace(".", "_"))
        assert p.reshape(-1).view(torch.uint8).tolist() == v.reshape(-1).view(torch.uint8).tolist()


def test_index_filters_files(tmp_path):
    """vLLM's discovery: a consolidated file beside indexed shards is not
    read (the index decides), as with load format safetensors."""
    d = tmp_path / "m"
    d.mkdir()
    save_file({"a": torch.ones(3)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(4)}, str(d / "model-00002-of-00002.safetensors"))
    save_file({"a": torch.zeros(3), "b": torch.zeros(4)}, str(d / "consolidated.safetensors"))
    (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", '
        '"b": "model-00002-of-00002.safetensors"}}')
    got = dict(_iterate(_loader(), d))
    assert sorted(got) == ["a", "b"]
    assert torch.equal(got["a"], torch.ones(3)) and torch.equal(got["b"], torch.ones(4))


def test_encoder_only_filter(tmp_path):
    """--mm-encoder-only: shards of language-model weights alone are not
    read; a filter that leaves no file is vLLM's own error, where fst's
    iterator once yielded nothing (the failure came later, as parameters
    left unloaded)."""
    d = tmp_path / "mm"
    d.mkdir()
    save_file({"vision.a": torch.ones(3)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"language_model.b": torch.ones(4)}, str(d / "model-00002-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"vision.a": "model-00001-of-00002.safetensors", '
        '"language_model.b": "model-00002-of-00002.safetensors"}}')
    ld = _loader()
    ld._encoder_only_lm_prefixes = ("language_model.",)
    assert sorted(dict(_iterate(ld, d))) == ["vision.a"]
    ld._encoder_only_lm_prefixes = ("language_model.", "vision.")
    with pytest.raises(RuntimeError, match="removed all weight files"):
        _iterate(ld, d)


def test_local_expert_ids_are_not_read(tmp_path, monkeypatch):
    d = tmp_path / "moe"
    d.mkdir()
    t = {}
    for e in range(4):
        t[f"model.layers.0.mlp.experts.{e}.w1.weight"] = torch.full((4, 4), float(e))
        t[f"model.layers.0.mlp.experts.{e}.w1.weight_scale"] = torch.tensor([float(e)])
    t["model.layers.0.mlp.gate.weight"] = torch.ones(4, 4)
    save_file(t, str(d / "model.safetensors"))
    asked = []
    real = fst.iter_tensors

    def spy(path, *a, **k):
        asked.append(k.get("names"))
        return real(path, *a, **k)

    monkeypatch.setattr(fst, "iter_tensors", spy)
    ld = _loader()
    ld.local_expert_ids = {1, 2}
    got = dict(_iterate(ld, d))
    keep = {n for n in t if not (".experts.0.w1.weight" == n[-21:] or n.endswith(
        "experts.0.w1.weight") or n.endswith("experts.3.w1.weight"))}
    assert set(got) == keep
    # other ranks' expert weights never reach fst's reader
    assert asked and all("model.layers.0.mlp.experts.3.w1.weight" not in n for n in asked)
    assert all(torch.equal(got[n], t[n]) for n in keep)


def test_extra_config_reaches_fst(model_dir, monkeypatch):
    seen = []
    real = fst.iter_tensors

    def spy(path, *a, **k):
        seen.append(k)
        return real(path, *a, **k)

    monkeypatch.setattr(fst, "iter_tensors", spy)
    opts = {"threads": 3, "staging_bytes": 1 << 22, "chunk_bytes": 1 << 16, "io": "uring",
            "gds": "off", "readahead_bytes": 1 << 20}
    _assert_same(dict(_iterate(_loader(opts), model_dir)), _reference(model_dir))
    assert seen and all(all(k[o] == v for o, v in opts.items()) for k in seen)


@pytest.mark.parametrize("extra, words", [
    ({"threads": -1}, "'threads'"), ({"threads": "4"}, "'threads'"),
    ({"threads": True}, "'threads'"), ({"io": "mmap"}, "'io'"), ({"gds": "yes"}, "'gds'"),
    ({"readahead_bytes": -1}, "'readahead_bytes'"), ({"threads": 65}, "'threads'.*0..64"),
    ({"chunk_bytes": 2 ** 64}, "'chunk_bytes'"),
])
def test_bad_extra_config(extra, words):
    with pytest.raises(ValueError, match=words):
        _loader(extra)


def test_extra_config_that_is_not_a_dict():
    """(vLLM's LoadConfig lets a config object through)"""
    with pytest.raises(ValueError, match="expected a dict"):
        plugin.parse_options(["threads", 4])


def test_broadcast_float8_that_torch_lacks_is_the_readers_form(tmp_path, monkeypatch):
    """A float8 dtype this torch lacks reaches the other ranks as the reader
    has it (bytes of the file's shape), where it was taken for F4/F6 and cut
    into 6-bit rows (a shape error on every rank but the reader)."""
    import fst._tensors as ft
    data = bytes(range(12))
    _write_raw(tmp_path / "e8.safetensors", [("scale", "F8_E8M0", [3, 4], data)])
    monkeypatch.setattr(ft, "_torch_dtypes", lambda: {})
    monkeypatch.setattr(fst, "_torch_dtypes", lambda: {})
    reader = fst.load(str(tmp_path / "e8.safetensors"), "cpu")["scale"]
    plugin._fill_plain()
    got = plugin._typed(torch.tensor(list(data), dtype=torch.uint8), "F8_E8M0", [3, 4], "cpu")
    assert got.dtype == reader.dtype == torch.uint8 and got.shape == reader.shape == (3, 4)
    assert torch.equal(got, reader)


def test_load_config_device_is_where_the_weights_go(model_dir, monkeypatch):
    """LoadConfig.device, where set, is where vLLM makes the model: fst
    loads there, not onto the worker's GPU (a GPU stands in here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert plugin._device() == "cuda:3"
    assert plugin._device("cpu") == plugin._device(torch.device("cpu")) == "cpu"
    assert plugin._device("cuda") == "cuda:3" and plugin._device("cuda:1") == "cuda:1"
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    seen = []
    real = plugin.fst_weights_iterator

    def spy(*a, **k):
        seen.append(k.get("load_device"))
        return real(*a, **k)
    monkeypatch.setattr(plugin, "fst_weights_iterator", spy)
    got = dict(_iterate(get_model_loader(LoadConfig(load_format="fst", device="cpu")),
                        model_dir))
    assert seen == ["cpu"]
    assert all(t.device.type == "cpu" for t in got.values())
    _assert_same(got, _reference(model_dir))


def test_extra_config_none_is_refused_as_vllm_refuses_it():
    """vLLM's own loader refuses None; fst's once took it for no options."""
    with pytest.raises(ValueError, match="expected a dict"):
        plugin.parse_options(None)


def test_torchao_strategy_goes_to_vllms_own_iterator(model_dir):
    """safetensors_load_strategy "torchao" (load_weights sets it for a
    torchao-serialized checkpoint): vLLM's own iterator rebuilds torchao's
    tensors, so fst hands the source to it, and the outcome is vLLM's (here,
    without torchao, its error); fst once yielded the plain tensors."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins
    load_general_plugins()

    def outcome(fmt):
        ld = get_model_loader(LoadConfig(load_format=fmt, safetensors_load_strategy="torchao"))
        try:
            return dict(_iterate(ld, model_dir))
        except Exception as e:  # noqa: BLE001
            return e
    want, got = outcome("safetensors"), outcome("fst")
    if isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want), (got, want)
    else:
        _assert_same(got, want)


def test_many_shards_under_a_low_descriptor_limit(tmp_path):
    """120 shards with 48 descriptors to spare: the files are opened one at
    a time, as vLLM's own iterators open them (every shard was held open
    from the start: "Too many open files")."""
    import resource
    d = tmp_path / "many"
    d.mkdir()
    for k in range(1, 121):
        save_file({f"w{k}": torch.full((3,), float(k))}, str(d / f"model-{k}-of-120.safetensors"))
    ref = _reference(d)
    ld = _loader({"threads": 2})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 48, hard))
    try:
        got = dict(_iterate(ld, d))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    _assert_same(got, ref)


def test_a_folder_named_like_a_shard_is_refused(model_dir):
    """vLLM's discovery lists every *.safetensors name, folders too; its own
    iterator fails on a folder, and so does fst's (which opens a folder as
    a checkpoint, and read this one's files)."""
    extra = model_dir / "extra.safetensors"
    extra.mkdir()
    save_file({"stray": torch.ones(2)}, str(extra / "x.safetensors"))
    with pytest.raises(IsADirectoryError, match="extra.safetensors"):
        _iterate(_loader(), model_dir)


def test_a_file_that_is_not_safetensors_is_named(model_dir):
    """A model's own patterns may find other files (BGE-M3 asks for
    sparse_linear.pt beside its weights): fst names the file and the load
    format that reads it, where a header error came from inside the .pt."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    torch.save({"sparse_linear.weight": torch.ones(2)}, str(model_dir / "sparse_linear.pt"))
    src = DefaultModelLoader.Source(str(model_dir), None,
                                    allow_patterns_overrides=["sparse_linear.pt"])
    with pytest.raises(plugin.VllmPluginError, match="sparse_linear.pt is not one.*'auto'"):
        list(_loader()._get_weights_iterator(src))


def test_unknown_extra_config_is_vllms_error():
    with pytest.raises(ValueError, match="Unexpected extra config keys"):
        _loader({"thread": 4})


def test_changed_loader_api_is_named(monkeypatch):
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    monkeypatch.delattr(DefaultModelLoader, "_prepare_weights")
    with pytest.raises(plugin.VllmPluginError, match=f"vLLM {vllm.__version__}.*_prepare_weights"):
        plugin.make_loader_class()


def test_vllm_runs_on_the_safetensors_drop_in(run_python_here, model_dir):
    """docs/python.md's rename: with fst.compat.safetensors in place of
    safetensors, vLLM's own weight utilities import (they take safe_open
    and _TYPES from safetensors.torch: an ImportError once) and its
    safetensors iterator reads through fst."""
    r = run_python_here(
        "import sys, fst.compat.safetensors, fst.compat.safetensors.torch\n"
        "for n in ('', '.torch'):\n"
        "    sys.modules['safetensors' + n] = sys.modules['fst.compat.safetensors' + n]\n"
        "import glob, torch\n"
        "from vllm.model_executor.model_loader import weight_utils as wu\n"
        "assert wu.safe_open is fst.compat.safetensors.safe_open\n"
        f"files = sorted(glob.glob({str(model_dir)!r} + '/*.safetensors'))\n"
        "got = dict(wu.safetensors_weights_iterator(files, False))\n"
        "ref = {}\n"
        "for f in files:\n"
        "    ref.update(fst.compat.safetensors.torch.load_file(f))\n"
        "assert sorted(got) == sorted(ref) and len(got) == 60, len(got)\n"
        "assert all(torch.equal(got[k].view(-1).view(torch.uint8), "
        "ref[k].view(-1).view(torch.uint8)) for k in ref if ref[k].numel())\n"
        "print('OK')\n")
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr[-3000:]


def test_missing_vllm_is_named(run_python_here):
    r = run_python_here("import sys; sys.modules['vllm'] = None\n"
                        "from fst.integrations import vllm as p\n"
                        "try:\n    p.register()\nexcept p.VllmPluginError as e:\n"
                        "    print('ERR', e)\n")
    assert "ERR fst's vLLM plugin needs vllm (written for vLLM 0.33)" in r.stdout, r.stderr


@pytest.fixture
def run_python_here():
    import subprocess

    def run(code):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
    return run


def test_tensor_parallel_reads_each_file_once(model_dir, free_port, run_ranks):
    """Two ranks in vLLM's world group (gloo, CPU): each file is read by one
    rank, every rank gets every tensor, the progress bar is rank 0's."""
    out = run_ranks(os.path.join(HERE, "vllm_rank.py"), 2, model_dir, free_port)
    reads = []
    for r, p in enumerate(out):
        assert p.returncode == 0, p.stderr[-3000:]
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert lines, p.stdout[-2000:]
        _, equal, files = lines[-1].split(" ", 2)
        assert equal == "equal", lines
        reads.append(set(files.split(",")))
        assert ("Loading safetensors with fst" in p.stderr) == (r == 0)
    assert not reads[0] & reads[1]
    assert reads[0] | reads[1] == {f"model-{k}-of-10.safetensors" for k in range(1, 11)}


def test_draft_model_on_the_last_pipeline_stage_alone(model_dir, free_port, run_ranks,
                                                      tmp_path, monkeypatch):
    """Two pipeline stages; only the last loads, as vLLM loads a draft model
    for speculative decoding: it reads every file itself and gets every
    tensor. Over the world group it once waited in a gather for a rank that
    never loads."""
    monkeypatch.setenv("FST_TEST_PP_DONE", str(tmp_path))
    out = run_ranks(os.path.join(HERE, "vllm_rank.py"), 2, model_dir, free_port, "ppdraft",
                    timeout=90)
    for p in out:
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    last = [ln for ln in out[1].stdout.splitlines() if ln.startswith("RESULT ")]
    assert last, out[1].stdout[-2000:]
    _, equal, files = last[-1].split(" ", 2)
    assert equal == "equal", last
    assert set(files.split(",")) == {f"model-{k}-of-10.safetensors" for k in range(1, 11)}
    assert any(ln == "RESULT skipped" for ln in out[0].stdout.splitlines()), out[0].stdout


def _write_raw(path, tensors):
    """A safetensors file of (name, dtype, shape, bytes), in that order:
    sub-byte dtypes (F4, F6) that torch cannot save."""
    import json
    import struct
    header, off = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors))


@pytest.fixture
def moe_dir(tmp_path):
    """Three shards of a mixture of experts: four experts a layer, each with
    a BF16 weight, F4 blocks whose rows are whole bytes ([4, 6]) and F4 and
    F6 ones whose rows are not (flat), and a replicated gate."""
    d = tmp_path / "moe"
    d.mkdir()
    g = torch.Generator().manual_seed(1)

    def raw(n):
        return bytes(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).tolist())

    for k in range(1, 4):
        tensors = []
        for e in range(4):
            p = f"model.layers.{k}.mlp.experts.{e}."
            w = torch.randn(4, 6, generator=g).to(torch.bfloat16)
            tensors += [(p + "w1.weight", "BF16", [4, 6], w.view(torch.uint8).numpy().tobytes()),
                        (p + "w1.blocks", "F4", [4, 6], raw(12)),
                        (p + "w2.blocks", "F4", [2, 3], raw(3)),
                        (p + "w3.blocks", "F6_E2M3", [4, 2], raw(6))]
        gate = torch.randn(4, 4, generator=g)
        tensors.append((f"model.layers.{k}.mlp.gate.weight", "F32", [4, 4],
                        gate.numpy().tobytes()))
        _write_raw(d / f"model-{k}-of-3.safetensors", tensors)
    return str(d)


def test_expert_parallel_ranks_get_their_own_experts(moe_dir, free_port, run_ranks):
    """Each rank wants other experts: a file's reader carries what any rank
    wants, and each rank gets exactly its own, with the dtypes and shapes
    fst gives in one process (F4 rows of whole bytes as float4_e2m1fn_x2,
    the others flat). The reader's list once stood for every rank's: the
    other rank got the reader's experts under its own experts' names."""
    out = run_ranks(os.path.join(HERE, "vllm_rank.py"), 2, moe_dir, free_port, "ep")
    for r, p in enumerate(out):
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert lines and lines[-1].split()[1] == "equal", (r, p.stdout[-2000:])


def test_a_read_that_fails_on_one_rank_fails_every_rank(model_dir, free_port, run_ranks):
    """Rank 1's first data read fails: it raises its own error, and rank 0
    one naming rank 1, before any broadcast, instead of waiting for bytes
    that never come."""
    out = run_ranks(os.path.join(HERE, "vllm_rank.py"), 2, model_dir, free_port, "fail",
                    timeout=120)
    said = []
    for p in out:
        assert p.returncode == 3, p.stdout[-2000:] + p.stderr[-3000:]
        said.append(next(ln for ln in p.stdout.splitlines() if ln.startswith("FAILED ")))
    assert "read of" in said[1], said
    assert "rank 1 could not read its file" in said[0] and "read of" in said[0], said
