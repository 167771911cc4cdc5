#!/usr/bin/env python3
"""qkv against peer engines (llama.cpp, ONNX Runtime, CTranslate2), accuracy first, then timing.

    python3 bench/compare_peers.py llama-cpp   [--rounds 4] [--dtypes f32,bf16,int8] [--llama-shape d512|1b] [--json]
    python3 bench/compare_peers.py gguf        [--rounds 4] [--dtypes q8_0,q4_k_m] [--json]
    python3 bench/compare_peers.py onnxruntime [--rounds 4] [--dtypes f32,int8] [--model DIR] [--ort-graph fused]
    python3 bench/compare_peers.py ctranslate2 [--rounds 4] [--dtypes f32,int8] [--workloads minilm,llama]
  common options: --threads 2 --seed 0 --json --qkv PATH --save DIR --convert-python PATH

Pairs (qkv --dtype / the peer's type; qkv's int8-row, a scale per row, pairs as int8 does):
  llama-cpp    the benchmark Llama: f32 / GGUF F32, bf16 / BF16, int8 / Q8_0 (converter --outtype f32|bf16|q8_0)
  gguf         the benchmark Llama as GGUF files, both engines on the same file: Q8_0 (converter --outtype
               q8_0) and Q4_K_M (llama.cpp's llama_model_quantize of the F32 file); qkv runs
               `qkv bench llama --model FILE` (Q8_0 blocks as stored, F16 and K-quant tensors in f32)
  onnxruntime  all-MiniLM-L6-v2: f32 / the f32 ONNX graph, int8 / quantize_dynamic's int8 (per channel)
  ctranslate2  all-MiniLM-L6-v2 and the benchmark Llama: f32 / compute_type float32, int8 / int8

Environment (nothing here is installed by the script; when the interpreter it runs under lacks the
mode's packages it re-executes itself under .venv-peers, and stops, naming what is missing, when
that lacks them too):
  .venv-peers   the peers, in a process without torch (the timed one):
                  python3 -m venv .venv-peers
                llama-cpp: llama-cpp-python built from the sdist with the machine's ISA:
                  NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                  CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='$NOAMX' -DCMAKE_CXX_FLAGS='$NOAMX'" \\
                      .venv-peers/bin/pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36 \\
                      numpy safetensors
                (-mno-amx-*: on one VM CPUID listed AMX but the tile instructions faulted, SIGILL in
                ggml's AMX matmul; on a Xeon where they work (2026-12-03) ggml's AMX Q8_0 matmul
                segfaulted in ggml_backend_amx_mul_mat. Add pip's --no-cache-dir when rebuilding:
                pip otherwise reinstalls the wheel it built before, whatever CMAKE_ARGS say)
                and that sdist's vendor/llama.cpp/{convert_hf_to_gguf.py,conversion,gguf-py} copied to
                .venv-peers/llama.cpp (the converter matching the library; --converter overrides).
                onnxruntime, ctranslate2 (wheels from PyPI):
                  .venv-peers/bin/pip install onnxruntime==1.32.0 onnx==1.23.2 sympy==1.14.0 \\
                      ctranslate2==4.8.5 tokenizers==0.23.3 numpy safetensors
                (sympy: onnxruntime.transformers' graph fusion runs symbolic shape inference)
  .venv-bench   the PyTorch side of preparing a model: the venv that bench/compare_torch.py creates
                (torch, transformers, sentencepiece, sentence-transformers); $CONVERT_PYTHON or
                --convert-python overrides. llama-cpp runs the GGUF converter there; onnxruntime and
                ctranslate2 export and convert there and compute sentence-transformers' f32 embeddings,
                and need two more packages in it (-c keeps every pinned version as it is):
                  .venv-bench/bin/pip install -c tools/fixtures/requirements.txt onnx==1.23.2 ctranslate2==4.8.5
                (torch.onnx.export writes through onnx; CTranslate2's converter reads through transformers)

The benchmark Llama (llama-cpp, ctranslate2). `qkv bench llama --save DIR` (seed --seed) writes a
LlamaForCausalLM folder without a tokenizer. Token ids are fed directly on both sides, so no
tokenizer touches the numbers:
  llama-cpp    the GGUF converter insists on a tokenizer, so a tiny SentencePiece model is trained into
               the folder (tokenizer.model) and the converter pads its vocabulary with [PADn] entries
               up to the model's 32000.
  ctranslate2  TransformersConverter with a stand-in tokenizer of no tokens: its Llama loader then names
               the 32000 ids <extra_id_N> (id N), the names the prompt is given in (vocabulary.json).
Accuracy (before any timing), against qkv f32 on the same ids (numpy, seed --seed + 1; not qkv
bench's own Rng ids, which only it sees): logits of the 512-token prefill prompt from `qkv forward`
(max |diff|, top-1 agreement per position) and 128 greedy tokens after the 16-token decode prompt
from `qkv generate --greedy` (equal position by position, first difference); qkv's bf16/int8 on
the same ids the same way (`--dtype`), and beside it what `qkv bench llama` reports in its JSON rows
(against its f32, on its own ids).
Workloads. Prefill: every position's logits (llama.cpp logits_all; CTranslate2 Generator.forward_batch;
qkv bench's default), from an empty KV cache. Decode: 128 greedy tokens after the 16-token prompt,
no stop at EOS (llama.cpp: top-k 1, temp 0; CTranslate2: generate_batch with sampling_topk 1,
max_length 128, end_token [] and include_prompt_in_result False, checked to return 128 tokens).

all-MiniLM-L6-v2 (onnxruntime, ctranslate2). The folder: --model, else $QKV_MINILM_DIR, else
~/.cache/qkv/minilm (tools/fetch_minilm.sh fetches it). Workloads as `qkv bench minilm`: its own
--sentences sentences (`qkv bench minilm --print-sentences --seed`: 5 to 30 words, every fourth one
Chinese) in batches of --batch (sentences/s), and its one sentence (ms). Tokenization is inside the
timed call: the folder's tokenizer.json through the `tokenizers` fast tokenizer, its fixed padding
to 128 turned off and truncation at sentence_bert_config.json's max_seq_length (as
sentence-transformers does); the sentences are grouped as qkv's embed_batched groups them (by token
count, longest first, each batch padded to its own longest); mean pooling over the mask and the L2
normalisation in numpy.
  onnxruntime  the Hugging Face BertModel's last_hidden_state exported by torch.onnx.export
               (TorchScript exporter, opset 17, dynamic batch and sequence), fused by default with
               onnxruntime.transformers.optimizer (model_type bert, opt_level 0: EmbedLayerNormalization,
               Attention, SkipLayerNormalization, BiasGelu; --ort-graph plain keeps the export as it
               is). int8: onnxruntime.quantization.quantize_dynamic of that graph, per_channel=True,
               weight_type QInt8, its default operators (the embedding table included); per-tensor's
               accuracy is reported beside it, untimed. Session: intra_op_num_threads --threads,
               inter_op_num_threads 1, ORT's default graph optimisations.
  ctranslate2  TransformersConverter of the folder (BertModel, an Encoder; float32), loaded with
               compute_type float32 or int8 (on a CPU int8_float32), intra_threads --threads;
               Encoder.forward_batch with token_type_ids 0, its last_hidden_state pooled as above.
Accuracy (before any timing): the least cosine, over the sentences, to sentence-transformers' f32
embeddings (computed in .venv-bench) of each peer type and of qkv in the same type (`qkv embed
--dtype`); beside it qkv bench's min_cosine_to_f32, which is against qkv's own f32.

Timing. --rounds rounds alternate `qkv bench WORKLOAD --dtype X --json --rounds 1` (one warm-up call,
one timed sample of >= 0.05 s) with the same on the peer (one warm-up call, then one sample of as
many calls as fill 0.05 s), in ABBA order, because the side that runs second in a round measures
slower on this VM (see compare_torch.py). Both sides get --threads threads. Reported: the median
over rounds, and qkv/peer = the peer's time / qkv's (above 1: qkv is faster).
"""

