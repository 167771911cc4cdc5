#!/usr/bin/env bash
# A Python with llama-cpp-python 0.3.36 (llama.cpp itself, built from the sdist with CMake: a few
# minutes on two cores) for the tests that run qkv's GGUF files in llama.cpp
# (`cargo test -p qkv --test gguf -- --ignored`).
#
#   tools/llama_cpp.sh [DEST]      (default: ~/.cache/qkv/llama-cpp)
#
# Makes a venv in DEST with the system python3 and installs the pinned versions of
# tools/fixtures/requirements-lcp.txt that the tests need; a venv already there with
# llama_cpp importable is kept (cache). Prints the venv's python on success.
set -euo pipefail

DEST="${1:-$HOME/.cache/qkv/llama-cpp}"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
PY="$DEST/bin/python"

if [ -x "$PY" ] && "$PY" -c "import llama_cpp" 2>/dev/null; then
    echo "$PY"
    exit 0
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
pin() { grep -i "^$1==" "$ROOT/tools/fixtures/requirements-lcp.txt"; }
python3 -m venv "$DEST" >&2
CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$PY" -m pip install --quiet "$(pin llama-cpp-python)" "$(pin numpy)" "$(pin typing_extensions)" \
    "$(pin diskcache)" "$(pin jinja2)" "$(pin markupsafe)" >&2
echo "$PY"
