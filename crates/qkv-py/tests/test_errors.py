"""Bad input raises ValueError or TypeError (MemoryError for work larger than the
machine, FileNotFoundError for a missing folder) with a message naming the argument,
tensor or field, and never a Rust panic (pyo3_runtime.PanicException, which derives
from BaseException and so escapes ``pytest.raises(Exception)``)."""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

import qkv
from conftest import FIXTURES, model_dir

RNG = np.random.default_rng(0)
Q = RNG.standard_normal((1, 4, 2, 8), dtype=np.float32)
KV = RNG.standard_normal((1, 6, 2, 8), dtype=np.float32)


def nan_at(x, index):
    y = x.copy()
    y[index] = np.nan
    return y


def call(fn, *args, **kw):
    return lambda: fn(*args, **kw)


GPT2 = None


def gpt2():
    global GPT2
    if GPT2 is None:
        GPT2 = qkv.load(model_dir("gpt2"))
    return GPT2


# (what, call, exception type, a fragment the message must hold)
CASES = [
    ("float64 q", call(qkv.attention, Q.astype(np.float64), KV, KV), TypeError, "`q` must be a float32"),
    ("list q", call(qkv.attention, Q.tolist(), KV, KV), TypeError, "`q` must be a numpy.ndarray"),
    ("int k", call(qkv.attention, Q, KV.astype(np.int32), KV), TypeError, "`k`"),
    ("big-endian v", call(qkv.attention, Q, KV, KV.astype(">f4")), TypeError, "`v`"),
    ("3-d q", call(qkv.attention, Q[0], KV, KV), ValueError, "`q`"),
    ("5-d k", call(qkv.attention, Q, KV[None], KV), ValueError, "`k`"),
    ("head width", call(qkv.attention, Q, KV[..., :4], KV), ValueError, "`k`"),
    ("batch", call(qkv.attention, Q, np.concatenate([KV, KV]), KV), ValueError, "`k`"),
    ("v length", call(qkv.attention, Q, KV, KV[:, :5]), ValueError, "`v`"),
    ("heads not dividing", call(qkv.attention, Q, np.zeros((1, 6, 3, 8), np.float32), np.zeros((1, 6, 3, 8), np.float32)), ValueError, "heads"),
    ("empty axis", call(qkv.attention, Q[:, :0], KV, KV), ValueError, "empty"),
    ("NaN in q", call(qkv.attention, nan_at(Q, (0, 1, 0, 3)), KV, KV), ValueError, "`q` holds a non-finite"),
    ("inf in v", call(qkv.attention, Q, KV, np.where(KV > 1.5, np.inf, KV).astype(np.float32)), ValueError, "`v`"),
    ("NaN in bias", call(qkv.attention, Q, KV, KV, bias=np.full((4, 6), np.nan, np.float32)), ValueError, "`bias`"),
    ("bias shape", call(qkv.attention, Q, KV, KV, bias=np.zeros((4, 5), np.float32)), ValueError, "`bias`"),
    ("bias rank", call(qkv.attention, Q, KV, KV, bias=np.zeros((1, 1, 1, 4, 6), np.float32)), ValueError, "`bias`"),
    ("float mask", call(qkv.attention, Q, KV, KV, mask=np.zeros((4, 6), np.float32)), TypeError, "pass an additive float mask as `bias`"),
    ("int mask", call(qkv.attention, Q, KV, KV, mask=np.zeros((4, 6), np.int64)), TypeError, "`mask` must be a bool"),
    ("mask shape", call(qkv.attention, Q, KV, KV, mask=np.ones((3, 6), bool)), ValueError, "`mask`"),
    ("mask heads", call(qkv.attention, Q, KV, KV, mask=np.ones((1, 3, 4, 6), bool)), ValueError, "`mask`"),
    ("padding shape", call(qkv.attention, Q, KV, KV, key_padding=np.ones((1, 5), bool)), ValueError, "key_padding"),
    ("padding rank", call(qkv.attention, Q, KV, KV, key_padding=np.ones(6, bool)), ValueError, "key_padding"),
    ("padding dtype", call(qkv.attention, Q, KV, KV, key_padding=np.ones((1, 6), np.int64)), TypeError, "`key_padding` must be a bool"),
    ("slopes length", call(qkv.attention, Q, KV, KV, alibi_slopes=np.ones(3, np.float32)), ValueError, "alibi slopes"),
    ("slopes NaN", call(qkv.attention, Q, KV, KV, alibi_slopes=np.array([np.nan, 1], np.float32)), ValueError, "alibi slopes"),
    ("bias and slopes", call(qkv.attention, Q, KV, KV, bias=np.zeros((4, 6), np.float32), alibi_slopes=np.ones(2, np.float32)), ValueError, "not both"),
    ("window 0", call(qkv.attention, Q, KV, KV, window=0), ValueError, "`window`"),
    ("negative window", call(qkv.attention, Q, KV, KV, window=-3), ValueError, "`window`"),
    ("NaN scale", call(qkv.attention, Q, KV, KV, scale=float("nan")), ValueError, "`scale`"),
    ("causal word", call(qkv.attention, Q, KV, KV, causal="upper"), ValueError, "`causal`"),
    ("layout", call(qkv.attention, Q, KV, KV, layout="tbhd"), ValueError, "`layout`"),
    ("kernel", call(qkv.attention, Q, KV, KV, kernel="fast"), ValueError, "`kernel`"),
    ("huge output", call(qkv.attention, np.zeros((1, 2**16, 16, 1), np.float32), np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 2**22), np.float32)), MemoryError, "attention output"),
    ("huge weights", call(qkv.attention, np.zeros((1, 2**17, 16, 1), np.float32), np.zeros((1, 2**17, 1, 1), np.float32), np.zeros((1, 2**17, 1, 1), np.float32), return_weights=True), MemoryError, "attention output"),
    ("small weights", call(qkv.attention, np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.float32), return_weights=True), None, None),
    ("backward lse shape", call(qkv.attention_backward, Q, KV, KV, Q, np.zeros((1, 2), np.float32), Q), ValueError, "lse"),
    ("backward grad shape", call(qkv.attention_backward, Q, KV, KV, Q, np.zeros((1, 2, 4), np.float32), Q[:, :3]), ValueError, "d_out"),
    ("backward NaN grad", call(qkv.attention_backward, Q, KV, KV, Q, np.zeros((1, 2, 4), np.float32), nan_at(Q, (0, 0, 0, 0))), ValueError, "d_out"),
    ("dbias without bias", call(qkv.attention_backward, Q, KV, KV, Q, np.zeros((1, 2, 4), np.float32), Q, return_dbias=True), ValueError, "dense bias"),
    ("sinusoidal layout", call(qkv.sinusoidal_table, 4, 8, layout="rotary"), ValueError, "`layout`"),
    ("huge sinusoidal", call(qkv.sinusoidal_table, 10**12, 10**6), MemoryError, "sinusoidal table"),
    ("huge alibi", call(qkv.alibi_slopes, 10**15), MemoryError, "ALiBi"),
    ("negative heads", call(qkv.alibi_slopes, -1), ValueError, "`n_heads`"),
    ("buckets too few", call(qkv.relative_position_bucket, 5, num_buckets=2), ValueError, "`num_buckets`"),
    ("max distance", call(qkv.relative_position_bucket, 5, num_buckets=32, max_distance=4), ValueError, "`max_distance`"),
    ("float positions", call(qkv.relative_position_bucket, np.ones(3)), TypeError, "relative_position"),
    ("rope odd", call(qkv.Rope, 7), ValueError, "rotary_dim"),
    ("rope base", call(qkv.Rope, 8, base=0.5), ValueError, "rope_theta"),
    ("rope scaling kind", call(qkv.Rope, 8, scaling={"rope_type": "longrope", "factor": 2.0}), ValueError, "longrope"),
    ("rope scaling field", call(qkv.Rope, 8, scaling={"rope_type": "linear"}), ValueError, "factor"),
    ("rope scaling type", call(qkv.Rope, 8, scaling={"rope_type": "linear", "factor": "two"}), ValueError, "scaling"),
    ("rope layout", call(qkv.Rope, 8, layout="split"), ValueError, "`layout`"),
    ("rope input width", lambda: qkv.Rope(8).apply(np.zeros((1, 2, 1, 6), np.float32)), ValueError, "`x`"),
    ("rope positions", lambda: qkv.Rope(8).apply(np.zeros((1, 2, 1, 8), np.float32), positions=[0, 1, 2]), ValueError, "`positions`"),
    ("rope negative position", lambda: qkv.Rope(8).apply(np.zeros((1, 2, 1, 8), np.float32), positions=[0, -1]), ValueError, "negative"),
    ("missing folder", call(qkv.load, FIXTURES / "no-such-model"), FileNotFoundError, "no-such-model"),
    ("not a model", call(qkv.load, FIXTURES / "sdpa"), FileNotFoundError, "config.json"),
    ("ids out of vocabulary", lambda: gpt2().forward(np.array([[1, 2, 10**6]])), ValueError, "index"),
    ("negative id", lambda: gpt2().forward(np.array([[1, -2]])), ValueError, "negative"),
    ("float ids", lambda: gpt2().forward(np.ones((1, 3))), TypeError, "input_ids"),
    ("ids rank", lambda: gpt2().forward(np.ones(3, np.int64)), ValueError, "input_ids"),
    ("mask shape", lambda: gpt2().forward(np.ones((1, 3), np.int64), np.ones((1, 2), np.int64)), ValueError, "attention_mask"),
    ("mask values", lambda: gpt2().forward(np.ones((1, 3), np.int64), np.full((1, 3), 2)), ValueError, "0 or 1"),
    ("decoder ids to a decoder", lambda: gpt2().forward(np.ones((1, 3), np.int64), decoder_input_ids=np.ones((1, 2), np.int64)), ValueError, "decoder_input_ids"),
    ("too long", lambda: gpt2().forward(np.ones((1, 100000), np.int64)), ValueError, "position"),
    ("huge maps", lambda: gpt2().forward(np.ones((1, 2**16), np.uint8), output_attentions=True), MemoryError, "with every attention map"),
    ("prompt type", lambda: gpt2().generate(3.5), TypeError, "prompt"),
    ("text without tokenizer", lambda: gpt2().generate("hello"), ValueError, "tokenizer"),
    ("zero beams", lambda: gpt2().generate([1, 2], num_beams=0), ValueError, "num_beams"),
    ("negative length", lambda: gpt2().generate([1, 2], max_new_tokens=-1), ValueError, "max_new_tokens"),
    ("greedy and sampling", lambda: gpt2().generate([1, 2], greedy=True, temperature=0.5), ValueError, "greedy"),
    ("beams and sampling", lambda: gpt2().generate([1, 2], num_beams=2, top_k=3), ValueError, "num_beams"),
    ("bad temperature", lambda: gpt2().generate([1, 2], temperature=-1.0), ValueError, "temperature"),
    ("bad top_p", lambda: gpt2().generate([1, 2], top_p=1.5), ValueError, "top_p"),
    ("early stopping word", lambda: gpt2().generate([1, 2], early_stopping="sometimes"), ValueError, "early_stopping"),
    ("embed without pooling", lambda: gpt2().embed(["a"]), ValueError, "sentence-transformers"),
    ("unknown experiment", call(qkv.experiment, "telepathy"), ValueError, "unknown experiment"),
    ("zero threads", call(qkv.set_num_threads, 0), ValueError, "from 1"),
    # integers past what the argument takes: a ValueError naming it, not OverflowError
    ("huge window", call(qkv.attention, Q, KV, KV, window=2**70), ValueError, "`window`"),
    ("negative positions", call(qkv.sinusoidal_table, -1, 8), ValueError, "`n_positions`"),
    ("huge dim", call(qkv.sinusoidal_table, 4, 2**64), ValueError, "`dim`"),
    ("huge buckets", call(qkv.relative_position_bucket, 5, num_buckets=2**70), ValueError, "`num_buckets`"),
    ("negative distance", call(qkv.relative_position_bucket, 5, max_distance=-1), ValueError, "`max_distance`"),
    ("huge head width", call(qkv.Rope, 2**70), ValueError, "`head_dim`"),
    ("negative rotary", call(qkv.Rope, 8, rotary_dim=-2), ValueError, "`rotary_dim`"),
    ("huge rope positions", call(qkv.Rope, 8, max_positions=2**80), ValueError, "`max_positions`"),
    ("negative offset", lambda: qkv.Rope(8).apply(np.zeros((1, 2, 1, 8), np.float32), offset=-1), ValueError, "`offset`"),
    ("huge seed", call(qkv.experiment, "scaling", seed=2**64), ValueError, "`seed`"),
    ("huge threads", call(qkv.set_num_threads, 2**70), ValueError, "`n`"),
    ("huge prompt id", lambda: gpt2().generate([1, 2**70]), ValueError, "`prompt`"),
    ("huge length", lambda: gpt2().generate([1, 2], max_new_tokens=2**70), ValueError, "`max_new_tokens`"),
    ("negative beams", lambda: gpt2().generate([1, 2], num_beams=-1), ValueError, "`num_beams`"),
    ("huge top_k", lambda: gpt2().generate([1, 2], top_k=2**65), ValueError, "`top_k`"),
    ("negative seed", lambda: gpt2().generate([1, 2], seed=-1), ValueError, "`seed`"),
    ("huge decode id", lambda: gpt2().decode([2**70]), ValueError, "`ids`"),
    ("huge batch", lambda: gpt2().embed(["a"], batch_size=2**70), ValueError, "`batch_size`"),
    ("float window", call(qkv.attention, Q, KV, KV, window=2.5), TypeError, "while processing 'window'"),
    # a folder with a config but no weights is a missing file, as documented
    ("no weights", lambda: qkv.load(config_only()), FileNotFoundError, "model.safetensors"),
]


