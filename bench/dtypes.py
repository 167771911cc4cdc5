#!/usr/bin/env python3
"""One `qkv bench` workload in each number type, in rotating order, against f32.

    python3 bench/dtypes.py ROUNDS QKV DTYPES -- BENCH_ARGS...
    e.g. python3 bench/dtypes.py 6 target/release/qkv f32,bf16,int8,int8-row -- llama --rounds 2

Each round runs `QKV bench BENCH_ARGS --dtype D --json` once per type, the order rotated
by one every round, since on the development VM the machine's speed drifts by tens of
percent from one minute to the next and whichever runs in a given slot would otherwise
carry the drift. Printed per result row and type: the median and the best of its best_s
over the rounds, its speed over the first type's (the first type's median time over its
own), and the accuracy fields the bench reports (the same every round: the inputs are
seeded). Keep the machine otherwise idle.
"""

import collections
import json
import statistics
import subprocess
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ab import row_key  # noqa: E402

ACCURACY = ("logits_max_abs", "prefill_top1_equal", "greedy_equal", "greedy_first_difference",
            "min_cosine_to_f32", "relative_error")


def main() -> None:
    if len(sys.argv) < 6 or sys.argv[4] != "--":
        sys.exit(__doc__)
    rounds, qkv, dtypes, args = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), sys.argv[5:]
    times = collections.defaultdict(list)
    accuracy = {}
    for r in range(rounds):
        for d in dtypes[r % len(dtypes):] + dtypes[:r % len(dtypes)]:
            cmd = [qkv, "bench", *args, "--dtype", d, "--json"]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
            for line in out.stdout.splitlines():
                row = json.loads(line)
                key = row_key({k: v for k, v in row.items() if k not in ACCURACY and k != "dtype"
                               and not k.startswith("weight_")})
                times[(key, d)].append(row["best_s"])
                accuracy[(key, d)] = {k: row[k] for k in ACCURACY if k in row}
    for key in sorted({k for k, _ in times}):
        print(key)
        base = statistics.median(times[(key, dtypes[0])])
        for d in dtypes:
            t = times[(key, d)]
            m = statistics.median(t)
            print(f"  {d:9} median {m * 1e3:9.3f} ms  best {min(t) * 1e3:9.3f} ms  "
                  f"× {base / m:5.2f}  {json.dumps(accuracy[(key, d)])}")


if __name__ == "__main__":
    main()
