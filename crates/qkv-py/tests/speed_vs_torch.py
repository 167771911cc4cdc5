"""qkv.attention against torch.nn.functional.scaled_dot_product_attention, side by side
in one process on the threads RAYON_NUM_THREADS / OMP_NUM_THREADS give (test_speed.py
runs it on 2): H=12, D=64, B=1, non-causal and causal, rounds alternating between the
sides, best and median of each printed with the ratios. qkv runs twice: on SDPA's
layout ``[B, H, T, D]`` (``layout="bhtd"``, swapped into qkv's layout and back inside the
call) and on its own ``[B, T, H, D]`` (read in place). Each pair is first checked to
compute the same numbers. Printed, never asserted: speed is measured, not tested."""

import os
import statistics
import time

import numpy as np
import torch

import qkv

ROUNDS, REPS = 5, 3


def seconds(fn):
    start = time.perf_counter()
    for _ in range(REPS):
        fn()
    return (time.perf_counter() - start) / REPS


def main():
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    print(f"qkv {qkv.__version__} ({qkv.get_num_threads()} threads) vs torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); best / median of {ROUNDS} alternating rounds")
    print(f"{'N':>6} {'causal':>7} {'qkv bhtd':>13} {'qkv bthd':>13} {'SDPA':>13}"
          f" {'bhtd/SDPA':>10} {'bthd/SDPA':>10}  max |diff|   (GFLOP/s best / median)")
    rng = np.random.default_rng(0)
    for n in (128, 512, 1024, 2048):
        q, k, v = (rng.standard_normal((1, 12, n, 64), dtype=np.float32) for _ in range(3))
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        nq, nk, nv = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
        for causal in (False, True):
            mode = "top_left" if causal else None
            ours = lambda: qkv.attention(q, k, v, causal=mode, layout="bhtd")
            native = lambda: qkv.attention(nq, nk, nv, causal=mode)
            theirs = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
            with torch.no_grad():
                diff = float(np.abs(ours()[0] - theirs().numpy()).max())
                times = {"bhtd": [], "bthd": [], "sdpa": []}
                for r in range(ROUNDS):
                    order = [("bhtd", ours), ("bthd", native), ("sdpa", theirs)]
                    for name, fn in order if r % 2 == 0 else order[::-1]:
                        times[name].append(seconds(fn))
            flops = 4 * 12 * n * n * 64 * (0.5 if causal else 1.0)
            best = {k: flops / min(t) / 1e9 for k, t in times.items()}
            med = {k: flops / statistics.median(t) / 1e9 for k, t in times.items()}
            cells = "".join(f"{best[k]:>7.1f} /{med[k]:>5.1f}" for k in ("bhtd", "bthd", "sdpa"))
            ratios = "".join(f"{best[k] / best['sdpa']:>10.2f}x" for k in ("bhtd", "bthd"))
            print(f"{n:>6} {str(causal):>7}{cells}{ratios}   {diff:.1e}")


if __name__ == "__main__":
    main()
