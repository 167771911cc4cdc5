#!/usr/bin/env bash
# Rebuilds examples/tiny-chat, the model the README's tour runs: a byte-level Llama that
# `qkv train --text` trains on short conversations about attention
# (tiny_chat_corpus.py), with the chat template those conversations were written in and
# a generation config that ends an answer at its newline (byte 10, the model's
# end-of-sequence token). About 5 minutes on 2 cores (release build).
# Usage: bash tools/examples/make_tiny_chat.sh [QKV_BINARY]
set -euo pipefail
cd "$(dirname "$0")/../.."
qkv="${1:-target/release/qkv}"
out=examples/tiny-chat
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python3 tools/examples/tiny_chat_corpus.py "$scratch/corpus.txt"
"$qkv" train --text "$scratch/corpus.txt" --style llama --d-model 128 --layers 4 --heads 4 \
  --kv-heads 2 --seq-len 256 --batch-size 8 --steps 1500 --lr 3e-3 --warmup 100 \
  --eval-every 500 --seed 0 --out "$scratch/run"
rm -rf "$out"
mkdir -p "$out"
cp "$scratch/run"/{config.json,model.safetensors,tokenizer.json,tokenizer_config.json} "$out/"
cp tools/examples/chat_template.jinja "$out/chat_template.jinja"
# the newline ends an answer: the model's end-of-sequence token, for the folder and for
# the GGUF file `qkv convert` writes of it
python3 - "$out/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["eos_token_id"] = 10
json.dump(config, open(sys.argv[1], "w"), indent=2)
PY
printf '{\n  "eos_token_id": 10,\n  "max_new_tokens": 160,\n  "do_sample": false\n}\n' \
  > "$out/generation_config.json"
ls -l "$out"
