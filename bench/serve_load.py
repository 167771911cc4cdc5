#!/usr/bin/env python3
"""Load on `qkv serve` over loopback: streaming clients and a chat's second turn on the benchmark
Llama, and one-sentence embedding clients on all-MiniLM-L6-v2 against the offline batch rate. The
clients are `qkv bench load` (Rust: a thread per client blocked on its socket, a clock read and a
small JSON parse per event); this script starts the server, writes the requests, and reads the
generator's figures.

    python3 bench/serve_load.py llama [--clients 1,8,32,64] [--tokens 128] [--prompt 16] [--rounds 2]
    python3 bench/serve_load.py chat [--history 2000] [--rounds 3]
    python3 bench/serve_load.py embed --model DIR [--clients 64] [--sentences 256] [--rounds 2]
  common options: --threads 2 --dtype f32 --qkv PATH --json; llama and chat: --prefill-chunk 256,
  --cache-bytes (the server's)

llama: the benchmark Llama of bench/compare_torch.py (`qkv bench llama --save DIR`: d512, 8 layers,
8 heads, 4 KV heads, vocabulary 32000, random weights, seed 0) with a stand-in word-level tokenizer
of 32000 words (t0 … t31999, written here) so that every token streams as its own piece of text.
Each client sends one streaming greedy completion of --prompt random words and --tokens new tokens
(random weights never choose an end: every stream is --tokens long), all clients at once. Reported
per client count: aggregate tokens/s (all clients' tokens over the wall time from the first request
to the last [DONE]), time to first token and inter-token latency (gaps between a stream's
successive events, all streams pooled), p50 and p99, medians over the rounds; and the goals of
issue 52 (32 streams ≥ 8× one stream's tokens/s; p99 inter-token latency at 32 ≤ 4× one stream's
median step).

chat: a conversation's first turn, --history random words streamed with 16 new tokens, then its
second turn (the history, the first answer and 16 new words) streamed the same way, one client: the
time to the first token of each; the goal (issue 52): the second ≤ 20% of the first, which the
server's prefix cache makes possible (--cache-bytes 0 shows the turn without it). Each round a new
history, so the first turn never finds it cached.

embed: --clients send the --sentences sentences of `qkv bench minilm --print-sentences` one per
request (each client takes the next unsent one) to a server on --model; sentences/s over the wall
time, against `qkv bench minilm --model DIR` (256 sentences, offline) in alternating rounds. The
goal (issue 52): ≥ 0.9× the offline rate.

Every request must end in a full answer (stream: [DONE] and --tokens tokens; embeddings: a 200
each): a lost or failed request stops the benchmark. The server listens on 127.0.0.1 only and the
script stops it by its PID.
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVE_QKV = None


def qkv_binary(path):
    if path:
        return path
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "qkv-cli"], cwd=ROOT, check=True)
    return str(ROOT / "target" / "release" / "qkv")


class Server:
    """`qkv serve` on 127.0.0.1 at a free port, stopped by its PID."""

    def __init__(self, qkv, model, args):
        cmd = [SERVE_QKV or qkv, "serve", "--model", str(model), "--host", "127.0.0.1", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = None
        for line in self.proc.stderr:
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.wait()
            sys.exit(f"qkv serve did not start ({self.proc.returncode})")
        # the per-request log lines are read away so the server never blocks on them
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def stop(self):
        os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=60)


def load(qkv, server, asks, clients):
    """Runs `qkv bench load` over `asks` ((path, body) pairs), `clients` in flight: its figures,
    each request's included (time to first event, events, text)."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for path, body in asks:
            f.write(json.dumps({"path": path, "body": body}) + "\n")
    try:
        r = subprocess.run([qkv, "bench", "load", "--url", f"http://127.0.0.1:{server.port}", "--requests",
                            f.name, "--clients", str(clients), "--each"], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        sys.exit(f"a request failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def words(rng, n, vocab):
    return " ".join(f"t{rng.randrange(vocab)}" for _ in range(n))


def llama_round(qkv, server, clients, tokens, prompt_len, vocab, rng):
    asks = [("/v1/completions", {"model": "llama", "prompt": words(rng, prompt_len, vocab), "max_tokens": tokens,
                                 "temperature": 0, "stream": True}) for _ in range(clients)]
    r = load(qkv, server, asks, clients)
    short = [e["events"] for e in r["each"] if e["events"] != tokens]
    if short:
        sys.exit(f"a stream ended early: {short[0]} of {tokens} tokens")
    return {
        "tokens_per_s": r["events_per_s"],
        "ttft_p50_ms": r["ttft_ms_p50"],
        "ttft_p99_ms": r["ttft_ms_p99"],
        "itl_p50_ms": r["itl_ms_p50"],
        "itl_p99_ms": r["itl_ms_p99"],
    }


def word_tokenizer(path, vocab):
    """A word-level tokenizer.json of `vocab` words t0 … t{vocab-1}, split on whitespace."""
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}, "unk_token": "t0"},
    }
    path.write_text(json.dumps(tok))


