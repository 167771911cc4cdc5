#!/usr/bin/env python3
"""Load on `qkv serve` over loopback: streaming clients on the benchmark Llama, and
one-sentence embedding clients on all-MiniLM-L6-v2 against the offline batch rate.

    python3 bench/serve_load.py llama [--clients 1,8,32,64] [--tokens 128] [--prompt 16] [--rounds 2]
    python3 bench/serve_load.py embed --model DIR [--clients 64] [--sentences 256] [--rounds 2]
  common options: --threads 2 --dtype f32 --qkv PATH --json; llama: --prefill-chunk 256

llama: the benchmark Llama of bench/compare_torch.py (`qkv bench llama --save DIR`: d512, 8 layers,
8 heads, 4 KV heads, vocabulary 32000, random weights, seed 0) with a stand-in word-level tokenizer
of 32000 words (t0 … t31999, written here) so that every token streams as its own piece of text.
Each client sends one streaming greedy completion of --prompt random words and --tokens new tokens
(random weights never choose an end: every stream is --tokens long), all clients at once. Reported
per client count: aggregate tokens/s (all clients' tokens over the wall time from the first request
to the last [DONE]), time to first token and inter-token latency (gaps between a stream's
successive events, all streams pooled), p50 and p99, medians over the rounds; and the goals of
issue 27 (32 streams ≥ 8× one stream's tokens/s; p99 inter-token latency at 32 ≤ 4× one stream's
median step).

embed: --clients threads send the --sentences sentences of `qkv bench minilm --print-sentences`
one per request (each thread takes the next unsent one) to a server on --model; sentences/s over
the wall time, against `qkv bench minilm --model DIR` (256 sentences in batches of 32, offline) in
alternating rounds. The goal: ≥ 0.8× the offline rate.

Every request must end in a full answer (stream: [DONE] and --tokens tokens; embeddings: one vector
each): a lost or failed request stops the benchmark. The server listens on 127.0.0.1 only and the
script stops it by its PID. The client threads run in this Python process, on the same cores as
the server: each event costs it a line read and a clock read, no JSON parsing until the end.
"""

import argparse
import http.client
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


def qkv_binary(path):
    if path:
        return path
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "qkv-cli"], cwd=ROOT, check=True)
    return str(ROOT / "target" / "release" / "qkv")


class Server:
    """`qkv serve` on 127.0.0.1 at a free port, stopped by its PID."""

    def __init__(self, qkv, model, args):
        cmd = [qkv, "serve", "--model", str(model), "--host", "127.0.0.1", "--port", "0", *args]
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

    def request(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        return c, c.getresponse()

    def stop(self):
        os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=60)


def run_all(threads):
    """Starts the threads together and waits for them: the wall time in seconds."""
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def stream(server, body, out, i):
    """One streaming completion: the time of each data event, checked complete."""
    t0 = time.perf_counter()
    c, r = server.request("/v1/completions", body)
    if r.status != 200:
        out[i] = ("failed", f"status {r.status}: {r.read()[:200]!r}")
        return
    times, last = [], None
    for line in r:
        if line.startswith(b"data: "):
            times.append(time.perf_counter())
            last = line
    c.close()
    done = last is not None and last.strip() == b"data: [DONE]"
    # the events before [DONE]: one per token, then the finish chunk and [DONE]
    out[i] = ("ok", t0, times[:-2], done)


