"""Position encodings against PyTorch and transformers (the committed fixtures of
tools/fixtures/gen_position.py): the sinusoidal tables, RoPE and its scalings, ALiBi's
slopes and T5's buckets."""

import numpy as np
import pytest

import qkv
from conftest import assert_close, fixture


def test_sinusoidal_tables_equal_the_paper_and_marian():
    f = fixture("position", "sinusoidal")
    assert_close("interleaved", qkv.sinusoidal_table(50, 16), f["interleaved"], 1e-6)
    assert_close("split", qkv.sinusoidal_table(50, 16, layout="split"), f["marian_split"], 1e-6)
    assert_close("split odd", qkv.sinusoidal_table(20, 15, layout="split"),
                 f["marian_split_odd"], 1e-6)


ROPES = [
    ("rope_half", "half"),
    ("rope_half_theta500k_linear", "half"),
    ("rope_interleaved", "interleaved"),
    ("rope_interleaved_partial", "interleaved"),
    ("rope_llama3", "half"),
    ("rope_yarn", "half"),
    ("rope_yarn_mscale", "half"),
    ("rope_dynamic", "half"),
]


@pytest.mark.parametrize("case,layout", ROPES)
def test_rope_rotates_q_and_k_as_transformers(case, layout):
    f = fixture("position", case)
    p = f.params
    scaling = p.get("rope_scaling")
    if "linear_factor" in p:
        scaling = {"rope_type": "linear", "factor": p["linear_factor"]}
    rope = qkv.Rope(p["head_dim"], base=p["base"], layout=layout,
                    rotary_dim=p.get("rotary_dim"), scaling=scaling,
                    max_positions=p.get("max_position_embeddings"))
    positions = f["position_ids"]
    if "inv_freq" in f and positions.max() < p["max_position_embeddings"]:
        assert_close(f"{case} inv_freq", rope.inv_freq, f["inv_freq"], 0.0, 2e-7)
    for name in ("q", "k"):
        assert_close(f"{case} {name}", rope.apply(f[name], positions), f[f"{name}_out"], 1e-5)


def test_rope_positions_default_to_an_offset_and_one_row_serves_the_batch():
    f = fixture("position", "rope_half")
    rope = qkv.Rope(16)
    x = f["q"]
    b, t = x.shape[:2]
    by_offset = rope.apply(x, offset=3)
    explicit = rope.apply(x, np.tile(np.arange(3, 3 + t), (b, 1)))
    np.testing.assert_array_equal(by_offset, explicit)
    np.testing.assert_array_equal(rope.apply(x, np.arange(3, 3 + t)), explicit)
    cos, sin = rope.cos_sin([0, 5])
    assert cos.shape == sin.shape == (2, 8)
    np.testing.assert_allclose(cos[1], np.cos(5 * rope.inv_freq), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(cos[0], np.ones(8, np.float32))


def test_rope_makes_scores_depend_on_the_offset_only():
    rng = np.random.default_rng(0)
    rope = qkv.Rope(32)
    q = rng.standard_normal((1, 1, 1, 32), dtype=np.float32)
    k = rng.standard_normal((1, 1, 1, 32), dtype=np.float32)
    score = lambda m, n: float((rope.apply(q, [m]) * rope.apply(k, [n])).sum())
    assert abs(score(7, 3) - score(104, 100)) < 1e-4


def test_alibi_slopes_equal_bloom_for_any_head_count():
    f = fixture("position", "alibi")
    mask = f["attention_mask"]
    # BLOOM's tensor [B·H, 1, S] is slope_h · (position of key j among the real tokens)
    position = (np.cumsum(mask, axis=1) - 1) * mask
    for h in f.params["num_heads"]:
        slopes = qkv.alibi_slopes(h)
        assert slopes.shape == (h,)
        expected = slopes[None, :, None] * position[:, None, :]
        got = f[f"alibi_h{h}"].reshape(mask.shape[0], h, -1)
        assert_close(f"alibi h={h}", expected.astype(np.float32), got, 1e-6, 1e-6)


def test_relative_buckets_equal_t5():
    f = fixture("position", "t5_buckets")
    rel = f["relative_position"]
    for key, bidirectional, n, dist in [
        ("buckets_bidirectional_32_128", True, 32, 128),
        ("buckets_bidirectional_8_20", True, 8, 20),
        ("buckets_causal_32_128", False, 32, 128),
    ]:
        got = qkv.relative_position_bucket(rel, bidirectional=bidirectional,
                                           num_buckets=n, max_distance=dist)
        assert got.dtype == np.int64 and got.shape == rel.shape
        np.testing.assert_array_equal(got, f[key])
    grid = qkv.relative_position_bucket(np.arange(-2, 3).reshape(1, 5))
    assert grid.shape == (1, 5)
    assert int(qkv.relative_position_bucket(0)) == 0
