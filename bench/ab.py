#!/usr/bin/env python3
"""Two qkv binaries against each other on one `qkv bench` workload, in alternating order.

    python3 bench/ab.py ROUNDS BIN_A BIN_B -- BENCH_ARGS...
    e.g. python3 bench/ab.py 6 /tmp/qkv-before target/release/qkv -- attention --threads 2 --n 512,2048

Each round runs `BIN bench BENCH_ARGS --json` for both binaries; the first of the pair
alternates A B, B A, A B, ... because on the development VM whichever process runs second
in a pair measured 7-13% slower (a binary against a copy of itself). Printed per result
row: the median and the best of each binary's best_s over the rounds, and B's speedup
over A (A's median time / B's). Keep the machine otherwise idle: build both binaries
first, then run this.
"""

import collections
import json
import statistics
import subprocess
import sys


def row_key(row: dict) -> str:
    """What identifies one measured row of a workload (its sizes and mode)."""
    skip = {"best_s", "median_s", "iters", "rounds", "warmup", "threads"}
    return " ".join(f"{k}={v}" for k, v in sorted(row.items())
                    if k not in skip and not k.endswith(("_best", "_median")) and not isinstance(v, (dict, list)))


def main() -> None:
    if len(sys.argv) < 6 or sys.argv[4] != "--":
        sys.exit(__doc__)
    rounds, bins, args = int(sys.argv[1]), sys.argv[2:4], sys.argv[5:]
    times = collections.defaultdict(list)
    for r in range(rounds):
        for b in (bins if r % 2 == 0 else bins[::-1]):
            out = subprocess.run([b, "bench", *args, "--json"], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{b} bench {' '.join(args)} failed:\n{out.stderr}")
            for line in out.stdout.splitlines():
                row = json.loads(line)
                times[(row_key(row), b)].append(row["best_s"])
    for key in sorted({k for k, _ in times}):
        a, b = (times[(key, x)] for x in bins)
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{key}\n  A median {ma * 1e3:.3f} ms best {min(a) * 1e3:.3f} | "
              f"B median {mb * 1e3:.3f} ms best {min(b) * 1e3:.3f} | B speedup {ma / mb:.3f}")


if __name__ == "__main__":
    main()
