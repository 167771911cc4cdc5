#!/usr/bin/env bash
# The Python package (crates/qkv-py, a cargo workspace of its own): builds the abi3 wheel
# with maturin into the venv VENV (created if missing), installs it, and runs its pytest
# suite from crates/qkv-py with QKV_PY_REQUIRE_ALL set, so a test whose input (the real
# MiniLM, QKV_MINILM_DIR) is missing fails rather than skips. Extra arguments go to
# pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(realpath -m "${QKV_PY_VENV:-.venv-py}")"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r crates/qkv-py/requirements-test.txt
rm -rf crates/qkv-py/target/wheels
"$venv/bin/maturin" build --release --quiet -m crates/qkv-py/Cargo.toml -o crates/qkv-py/target/wheels
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps crates/qkv-py/target/wheels/qkv-*.whl
cd crates/qkv-py
QKV_PY_REQUIRE_ALL=1 "$venv/bin/python" -m pytest -q -rs tests "$@"