def llama_folder(a, qkv):
    """The benchmark Llama with its word-level tokenizer: the folder and its vocabulary size."""
    work = Path(tempfile.mkdtemp(prefix="qkv-serve-load-"))
    model = work / "llama"
    subprocess.run([qkv, "bench", "llama", "--save", str(model), "--seed", "0", "--prefill", "4",
                    "--decode", "1", "--rounds", "1", "--warmup", "0", "--threads", str(a.threads)],
                   check=True, stdout=subprocess.DEVNULL)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    word_tokenizer(model / "tokenizer.json", vocab)
    return model, vocab


def llama_server(a, qkv, model, max_batch):
    args = ["--name", "llama", "--threads", str(a.threads), "--dtype", a.dtype, "--max-batch", str(max_batch),
            "--max-queue", "1024", "--prefill-chunk", str(a.prefill_chunk)]
    if a.cache_bytes is not None:
        args += ["--cache-bytes", str(a.cache_bytes)]
    return Server(qkv, model, args)


def run_llama(a, qkv):
    model, vocab = llama_folder(a, qkv)
    clients = [int(c) for c in a.clients.split(",")]
    server = llama_server(a, qkv, model, max(clients))
    rng = random.Random(0)
    results = {c: [] for c in clients}
    try:
        llama_round(qkv, server, 1, 8, a.prompt, vocab, rng)  # warm-up
        for r in range(a.rounds):
            order = clients if r % 2 == 0 else clients[::-1]
            for c in order:
                results[c].append(llama_round(qkv, server, c, a.tokens, a.prompt, vocab, rng))
    finally:
        server.stop()
    rows = {}
    for c in clients:
        rows[c] = {k: statistics.median(r[k] for r in results[c]) for k in results[c][0]}
        rows[c]["clients"] = c
    report(rows, a)
    if 1 in rows and 32 in rows:
        one, many = rows[1], rows[32]
        print(f"goal: 32 streams {many['tokens_per_s'] / one['tokens_per_s']:.2f}x one stream's tokens/s (>= 8); "
              f"p99 inter-token latency at 32 {many['itl_p99_ms'] / one['itl_p50_ms']:.2f}x one stream's median step (<= 4)")


