#!/usr/bin/env bash
# Every number type beside every peer, on the four workloads of the README's dtype table
# (issue 26): the benchmark Llama's greedy decoding of 128 tokens and prefill of 512, and
# all-MiniLM-L6-v2's 256 sentences (batch 32) and one sentence. Each run checks accuracy
# before it times, and alternates its sides' rounds; a cell's ratio to PyTorch f32 comes
# from the run it was measured in (the peers' runs pair with qkv, not with PyTorch: their
# ratio is to qkv in the same type).
#
#   bench/dtype_table.sh                  # ROUNDS=2 THREADS=2 OUT=bench-dtypes
#   ROUNDS=4 OUT=/tmp/table bench/dtype_table.sh
#
# Needs .venv-bench (PyTorch, see bench/compare_torch.py) and .venv-peers (llama-cpp-python,
# onnxruntime, ctranslate2; set-up in bench/compare_peers.py's docstring); MiniLM from
# $QKV_MINILM_DIR or ~/.cache/qkv/minilm (tools/fetch_minilm.sh). Each run's table is
# written to OUT/<run>.txt as well as printed. Run it on an idle machine: about 40 minutes
# on 2 cores.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-2}"
THREADS="${THREADS:-2}"
OUT="${OUT:-bench-dtypes}"
MODEL="${QKV_MINILM_DIR:-$HOME/.cache/qkv/minilm}"
cd "$ROOT"
mkdir -p "$OUT"
cargo build --release -p qkv-cli
QKV="$ROOT/target/release/qkv"
common=(--rounds "$ROUNDS" --threads "$THREADS" --qkv "$QKV")

run() {
    local name="$1"
    shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$OUT/$name.txt"
}

"$QKV" bench machine --threads "$THREADS" | tee "$OUT/machine.txt"
for w in llama minilm; do
    extra=()
    [ "$w" = minilm ] && extra=(--model "$MODEL")
    torch=(.venv-bench/bin/python bench/compare_torch.py "$w" "${common[@]}" "${extra[@]}")
    run "torch-$w-f32" "${torch[@]}"
    run "torch-$w-bf16" "${torch[@]}" --dtype bf16
    for d in bf16 int8 int8-row; do
        run "torch-$w-f32-qkv-$d" "${torch[@]}" --qkv-dtype "$d"
    done
done
peers=(.venv-peers/bin/python bench/compare_peers.py)
run llama-cpp "${peers[@]}" llama-cpp "${common[@]}" --dtypes f32,bf16,int8
run onnxruntime "${peers[@]}" onnxruntime "${common[@]}" --dtypes f32,int8,int8-row --model "$MODEL"
run ctranslate2 "${peers[@]}" ctranslate2 "${common[@]}" --dtypes f32,int8
