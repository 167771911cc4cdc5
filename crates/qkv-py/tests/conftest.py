"""Shared test support: the PyTorch fixtures that the Rust tests use
(crates/qkv/tests/fixtures, made by tools/fixtures with a pinned PyTorch), read with
safetensors' NumPy loader, and a comparison that names the worst element."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

FIXTURES = Path(__file__).resolve().parents[2] / "qkv" / "tests" / "fixtures"


class Fixture(dict):
    """A fixture file's tensors, with its JSON ``params`` metadata."""

    def __init__(self, path):
        if not path.is_file():
            # committed files: a missing one is a broken checkout, not a skip
            raise FileNotFoundError(f"fixture {path} is missing")
        with safe_open(str(path), "np") as f:
            super().__init__({k: f.get_tensor(k) for k in f.keys()})
            meta = f.metadata() or {}
        self.params = json.loads(meta.get("params", "{}"))
        self.name = f"{path.parent.name}/{path.stem}"


def fixture(group, name):
    return Fixture(FIXTURES / group / f"{name}.safetensors")


def model_dir(name):
    path = FIXTURES / "models" / name
    assert path.is_dir(), f"model fixture {path} is missing"
    return path


def assert_close(what, actual, expected, atol, rtol=0.0):
    """Every element within ``atol + rtol·|expected|``; equal values (infinities too)
    always pass."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} vs {expected.shape}"
    same = actual == expected
    excess = np.where(same, -1.0, np.abs(actual - expected) - (atol + rtol * np.abs(expected)))
    excess = np.where(np.isnan(excess), np.inf, excess)
    worst = np.unravel_index(np.argmax(excess), excess.shape) if excess.size else None
    if worst is not None and excess[worst] > 0:
        pytest.fail(
            f"{what}: element {tuple(int(i) for i in worst)} is {actual[worst]} but expected "
            f"{expected[worst]} (atol {atol:g}, rtol {rtol:g})"
        )


def required(variable, why):
    """The folder an environment variable names. Missing, the test is skipped with the
    reason, or fails where QKV_PY_REQUIRE_ALL is set (as .ci/run sets it), so CI can
    never pass by leaving it out."""
    import os

    value = os.environ.get(variable)
    if value:
        return Path(value)
    message = f"{variable} is not set: {why}"
    if os.environ.get("QKV_PY_REQUIRE_ALL"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def opus(tmp_path_factory):
    """An OPUS-MT style folder, as gen_generate.py assembles it: models/marian's weights,
    tokenizers/marian's SentencePiece files, generate/marian_opus's generation config."""
    folder = tmp_path_factory.mktemp("opus")
    for src, name in [("models/marian", "config.json"), ("models/marian", "model.safetensors"),
                      ("tokenizers/marian", "source.spm"), ("tokenizers/marian", "target.spm"),
                      ("tokenizers/marian", "vocab.json"),
                      ("tokenizers/marian", "tokenizer_config.json"),
                      ("generate/marian_opus", "generation_config.json")]:
        shutil.copy(FIXTURES / src / name, folder / name)
    return folder