from __future__ import annotations

import argparse
import importlib.util
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
CHILD_MARK = "QKV_COMPARE_PEERS_CHILD"
PREFILL, DECODE, DECODE_PROMPT, VOCAB = 512, 128, 16, 32000
# The benchmark Llama's sizes (`qkv bench llama` flags): the default d512 (8 layers, 8 heads, 4
# key/value heads, 52 M parameters), and one of 1.08 B parameters (TinyLlama's stack: d 2048,
# 22 layers, 32 heads, 4 key/value heads; F = 8·2048/3 rounded up to 5464).
LLAMA_SHAPES = {"d512": [], "1b": ["--d-model", "2048", "--layers", "22", "--heads", "32", "--kv-heads", "4"]}
PAIRS = {"f32": "f32", "bf16": "bf16", "int8": "q8_0"}  # qkv dtype -> converter --outtype

# What each mode imports in the timed process (.venv-peers), and in the converter's (.venv-bench).
PEER_MODULES = {
    "llama-cpp": ["llama_cpp", "numpy", "safetensors"],
    "gguf": ["llama_cpp", "numpy", "safetensors"],
    "onnxruntime": ["onnxruntime", "onnx", "sympy", "tokenizers", "numpy", "safetensors"],
    "ctranslate2": ["ctranslate2", "tokenizers", "numpy", "safetensors"],
}
CONVERT_MODULES = {  # llama-cpp: whatever its converter imports (checked by running it)
    "onnxruntime": ["torch", "transformers", "onnx", "sentence_transformers"],
    "ctranslate2": ["torch", "transformers", "ctranslate2", "sentence_transformers"],
}
# The peers' names in the printed lines, by the prefix of their JSON keys.
NAMES = {"llama_cpp": "llama.cpp", "onnxruntime": "ORT", "ctranslate2": "CT2"}
# gguf: the files' types, and llama.cpp's quantizer's ftype for those it makes.
GGUF_TYPES = {"q8_0": None, "q4_k_m": 15}
# qkv's number types and the peer's type each pairs with (llama-cpp: the GGUF --outtype above).
ORT_TYPES = {"f32": "f32", "int8": "int8", "int8-row": "int8"}
CT2_TYPES = {"f32": "float32", "int8": "int8", "int8-row": "int8"}
# cmd/bench/minilm.rs's SINGLE_SENTENCE, checked against the row qkv bench prints (the peer needs it before).
SINGLE_SENTENCE = "Attention lets every word look at all the other words."

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

# Run by the converter's interpreter: sentence-transformers' f32 embeddings of a JSON list of texts.
ST_EMBED = """
import json, sys, numpy as np
from sentence_transformers import SentenceTransformer
folder, texts, out = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
np.save(out, SentenceTransformer(folder, device="cpu").encode(texts, batch_size=32))
"""

# Run by the converter's interpreter: the BertModel's last hidden state as an ONNX graph with
# dynamic batch and sequence (pooling stays outside, in numpy, as for CTranslate2).
EXPORT_ONNX = """
import sys, torch
from transformers import BertModel
folder, out = sys.argv[1], sys.argv[2]
bert = BertModel.from_pretrained(folder, attn_implementation="eager").eval()

class LastHidden(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = bert
    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids).last_hidden_state

ids = torch.ones(2, 8, dtype=torch.int64)
names = ["input_ids", "attention_mask", "token_type_ids"]
axes = {0: "batch", 1: "sequence"}
with torch.inference_mode():
    torch.onnx.export(LastHidden(), (ids, ids, torch.zeros_like(ids)), out, input_names=names,
                      output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={n: axes for n in [*names, "last_hidden_state"]})
"""

# Run by the converter's interpreter: a CTranslate2 model of a Hugging Face folder. The benchmark
# Llama has no tokenizer (--no-tokenizer): a stand-in of no tokens makes the loader name every id.
CONVERT_CT2 = """
import sys, types, ctranslate2
folder, out = sys.argv[1], sys.argv[2]

class StandInTokenizer(ctranslate2.converters.TransformersConverter):
    def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
        return types.SimpleNamespace(get_vocab=dict, unk_token="<extra_id_0>", bos_token="<extra_id_1>",
                                     eos_token="<extra_id_2>")

converter = StandInTokenizer if "--no-tokenizer" in sys.argv else ctranslate2.converters.TransformersConverter
converter(folder).convert(out, quantization="float32", force=True)
"""


