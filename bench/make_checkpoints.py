#!/usr/bin/env python3
"""Write the two benchmark checkpoints with the reference writer
(safetensors.torch.save_file), shaped like real models, random bytes:

  llama3-8b  16.1 GB, 4 shards: Llama-3-8B's tensors (BF16), 291 tensors
  gpt-oss-20b  13.8 GB, 3 shards: gpt-oss-20b's tensors, experts as MXFP4
             U8 blocks and scales, BF16 biases and attention; each file's
             data starts at 8 mod 16 (the header is padded through metadata)

  python3 bench/make_checkpoints.py OUTDIR [--only llama3-8b|gpt-oss-20b] [--layers N]

Random bytes are made on the GPU when there is one (fast), else on the CPU.
--layers makes smaller models of the same shapes, for trying the scripts.
"""
import argparse
import json
import os
import struct

import torch
from safetensors.torch import save_file


def llama3_8b(layers):
    h, inter, vocab, kv = 4096, 14336, 128256, 1024
    t = {"model.embed_tokens.weight": ((vocab, h), torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ((h,), torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = ((h,), torch.bfloat16)
        t[p + "self_attn.q_proj.weight"] = ((h, h), torch.bfloat16)
        t[p + "self_attn.k_proj.weight"] = ((kv, h), torch.bfloat16)
        t[p + "self_attn.v_proj.weight"] = ((kv, h), torch.bfloat16)
        t[p + "self_attn.o_proj.weight"] = ((h, h), torch.bfloat16)
        t[p + "mlp.gate_proj.weight"] = ((inter, h), torch.bfloat16)
        t[p + "mlp.up_proj.weight"] = ((inter, h), torch.bfloat16)
        t[p + "mlp.down_proj.weight"] = ((h, inter), torch.bfloat16)
    t["model.norm.weight"] = ((h,), torch.bfloat16)
    t["lm_head.weight"] = ((vocab, h), torch.bfloat16)
    return t, 4, False


def gpt_oss_20b(layers):
    h, vocab, experts, inter, heads, kvh, hd = 2880, 201088, 32, 2880, 64, 8, 64
    blocks = inter // 32  # 32 FP4 values per block, 16 bytes each
    bf, u8 = torch.bfloat16, torch.uint8
    t = {"model.embed_tokens.weight": ((vocab, h), bf)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ((h,), bf)
        t[p + "post_attention_layernorm.weight"] = ((h,), bf)
        t[p + "self_attn.q_proj.weight"] = ((heads * hd, h), bf)
        t[p + "self_attn.q_proj.bias"] = ((heads * hd,), bf)
        t[p + "self_attn.k_proj.weight"] = ((kvh * hd, h), bf)
        t[p + "self_attn.k_proj.bias"] = ((kvh * hd,), bf)
        t[p + "self_attn.v_proj.weight"] = ((kvh * hd, h), bf)
        t[p + "self_attn.v_proj.bias"] = ((kvh * hd,), bf)
        t[p + "self_attn.o_proj.weight"] = ((h, heads * hd), bf)
        t[p + "self_attn.o_proj.bias"] = ((h,), bf)
        t[p + "self_attn.sinks"] = ((heads,), bf)
        t[p + "mlp.router.weight"] = ((experts, h), bf)
        t[p + "mlp.router.bias"] = ((experts,), bf)
        t[p + "mlp.experts.gate_up_proj_blocks"] = ((experts, 2 * inter, blocks, 16), u8)
        t[p + "mlp.experts.gate_up_proj_scales"] = ((experts, 2 * inter, blocks), u8)
        t[p + "mlp.experts.gate_up_proj_bias"] = ((experts, 2 * inter), bf)
        t[p + "mlp.experts.down_proj_blocks"] = ((experts, h, blocks, 16), u8)
        t[p + "mlp.experts.down_proj_scales"] = ((experts, h, blocks), u8)
        t[p + "mlp.experts.down_proj_bias"] = ((experts, h), bf)
    t["model.norm.weight"] = ((h,), bf)
    t["lm_head.weight"] = ((vocab, h), bf)
    return t, 3, True


SHAPES = {"llama3-8b": (llama3_8b, 32), "gpt-oss-20b": (gpt_oss_20b, 24)}


def nbytes(shape, dtype):
    n = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        n *= d
    return n


def random_tensor(shape, dtype, gen_device):
    n = nbytes(shape, dtype)
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, device=gen_device).cpu()
    return raw.view(dtype).reshape(shape)


def data_start(path):
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def write_shard(path, tensors, misalign):
    """save_file, with metadata padded until the data starts at 8 mod 16
    when misalign (the reference pads headers to 8 bytes only)."""
    meta = {"format": "pt"}
    save_file(tensors, path, metadata=meta)
    pad = 0
    while misalign and data_start(path) % 16 != 8:
        pad += 1
        save_file(tensors, path, metadata=dict(meta, pad="x" * pad))
    return data_start(path)


def make(name, outdir, layers, gen_device):
    build, full_layers = SHAPES[name]
    table, shards, misalign = build(layers if layers else full_layers)
    names = list(table)
    total = sum(nbytes(*table[n]) for n in names)
    # consecutive names into `shards` files of about equal size
    per, groups, acc = total / shards, [[]], 0
    for n in names:
        if acc >= per * len(groups) and len(groups) < shards:
            groups.append([])
        groups[-1].append(n)
        acc += nbytes(*table[n])
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    weight_map = {}
    torch.manual_seed(0)
    for k, group in enumerate(groups, 1):
        fname = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: random_tensor(*table[n], gen_device) for n in group}
        start = write_shard(os.path.join(d, fname), tensors, misalign)
        del tensors
        weight_map.update({n: fname for n in group})
        print(f"{name}/{fname}: {len(group)} tensors, data at {start} ({start % 16} mod 16)",
              flush=True)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print(f"{name}: {len(names)} tensors, {total / 1e9:.2f} GB in {len(groups)} shards")
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--only", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=0)
    a = ap.parse_args()
    gen_device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in ([a.only] if a.only else sorted(SHAPES, reverse=True)):
        make(name, a.outdir, a.layers, gen_device)


if __name__ == "__main__":
    main()
