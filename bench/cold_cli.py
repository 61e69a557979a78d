#!/usr/bin/env python3
"""`fst load` of a cold checkpoint with several commands or options, in
alternating rounds: before each pass the page cache is dropped and, with a
scrub folder, other files are read with O_DIRECT (bench/coldcache.py), so
no cache under the guest holds the checkpoint. Prints GB/s and the path each
load chose, as the command reports them.

  python3 bench/cold_cli.py CKPT SCRUB_DIR NAME=[@FST_BINARY ][+VAR=VALUE ]ARGS ... [--device cpu]
  ROUNDS=3 python3 bench/cold_cli.py /tmp/ck /tmp/other "before=@/tmp/old/fst" "after=@build/fst"
  PROCS=4 python3 bench/cold_cli.py /tmp/ck /tmp/other "direct=" \
      "cache=+FST_URING_PAGE_CACHE=random" --device cuda:0

PROCS=N starts N loads of the checkpoint at once in each pass (replicas
starting together on one machine): each one's GB/s, and the seconds until
the last is done. A +VAR=VALUE token sets VAR in the loads' environment.
"""
import glob
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coldcache import make_cold, scrub_files  # noqa: E402


def main():
    argv = sys.argv[1:]
    device = "cpu"
    if "--device" in argv:
        i = argv.index("--device")
        device = argv[i + 1]
        del argv[i:i + 2]
    if len(argv) < 3:
        sys.exit(__doc__)
    ck, scrub_dir = argv[0], argv[1]
    files = sorted(glob.glob(os.path.join(ck, "*.safetensors")))
    variants = [a.split("=", 1) for a in argv[2:]]
    procs = int(os.environ.get("PROCS", "1"))
    for r in range(int(os.environ.get("ROUNDS", "2"))):
        for name, args in (variants if r % 2 == 0 else variants[::-1]):
            how = make_cold(files, scrub_files(scrub_dir))
            binary = "fst"
            if args.startswith("@"):
                binary, _, args = args[1:].partition(" ")
            env = dict(os.environ)
            rest = []
            for tok in args.split():
                if tok.startswith("+") and "=" in tok:
                    k, _, v = tok[1:].partition("=")
                    env[k] = v
                else:
                    rest.append(tok)
            cmd = [binary, "load", ck, "--device", device, "--json", "--no-progress"] + rest
            t0 = time.perf_counter()
            runs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env) for _ in range(procs)]
            outs = [p.communicate() + (p.returncode,) for p in runs]
            wall = time.perf_counter() - t0
            rates, path = [], None
            for out, err, rc in outs:
                if rc:
                    print(f"round {r + 1} {name}: exit {rc}: {err.strip()}")
                    continue
                j = json.loads(out)
                rates.append(f"{j['gbps']:.2f}")
                path = j.get("path_chosen")
            if not rates:
                continue
            together = f", {procs} at once, all done in {wall:.2f} s" if procs > 1 else ""
            print(f"round {r + 1} {name}: {' / '.join(rates)} GB/s ({how}{together}) {path}",
                  flush=True)

if __name__ == "__main__":
    main()
