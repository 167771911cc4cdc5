"""qkv.ray on a local Ray Data against one process: does a corpus embedded by K
one-thread workers (`map_batches(qkv.ray.Embed, concurrency=K, num_cpus=1)`) go as
fast as by one process computing on K threads (`qkv.load(...).embed`)? The issue's
goal: ≥ 0.85× at K = 2.

Rounds alternate the two ways. Each times the job from the model's load to the last
vector (Ray: from the dataset's creation, the workers loading the folder, to the rows
in the driver; the cluster's start with `ray.init` is not timed, nor Python's). The
one-process way runs in its own process with Ray shut down, so each way has the
machine to itself. Before any timing, the two ways' vectors are compared.

    python3 bench/ray_data.py --model ~/.cache/qkv/minilm --texts 8192 --batch 1024 --rounds 3

Needs a venv with the qkv wheel and `ray[data]` (tools/python_tests.sh makes one:
QKV_PY_VENV=.venv-py), run with its python.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

WORDS = ("attention lets every word look at every other word and weigh what it finds "
         "the keys are matched against the query softmax turns the scores into weights "
         "position encodings give the model an order that attention alone does not have").split()


def corpus(n):
    """n sentences of 8 to 40 words, the same for a given n."""
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, size=rng.integers(8, 41))) for _ in range(n)]


ONE_PROCESS = """
import json, sys, time, numpy as np, qkv
model, threads, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, sys.argv[5]); from ray_data import corpus
texts = corpus(n)
qkv.set_num_threads(threads)
t0 = time.perf_counter()
vectors = qkv.load(model).embed(texts, batch_size=32)
seconds = time.perf_counter() - t0
np.save(out, vectors)
print(json.dumps({"seconds": seconds}))
"""


def one_process(args, out):
    r = subprocess.run(
        [sys.executable, "-c", ONE_PROCESS, args.model, str(args.workers), str(args.texts),
         out, os.path.dirname(os.path.abspath(__file__))],
        check=True, capture_output=True, text=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])["seconds"], np.load(out)


def with_ray(args):
    import ray
    import qkv.ray

    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    try:
        texts = corpus(args.texts)
        t0 = time.perf_counter()
        ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
        ds = ds.map_batches(
            qkv.ray.Embed,
            fn_constructor_kwargs={"path": args.model, "threads": 1},
            concurrency=args.workers, num_cpus=1, batch_size=args.batch,
        )
        rows = ds.take_all()
        seconds = time.perf_counter() - t0
    finally:
        ray.shutdown()
    rows.sort(key=lambda r: r["id"])
    return seconds, np.stack([r["embedding"] for r in rows])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a sentence-transformers folder")
    p.add_argument("--texts", type=int, default=8192)
    p.add_argument("--workers", type=int, default=2, help="Ray workers; threads of the one process")
    p.add_argument("--batch", type=int, default=1024, help="rows of a Ray batch")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    out = "/tmp/qkv_ray_bench_one.npy"
    import platform
    print(f"{platform.processor() or platform.machine()}, {args.texts} texts, "
          f"{args.workers} Ray workers x 1 thread vs 1 process x {args.workers} threads")
    one, ray_times = [], []
    for r in range(args.rounds):
        s1, v1 = one_process(args, out)
        s2, v2 = with_ray(args)
        if r == 0:
            diff = float(np.abs(v1 - v2).max())
            cos = float(((v1 * v2).sum(1) / np.linalg.norm(v1, axis=1) / np.linalg.norm(v2, axis=1)).min())
            print(f"accuracy: max |one - ray| {diff:.2e}, min cosine {cos:.8f}")
            assert diff < 1e-4, "the two ways disagree"
        one.append(s1)
        ray_times.append(s2)
        print(f"round {r}: one process {args.texts / s1:7.1f} texts/s ({s1:.2f} s)   "
              f"Ray {args.workers}x1 {args.texts / s2:7.1f} texts/s ({s2:.2f} s)   "
              f"ratio {s1 / s2:.3f}")
    ratio = statistics.median(one) / statistics.median(ray_times)
    print(f"median: one process {args.texts / statistics.median(one):.1f} texts/s, "
          f"Ray {args.texts / statistics.median(ray_times):.1f} texts/s: Ray at {ratio:.3f}x")


if __name__ == "__main__":
    main()