def config_only():
    """A new folder holding only the GPT-2 fixture's config.json."""
    folder = Path(tempfile.mkdtemp(prefix="qkv-config-only-"))
    shutil.copy(model_dir("gpt2") / "config.json", folder / "config.json")
    return folder


@pytest.mark.parametrize("what,fn,kind,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_a_python_error_naming_it(what, fn, kind, fragment):
    if kind is None:
        fn()  # a valid call among the hostile ones: it must simply work
        return
    try:
        fn()
    except BaseException as e:  # noqa: B036 — a PanicException must be seen, not escape
        assert type(e).__name__ != "PanicException", f"{what}: Rust panicked: {e}"
        assert isinstance(e, kind), f"{what}: expected {kind.__name__}, got {type(e).__name__}: {e}"
        if fragment is not None:
            # PyO3 names the argument of a failed conversion in a note the traceback shows
            shown = " ".join([str(e), *getattr(e, "__notes__", [])])
            assert fragment in shown, f"{what}: {fragment!r} not in {shown!r}"
    else:
        pytest.fail(f"{what}: no error raised")


def test_the_cases_cover_every_public_callable():
    # train's bad settings are in test_train.py, Model.generate's batches in test_generate.py
    touched = {"attention", "attention_backward", "sinusoidal_table", "alibi_slopes",
               "relative_position_bucket", "Rope", "load", "experiment", "set_num_threads",
               "train"}
    public = {n for n in qkv.__all__ if callable(getattr(qkv, n)) and not n[0].isupper() or n == "Rope"}
    assert public - touched <= {"get_num_threads"}, public - touched
