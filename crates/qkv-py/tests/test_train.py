"""qkv.train: the CLI's run with its flags as keywords, returning the JSON log lines."""

import json

import pytest

import qkv
from conftest import model_dir

SMALL = dict(task="copy", d_model=16, layers=1, heads=2, batch_size=8, eval_every=3, lr=3e-3)


def test_the_run_returns_its_log_lines_and_resumes_exactly(tmp_path):
    log = tmp_path / "a.jsonl"
    steps = qkv.train(**SMALL, steps=6, out=tmp_path / "a", log_json=log)
    assert [s["step"] for s in steps] == list(range(6))
    assert {"loss", "lr", "grad_norm"} <= set(steps[0])
    assert "eval_loss" in steps[2] and "eval_accuracy" in steps[5]
    assert [json.loads(line) for line in log.read_text().splitlines()] == steps
    # interrupted after 3 steps, then resumed: the same 6 losses
    first = qkv.train(**SMALL, steps=6, stop_after=3, out=tmp_path / "b")
    rest = qkv.train(resume=tmp_path / "b")
    assert [s["loss"] for s in first + rest] == [s["loss"] for s in steps]
    assert qkv.load(tmp_path / "b").info["family"] == "gpt2"


def test_recurrent_and_llama_style_models_train(tmp_path):
    rnn = qkv.train(task="copy", arch="rnn-attention", d_model=16, steps=2, out=tmp_path / "r")
    llama = qkv.train(**SMALL, style="llama", position="rope", steps=2, out=tmp_path / "l")
    assert len(rnn) == len(llama) == 2
    assert qkv.load(tmp_path / "l").info["family"] == "llama"


def test_bf16_mixed_precision_follows_f32(tmp_path):
    f32 = qkv.train(**SMALL, steps=4, out=tmp_path / "f")
    bf16 = qkv.train(**SMALL, steps=4, dtype="bf16", out=tmp_path / "b")
    pairs = [(b["loss"], f["loss"]) for b, f in zip(bf16, f32)]
    assert len(pairs) == 4 and all(abs(b / f - 1) <= 0.01 for b, f in pairs)
    assert [b for b, _ in pairs] != [f for _, f in pairs]


def test_a_run_from_a_folder_keeps_its_family(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 99, size=(2, 2, 8), dtype=np.int64)
    save_file({"input_ids": ids, "targets": ids}, str(tmp_path / "b.safetensors"))
    steps = qkv.train(init=model_dir("gpt2"), data=tmp_path / "b.safetensors", steps=2,
                      out=tmp_path / "ft")
    assert len(steps) == 2 and qkv.load(tmp_path / "ft").info["architecture"] == "GPT2LMHeadModel"


@pytest.mark.parametrize("kwargs,kind,fragment", [
    ({}, ValueError, "say what to train on"),
    ({"task": "copy", "text": "t.txt", "out": "o"}, ValueError, "`task` and `text` cannot be used together"),
    ({"task": "copy"}, ValueError, "give `out`"),
    ({"task": "copy", "out": "o", "style": "gpt3"}, ValueError, "unknown style `gpt3`"),
    ({"task": "copyy", "out": "o"}, ValueError, "unknown task"),
    ({"task": "copy", "out": "o", "layers": -1}, ValueError, "`layers`"),
    ({"task": "copy", "out": "o", "lr": "fast"}, TypeError, "`lr`"),
    ({"task": "copy", "out": "o", "dtype": "fp8"}, ValueError, "invalid `dtype`"),
    ({"task": "copy", "out": "o", "dtype": "int8"}, ValueError, "trains in f32 or bf16"),
    ({"task": "copy", "out": "o", "speed": 3}, TypeError, "unexpected keyword argument 'speed'"),
    ({"resume": "nowhere", "lr": 0.1}, ValueError, "`lr` cannot be used with `resume`"),
    ({"task": "copy", "out": "o", "d_model": 2**20, "layers": 64}, MemoryError, "training a model"),
])
def test_bad_settings_are_named(kwargs, kind, fragment):
    with pytest.raises(kind, match=fragment.replace("(", r"\(")):
        qkv.train(**kwargs)