def run_chat(a, qkv):
    model, vocab = llama_folder(a, qkv)
    server = llama_server(a, qkv, model, 1)
    rng = random.Random(0)
    first, second = [], []

    def turn(prompt):
        body = {"model": "llama", "prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True}
        e = load(qkv, server, [("/v1/completions", body)], 1)["each"][0]
        return e["ttft_ms"], e["text"]

    try:
        turn(words(rng, 64, vocab))  # warm-up
        for _ in range(a.rounds):
            history = words(rng, a.history, vocab)
            t1, answer = turn(history)
            # the answer's words as the next turn's prompt holds them
            said = " ".join(re.findall(r"t\d+", answer))
            t2, _ = turn(f"{history} {said} {words(rng, 16, vocab)}")
            first.append(t1)
            second.append(t2)
    finally:
        server.stop()
    f, s2 = statistics.median(first), statistics.median(second)
    if a.json:
        print(json.dumps({"history": a.history, "first_turn_ttft_ms": f, "second_turn_ttft_ms": s2}))
    else:
        print(f"history of {a.history} tokens: time to first token {f:.1f} ms (first turn), "
              f"{s2:.1f} ms (second turn); medians of {a.rounds}")
    print(f"goal: the second turn's time to first token {s2 / f:.3f}x the first's (<= 0.2)")


def report(rows, a):
    if a.json:
        for r in rows.values():
            print(json.dumps(r))
        return
    print(f"{'clients':>7} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}  (ms)")
    for c, r in rows.items():
        print(f"{c:>7} {r['tokens_per_s']:>9.1f} {r['ttft_p50_ms']:>9.1f} {r['ttft_p99_ms']:>9.1f} "
              f"{r['itl_p50_ms']:>8.2f} {r['itl_p99_ms']:>8.2f}")


def embed_round(qkv, server, clients, sentences):
    asks = [("/v1/embeddings", {"model": "minilm", "input": t}) for t in sentences]
    r = load(qkv, server, asks, clients)
    return len(sentences) / r["wall_s"]


def run_embed(a, qkv):
    if not a.model:
        sys.exit("embed needs --model DIR (tools/fetch_minilm.sh DIR)")
    sentences = json.loads(subprocess.run([qkv, "bench", "minilm", "--print-sentences", "--sentences",
                                           str(a.sentences)], check=True, capture_output=True).stdout)
    clients = int(a.clients.split(",")[-1])
    server = Server(qkv, a.model, ["--name", "minilm", "--threads", str(a.threads), "--dtype", a.dtype,
                                   "--max-queue", "1024"])
    served, offline = [], []
    try:
        embed_round(qkv, server, clients, sentences)  # warm-up: a whole round, as the offline run warms up with a call
        for r in range(a.rounds):
            def offline_run():
                out = subprocess.run([qkv, "bench", "minilm", "--model", a.model, "--threads", str(a.threads),
                                      "--dtype", a.dtype,
                                      "--sentences", str(a.sentences), "--rounds", "3", "--json"],
                                     check=True, capture_output=True, text=True).stdout
                batch = [json.loads(l) for l in out.splitlines() if '"mode":"batch"' in l][0]
                offline.append(batch["sentences_per_s_median"])
            # the offline side runs while the server idles (its threads park between requests)
            if r % 2 == 0:
                served.append(embed_round(qkv, server, clients, sentences))
                offline_run()
            else:
                offline_run()
                served.append(embed_round(qkv, server, clients, sentences))
    finally:
        server.stop()
    s, o = statistics.median(served), statistics.median(offline)
    if a.json:
        print(json.dumps({"clients": clients, "served_sentences_per_s": s, "offline_sentences_per_s": o}))
    else:
        print(f"{clients} one-sentence clients: {s:.1f} sentences/s; offline batches of 32: {o:.1f} sentences/s")
    print(f"goal: served {s / o:.2f}x the offline batch rate (>= 0.9)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["llama", "chat", "embed"])
    p.add_argument("--clients", default=None)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="f32", help="the server's (and the offline run's) --dtype")
    p.add_argument("--prefill-chunk", type=int, default=256, help="the server's --prefill-chunk")
    p.add_argument("--cache-bytes", type=int, default=None, help="the server's --cache-bytes")
    p.add_argument("--history", type=int, default=2000, help="chat: the first turn's tokens")
    p.add_argument("--model")
    p.add_argument("--qkv")
    p.add_argument("--serve-qkv", help="the binary the server runs (default --qkv): another build to compare")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.clients is None:
        a.clients = "1,8,32,64" if a.mode == "llama" else "64"
    qkv = qkv_binary(a.qkv)
    global SERVE_QKV
    SERVE_QKV = a.serve_qkv
    {"llama": run_llama, "chat": run_chat, "embed": run_embed}[a.mode](a, qkv)


if __name__ == "__main__":
    main()
