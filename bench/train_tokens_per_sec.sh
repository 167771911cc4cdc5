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
# DTYPE=bf16 trains both in mixed precision (qkv --dtype bf16; PyTorch under
# torch.autocast bf16), and adds qkv in f32 as a third side, for the ratio bf16 / f32.
#
#   bench/train_tokens_per_sec.sh            # THREADS=2 WARMUP=2 STEPS=5 ROUNDS=4
#   THREADS=2 STEPS=10 ROUNDS=5 bench/train_tokens_per_sec.sh
#   DTYPE=bf16 PYTHON=.venv-bench/bin/python bench/train_tokens_per_sec.sh
#
# PyTorch comes from the fixture venv (.venv-ref, or $PYTHON); qkv is a release build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${THREADS:-2}"
WARMUP="${WARMUP:-2}"
STEPS="${STEPS:-5}"
ROUNDS="${ROUNDS:-4}"
DTYPE="${DTYPE:-f32}"
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
    --dtype "$DTYPE" >>"$WORK/torch.jsonl"
}
# run_qkv ROUND [DTYPE]: appends to qkv.jsonl (the run's DTYPE) or qkv-f32.jsonl
run_qkv() {
  local dtype="${2:-$DTYPE}" log="$WORK/qkv.jsonl"
  [ "$dtype" = "$DTYPE" ] || log="$WORK/qkv-$dtype.jsonl"
  echo "round $1/$ROUNDS: qkv $dtype, $WARMUP warm-up + $STEPS timed steps on $THREADS threads..." >&2
  rm -rf "$WORK/ckpt"
  "$QKV" train --text "$WORK/random.bin" --style gpt2 \
    --d-model 384 --layers 6 --heads 6 --batch-size "$B" --seq-len "$T" \
    --steps "$((WARMUP + STEPS))" --lr 3e-4 --constant-lr --eval-batches 0 \
    --threads "$THREADS" --quiet --bench-warmup "$WARMUP" --out "$WORK/ckpt" \
    --dtype "$dtype" >>"$log"
}
for round in $(seq 1 "$ROUNDS"); do
  case $(((round - 1) % 4)) in
    0 | 3) run_torch "$round"; run_qkv "$round" ;;
    *) run_qkv "$round"; run_torch "$round" ;;
  esac
  if [ "$DTYPE" != f32 ]; then run_qkv "$round" f32; fi
done

"$PYTHON" - "$DTYPE" "$WORK"/torch.jsonl "$WORK"/qkv.jsonl "$WORK"/qkv-f32.jsonl <<'PY'
import json, os, statistics, sys
dtype, paths = sys.argv[1], [p for p in sys.argv[2:] if os.path.exists(p)]
runs = [[json.loads(l) for l in open(p)] for p in paths]
torch, qkv, *f32 = ([r["tokens_per_sec"] for r in rs] for rs in runs)
info = runs[0][0]
best_median = lambda xs: f"{max(xs):7.0f} / {statistics.median(xs):7.0f}   rounds: {' '.join(f'{x:.0f}' for x in xs)}"
print(f"training tokens/s in {dtype}, GPT-2 style d=384 L=6 H=6 V=256, B=8 T=256, "
      f"{runs[1][0]['threads']} threads, {len(torch)} rounds (best / median):")
print(f"  PyTorch {info['torch']} {dtype} ({info['attn_implementation']} attention): {best_median(torch)}")
print(f"  qkv {dtype}:{' ' * 30}{best_median(qkv)}")
print(f"  ratio qkv / PyTorch (best): {max(qkv) / max(torch):.2f}   "
      f"(median): {statistics.median(qkv) / statistics.median(torch):.2f}")
if f32:
    print(f"  qkv f32:{' ' * 30}{best_median(f32[0])}")
    print(f"  ratio qkv {dtype} / qkv f32 (best): {max(qkv) / max(f32[0]):.2f}   "
          f"(median): {statistics.median(qkv) / statistics.median(f32[0]):.2f}")
PY
