#!/usr/bin/env python3
"""qkv against a peer engine (llama.cpp) on qkv's benchmark Llama, accuracy first, then timing.

    python3 bench/compare_peers.py llama-cpp [--rounds 4] [--dtypes f32,bf16,int8] [--json]

Pairs: qkv f32 vs llama.cpp F32, qkv bf16 vs BF16, qkv int8 vs Q8_0 (GGUF --outtype f32|bf16|q8_0).

Environment (nothing here is installed by the script):
  .venv-peers   llama-cpp-python built from the sdist with the machine's ISA:
                  python3 -m venv .venv-peers
                  NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                  CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='$NOAMX' -DCMAKE_CXX_FLAGS='$NOAMX'" \
                      .venv-peers/bin/pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36 \
                      numpy safetensors
                (this VM's CPUID lists AMX but the tile instructions fault: a native build dies with
                SIGILL in ggml's AMX matmul, hence -mno-amx-*)
                and that sdist's vendor/llama.cpp/{convert_hf_to_gguf.py,conversion,gguf-py} copied to
                .venv-peers/llama.cpp (the converter matching the library; --converter overrides).
  .venv-bench   the converter's own imports (torch, transformers, sentencepiece): the venv that
                bench/compare_torch.py creates; $CONVERT_PYTHON overrides.

Model. `qkv bench llama --save DIR` (seed --seed) writes a LlamaForCausalLM folder without a tokenizer;
the converter insists on one, so a tiny SentencePiece model is trained into the folder
(tokenizer.model) and the converter pads its vocabulary with [PADn] entries up to the model's 32000.
Token ids are fed directly on both sides, so the tokenizer never touches the numbers.

Accuracy (before any timing), against qkv f32 on the same ids (numpy, seed --seed + 1; not qkv
bench's own Rng ids, which only it sees): logits of the 512-token prefill prompt from `qkv forward`
(max |diff|, top-1 agreement per position) and 128 greedy tokens after the 16-token decode prompt
from `qkv generate --greedy` (equal position by position, first difference). qkv's own bf16/int8
accuracy against its f32 is what `qkv bench llama` reports in its JSON rows.

Timing. --rounds rounds alternate `qkv bench llama --dtype X --json --rounds 1` (one warm-up call,
one timed sample of >= 0.05 s) with the same on llama.cpp, in ABBA order, because the side that runs
second in a round measures slower on this VM (see compare_torch.py). Both sides get --threads
threads. Prefill: every position's logits (llama.cpp logits_all; qkv bench's default), from an
empty KV cache. Decode: 128 greedy tokens (top-k 1, temp 0), no stop at EOS. Reported: the median
over rounds, and qkv/llama.cpp = llama.cpp's time / qkv's (above 1: qkv is faster).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / ".venv-peers"
PREFILL, DECODE, DECODE_PROMPT, VOCAB = 512, 128, 16, 32000
PAIRS = {"f32": "f32", "bf16": "bf16", "int8": "q8_0"}  # qkv dtype -> converter --outtype

# Run by the converter's interpreter: a small SentencePiece model for the converter to read, then
# the converter itself (its argv follows).
CONVERT = """
import os, runpy, sys, sentencepiece as spm
folder = sys.argv[1]
text = ["the quick brown fox jumps over the lazy dog", "attention is all you need"] * 50
spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=folder + "/tokenizer",
                               vocab_size=40, model_type="char", minloglevel=2)
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))  # the converter imports its sibling package
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def reexec_in_peers_venv() -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        py = PEERS / "bin" / "python"
        if not py.exists() or os.environ.get("QKV_COMPARE_PEERS_CHILD"):
            sys.exit(f"llama_cpp is not importable and {py} is missing: see the docstring's set-up")
        os.execve(str(py), [str(py), *sys.argv], dict(os.environ, QKV_COMPARE_PEERS_CHILD="1"))


def run(cmd: list[str]) -> str:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{out.stderr[-4000:]}")
    return out.stdout


def convert(opts, folder: Path, outtype: str) -> Path:
    gguf = folder / f"model-{outtype}.gguf"
    if not gguf.exists():
        print(f"converting to GGUF {outtype}...", file=sys.stderr, flush=True)
        run([opts.convert_python, "-c", CONVERT, folder, opts.converter, folder, "--outtype", outtype,
             "--outfile", gguf])
    return gguf