def llama_round(server, clients, tokens, prompt_len, vocab, rng):
    bodies = []
    for _ in range(clients):
        words = " ".join(f"t{rng.randrange(vocab)}" for _ in range(prompt_len))
        bodies.append({"model": "llama", "prompt": words, "max_tokens": tokens, "temperature": 0, "stream": True})
    out = [None] * clients
    wall = run_all([threading.Thread(target=stream, args=(server, b, out, i)) for i, b in enumerate(bodies)])
    ttft, gaps, total = [], [], 0
    for r in out:
        if r is None or r[0] != "ok":
            sys.exit(f"a request failed: {r}")
        _, t0, times, done = r
        if not done or len(times) != tokens:
            sys.exit(f"a stream ended early: {len(times)} of {tokens} tokens, [DONE] {done}")
        ttft.append(times[0] - t0)
        gaps.extend(b - a for a, b in zip(times, times[1:]))
        total += len(times)
    return {
        "tokens_per_s": total / wall,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "itl_p50_ms": 1e3 * percentile(gaps, 50),
        "itl_p99_ms": 1e3 * percentile(gaps, 99),
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


def run_llama(a, qkv):
    work = Path(tempfile.mkdtemp(prefix="qkv-serve-load-"))
    model = work / "llama"
    subprocess.run([qkv, "bench", "llama", "--save", str(model), "--seed", "0", "--prefill", "4",
                    "--decode", "1", "--rounds", "1", "--warmup", "0", "--threads", str(a.threads)],
                   check=True, stdout=subprocess.DEVNULL)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    word_tokenizer(model / "tokenizer.json", vocab)
    clients = [int(c) for c in a.clients.split(",")]
    server = Server(qkv, model, ["--name", "llama", "--threads", str(a.threads), "--dtype", a.dtype,
                                 "--max-batch", str(max(clients)), "--max-queue", "1024",
                                 "--prefill-chunk", str(a.prefill_chunk)])
    rng = random.Random(0)
    results = {c: [] for c in clients}
    try:
        llama_round(server, 1, 8, a.prompt, vocab, rng)  # warm-up
        for r in range(a.rounds):
            order = clients if r % 2 == 0 else clients[::-1]
            for c in order:
                results[c].append(llama_round(server, c, a.tokens, a.prompt, vocab, rng))
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


def report(rows, a):
    if a.json:
        for r in rows.values():
            print(json.dumps(r))
        return
    print(f"{'clients':>7} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}  (ms)")
    for c, r in rows.items():
        print(f"{c:>7} {r['tokens_per_s']:>9.1f} {r['ttft_p50_ms']:>9.1f} {r['ttft_p99_ms']:>9.1f} "
              f"{r['itl_p50_ms']:>8.2f} {r['itl_p99_ms']:>8.2f}")


def embed_round(server, clients, sentences):
    queue = list(enumerate(sentences))
    lock = threading.Lock()
    got = [None] * len(sentences)

    def client():
        while True:
            with lock:
                if not queue:
                    return
                i, s = queue.pop()
            c, r = server.request("/v1/embeddings", {"model": "minilm", "input": s})
            body = r.read()
            c.close()
            if r.status != 200:
                got[i] = f"status {r.status}: {body[:200]!r}"
                continue
            got[i] = len(json.loads(body)["data"][0]["embedding"])

    wall = run_all([threading.Thread(target=client) for _ in range(clients)])
    bad = [g for g in got if not isinstance(g, int)]
    if bad:
        sys.exit(f"{len(bad)} embedding requests failed: {bad[0]}")
    return len(sentences) / wall


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
        embed_round(server, clients, sentences[:32])  # warm-up
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
                served.append(embed_round(server, clients, sentences))
                offline_run()
            else:
                offline_run()
                served.append(embed_round(server, clients, sentences))
    finally:
        server.stop()
    s, o = statistics.median(served), statistics.median(offline)
    if a.json:
        print(json.dumps({"clients": clients, "served_sentences_per_s": s, "offline_sentences_per_s": o}))
    else:
        print(f"{clients} one-sentence clients: {s:.1f} sentences/s; offline batches of 32: {o:.1f} sentences/s")
    print(f"goal: served {s / o:.2f}x the offline batch rate (>= 0.8)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["llama", "embed"])
    p.add_argument("--clients", default=None)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="f32", help="the server's (and the offline run's) --dtype")
    p.add_argument("--prefill-chunk", type=int, default=256, help="the server's --prefill-chunk")
    p.add_argument("--model")
    p.add_argument("--qkv")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.clients is None:
        a.clients = "1,8,32,64" if a.mode == "llama" else "64"
    qkv = qkv_binary(a.qkv)
    (run_llama if a.mode == "llama" else run_embed)(a, qkv)


if __name__ == "__main__":
    main()
