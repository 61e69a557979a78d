"""transformers loads through fst's reference API: from_pretrained of a
sharded checkpoint with fst.compat.safetensors put where transformers
imports safetensors' functions gives the same logits, bit for bit, as
from_pretrained with the real safetensors, and fst (libfst's load) did the
loading. save_pretrained through fst writes the reference's bytes."""
import collections
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
fst = pytest.importorskip("fst")

import transformers.integrations.accelerate as hf_accelerate  # noqa: E402
import transformers.modeling_layers as hf_layers  # noqa: E402
import transformers.modeling_utils as hf_modeling  # noqa: E402
import transformers.pytorch_utils as hf_pytorch_utils  # noqa: E402

import fst.compat.safetensors as fst_st  # noqa: E402
import fst.compat.safetensors.torch as fst_st_torch  # noqa: E402

# Where transformers 5 holds safetensors' functions, bound at its import
# (`from safetensors import safe_open` and the like), and what replaces each.
# modeling_utils.safe_open is the call from_pretrained makes for every shard,
# with backend="mmap"; _safe_load_bytes is its path for files it reads whole
# (disable_mmap); the others serve MTP weights, disk offload and saving
# (storage_ptr and storage_size find tied weights).
LOAD_TARGETS = [
    (hf_modeling, "safe_open", fst_st.safe_open),
    (hf_modeling, "_safe_load_bytes", fst_st_torch.load),
    (hf_layers, "safe_open", fst_st.safe_open),
    (hf_accelerate, "safe_open", fst_st.safe_open),
]
SAVE_TARGETS = [
    (hf_modeling, "safe_save_file", fst_st_torch.save_file),
    (hf_accelerate, "save_file", fst_st_torch.save_file),
    (hf_pytorch_utils, "storage_ptr", fst_st_torch.storage_ptr),
    (hf_pytorch_utils, "storage_size", fst_st_torch.storage_size),
]


def patch_in_fst(monkeypatch, targets):
    """Put fst's functions in place, each counting its calls and keeping
    the keyword arguments it was called with."""
    calls = collections.defaultdict(list)
    for module, name, fn in targets:
        key = f"{module.__name__}.{name}"

        def counted(*args, _fn=fn, _key=key, **kwargs):
            calls[_key].append(kwargs)
            return _fn(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


def count_libfst_loads(monkeypatch):
    loads = []
    real = fst._fst.load

    def counting(*args, **kwargs):
        loads.append(kwargs.get("io"))
        return real(*args, **kwargs)

    monkeypatch.setattr(fst._fst, "load", counting)
    return loads


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A 2-layer Llama with random weights, saved by the real safetensors
    in several shards with an index."""
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    d = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(d, max_shard_size="100KB")
    shards = sorted(d.glob("*.safetensors"))
    assert len(shards) >= 3, shards
    assert (d / "model.safetensors.index.json").exists()
    return d


INPUT = torch.tensor([[1, 17, 42, 99, 3, 64, 127, 5]])


def logits(model):
    model.eval()
    with torch.no_grad():
        return model(INPUT.to(model.device)).logits


def load(path, **kwargs):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                             **kwargs)


@pytest.fixture(scope="module")
def reference_logits(tiny_dir):
    return logits(load(tiny_dir))


def test_from_pretrained_through_fst(tiny_dir, reference_logits, monkeypatch):
    calls = patch_in_fst(monkeypatch, LOAD_TARGETS)
    loads = count_libfst_loads(monkeypatch)
    got = logits(load(tiny_dir))
    assert torch.equal(got, reference_logits)
    shards = sorted(tiny_dir.glob("*.safetensors"))
    opened = calls["transformers.modeling_utils.safe_open"]
    # one safe_open per shard, with the backend= that fst once refused
    assert len(opened) == len(shards), calls
    assert all(kw.get("backend") == "mmap" for kw in opened), opened
    # and each was served by libfst: io=mmap is 3 (copy-on-write views)
    assert loads == [3] * len(shards), loads


def test_from_pretrained_whole_files_through_fst(tiny_dir, reference_logits, monkeypatch):
    """disable_mmap=True: transformers reads each file into memory and hands
    the bytes to safetensors.torch.load; fst's load reads them with libfst."""
    calls = patch_in_fst(monkeypatch, LOAD_TARGETS)
    loads = count_libfst_loads(monkeypatch)
    got = logits(load(tiny_dir, disable_mmap=True))
    assert torch.equal(got, reference_logits)
    n = len(list(tiny_dir.glob("*.safetensors")))
    assert len(calls["transformers.modeling_utils._safe_load_bytes"]) == n, calls
    assert loads == [1] * n, loads  # io=pread over the bytes in memory


def test_save_pretrained_through_fst_is_the_reference_bytes(tiny_dir, reference_logits,
                                                            tmp_path, monkeypatch):
    model = load(tiny_dir)
    by_reference, by_fst = tmp_path / "by-reference", tmp_path / "by-fst"
    model.save_pretrained(by_reference, max_shard_size="100KB")
    calls = patch_in_fst(monkeypatch, SAVE_TARGETS)
    model.save_pretrained(by_fst, max_shard_size="100KB")
    monkeypatch.undo()
    want = sorted(by_reference.glob("*.safetensors"))
    got = sorted(by_fst.glob("*.safetensors"))
    assert len(want) >= 3 and [p.name for p in got] == [p.name for p in want]
    assert len(calls["transformers.modeling_utils.safe_save_file"]) == len(want), calls
    assert calls["transformers.pytorch_utils.storage_ptr"], calls.keys()
    for g, w in zip(got, want):
        assert g.read_bytes() == w.read_bytes(), g.name
    assert json.loads((by_fst / "model.safetensors.index.json").read_text()) == \
        json.loads((by_reference / "model.safetensors.index.json").read_text())
    assert torch.equal(logits(load(by_fst)), reference_logits)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_from_pretrained_onto_cuda_through_fst(tiny_dir, monkeypatch):
    """device_map="cuda": the same logits, bit for bit, as the real
    safetensors loading onto the same GPU, every shard opened through fst
    and loaded by libfst."""
    want = logits(load(tiny_dir, device_map="cuda"))
    calls = patch_in_fst(monkeypatch, LOAD_TARGETS)
    loads = count_libfst_loads(monkeypatch)
    model = load(tiny_dir, device_map="cuda")
    assert all(p.device.type == "cuda" for p in model.parameters())
    got = logits(model)
    assert torch.equal(got, want)
    n = len(list(tiny_dir.glob("*.safetensors")))
    assert len(calls["transformers.modeling_utils.safe_open"]) == n, calls
    assert len(loads) == n, loads