# ---- environment and shared helpers --------------------------------------------------


def missing(modules: list[str]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def reexec_in_peers_venv(peer: str) -> None:
    """Runs the script under .venv-peers unless this interpreter has the mode's packages."""
    absent = missing(PEER_MODULES[peer])
    if not absent:
        return
    py = PEERS / "bin" / "python"
    if not py.exists() or os.environ.get(CHILD_MARK):
        where = f"{sys.executable}" + ("" if py.exists() else f", and {py} is missing")
        sys.exit(f"{peer}: {', '.join(absent)} not importable in {where}: see the docstring's set-up "
                 f"(python3 {Path(__file__).relative_to(ROOT)} --help)")
    os.execve(str(py), [str(py), *sys.argv], dict(os.environ, **{CHILD_MARK: "1"}))


def check_convert_python(opts) -> None:
    """The converter's interpreter has what this mode runs there, before anything is built."""
    mods = CONVERT_MODULES[opts.peer]
    probe = f"import importlib.util as u; print(','.join(m for m in {mods!r} if u.find_spec(m) is None))"
    out = subprocess.run([opts.convert_python, "-c", probe], capture_output=True, text=True)
    if out.returncode != 0 or out.stdout.strip():
        absent = out.stdout.strip() or out.stderr.strip()[-300:]
        sys.exit(f"{opts.peer}: the converter's interpreter {opts.convert_python} lacks {absent}: see the "
                 f"docstring's set-up (.venv-bench; --convert-python or $CONVERT_PYTHON overrides)")


def run(cmd: list) -> str:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{out.stderr[-4000:]}")
    return out.stdout


def timed(call) -> float:
    """As qkv bench --rounds 1 --warmup 1 --min-time 0.05: seconds per call of one sample."""
    t0 = time.perf_counter()
    call()
    iters = max(1, math.ceil(0.05 / max(time.perf_counter() - t0, 1e-9)))
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def alternate(opts, label: str, qkv_side, peer_side) -> None:
    """--rounds rounds of both sides, qkv first in rounds 1, 4, 5, 8, ... (ABBA): the side that
    runs second in a round measures slower on this VM."""
    for r in range(opts.rounds):
        print(f"{label}: round {r + 1}/{opts.rounds}", file=sys.stderr, flush=True)
        first, second = (qkv_side, peer_side) if r % 4 in (0, 3) else (peer_side, qkv_side)
        first()
        second()


def qkv_bench(opts, workload: str, dtype: str, *args) -> list[dict]:
    """One round of `qkv bench WORKLOAD` in a type: its JSON rows."""
    out = run([opts.qkv, "bench", workload, *args, "--dtype", dtype, "--json", "--rounds", "1",
               "--threads", opts.threads, "--seed", opts.seed])
    return [json.loads(line) for line in out.splitlines()]


def qkv_commit() -> str:
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return head.stdout.strip()


def check_dtypes(opts, allowed) -> list[str]:
    dtypes = opts.dtypes.split(",")
    bad = [d for d in dtypes if d not in allowed]
    if bad:
        sys.exit(f"{opts.peer}: --dtypes {','.join(bad)} has no pair here (pairs: {', '.join(allowed)})")
    return dtypes


def pair_summary(times: dict, qkv_key: str, peer_key: str, amount: float | None) -> dict:
    """Medians over rounds, and qkv/peer = the peer's time / qkv's; a rate when `amount` is given."""
    q, p = statistics.median(times["qkv"]), statistics.median(times["peer"])
    out = {"qkv_median_s": q, f"{peer_key}_median_s": p, f"qkv_over_{peer_key}": p / q,
           "qkv_rounds_s": times["qkv"], f"{peer_key}_rounds_s": times["peer"]}
    if amount is not None:
        out.update({f"qkv_{qkv_key}": amount / q, f"{peer_key}_{qkv_key}": amount / p})
    return out


# ---- the benchmark Llama (llama-cpp, ctranslate2) ----------------------------------------


def make_llama(opts, folder: Path) -> None:
    run([opts.qkv, "bench", "llama", *LLAMA_SHAPES[opts.llama_shape], "--save", folder, "--seed", opts.seed,
         "--prefill", "1", "--decode", "1",
         "--decode-prompt", "1", "--rounds", "1", "--warmup", "0", "--min-time", "0", "--json"])


def llama_ids(opts):
    import numpy as np

    rng = np.random.default_rng(opts.seed + 1)
    return rng.integers(0, VOCAB, PREFILL), rng.integers(0, VOCAB, DECODE_PROMPT)


def qkv_reference(opts, folder: Path, prompt, decode_prompt, dtype: str = "f32") -> dict:
    """qkv's prefill logits and greedy tokens on our ids; in f32, what the peer is held to."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    with tempfile.TemporaryDirectory() as tmp:
        save_file({"input_ids": prompt[None, :].astype(np.int64)}, f"{tmp}/in.safetensors")
        run([opts.qkv, "forward", "--model", folder, "--input", f"{tmp}/in.safetensors",
             "--output", f"{tmp}/out.safetensors", "--dtype", dtype])
        logits = load_file(f"{tmp}/out.safetensors")["logits"][0]
    tokens = json.loads(run([opts.qkv, "generate", "--model", folder, "--greedy", "--json", "--dtype", dtype,
                             "--input-ids", ",".join(map(str, decode_prompt)),
                             "--max-new-tokens", str(DECODE)]))
    tokens = tokens[0] if tokens and isinstance(tokens[0], list) else tokens
    return {"logits": logits, "tokens": tokens, "folder": folder, "prompt": prompt, "decode_prompt": decode_prompt}


def llama_accuracy(logits, tokens: list[int], ref) -> dict:
    """A peer's prefill logits and greedy tokens against qkv f32's."""
    import numpy as np

    pairs = list(zip(ref["tokens"], tokens))
    return {"logits_max_abs": float(np.abs(logits - ref["logits"]).max()),
            "max_abs_logit": float(np.abs(ref["logits"]).max()),
            "prefill_top1_equal": int((logits.argmax(-1) == ref["logits"].argmax(-1)).sum()),
            "greedy_equal": sum(a == b for a, b in pairs),
            "greedy_first_difference": next((i for i, (a, b) in enumerate(pairs) if a != b), None)}


def compare_llama(opts, dtype: str, peer, peer_key: str, peer_type: str, ref) -> dict:
    """Accuracy of the peer (prefill(), decode()) against qkv f32, then the alternating rounds
    against `qkv bench llama --dtype`. JSON keys carry `peer_key` (llama_cpp, ctranslate2)."""
    import numpy as np

    logits = np.array(peer.prefill())  # a copy: a later call may overwrite the peer's buffer
    acc = llama_accuracy(logits, peer.decode(), ref)
    print(f"check {dtype} / {NAMES[peer_key]} {peer_type}: {json.dumps(acc)}", file=sys.stderr, flush=True)
    # qkv in this type on the peer's ids too: qkv bench's own accuracy fields are on other ids
    same_ids = {}
    if dtype != "f32":
        mine = qkv_reference(opts, ref["folder"], ref["prompt"], ref["decode_prompt"], dtype)
        same_ids = llama_accuracy(mine["logits"], mine["tokens"], ref)
        print(f"check {dtype} / qkv {dtype} on the same ids: {json.dumps(same_ids)}", file=sys.stderr, flush=True)
    times = {m: {"qkv": [], "peer": []} for m in ("prefill", "decode")}
    qkv_acc = {}

    def qkv_side():
        for r in qkv_bench(opts, "llama", dtype, *LLAMA_SHAPES[opts.llama_shape]):
            times[r["mode"]]["qkv"].append(r["median_s"])
            qkv_acc.update({k: r[k] for k in ("logits_max_abs", "prefill_top1_equal", "greedy_equal",
                                              "greedy_first_difference") if k in r})

    def peer_side():
        times["prefill"]["peer"].append(timed(peer.prefill))
        times["decode"]["peer"].append(timed(peer.decode))

    alternate(opts, f"{dtype} / {NAMES[peer_key]} {peer_type}", qkv_side, peer_side)
    out = {"qkv_dtype": dtype, f"{peer_key}_type": peer_type, f"{peer_key}_accuracy_vs_qkv_f32": acc,
           "qkv_accuracy_vs_qkv_f32": qkv_acc, "qkv_accuracy_vs_qkv_f32_same_ids": same_ids, "rounds": opts.rounds}
    for mode, n in (("prefill", PREFILL), ("decode", DECODE)):
        out[mode] = pair_summary(times[mode], "tokens_per_s", peer_key, n)
    return out


def print_rates(first: str, peer_key: str, rows: list[tuple[str, dict]]) -> None:
    """The tokens/s table of the Llama workloads: a line per (first column, result) and workload."""
    peer_name = NAMES[peer_key]
    print(f"{first:<20} {'workload':<22} {'qkv tok/s':>10} {peer_name:>12} {'qkv/' + peer_name:>16}")
    for name, r in rows:
        for mode, label in (("prefill", f"prefill {PREFILL}"), ("decode", f"greedy decode {DECODE}")):
            m = r[mode]
            print(f"{name:<20} {label:<22} {m['qkv_tokens_per_s']:>10.1f} {m[f'{peer_key}_tokens_per_s']:>12.1f} "
                  f"{m[f'qkv_over_{peer_key}']:>16.2f}")


def print_llama(peer_key: str, results: list[dict]) -> None:
    peer_name = NAMES[peer_key]
    print_rates("pair", peer_key, [(f"{r['qkv_dtype']} / {r[f'{peer_key}_type']}", r) for r in results])
    print("\naccuracy against qkv f32 (logits over the prefill prompt; greedy tokens, position by position)")
    for r in results:
        for who, a in ((f"{peer_name} {r[f'{peer_key}_type']}", r[f"{peer_key}_accuracy_vs_qkv_f32"]),
                       (f"qkv {r['qkv_dtype']}", r["qkv_accuracy_vs_qkv_f32_same_ids"]),
                       (f"qkv {r['qkv_dtype']} (bench's ids)", r["qkv_accuracy_vs_qkv_f32"])):
            if a:
                print(f"  {who:<26} logits max abs {a['logits_max_abs']:.3g}, top-1 {a['prefill_top1_equal']}/{PREFILL}, "
                      f"greedy {a['greedy_equal']}/{DECODE} (first difference at {a['greedy_first_difference']})")


# ---- llama.cpp -------------------------------------------------------------------------


def convert(opts, folder: Path, outtype: str) -> Path:
    gguf = folder / f"model-{outtype}.gguf"
    if not gguf.exists():
        print(f"converting to GGUF {outtype}...", file=sys.stderr, flush=True)
        run([opts.convert_python, "-c", CONVERT, folder, opts.converter, folder, "--outtype", outtype,
             "--outfile", gguf])
    return gguf


class LlamaCpp:
    def __init__(self, opts, gguf: Path, prompt, decode_prompt, f32_cache: bool = False):
        from llama_cpp import Llama

        # logits_all: the prefill workload and the accuracy check want every position's logits;
        # the KV cache in llama.cpp's default type (f16) unless `f32_cache`, qkv's
        cache = {"type_k": 0, "type_v": 0} if f32_cache else {}
        self.llm = Llama(model_path=str(gguf), n_threads=opts.threads, n_threads_batch=opts.threads,
                         n_ctx=1024, n_batch=PREFILL, logits_all=True, verbose=False, **cache)
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


def llama_cpp_header(opts) -> dict:
    """What a llama.cpp run records of itself."""
    import llama_cpp

    return {"qkv": qkv_commit(), "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode().strip(), "threads": opts.threads,
            # left at llama.cpp's default for every GGUF type, F32 included (qkv's cache is f32)
            "llama_cpp_kv_cache": {0: "f32", 1: "f16"}.get(kv := llama_cpp.llama_context_default_params().type_k, kv),
            "rounds": opts.rounds, "llama_shape": opts.llama_shape, "load_average_1min": os.getloadavg()[0]}


def run_llama_cpp(opts, folder: Path) -> tuple[dict, list[dict]]:
    opts.dtypes = opts.dtypes or "f32,bf16,int8"
    dtypes = check_dtypes(opts, PAIRS)
    prompt, decode_prompt = llama_ids(opts)
    ref = qkv_reference(opts, folder, prompt, decode_prompt)
    header = llama_cpp_header(opts)
    results = []
    for d in dtypes:
        peer = LlamaCpp(opts, convert(opts, folder, PAIRS[d]), prompt, decode_prompt)
        results.append(compare_llama(opts, d, peer, "llama_cpp", PAIRS[d].upper(), ref))
        del peer  # frees the model before the next pair loads
    return header, results


def gguf_file(opts, folder: Path, name: str) -> Path:
    """The benchmark Llama as a GGUF file of type `name`: the converter's, or llama.cpp's
    quantizer's of the converter's F32 file."""
    import ctypes

    import llama_cpp

    if GGUF_TYPES[name] is None:
        return convert(opts, folder, name)
    path = folder / f"model-{name}.gguf"
    if not path.exists():
        print(f"quantizing to {name}...", file=sys.stderr, flush=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread = GGUF_TYPES[name], opts.threads
        src = convert(opts, folder, "f32")
        if llama_cpp.llama_model_quantize(str(src).encode(), str(path).encode(), ctypes.byref(params)) != 0:
            sys.exit(f"llama_model_quantize failed for {path}")
    return path


def run_gguf(opts, folder: Path) -> tuple[dict, list[dict]]:
    """Both engines on the same GGUF files: accuracy against qkv f32 of the folder (transformers'
    numbers), qkv against llama.cpp on the file, then alternating rounds."""
    import numpy as np

    names = (opts.dtypes or "q8_0,q4_k_m").split(",")
    if not set(names) <= set(GGUF_TYPES):
        sys.exit(f"--dtypes: gguf pairs {', '.join(GGUF_TYPES)}")
    prompt, decode_prompt = llama_ids(opts)
    ref = qkv_reference(opts, folder, prompt, decode_prompt)
    header = llama_cpp_header(opts)
    results = []
    for name in names:
        path = gguf_file(opts, folder, name)
        mine = qkv_reference(opts, path, prompt, decode_prompt)
        acc = {"qkv_vs_qkv_f32": llama_accuracy(mine["logits"], mine["tokens"], ref)}
        # llama.cpp with an f32 KV cache (qkv's) computes what qkv does but for its
        # products; with its default f16 cache, the one timed below, less so
        for cache, f32_cache in (("f32_kv", True), ("f16_kv", False)):
            peer = LlamaCpp(opts, path, prompt, decode_prompt, f32_cache)
            logits, tokens = np.array(peer.prefill()), peer.decode()
            acc[f"llama_cpp_{cache}_vs_qkv_f32"] = llama_accuracy(logits, tokens, ref)
            acc[f"qkv_vs_llama_cpp_{cache}"] = llama_accuracy(mine["logits"], mine["tokens"],
                                                              {"logits": logits, "tokens": tokens})
        print(f"check {name}: {json.dumps(acc)}", file=sys.stderr, flush=True)
        times = {m: {"qkv": [], "peer": []} for m in ("prefill", "decode")}

        def qkv_side():
            for r in qkv_bench(opts, "llama", "f32", "--model", path):
                times[r["mode"]]["qkv"].append(r["median_s"])

        def peer_side():
            times["prefill"]["peer"].append(timed(peer.prefill))
            times["decode"]["peer"].append(timed(peer.decode))

        alternate(opts, f"{name} file", qkv_side, peer_side)
        out = {"file": name, "bytes": path.stat().st_size, "accuracy": acc, "rounds": opts.rounds}
        for mode, n in (("prefill", PREFILL), ("decode", DECODE)):
            out[mode] = pair_summary(times[mode], "tokens_per_s", "llama_cpp", n)
        results.append(out)
        del peer
    return header, results


def print_gguf(header: dict, results: list[dict]) -> None:
    print(f"qkv {header['qkv']} against llama.cpp (llama-cpp-python {header['llama_cpp_python']}) on the same "
          f"GGUF files; {header['threads']} threads, {header['rounds']} alternating rounds, medians")
    print(f"llama.cpp system_info: {header['system_info']}; KV cache {header['llama_cpp_kv_cache']} (its default)")
    print_rates("file", "llama_cpp", [(r["file"], r) for r in results])
    print("\naccuracy (logits over the prefill prompt; greedy tokens, position by position)")
    for r in results:
        for who, a in r["accuracy"].items():
            print(f"  {r['file']:<8} {who:<28} logits max abs {a['logits_max_abs']:.3g}, top-1 "
                  f"{a['prefill_top1_equal']}/{PREFILL}, greedy {a['greedy_equal']}/{DECODE} "
                  f"(first difference at {a['greedy_first_difference']})")


def print_llama_cpp(header: dict, results: list[dict]) -> None:
    print(f"qkv {header['qkv']} against llama.cpp (llama-cpp-python {header['llama_cpp_python']}); "
          f"{header['threads']} threads each; {header['rounds']} alternating rounds, medians; "
          f"the {header['llama_shape']} Llama")
    print(f"llama.cpp system_info: {header['system_info']}; KV cache {header['llama_cpp_kv_cache']} (its default)")
    print_llama("llama_cpp", results)


# ---- all-MiniLM-L6-v2 (onnxruntime, ctranslate2) ---------------------------------------------


class MiniLMText:
    """The peer side's tokenizer and pooling: tokenization is part of every timed call."""

    def __init__(self, folder: Path, batch: int):
        from tokenizers import Tokenizer

        self.batch = batch
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # tokenizer.json pads every text to 128 and cuts at 128; sentence-transformers (and qkv)
        # pad a batch to its own longest and cut at max_seq_length
        self.tok.no_padding()
        st = json.loads((folder / "sentence_bert_config.json").read_text())
        self.tok.enable_truncation(st["max_seq_length"])
        self.dim = json.loads((folder / "config.json").read_text())["hidden_size"]

    def batches(self, texts: list[str]):
        """(indices, token ids) per batch, grouped as qkv's embed_batched: by token count,
        longest first, so that a batch pads only to its own longest text."""
        ids = [e.ids for e in self.tok.encode_batch([t.strip() for t in texts])]
        order = sorted(range(len(texts)), key=lambda i: -len(ids[i]))
        for k in range(0, len(order), self.batch):
            chunk = order[k:k + self.batch]
            yield chunk, [ids[i] for i in chunk]

    def embed(self, texts: list[str], hidden_states):
        """Unit mean-pooled embeddings; hidden_states(ids lists) -> [B, T, dim] of one batch."""
        import numpy as np

        out = np.zeros((len(texts), self.dim), np.float32)
        for chunk, ids in self.batches(texts):
            h = hidden_states(ids)
            lens = np.array([len(x) for x in ids])
            mask = (np.arange(h.shape[1])[None, :] < lens[:, None]).astype(np.float32)[..., None]
            v = (h * mask).sum(1) / lens[:, None]
            out[chunk] = v / np.linalg.norm(v, axis=1, keepdims=True)
        return out


def padded(ids: list[list[int]]):
    """Right-padded int64 ids and the attention mask of one batch."""
    import numpy as np

    t = max(map(len, ids))
    tokens, mask = np.zeros((len(ids), t), np.int64), np.zeros((len(ids), t), np.int64)
    for i, x in enumerate(ids):
        tokens[i, :len(x)], mask[i, :len(x)] = x, 1
    return tokens, mask


class OrtMiniLM:
    def __init__(self, opts, path: Path, text: MiniLMText):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = opts.threads, 1
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.text = text

    def hidden(self, ids):
        import numpy as np

        tokens, mask = padded(ids)
        return self.session.run(None, {"input_ids": tokens, "attention_mask": mask,
                                       "token_type_ids": np.zeros_like(tokens)})[0]

    def embed(self, texts):
        return self.text.embed(texts, self.hidden)


class Ct2MiniLM:
    def __init__(self, opts, path: Path, compute_type: str, text: MiniLMText):
        import ctranslate2

        self.encoder = ctranslate2.Encoder(str(path), device="cpu", compute_type=compute_type,
                                           intra_threads=opts.threads, inter_threads=1)
        self.text = text

    def hidden(self, ids):
        import numpy as np

        # ragged lists: CTranslate2 pads to the longest itself
        out = self.encoder.forward_batch(ids, token_type_ids=[[0] * len(x) for x in ids])
        return np.asarray(out.last_hidden_state)

    def embed(self, texts):
        return self.text.embed(texts, self.hidden)


def minilm_dir(given: str | None) -> Path:
    folder = Path(given or os.environ.get("QKV_MINILM_DIR") or Path.home() / ".cache" / "qkv" / "minilm")
    if not (folder / "modules.json").exists():
        sys.exit(f"{folder} is not a sentence-transformers folder of all-MiniLM-L6-v2: give --model DIR "
                 f"(tools/fetch_minilm.sh DIR fetches it)")
    return folder


def least_cosine(got, want) -> float:
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    return float(cos.min())


class MiniLMBench:
    """The sentences, sentence-transformers' f32 embeddings of them, and qkv's side."""

    def __init__(self, opts, work: Path):
        import numpy as np

        self.opts, self.folder = opts, minilm_dir(opts.model)
        self.sentences = json.loads(run([opts.qkv, "bench", "minilm", "--print-sentences", "--sentences",
                                         opts.sentences, "--seed", opts.seed]))
        (work / "sentences.json").write_text(json.dumps(self.sentences, ensure_ascii=False))
        print("sentence-transformers f32 embeddings...", file=sys.stderr, flush=True)
        run([opts.convert_python, "-c", ST_EMBED, self.folder, work / "sentences.json", work / "reference.npy"])
        self.reference = np.load(work / "reference.npy")
        self.text = MiniLMText(self.folder, opts.batch)

    def cosine(self, embeddings) -> float:
        return least_cosine(embeddings, self.reference)

    def qkv_cosine(self, dtype: str) -> float:
        import numpy as np

        got = json.loads(run([self.opts.qkv, "embed", "--model", self.folder, "--json", "--dtype", dtype,
                              *self.sentences]))
        return self.cosine(np.array(got))

    def compare(self, dtype: str, peer, peer_key: str, peer_type: str, extra_accuracy=None) -> dict:
        """Accuracy of both sides against sentence-transformers f32, then the alternating rounds."""
        acc = {f"{peer_key}_min_cosine": self.cosine(peer.embed(self.sentences)),
               "qkv_min_cosine": self.qkv_cosine(dtype), **(extra_accuracy or {})}
        print(f"check {dtype} / {NAMES[peer_key]} {peer_type}: least cosine to sentence-transformers f32 over "
              f"{len(self.sentences)} sentences: {json.dumps(acc)}", file=sys.stderr, flush=True)
        times = {m: {"qkv": [], "peer": []} for m in ("batch", "single")}

        def qkv_side():
            for r in qkv_bench(self.opts, "minilm", dtype, "--model", self.folder, "--sentences",
                               self.opts.sentences, "--batch", self.opts.batch):
                times[r["mode"]]["qkv"].append(r["median_s"])
                if r["mode"] == "single" and r["sentence"] != SINGLE_SENTENCE:
                    sys.exit(f"qkv bench minilm's one sentence is now {r['sentence']!r}: update SINGLE_SENTENCE")
                if "min_cosine_to_f32" in r:
                    acc["qkv_min_cosine_to_qkv_f32"] = r["min_cosine_to_f32"]

        def peer_side():
            times["batch"]["peer"].append(timed(lambda: peer.embed(self.sentences)))
            times["single"]["peer"].append(timed(lambda: peer.embed([SINGLE_SENTENCE])))

        alternate(self.opts, f"MiniLM {dtype} / {NAMES[peer_key]} {peer_type}", qkv_side, peer_side)
        return {"workload": "minilm", "qkv_dtype": dtype, f"{peer_key}_type": peer_type,
                "accuracy_vs_sentence_transformers_f32": acc, "rounds": self.opts.rounds,
                "batch": pair_summary(times["batch"], "sentences_per_s", peer_key, len(self.sentences)),
                "single": pair_summary(times["single"], "", peer_key, None)}


def print_minilm(peer_key: str, sentences: int, batch: int, results: list[dict]) -> None:
    peer_name = NAMES[peer_key]
    print("all-MiniLM-L6-v2 (tokenization included)")
    print(f"{'pair':<22} {'workload':<28} {'qkv':>10} {peer_name:>12} {'qkv/' + peer_name:>16}")
    for r in results:
        pair = f"{r['qkv_dtype']} / {r[f'{peer_key}_type']}"
        b, s = r["batch"], r["single"]
        print(f"{pair:<22} {f'{sentences} sentences, batch {batch}':<28} {b['qkv_sentences_per_s']:>10.1f} "
              f"{b[f'{peer_key}_sentences_per_s']:>12.1f} {b[f'qkv_over_{peer_key}']:>16.2f}   sentences/s")
        print(f"{pair:<22} {'one sentence':<28} {s['qkv_median_s'] * 1e3:>10.3f} "
              f"{s[f'{peer_key}_median_s'] * 1e3:>12.3f} {s[f'qkv_over_{peer_key}']:>16.2f}   ms")
    print(f"\nleast cosine to sentence-transformers f32 over {sentences} sentences")
    for r in results:
        a = r["accuracy_vs_sentence_transformers_f32"]
        line = (f"  {peer_name} {r[f'{peer_key}_type']}: {a[f'{peer_key}_min_cosine']:.6f}; "
                f"qkv {r['qkv_dtype']}: {a['qkv_min_cosine']:.6f}")
        if "qkv_min_cosine_to_qkv_f32" in a:
            line += f" (to qkv f32: {a['qkv_min_cosine_to_qkv_f32']:.6f})"
        extra = {k: v for k, v in a.items() if k.startswith(f"{peer_key}_") and k != f"{peer_key}_min_cosine"}
        for k, v in extra.items():
            line += f"; {k.removeprefix(peer_key + '_').replace('_', ' ')}: {v:.6f}"
        print(line)


# ---- ONNX Runtime --------------------------------------------------------------------------


def ort_models(opts, folder: Path, work: Path) -> dict[str, Path]:
    """The f32 graph (exported, fused unless --ort-graph plain) and its int8 quantizations."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    exported = work / "minilm.onnx"
    if not exported.exists():
        print("exporting MiniLM to ONNX...", file=sys.stderr, flush=True)
        run([opts.convert_python, "-c", EXPORT_ONNX, folder, exported])
    f32 = exported
    if opts.ort_graph == "fused":
        f32 = work / "minilm-fused.onnx"
        if not f32.exists():
            from onnxruntime.transformers import optimizer

            config = json.loads((folder / "config.json").read_text())
            # opt_level 0: the fusions alone; the session applies ORT's own optimisations on load
            fused = optimizer.optimize_model(str(exported), model_type="bert", opt_level=0,
                                             num_heads=config["num_attention_heads"],
                                             hidden_size=config["hidden_size"])
            print(f"ONNX Runtime fusions: {fused.get_fused_operator_statistics()}", file=sys.stderr, flush=True)
            fused.save_model_to_file(str(f32))
    models = {"f32": f32}
    for name, per_channel in (("int8", True), ("int8-per-tensor", False)):
        path = work / f"{f32.stem}-{name}.onnx"
        if not path.exists():
            # the fused operators (Attention, SkipLayerNormalization) have no type for the quantizer's
            # shape inference: their outputs are f32
            quantize_dynamic(str(f32), str(path), per_channel=per_channel, weight_type=QuantType.QInt8,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        models[name] = path
    return models


def run_onnxruntime(opts, work: Path) -> tuple[dict, list[dict]]:
    import onnxruntime

    opts.dtypes = opts.dtypes or "f32,int8"
    dtypes = check_dtypes(opts, ORT_TYPES)
    bench = MiniLMBench(opts, work)
    models = ort_models(opts, bench.folder, work)
    results = []
    for d in dtypes:
        kind = ORT_TYPES[d]
        extra = {}
        if kind == "int8":  # per-tensor scales: accuracy only (the issue measured 0.953 against 0.9906)
            per_tensor = OrtMiniLM(opts, models["int8-per-tensor"], bench.text)
            extra["onnxruntime_per_tensor_min_cosine"] = bench.cosine(per_tensor.embed(bench.sentences))
            del per_tensor
        peer = OrtMiniLM(opts, models[kind], bench.text)
        results.append(bench.compare(d, peer, "onnxruntime", kind, extra))
        del peer
    header = {"qkv": qkv_commit(), "onnxruntime": onnxruntime.__version__, "graph": opts.ort_graph,
              "threads": opts.threads, "rounds": opts.rounds, "sentences": opts.sentences, "batch": opts.batch,
              "load_average_1min": os.getloadavg()[0]}
    return header, results


def print_onnxruntime(header: dict, results: list[dict]) -> None:
    print(f"qkv {header['qkv']} against ONNX Runtime {header['onnxruntime']} ({header['graph']} graph; int8: "
          f"quantize_dynamic per channel); {header['threads']} threads each; {header['rounds']} alternating "
          f"rounds, medians")
    print_minilm("onnxruntime", header["sentences"], header["batch"], results)


# ---- CTranslate2 ---------------------------------------------------------------------------


def ct2_model(opts, folder: Path, out: Path, no_tokenizer: bool) -> Path:
    if not (out / "model.bin").exists():
        print(f"converting {folder} to CTranslate2...", file=sys.stderr, flush=True)
        run([opts.convert_python, "-c", CONVERT_CT2, folder, out, *(["--no-tokenizer"] if no_tokenizer else [])])
    return out


class Ct2Llama:
    def __init__(self, opts, path: Path, compute_type: str, prompt, decode_prompt):
        import ctranslate2

        self.generator = ctranslate2.Generator(str(path), device="cpu", compute_type=compute_type,
                                               intra_threads=opts.threads, inter_threads=1)
        names = json.loads((path / "vocabulary.json").read_text())  # id -> the name the converter gave it
        self.prompt = [int(t) for t in prompt]
        self.decode_prompt = [names[int(t)] for t in decode_prompt]  # generate_batch takes names

    def prefill(self):
        import numpy as np

        return np.asarray(self.generator.forward_batch([self.prompt]))[0]

    def decode(self) -> list[int]:
        r = self.generator.generate_batch([self.decode_prompt], max_length=DECODE, sampling_topk=1, beam_size=1,
                                          end_token=[], include_prompt_in_result=False)[0]
        ids = r.sequences_ids[0]
        if len(ids) != DECODE:
            sys.exit(f"CTranslate2 generated {len(ids)} tokens, not {DECODE}")
        return ids


def run_ctranslate2(opts, work: Path) -> tuple[dict, list[dict]]:
    import ctranslate2

    opts.dtypes = opts.dtypes or "f32,int8"
    dtypes = check_dtypes(opts, CT2_TYPES)
    workloads = opts.workloads.split(",")
    results = []
    if "minilm" in workloads:
        bench = MiniLMBench(opts, work)
        path = ct2_model(opts, bench.folder, work / "ct2-minilm", no_tokenizer=False)
        for d in dtypes:
            peer = Ct2MiniLM(opts, path, CT2_TYPES[d], bench.text)
            results.append(bench.compare(d, peer, "ctranslate2", peer.encoder.compute_type))
            del peer
    if "llama" in workloads:
        folder = work / "llama"
        make_llama(opts, folder)
        path = ct2_model(opts, folder, work / "ct2-llama", no_tokenizer=True)
        prompt, decode_prompt = llama_ids(opts)
        ref = qkv_reference(opts, folder, prompt, decode_prompt)
        for d in dtypes:
            peer = Ct2Llama(opts, path, CT2_TYPES[d], prompt, decode_prompt)
            out = compare_llama(opts, d, peer, "ctranslate2", peer.generator.compute_type, ref)
            results.append({"workload": "llama", **out})
            del peer
    header = {"qkv": qkv_commit(), "ctranslate2": ctranslate2.__version__, "threads": opts.threads,
              "rounds": opts.rounds, "sentences": opts.sentences, "batch": opts.batch,
              "load_average_1min": os.getloadavg()[0]}
    return header, results


def print_ctranslate2(header: dict, results: list[dict]) -> None:
    print(f"qkv {header['qkv']} against CTranslate2 {header['ctranslate2']}; {header['threads']} threads each; "
          f"{header['rounds']} alternating rounds, medians")
    minilm = [r for r in results if r["workload"] == "minilm"]
    llama = [r for r in results if r["workload"] == "llama"]
    if minilm:
        print()
        print_minilm("ctranslate2", header["sentences"], header["batch"], minilm)
    if llama:
        print("\nthe benchmark Llama (d512 L8 G4, random weights; token ids fed directly)")
        print_llama("ctranslate2", llama)


# ---- command line --------------------------------------------------------------------------


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("peer", choices=["llama-cpp", "gguf", "onnxruntime", "ctranslate2"])
    p.add_argument("--dtypes", help="qkv dtypes to pair (default: llama-cpp f32,bf16,int8; the others f32,int8)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.add_argument("--qkv", default=str(ROOT / "target" / "release" / "qkv"))
    p.add_argument("--convert-python", default=os.environ.get("CONVERT_PYTHON", str(ROOT / ".venv-bench/bin/python")),
                   help="the interpreter with torch that converts models (default .venv-bench)")
    p.add_argument("--save", help="keep the models here (default: a temporary folder); converted models "
                                  "already there are reused (delete them after changing --seed or the model). llama-cpp: "
                                  "the Llama folder, its GGUFs beside it; the others: a folder of llama/, ct2-*/, "
                                  "*.onnx")
    p.add_argument("--converter", default=str(PEERS / "llama.cpp" / "convert_hf_to_gguf.py"),
                   help="llama-cpp: the GGUF converter")
    p.add_argument("--model", help="onnxruntime, ctranslate2: the all-MiniLM-L6-v2 folder "
                                   "(default $QKV_MINILM_DIR, else ~/.cache/qkv/minilm)")
    p.add_argument("--sentences", type=int, default=256, help="MiniLM: sentences of the batch workload")
    p.add_argument("--batch", type=int, default=32, help="MiniLM: sentences per batch")
    p.add_argument("--ort-graph", choices=["fused", "plain"], default="fused",
                   help="onnxruntime: fuse the exported graph with onnxruntime.transformers (default) or not")
    p.add_argument("--llama-shape", choices=list(LLAMA_SHAPES), default="d512",
                   help="llama-cpp, ctranslate2: the benchmark Llama's sizes (1b: 1.08 B parameters; use its own --save folder)")
    p.add_argument("--workloads", default="minilm,llama", help="ctranslate2: minilm, llama or both")
    opts = p.parse_args()
    for k in ("rounds", "threads", "sentences", "batch"):
        if getattr(opts, k) < 1:
            p.error(f"--{k} must be at least 1")
    if not set(opts.workloads.split(",")) <= {"minilm", "llama"}:
        p.error("--workloads: minilm, llama or minilm,llama")
    return opts


def main() -> None:
    opts = parse()
    reexec_in_peers_venv(opts.peer)
    if opts.peer in CONVERT_MODULES:
        check_convert_python(opts)
    if not Path(opts.qkv).exists():
        sys.exit(f"{opts.qkv} is missing: cargo build --release -p qkv-cli (or give --qkv)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(opts.save or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if opts.peer in ("llama-cpp", "gguf"):
            # the folder itself, as before: its GGUFs sit beside the model
            folder = Path(opts.save or f"{tmp}/llama")
            make_llama(opts, folder)
            run_mode, show = {"llama-cpp": (run_llama_cpp, print_llama_cpp),
                              "gguf": (run_gguf, print_gguf)}[opts.peer]
            header, results = run_mode(opts, folder)
        elif opts.peer == "onnxruntime":
            header, results = run_onnxruntime(opts, work)
            show = print_onnxruntime
        else:
            header, results = run_ctranslate2(opts, work)
            show = print_ctranslate2
    if opts.json:
        for line in ({"header": header}, *results):
            print(json.dumps(line))
    else:
        show(header, results)


if __name__ == "__main__":
    main()
