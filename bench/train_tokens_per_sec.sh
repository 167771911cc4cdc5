#!/usr/bin/env bash
# Training throughput, qkv vs PyTorch, in one run on this machine (issue 4 §7).
#
# Both train the same GPT-2-style model — d=384, 6 layers, 6 heads, vocabulary 256,
# 256 learned positions, GELU-tanh MLP of 4·d, tied head, no dropout — on random byte
# batches of B=8, T=256: one step is forward + cross-entropy + backward + AdamW.
# Each side gets THREADS threads (default 2), runs WARMUP untimed steps (default 2),
# then times STEPS steps (default 5), and reports training tokens/s = STEPS·B·T / time.
#
#   bench/train_tokens_per_sec.sh            # THREADS=2 WARMUP=2 STEPS=5
#   THREADS=2 STEPS=10 bench/train_tokens_per_sec.sh
#
# PyTorch comes from the fixture venv (.venv-ref, or $PYTHON); qkv is a release build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${THREADS:-2}"
WARMUP="${WARMUP:-2}"
STEPS="${STEPS:-5}"
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

echo "PyTorch: $WARMUP warm-up + $STEPS timed steps on $THREADS threads..." >&2
TORCH_JSON="$(OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS" "$PYTHON" \
  "$ROOT/bench/train_tokens_per_sec_torch.py" \
  --threads "$THREADS" --warmup "$WARMUP" --steps "$STEPS" --batch "$B" --seq "$T")"

echo "qkv: $WARMUP warm-up + $STEPS timed steps on $THREADS threads..." >&2
QKV_JSON="$("$QKV" train --text "$WORK/random.bin" --style gpt2 \
  --d-model 384 --layers 6 --heads 6 --batch-size "$B" --seq-len "$T" \
  --steps "$((WARMUP + STEPS))" --lr 3e-4 --constant-lr --eval-batches 0 \
  --threads "$THREADS" --quiet --bench-warmup "$WARMUP" --out "$WORK/ckpt")"

echo "pytorch: $TORCH_JSON"
echo "qkv:     $QKV_JSON"
"$PYTHON" - "$TORCH_JSON" "$QKV_JSON" <<'PY'
import json, sys
torch, qkv = json.loads(sys.argv[1]), json.loads(sys.argv[2])
t, q = torch["tokens_per_sec"], qkv["tokens_per_sec"]
print(f"training tokens/s (GPT-2 style d=384 L=6 H=6 V=256, B=8 T=256, {qkv['threads']} threads):")
print(f"  PyTorch {torch['torch']} ({torch['attn_implementation']} attention): {t:8.0f}")
print(f"  qkv:                                   {q:8.0f}")
print(f"  ratio qkv / PyTorch: {q / t:.2f}")
PY
