"""qkv.attention and qkv.attention_backward against PyTorch's SDPA and autograd (the
committed fixtures) and against the NumPy twin in reference.py."""

import numpy as np
import pytest

import qkv
import reference
from conftest import assert_close, fixture

SDPA_CASES = [
    "self_plain", "cross", "causal_top_left", "causal_top_left_rect", "causal_bottom_right",
    "decode_bottom_right", "bool_mask_shared", "bool_mask_per_batch", "bool_mask_per_head",
    "bias_per_head", "key_padding", "window_causal", "window_bidirectional", "gqa", "mqa",
    "scale_one", "value_dim", "fully_masked", "combined", "long",
]
GRAD_CASES = [
    "bias", "bool_mask", "causal", "causal_rect", "combined", "fully_masked", "gqa",
    "key_padding",
]


def options(f):
    """The keywords of one fixture, as qkv.attention takes them."""
    p = f.params
    kw = {"causal": p.get("causal"), "window": p.get("window"), "scale": p.get("scale")}
    if "bool_mask" in f:
        kw["mask"] = f["bool_mask"].astype(bool)
    if "key_padding" in f:
        kw["key_padding"] = f["key_padding"].astype(bool)
    if "bias" in f:
        kw["bias"] = f["bias"]
    return kw


def to_bhtd(x):
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3))


@pytest.mark.parametrize("kernel", ["tiled", "reference"])
@pytest.mark.parametrize("case", SDPA_CASES)
def test_forward_equals_torch_sdpa(case, kernel):
    f = fixture("sdpa", case)
    out, lse, weights = qkv.attention(
        f["q"], f["k"], f["v"], return_weights=True, kernel=kernel, **options(f)
    )
    assert out.dtype == np.float32 and out.shape == f["out"].shape
    assert lse.shape == (f["q"].shape[0], f["q"].shape[2], f["q"].shape[1])
    assert_close(f"{case} weights", weights, f["weights"], 1e-5)
    # SDPA gives NaN for a query with no visible key; qkv defines that output as zeros
    masked = (f["weights"] == 0).all(-1).transpose(0, 2, 1)[..., None]
    assert np.all(out[np.broadcast_to(masked, out.shape)] == 0)
    expected = np.where(masked, 0.0, np.nan_to_num(f["out"]))
    assert_close(f"{case} out", out, expected, 1e-5)


@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_layout_gives_the_same_numbers(case):
    f = fixture("sdpa", case)
    kw = options(f)
    out, lse = qkv.attention(f["q"], f["k"], f["v"], **kw)
    out_t, lse_t = qkv.attention(
        to_bhtd(f["q"]), to_bhtd(f["k"]), to_bhtd(f["v"]), layout="bhtd", **kw
    )
    assert out_t.shape == to_bhtd(out).shape
    np.testing.assert_array_equal(out_t, to_bhtd(out))
    np.testing.assert_array_equal(lse_t, lse)


def test_views_are_read_as_their_values():
    """A transposed or strided view (no copy on the caller's side) gives what its
    contiguous copy gives."""
    f = fixture("sdpa", "gqa")
    q_view = to_bhtd(f["q"]).transpose(0, 2, 1, 3)  # [B, T, H, D], not C-contiguous
    assert not q_view.flags.c_contiguous
    wide = np.zeros(f["k"].shape[:-1] + (2 * f["k"].shape[-1],), np.float32)
    wide[..., ::2] = f["k"]
    k_view = wide[..., ::2]
    out, _ = qkv.attention(q_view, k_view, f["v"])
    expected, _ = qkv.attention(f["q"], f["k"], f["v"])
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("kernel", ["tiled", "reference"])
@pytest.mark.parametrize("case", GRAD_CASES)
def test_backward_equals_torch_autograd(case, kernel):
    f = fixture("grad", f"attention_{case}")
    kw = options(f)
    kw["kernel"] = kernel
    out, lse = qkv.attention(f["q"], f["k"], f["v"], **kw)
    assert_close(f"{case} out", out, np.nan_to_num(f["out"]), 1e-5)
    want_dbias = "dbias" in f
    grads = qkv.attention_backward(
        f["q"], f["k"], f["v"], out, lse, f["dy"], return_dbias=want_dbias, **kw
    )
    names = ["dq", "dk", "dv"] + (["dbias"] if want_dbias else [])
    assert len(grads) == len(names)
    for name, got in zip(names, grads):
        assert_close(f"{case} {name}", got, f[name], 1e-5, 1e-4)


