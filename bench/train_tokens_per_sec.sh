#!/usr/bin/env bash
# Training throughput, qkv vs PyTorch, in one run on this machine (issue 4 §7).
#
# Both train the same GPT-2-style model — d=384, 6 layers, 6 heads, vocabulary 256,
# 256 learned positions, GELU-tanh MLP of 4·d, tied head, no dropout — on random byte
# batches of B=8, T=256: one step is forward + cross-entropy + backward + AdamW.
# Each side gets THREADS threads (default 2), runs WARMUP untimed steps (default 2),
# then times STEPS steps (default 5): training tokens/s = STEPS·B·T / time. ROUNDS
# (default 4) alternating runs of each; the best and the median are reported.
#
#   bench/train_tokens_per_sec.sh            # THREADS=2 WARMUP=2 STEPS=5 ROUNDS=4
#   THREADS=2 STEPS=10 ROUNDS=5 bench/train_tokens_per_sec.sh
#
# PyTorch comes from the fixture venv (.venv-ref, or $PYTHON); qkv is a release build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${THREADS:-2}"
WARMUP="${WARMUP:-2}"
STEPS="${STEPS:-5}"
ROUNDS="${ROUNDS:-4}"
PYTHON="${PYTHON:-$ROOT/.venv-ref/bin/python}"
B=8
T=256

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "building qkv (release)..." >&2
cargo build --release -p qkv-cli --manifest-path "$ROOT/Cargo.toml" >&2
QKV="$ROOT/target/release/qkv"

# Random bytes: the vocabulary is the 256 byte values, as in the PyTorch script.
"$PYTHON" -c "import random, sys; random.seed(0); sys.stdout.buffer.write(bytes(random.randrange(256) for _ in range(1 << 20)))" >"$WORK/random.bin"

# The two sides alternate for ROUNDS rounds, so that load from other processes hits
# both alike; the best round of each is reported (the least disturbed), with the median.
# The order inside a round alternates too (PyTorch first in rounds 1, 4, 5, 8, ...; qkv
# first in 2, 3, 6, 7, ...): whichever side runs second in a round measures slower on
# this VM (a binary against a copy of itself came out 7-13% apart in A-then-B order).
run_torch() {
  echo "round $1/$ROUNDS: PyTorch, $WARMUP warm-up + $STEPS timed steps on $THREADS threads..." >&2
  OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS" "$PYTHON" \
    "$ROOT/bench/train_tokens_per_sec_torch.py" \
    --threads "$THREADS" --warmup "$WARMUP" --steps "$STEPS" --batch "$B" --seq "$T" \
    >>"$WORK/torch.jsonl"
}
run_qkv() {
  echo "round $1/$ROUNDS: qkv, $WARMUP warm-up + $STEPS timed steps on $THREADS threads..." >&2
  rm -rf "$WORK/ckpt"
  "$QKV" train --text "$WORK/random.bin" --style gpt2 \
    --d-model 384 --layers 6 --heads 6 --batch-size "$B" --seq-len "$T" \
    --steps "$((WARMUP + STEPS))" --lr 3e-4 --constant-lr --eval-batches 0 \
    --threads "$THREADS" --quiet --bench-warmup "$WARMUP" --out "$WORK/ckpt" \
    >>"$WORK/qkv.jsonl"
}
for round in $(seq 1 "$ROUNDS"); do
  case $(((round - 1) % 4)) in
    0 | 3) run_torch "$round"; run_qkv "$round" ;;
    *) run_qkv "$round"; run_torch "$round" ;;
  esac
done

"$PYTHON" - "$WORK/torch.jsonl" "$WORK/qkv.jsonl" <<'PY'
import json, statistics, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
torch, qkv = ([r["tokens_per_sec"] for r in rs] for rs in runs)
info = runs[0][0]
print(f"training tokens/s, GPT-2 style d=384 L=6 H=6 V=256, B=8 T=256, "
      f"{runs[1][0]['threads']} threads, {len(torch)} rounds (best / median):")
print(f"  PyTorch {info['torch']} ({info['attn_implementation']} attention): "
      f"{max(torch):7.0f} / {statistics.median(torch):7.0f}   rounds: {' '.join(f'{x:.0f}' for x in torch)}")
print(f"  qkv:                                  "
      f"{max(qkv):7.0f} / {statistics.median(qkv):7.0f}   rounds: {' '.join(f'{x:.0f}' for x in qkv)}")
print(f"  ratio qkv / PyTorch (best): {max(qkv) / max(torch):.2f}   "
      f"(median): {statistics.median(qkv) / statistics.median(torch):.2f}")
PY
