"""``Model.attribute``: every attribution method through the Python package equals the
PyTorch references of tools/fixtures/gen_attribution.py (transformers' maps, autograd
through the eager attention, networkx's flows, forwards with a hole in attention_mask):
the tiny GPT-2 and Llama, T5 over its three attentions, and the real MiniLM's cosine
with another sentence."""

import numpy as np
import pytest

import qkv
from conftest import assert_close, fixture, model_dir, required


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
def test_decoder_methods_equal_the_references(name):
    f = fixture("attribution", name)
    model = qkv.load(model_dir(name))
    ids = [int(i) for i in f["input_ids"]]
    for method in ["rollout", "flow", "grad"]:
        out = model.attribute(ids, method=method)
        assert out["method"] == method
        assert out["target"]["kind"] == "next_token"
        assert out["target"]["token"] == f.params["target_token"]
        for l, m in enumerate(out["maps"]["decoder"]):
            assert_close(f"{name} {method}.{l}", m, f[f"{method}.{l}"], 1e-5, 1e-4)
    for l, m in enumerate(model.attribute(ids, method="value-norm")["maps"]["decoder"]):
        assert_close(f"{name} value_norm.{l}", m, f[f"value_norm.{l}"], 1e-5, 1e-4)
    out = model.attribute(ids, method="ablation")
    assert "maps" not in out
    assert_close(f"{name} ablation", out["scores"], f["ablation"], 1e-4, 1e-3)
    other = model.attribute(ids, method="ablation", target=f.params["target_token"] + 1)
    assert other["target"]["token"] == f.params["target_token"] + 1


def test_encoder_decoder_methods_cover_the_cross_attention():
    f = fixture("attribution", "t5")
    model = qkv.load(model_dir("t5"))
    src = [int(i) for i in f["input_ids"]]
    dec = [int(i) for i in f["decoder_input_ids"]]
    out = model.attribute(src, method="grad", decoder_input=dec)
    for kind in ["encoder", "decoder", "cross"]:
        for l, m in enumerate(out["maps"][kind]):
            assert_close(f"t5 grad.{kind}.{l}", m, f[f"grad.{kind}.{l}"], 1e-5, 1e-4)
    out = model.attribute(src, method="rollout", decoder_input=dec)
    assert_close("t5 rollout.cross.1", out["maps"]["cross"][1], f["rollout.cross.1"], 1e-5, 1e-4)
    out = model.attribute(src, method="ablation", decoder_input=dec)
    assert_close("t5 ablation", out["scores"], f["ablation"], 1e-4, 1e-3)
    with pytest.raises(ValueError, match="decoder_input"):
        model.attribute(src, method="weights")


def test_sentence_cosine_of_the_animal_sentence_equals_the_reference():
    folder = required("QKV_MINILM_DIR", "run tools/fetch_minilm.sh DIR and set it to DIR, as .ci/run does")
    f = fixture("attribution", "minilm")
    model = qkv.load(folder)
    out = model.attribute(f.params["text"], method="ablation", target=f.params["compare"])
    assert out["target"]["kind"] == "cosine"
    assert out["tokens"][2] == "animal"
    assert_close("minilm ablation", out["scores"], f["ablation"], 1e-4)
    out = model.attribute(f.params["text"], method="grad", target=f.params["compare"])
    for l, m in enumerate(out["maps"]["encoder"]):
        assert_close(f"minilm grad.{l}", m, f[f"grad.{l}"], 1e-4, 1e-3)
    weights = model.attribute(f.params["text"])
    assert weights["target"] is None and weights["scores"] is None
    assert weights["maps"]["encoder"][0].shape == (12, 16, 16)


def test_bad_requests_raise_value_errors_naming_what_is_wrong():
    model = qkv.load(model_dir("gpt2"))
    with pytest.raises(ValueError, match="value-norm"):
        model.attribute([1, 2, 3], method="saliency")
    with pytest.raises(ValueError, match="target token"):
        model.attribute([1, 2, 3], method="grad", target=10**6)
    with pytest.raises(ValueError, match="sentence-transformers"):
        model.attribute([1, 2, 3], method="grad", target="another text")
    with pytest.raises(ValueError, match="no tokens"):
        model.attribute([], method="weights")
    with pytest.raises(ValueError, match="encoder-decoders"):
        model.attribute([1, 2], decoder_input=[0, 1])
    bert = qkv.load(model_dir("bert"))
    with pytest.raises(ValueError, match="explains a target"):
        bert.attribute([5, 6, 7], method="ablation")
    assert np.isfinite(bert.attribute([5, 6, 7], method="rollout")["maps"]["encoder"][1]).all()