def test_backward_in_sdpa_layout_equals_the_native_one():
    f = fixture("grad", "attention_gqa")
    out, lse = qkv.attention(f["q"], f["k"], f["v"])
    native = qkv.attention_backward(f["q"], f["k"], f["v"], out, lse, f["dy"])
    out_t, lse_t = qkv.attention(to_bhtd(f["q"]), to_bhtd(f["k"]), to_bhtd(f["v"]), layout="bhtd")
    swapped = qkv.attention_backward(
        to_bhtd(f["q"]), to_bhtd(f["k"]), to_bhtd(f["v"]), out_t, lse_t, to_bhtd(f["dy"]),
        layout="bhtd",
    )
    for a, b in zip(native, swapped):
        np.testing.assert_array_equal(to_bhtd(a), b)


def random_case(rng, b, t, s, h, g, d, dv):
    q = rng.standard_normal((b, t, h, d), dtype=np.float32)
    k = rng.standard_normal((b, s, g, d), dtype=np.float32)
    v = rng.standard_normal((b, s, g, dv), dtype=np.float32)
    return q, k, v


MIXES = [
    dict(causal="bottom_right"),
    dict(causal="top_left", window=3),
    dict(window=2),
    dict(alibi=True),
    dict(alibi=True, causal="bottom_right"),
    dict(key_padding=True, causal="top_left"),
    dict(mask="2d", bias="per_head"),
    dict(mask="per_batch", causal="bottom_right", window=4, key_padding=True),
    dict(scale=0.05, bias="per_head", key_padding=True),
]


@pytest.mark.parametrize("kernel", ["tiled", "reference"])
@pytest.mark.parametrize("mix", range(len(MIXES)))
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (4, 1)])
def test_every_option_equals_the_numpy_twin(mix, heads, kernel):
    spec = MIXES[mix]
    rng = np.random.default_rng(100 * mix + heads[1])
    b, t, s, (h, g), d, dv = 2, 5, 9, heads, 8, 6
    q, k, v = random_case(rng, b, t, s, h, g, d, dv)
    kw, ref = {}, {}
    for key in ("causal", "window", "scale"):
        if key in spec:
            kw[key] = ref[key] = spec[key]
    if spec.get("alibi"):
        kw["alibi_slopes"] = ref["alibi_slopes"] = qkv.alibi_slopes(h)
    if spec.get("key_padding"):
        pad = np.ones((b, s), dtype=bool)
        pad[1, 6:] = False
        kw["key_padding"] = ref["key_padding"] = pad
    if spec.get("mask") == "2d":
        kw["mask"] = ref["mask"] = rng.random((t, s)) > 0.3
    elif spec.get("mask") == "per_batch":
        kw["mask"] = ref["mask"] = rng.random((b, 1, t, s)) > 0.3
    if spec.get("bias") == "per_head":
        kw["bias"] = ref["bias"] = rng.standard_normal((1, h, t, s), dtype=np.float32)
    out, _, weights = qkv.attention(q, k, v, return_weights=True, kernel=kernel, **kw)
    out_ref, weights_ref = reference.attention(q, k, v, **ref)
    assert_close(f"mix {spec} weights", weights, weights_ref, 1e-5, 1e-4)
    assert_close(f"mix {spec} out", out, out_ref, 1e-5, 1e-4)


def test_dbias_keeps_the_callers_broadcast_shape():
    rng = np.random.default_rng(3)
    q, k, v = random_case(rng, 2, 4, 6, 2, 2, 8, 8)
    bias = rng.standard_normal((4, 6), dtype=np.float32)  # [T, S], shared by all
    out, lse = qkv.attention(q, k, v, bias=bias)
    grads = qkv.attention_backward(q, k, v, out, lse, np.ones_like(out), bias=bias,
                                   return_dbias=True)
    assert grads[3].shape == bias.shape


def test_a_fully_masked_query_gives_zeros_and_minus_infinity():
    rng = np.random.default_rng(4)
    q, k, v = random_case(rng, 1, 3, 4, 2, 2, 8, 8)
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False
    out, lse = qkv.attention(q, k, v, mask=mask)
    assert np.all(out[0, 1] == 0) and np.all(np.isneginf(lse[0, :, 1]))
    assert np.isfinite(out).all()


def test_threads_run_concurrently_and_agree():
    """The GIL is released in the kernel: calls from several Python threads finish
    and each equals the single-threaded result."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(5)
    q, k, v = random_case(rng, 2, 64, 64, 4, 4, 32, 32)
    expected, _ = qkv.attention(q, k, v, causal="top_left")
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: qkv.attention(q, k, v, causal="top_left")[0], range(8)))
    for r in results:
        np.testing.assert_array_equal(r, expected)