def qkv_reference(opts, folder: Path, prompt, decode_prompt) -> dict:
    """qkv f32's prefill logits and greedy tokens on our ids: what llama.cpp is held to."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    with tempfile.TemporaryDirectory() as tmp:
        save_file({"input_ids": prompt[None, :].astype(np.int64)}, f"{tmp}/in.safetensors")
        run([opts.qkv, "forward", "--model", folder, "--input", f"{tmp}/in.safetensors",
             "--output", f"{tmp}/out.safetensors"])
        logits = load_file(f"{tmp}/out.safetensors")["logits"][0]
    tokens = json.loads(run([opts.qkv, "generate", "--model", folder, "--greedy", "--json",
                             "--input-ids", ",".join(map(str, decode_prompt)),
                             "--max-new-tokens", str(DECODE)]))
    tokens = tokens[0] if tokens and isinstance(tokens[0], list) else tokens
    return {"logits": logits, "tokens": tokens}


class LlamaCpp:
    def __init__(self, opts, gguf: Path, prompt, decode_prompt):
        from llama_cpp import Llama

        # logits_all: the prefill workload and the accuracy check want every position's logits
        self.llm = Llama(model_path=str(gguf), n_threads=opts.threads, n_threads_batch=opts.threads,
                         n_ctx=1024, n_batch=PREFILL, logits_all=True, verbose=False)
        self.prompt, self.decode_prompt = [int(t) for t in prompt], [int(t) for t in decode_prompt]

    def prefill(self):
        self.llm.reset()  # n_tokens = 0: eval() drops the whole KV cache before the prompt
        self.llm.eval(self.prompt)
        return self.llm.scores[:PREFILL]

    def decode(self) -> list[int]:
        self.llm.reset()  # else generate() would reuse the cached prefix of the previous call
        out = []
        for tok in self.llm.generate(self.decode_prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                     repeat_penalty=1.0):
            out.append(tok)  # EOS is just another token here: the count alone stops us
            if len(out) == DECODE:
                break
        return out

    def accuracy(self, ref) -> dict:
        import numpy as np

        logits = np.array(self.prefill())  # a copy: decode() below overwrites llm.scores' first rows
        tokens = self.decode()
        pairs = list(zip(ref["tokens"], tokens))
        return {"logits_max_abs": float(np.abs(logits - ref["logits"]).max()),
                "max_abs_logit": float(np.abs(ref["logits"]).max()),
                "prefill_top1_equal": int((logits.argmax(-1) == ref["logits"].argmax(-1)).sum()),
                "greedy_equal": sum(a == b for a, b in pairs),
                "greedy_first_difference": next((i for i, (a, b) in enumerate(pairs) if a != b), None)}

    def timed(self, call) -> float:
        """As qkv bench --rounds 1 --warmup 1 --min-time 0.05: seconds per call of one sample."""
        t0 = time.perf_counter()
        call()
        iters = max(1, math.ceil(0.05 / max(time.perf_counter() - t0, 1e-9)))
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        return (time.perf_counter() - t0) / iters


def compare(opts, folder: Path, dtype: str, ref, prompt, decode_prompt) -> dict:
    peer = LlamaCpp(opts, convert(opts, folder, PAIRS[dtype]), prompt, decode_prompt)
    acc = peer.accuracy(ref)
    print(f"check {dtype} / llama.cpp {PAIRS[dtype]}: {json.dumps(acc)}", file=sys.stderr, flush=True)
    times = {"qkv": {"prefill": [], "decode": []}, "llama.cpp": {"prefill": [], "decode": []}}
    qkv_acc = {}

    def qkv_side():
        rows = [json.loads(l) for l in run([opts.qkv, "bench", "llama", "--dtype", dtype, "--json", "--rounds", "1",
                                            "--threads", opts.threads, "--seed", opts.seed]).splitlines()]
        for r in rows:
            times["qkv"][r["mode"]].append(r["median_s"])
            qkv_acc.update({k: r[k] for k in ("logits_max_abs", "prefill_top1_equal", "greedy_equal",
                                              "greedy_first_difference") if k in r})

    def peer_side():
        times["llama.cpp"]["prefill"].append(peer.timed(peer.prefill))
        times["llama.cpp"]["decode"].append(peer.timed(peer.decode))

    for r in range(opts.rounds):
        print(f"{dtype}: round {r + 1}/{opts.rounds}", file=sys.stderr, flush=True)
        first, second = (qkv_side, peer_side) if r % 4 in (0, 3) else (peer_side, qkv_side)
        first()
        second()
    out = {"qkv_dtype": dtype, "llama_cpp_type": PAIRS[dtype].upper(), "llama_cpp_accuracy_vs_qkv_f32": acc,
           "qkv_accuracy_vs_qkv_f32": qkv_acc, "rounds": opts.rounds}
    for mode, n in (("prefill", PREFILL), ("decode", DECODE)):
        q, p = (statistics.median(times[s][mode]) for s in ("qkv", "llama.cpp"))
        out[mode] = {"qkv_median_s": q, "llama_cpp_median_s": p, "qkv_tokens_per_s": n / q,
                     "llama_cpp_tokens_per_s": n / p, "qkv_over_llama_cpp": p / q,
                     "qkv_rounds_s": times["qkv"][mode], "llama_cpp_rounds_s": times["llama.cpp"][mode]}
    del peer  # frees the model before the next pair loads
    return out


def print_table(header: dict, results: list[dict]) -> None:
    print(f"qkv {header['qkv']} against llama.cpp (llama-cpp-python {header['llama_cpp_python']}); "
          f"{header['threads']} threads each; {header['rounds']} alternating rounds, medians")
    print(f"llama.cpp system_info: {header['system_info']}; KV cache {header['llama_cpp_kv_cache']} (its default)")
    print(f"{'pair':<16} {'workload':<22} {'qkv tok/s':>10} {'llama.cpp':>10} {'qkv/llama.cpp':>14}")
    for r in results:
        for mode, label in (("prefill", f"prefill {PREFILL}"), ("decode", f"greedy decode {DECODE}")):
            m = r[mode]
            print(f"{r['qkv_dtype'] + ' / ' + r['llama_cpp_type']:<16} {label:<22} {m['qkv_tokens_per_s']:>10.1f} "
                  f"{m['llama_cpp_tokens_per_s']:>10.1f} {m['qkv_over_llama_cpp']:>14.2f}")
    print("\naccuracy against qkv f32 (logits over the prefill prompt; greedy tokens, position by position)")
    for r in results:
        for who, a in (("llama.cpp " + r["llama_cpp_type"], r["llama_cpp_accuracy_vs_qkv_f32"]),
                       ("qkv " + r["qkv_dtype"], r["qkv_accuracy_vs_qkv_f32"])):
            if a:
                print(f"  {who:<16} logits max abs {a['logits_max_abs']:.3g}, top-1 {a['prefill_top1_equal']}/{PREFILL}, "
                      f"greedy {a['greedy_equal']}/{DECODE} (first difference at {a['greedy_first_difference']})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("peer", choices=["llama-cpp"])
    p.add_argument("--dtypes", default="f32,bf16,int8", help="qkv dtypes to pair (default all three)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.add_argument("--qkv", default=str(ROOT / "target" / "release" / "qkv"))
    p.add_argument("--converter", default=str(PEERS / "llama.cpp" / "convert_hf_to_gguf.py"))
    p.add_argument("--convert-python", default=os.environ.get("CONVERT_PYTHON", str(ROOT / ".venv-bench/bin/python")))
    p.add_argument("--save", help="keep the model folder and GGUFs here (default: a temporary folder); "
                                  "GGUFs already there are reused")
    opts = p.parse_args()
    reexec_in_peers_venv()
    import llama_cpp
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(opts.save or f"{tmp}/llama")
        run([opts.qkv, "bench", "llama", "--save", folder, "--seed", opts.seed, "--prefill", "1", "--decode", "1",
             "--decode-prompt", "1", "--rounds", "1", "--warmup", "0", "--min-time", "0", "--json"])
        rng = np.random.default_rng(opts.seed + 1)
        prompt, decode_prompt = rng.integers(0, VOCAB, PREFILL), rng.integers(0, VOCAB, DECODE_PROMPT)
        ref = qkv_reference(opts, folder, prompt, decode_prompt)
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        header = {"qkv": head.stdout.strip(), "llama_cpp_python": llama_cpp.__version__,
                  "system_info": llama_cpp.llama_print_system_info().decode().strip(), "threads": opts.threads,
                  # left at llama.cpp's default for every GGUF type, F32 included (qkv's cache is f32)
                  "llama_cpp_kv_cache": {0: "f32", 1: "f16"}.get(kv := llama_cpp.llama_context_default_params().type_k, kv),
                  "rounds": opts.rounds, "load_average_1min": os.getloadavg()[0]}
        results = [compare(opts, folder, d, ref, prompt, decode_prompt) for d in opts.dtypes.split(",")]
    if opts.json:
        for line in ({"header": header}, *results):
            print(json.dumps(line))
    else:
        print_table(header, results)


if __name__ == "__main__":
    main()
