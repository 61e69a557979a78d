#!/usr/bin/env python3
"""fst's remote reads against curl fetching the same bytes over the same
number of connections, from a server on loopback.

  python3 bench/remote.py --fst-bin build/fst --work /tmp/rb --size 2GiB --shards 4 \\
      --threads 4,8,16 --chunk 4MiB,8MiB,16MiB --runs 3 --out bench/results/DIR

For each (connections, request size): `fst bench --json --threads N --chunk C
URL` (its load into memory already faulted in, and into fresh memory), and
`curl --parallel --parallel-max N` over the very ranges fst reads (each
file's tensor bytes cut at multiples of C from the data section's start) to
/dev/null, timed from outside; both best of --runs, the files in the page
cache (read once before). The server is nginx (Debian's, run as this user)
or --server python (tests/remote/server.py, sendfile). --device cuda:0
loads onto a GPU instead; curl's side does not change.
Writes remote.txt (the table) and remote.json under --out.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "remote"))

from servers import start_fault_server, start_nginx, stop  # noqa: E402

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size_of(s):
    for u, m in UNITS.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


def header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return 8 + n, json.loads(f.read(n))


def ranges(files, chunk):
    """(name, first, last) of every request fst's plan makes: each file's
    run of tensor bytes cut at multiples of chunk from the data section."""
    out = []
    for f in files:
        off, h = header(f)
        spans = sorted(v["data_offsets"] for k, v in h.items() if k != "__metadata__")
        if not spans:
            continue
        a, b = off + spans[0][0], off + spans[-1][1]
        for s in range(a, b, chunk):
            out.append((f.name, s, min(s + chunk, b) - 1))
    return out


def curl_once(base, rel, reqs, threads, cfg):
    with open(cfg, "w") as c:
        # each transfer its own options: "next" ends one (a range would
        # otherwise be the last one given, for every URL)
        for i, (name, a, b) in enumerate(reqs):
            c.write(f'{"next" + chr(10) if i else ""}url = "{base}/{rel}/{name}"\n'
                    f'range = {a}-{b}\noutput = /dev/null\n')
    t0 = time.perf_counter()
    r = subprocess.run(["curl", "-s", "-S", "--fail", "--parallel", "--parallel-max", str(threads),
                        "--parallel-immediate", "-K", cfg], capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if r.returncode:
        raise RuntimeError(f"curl failed ({r.returncode}): {r.stderr[-500:]}")
    return secs


def fst_rows(fst_bin, url, threads, chunk, device, runs):
    """fst bench's rows (best of runs each): the load into fresh memory, and
    on the CPU into memory already faulted in, which is what curl's
    /dev/null costs compare with (fresh pages cost the kernel's zeroing)."""
    r = subprocess.run([fst_bin, "bench", "--json", "--runs", str(runs), "--threads", str(threads),
                        "--chunk", str(chunk), "--device", device, url],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"fst bench failed ({r.returncode}): {r.stderr[-500:]}")
    return {row["name"]: row for row in json.loads(r.stdout)["rows"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fst-bin", default=str(REPO / "build" / "fst"))
    ap.add_argument("--ckpt", help="a checkpoint folder (default: fst gen one in --work)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--threads", default="4,8,16")
    ap.add_argument("--chunk", default="4MiB,8MiB,16MiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--server", choices=["nginx", "python"], default="nginx")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out")
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="fst-remote-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    ck = Path(a.ckpt) if a.ckpt else work / "ckpt"
    if not a.ckpt and not (ck / "model.safetensors.index.json").exists():
        subprocess.run([a.fst_bin, "gen", str(ck), "--size", a.size, "--shards", str(a.shards),
                        "--misaligned"], check=True, stdout=subprocess.DEVNULL)
    files = sorted(ck.glob("*.safetensors"))
    for p in [ck.parent, ck, *files]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    for f in files:  # into the page cache: the network path is measured, not the disk
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    tensor_bytes = 0
    for f in files:
        _, h = header(f)
        tensor_bytes += sum(v["data_offsets"][1] - v["data_offsets"][0]
                            for k, v in h.items() if k != "__metadata__")
    if a.server == "nginx":
        prefix = work / "nginx"
        prefix.mkdir(exist_ok=True)
        base, proc = start_nginx(ck.parent, prefix)
        rel = ck.name
    else:
        base, proc = start_fault_server(ck.parent)
        rel = "ok/" + ck.name
    index = f"{base}/{rel}/model.safetensors.index.json"
    if not (ck / "model.safetensors.index.json").exists():
        index = f"{base}/{rel}/{files[0].name}"
    rows = []
    try:
        for threads in [int(t) for t in a.threads.split(",")]:
            for chunk in [size_of(c) for c in a.chunk.split(",")]:
                reqs = ranges(files, chunk)
                best_c = min(curl_once(base, rel, reqs, threads, work / "curl.cfg")
                             for _ in range(a.runs))
                fr = fst_rows(a.fst_bin, index, threads, chunk, a.device, a.runs)
                fresh = fr["fst load (warm)"]
                reused = fr.get("fst load (warm, reused memory)", fresh)
                row = {"connections": threads, "chunk_bytes": chunk, "requests": len(reqs),
                       "fst_seconds": reused["seconds"], "fst_fresh_seconds": fresh["seconds"],
                       "curl_seconds": best_c, "fst_gbps": tensor_bytes / reused["seconds"] / 1e9,
                       "fst_fresh_gbps": tensor_bytes / fresh["seconds"] / 1e9,
                       "curl_gbps": tensor_bytes / best_c / 1e9,
                       "ratio": best_c / reused["seconds"], "path": fresh["notes"]}
                rows.append(row)
                print(f"{threads:3d} conns {chunk >> 20:3d} MiB: fst {row['fst_gbps']:6.2f} GB/s "
                      f"(fresh memory {row['fst_fresh_gbps']:.2f}), curl {row['curl_gbps']:6.2f} "
                      f"GB/s, fst/curl {row['ratio']:.2f}", flush=True)
    finally:
        stop(proc)
    lines = [f"fst remote read vs curl, {a.server} on loopback, {len(files)} files, "
             f"{tensor_bytes / 1e9:.2f} GB of tensors, device {a.device}, best of {a.runs}",
             "fst: into memory already faulted in (fresh: into new memory, which the kernel "
             "zeroes first)",
             f"{'conns':>5} {'chunk':>7} {'requests':>8} {'fst s':>7} {'fst GB/s':>9} "
             f"{'fresh GB/s':>10} {'curl s':>7} {'curl GB/s':>9} {'fst/curl':>8}"]
    for r in rows:
        lines.append(f"{r['connections']:>5} {r['chunk_bytes'] >> 20:>4}MiB {r['requests']:>8} "
                     f"{r['fst_seconds']:>7.3f} {r['fst_gbps']:>9.2f} {r['fst_fresh_gbps']:>10.2f} "
                     f"{r['curl_seconds']:>7.3f} {r['curl_gbps']:>9.2f} {r['ratio']:>8.2f}")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "remote.txt").write_text(text)
        (out / "remote.json").write_text(json.dumps(
            {"server": a.server, "device": a.device, "files": len(files),
             "tensor_bytes": tensor_bytes, "runs": a.runs, "rows": rows,
             "command": " ".join(sys.argv)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
