#!/usr/bin/env python3
"""`qkv attention --method grad` on all-MiniLM-L6-v2 against the same computation in PyTorch:
accuracy first, then timing.

    python3 bench/attribution.py [--rounds 5] [--threads 2] [--model DIR] [--qkv PATH] [--json]

The work: the articles' sentence, the target its embedding's cosine with another sentence's
(mean pooling), every layer's attention map and its gradient, then gradient × attention (Chefer
et al. 2021). qkv runs the whole command as a user does (`qkv attention --method grad --compare
TEXT --json FILE`: the process, loading the folder, tokenising, the forward and backward, writing
the JSON); its own step lines (`--progress`) give the part after loading. PyTorch runs in this
process with the model loaded once: transformers' eager attention with `output_attentions`, autograd
for the maps' gradients, the same rollout in torch (compute only, the part qkv's step line times).

Accuracy: qkv's relevance after the last layer against PyTorch's, largest |difference|.
Timing: --rounds rounds alternate the two sides (the order within a round alternates too); per
side the best and the median of the rounds. The goal the issue sets: the qkv command under 1 s.
Runs under the venv of bench/compare_torch.py (.venv-ref or .venv-bench: torch, transformers).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_torch as ct  # noqa: E402  (the shared environment helpers)

SENTENCE = "The animal didn't cross the street because it was too tired."
COMPARE = "The tired dog stayed on the pavement."


def torch_side(model_dir: Path, threads: int):
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    ids = tok(SENTENCE, return_tensors="pt")
    other = tok(COMPARE, return_tensors="pt")
    with torch.no_grad():
        compare = model(**other).last_hidden_state[0].mean(0)

    def call():
        out = model(**ids, output_attentions=True)
        for a in out.attentions:
            a.retain_grad()
        e = out.last_hidden_state[0].mean(0)
        torch.nn.functional.cosine_similarity(e, compare, dim=0).backward()
        t = ids["input_ids"].shape[1]
        r = torch.eye(t)
        for a in out.attentions:
            cam = (a.grad[0] * a.detach()[0]).clamp(min=0).mean(0)
            r = r + cam @ r
        return r

    return call


def qkv_side(qkv: Path, model_dir: Path, threads: int, out: Path):
    def call():
        t0 = time.perf_counter()
        run = subprocess.run(
            [str(qkv), "attention", "--model", str(model_dir), "--text", SENTENCE, "--compare", COMPARE,
             "--method", "grad", "--json", str(out), "--threads", str(threads), "--progress"],
            capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        step = re.search(r"grad over \d+ tokens \(([\d.]+) s\)", run.stderr)
        return wall, float(step.group(1)) if step else float("nan")

    return call


def reexec_in_venv(threads: int) -> None:
    """This script again under the venv of compare_torch.py, the thread variables set before
    torch is imported."""
    import os

    if os.environ.get(ct.CHILD_MARK):
        return
    py = ct.venv_python()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **{ct.CHILD_MARK: "1"})
    os.execve(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]], env)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model")
    ap.add_argument("--qkv")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    reexec_in_venv(opts.threads)
    qkv = ct.build_qkv(opts.qkv)
    model_dir = ct.minilm_dir(opts.model)
    torch_call = torch_side(model_dir, opts.threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "grad.json"
        qkv_call = qkv_side(qkv, model_dir, opts.threads, out)
        qkv_call()
        doc = json.loads(out.read_text())
        ours = doc["layers"][-1]["weights"]
        theirs = torch_call().tolist()
        diff = max(abs(a - b) for ra, rb in zip(ours, theirs) for a, b in zip(ra, rb))
        torch_call()
        walls, steps, torch_times = [], [], []
        for r in range(opts.rounds):
            order = ["qkv", "torch"] if r % 4 in (0, 3) else ["torch", "qkv"]
            for side in order:
                if side == "qkv":
                    w, s = qkv_call()
                    walls.append(w)
                    steps.append(s)
                else:
                    t0 = time.perf_counter()
                    torch_call()
                    torch_times.append(time.perf_counter() - t0)
    result = {
        "machine": ct.machine(),
        "commit": ct.git_commit(),
        "threads": opts.threads,
        "tokens": len(doc["tokens"]),
        "max_abs_diff_relevance": diff,
        "qkv_command_s": {"best": min(walls), "median": statistics.median(walls)},
        "qkv_grad_step_s": {"best": min(steps), "median": statistics.median(steps)},
        "torch_compute_s": {"best": min(torch_times), "median": statistics.median(torch_times)},
    }
    if opts.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{result['machine']}, {opts.threads} threads, commit {result['commit']}, {result['tokens']} tokens")
        print(f"accuracy: largest |R_qkv - R_torch| after the last layer = {diff:.2e}")
        for name in ["qkv_command_s", "qkv_grad_step_s", "torch_compute_s"]:
            v = result[name]
            print(f"{name:18} best {v['best'] * 1000:8.1f} ms   median {v['median'] * 1000:8.1f} ms")
        print(f"ratio PyTorch compute / qkv step (median): {result['torch_compute_s']['median'] / result['qkv_grad_step_s']['median']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
