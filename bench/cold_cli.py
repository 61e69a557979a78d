#!/usr/bin/env python3
"""`fst load` of a cold checkpoint with several commands or options, in
alternating rounds: before each pass the page cache is dropped and, with a
scrub folder, other files are read with O_DIRECT (bench/coldcache.py), so
no cache under the guest holds the checkpoint. Prints GB/s and the path each
load chose, as the command reports them.

  python3 bench/cold_cli.py CKPT SCRUB_DIR NAME=[@FST_BINARY ]ARGS ... [--device cpu]
  ROUNDS=3 python3 bench/cold_cli.py /tmp/ck /tmp/other "before=@/tmp/old/fst" "after=@build/fst"
"""
import glob
import json
import os
import subprocess
import sys

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
    for r in range(int(os.environ.get("ROUNDS", "2"))):
        for name, args in (variants if r % 2 == 0 else variants[::-1]):
            how = make_cold(files, scrub_files(scrub_dir))
            binary = "fst"
            if args.startswith("@"):
                binary, _, args = args[1:].partition(" ")
            out = subprocess.run([binary, "load", ck, "--device", device, "--json",
                                  "--no-progress"] + args.split(), capture_output=True, text=True)
            if out.returncode:
                print(f"round {r + 1} {name}: exit {out.returncode}: {out.stderr.strip()}")
                continue
            j = json.loads(out.stdout)
            print(f"round {r + 1} {name}: {j['gbps']:.2f} GB/s ({how}) {j.get('path_chosen')}",
                  flush=True)


if __name__ == "__main__":
    main()
