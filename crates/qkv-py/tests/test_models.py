"""qkv.load(...).forward/generate/embed against transformers' outputs on the committed
tiny checkpoints (tools/fixtures/gen_models.py, gen_generate.py) and the real
all-MiniLM-L6-v2 that .ci/run fetches. Tolerances are the Rust tests' (atol 1e-4 +
rtol 1e-3 on logits; cosine ≥ 0.99999 on embeddings)."""

import json

import numpy as np
import pytest

import qkv
from conftest import FIXTURES, assert_close, fixture, model_dir, required

ATOL, RTOL = 1e-4, 1e-3
DECODERS = ["gpt2", "llama_gqa", "bloom", "mistral", "qwen2", "llama3_rope", "smollm_tied"]
SEQ2SEQ = ["marian", "t5"]


def real_rows(x, mask):
    """The rows of ``x`` ``[B, T, …]`` at real (unpadded) positions."""
    return x[mask.astype(bool)]


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_logits_and_attentions_equal_transformers(name):
    f = fixture(f"models/{name}", "reference")
    m = qkv.load(model_dir(name))
    assert m.info["kind"] == "decoder" and m.info["family"] == f.params["family"]
    for ids, mask, logits in [("input_ids", "attention_mask", "logits"),
                              ("left_input_ids", "left_attention_mask", "left_logits")]:
        out = m.forward(f[ids], f[mask], output_attentions=True)
        assert out["logits"].shape == f[logits].shape
        assert_close(f"{name} {logits}", real_rows(out["logits"], f[mask]),
                     real_rows(f[logits], f[mask]), ATOL, RTOL)
    layers = sorted(k for k in f if k.startswith("attentions."))
    out = m.forward(f["input_ids"], f["attention_mask"], output_attentions=True)
    assert len(out["attentions"]) == m.info["layers"]
    # the RoPE-scaling and tied-embedding fixtures keep logits only
    assert layers or name in ("llama3_rope", "smollm_tied"), f"{name}: no reference attentions"
    rows = f["attention_mask"].astype(bool)
    for i, key in enumerate(layers):
        got, want = out["attentions"][i], f[key]
        assert got.shape == want.shape
        # [B, H, T, S] at real query rows
        assert_close(f"{name} {key}", got.transpose(0, 2, 1, 3)[rows],
                     want.transpose(0, 2, 1, 3)[rows], ATOL, RTOL)


@pytest.mark.parametrize("dtype", ["bf16", "int8", "int8-row"])
@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_reduced_logits_equal_pytorch_with_such_linear_layers(name, dtype):
    # tools/fixtures/gen_dtype.py: each linear layer's input and weight rounded to bf16,
    # or quantized to int8 and dequantized
    f = fixture(f"models/{name}", "reference")
    want = fixture(f"dtype/{dtype.replace('-', '_')}", name)["logits"]
    m = qkv.load(model_dir(name), dtype=dtype)
    assert m.info["dtype"] == dtype and qkv.load(model_dir(name)).info["dtype"] == "f32"
    out = m.forward(f["input_ids"], f["attention_mask"])["logits"]
    rows = f["attention_mask"]
    assert np.abs(real_rows(want, rows) - real_rows(f["logits"], rows)).max() > 3 * ATOL
    assert_close(f"{name} {dtype} logits", real_rows(out, rows), real_rows(want, rows), ATOL, RTOL)
    with pytest.raises(ValueError, match="`int4` is not one of f32, bf16, int8, int8-row"):
        qkv.load(model_dir(name), dtype="int4")


def test_a_bf16_kv_cache_generates_and_is_refused_where_nothing_decodes():
    # the cache's accuracy is held in the library's tests (attention::cache, tests/dtype.rs)
    m = qkv.load(model_dir("llama_gqa"), kv_dtype="bf16")
    assert m.info["kv_dtype"] == "bf16" and qkv.load(model_dir("llama_gqa")).info["kv_dtype"] == "f32"
    f32 = qkv.load(model_dir("llama_gqa")).generate([1, 2, 3, 4], greedy=True, max_new_tokens=8)
    assert m.generate([1, 2, 3, 4], greedy=True, max_new_tokens=8) == f32
    with pytest.raises(ValueError, match="`int8`: a KV cache stores f32 or bf16"):
        qkv.load(model_dir("llama_gqa"), kv_dtype="int8")
    with pytest.raises(ValueError, match="kv_dtype.*`bf16`.*has no decoder"):
        qkv.load(model_dir("bert"), kv_dtype="bf16")


def new_tokens(output, prompt_len, eos):
    row = [int(t) for t in output[prompt_len:]]
    for i, t in enumerate(row):
        if t in eos:
            return row[: i + 1]
    return row


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_greedy_generation_equals_transformers(name):
    f = fixture(f"models/{name}", "reference")
    if "gen_prompt" not in f:
        pytest.fail(f"{name}: the reference has no generation")
    m = qkv.load(model_dir(name))
    prompt = [int(t) for t in f["gen_prompt"][0]]
    got = m.generate(prompt, greedy=True, max_new_tokens=f.params["max_new_tokens"])
    eos = f.params["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    assert got == new_tokens(f["gen_output"][0], len(prompt), eos)


def test_encoder_states_segments_and_attentions_equal_transformers():
    f = fixture("models/bert", "reference")
    m = qkv.load(model_dir("bert"))
    assert m.info["kind"] == "encoder" and m.info["architecture"] == "BertModel"
    out = m.forward(f["input_ids"], f["attention_mask"], token_type_ids=f["token_type_ids"],
                    output_attentions=True)
    assert "logits" not in out  # BertModel has no head
    mask = f["attention_mask"]
    assert_close("bert hidden", real_rows(out["last_hidden_state"], mask),
                 real_rows(f["last_hidden_state"], mask), ATOL, RTOL)
    rows = mask.astype(bool)
    for i, a in enumerate(out["attentions"]):
        assert_close(f"bert attentions.{i}", a.transpose(0, 2, 1, 3)[rows],
                     f[f"attentions.{i}"].transpose(0, 2, 1, 3)[rows], ATOL, RTOL)


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_encoder_decoder_logits_attentions_and_generation_equal_transformers(name):
    f = fixture(f"models/{name}", "reference")
    m = qkv.load(model_dir(name))
    assert m.info["kind"] == "encoder-decoder"
    out = m.forward(f["input_ids"], f["attention_mask"], decoder_input_ids=f["decoder_input_ids"],
                    output_attentions=True)
    assert_close(f"{name} logits", out["logits"], f["logits"], ATOL, RTOL)
    src = f["attention_mask"].astype(bool)
    for part in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
        assert len(out[part]) == 2
        for i, a in enumerate(out[part]):
            want = f[f"{part}.{i}"]
            if part == "encoder_attentions":  # real source rows only
                a, want = a.transpose(0, 2, 1, 3)[src], want.transpose(0, 2, 1, 3)[src]
            assert_close(f"{name} {part}.{i}", a, want, ATOL, RTOL)
    prompt = [int(t) for t in f["gen_prompt"][0]]
    got = m.generate(prompt, greedy=True, max_new_tokens=f.params["max_new_tokens"])
    # the reference output starts with the decoder start token
    assert got == new_tokens(f["gen_output"][0], 1, [f.params["eos_token_id"]])


def test_info_reports_what_inspect_prints():
    info = qkv.load(model_dir("llama_gqa")).info
    assert info["family"] == "llama" and info["architecture"] == "LlamaForCausalLM"
    assert info["heads"] == 4 and info["kv_heads"] == 2
    assert info["hidden"] == info["heads"] * info["head_dim"]
    assert info["parameters"] > 0 and sum(info["dtypes"].values()) >= info["parameters"]
    assert "RoPE" in info["position"]
    assert info["eos_token_id"] == [2] and info["bos_token_id"] == 1
    assert qkv.load(model_dir("marian")).info["decoder_start_token_id"] == 98
    # a sentence-transformers folder counts what its checkpoint stores, as inspect does
    sentence = FIXTURES / "sentence" / "xlm_roberta_mean"
    info = qkv.load(sentence).info
    raw = (sentence / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    stored = sum(int(np.prod(t["shape"])) for k, t in header.items() if k != "__metadata__")
    assert info["parameters"] == stored and info["dtypes"] == {"F32": stored}
    assert "qkv.Model(llama" in repr(qkv.load(model_dir("llama_gqa")))


# the generate() keywords qkv.Model.generate takes as they are
KEYWORDS = {"num_beams", "length_penalty", "early_stopping", "max_new_tokens"}


def test_translation_from_text_to_text_equals_marian_generate(opus):
    m = qkv.load(opus)
    reference = json.loads((FIXTURES / "generate/marian_opus/reference.json").read_text())
    checked = 0
    for case in reference["cases"]:
        assert m.encode(case["text"]) == case["input_ids"]
        for run in case["runs"]:
            if not set(run["kwargs"]) <= KEYWORDS:
                continue  # eos overrides: the Rust tests cover them through the library
            ids = m.generate(case["input_ids"], **run["kwargs"])
            assert ids == run["output_ids"][0][1:], (case["text"], run["kwargs"])
            assert m.generate(case["text"], **run["kwargs"]) == run["text"]
            checked += 1
    assert checked >= 10


def test_sentence_embeddings_equal_sentence_transformers():
    folder = required("QKV_MINILM_DIR", "run tools/fetch_minilm.sh DIR and set it to DIR, as .ci/run does")
    reference = json.loads((FIXTURES / "minilm/reference.json").read_text())
    m = qkv.load(folder)
    got = m.embed(reference["sentences"])
    want = np.array(reference["embeddings"], dtype=np.float64)
    assert got.shape == want.shape and got.dtype == np.float32
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.99999, cosine.min()
    # another batching pads to other lengths: the sums run in another order
    assert_close("batch of 3", m.embed(reference["sentences"], batch_size=3), got, 1e-5)
    assert [m.encode(s) for s in reference["sentences"][:3]] == reference["input_ids"][:3]


def test_a_probe_gpt2_loads_with_warnings_and_runs_as_transformers():
    """GPT2Config(vocab_size=99) keeps bos = eos = 50256: transformers runs such a folder,
    so qkv loads it, naming the ids in warnings, and computes the same logits."""
    f = fixture("models/gpt2_probe", "reference")
    with pytest.warns(UserWarning, match="token id 50256 is outside the vocabulary of 99") as caught:
        m = qkv.load(model_dir("gpt2_probe"))
    assert any("eos_token_id" in str(w.message) and "never stops" in str(w.message) for w in caught)
    out = m.forward(f["input_ids"], f["attention_mask"])
    assert_close("gpt2_probe logits", real_rows(out["logits"], f["attention_mask"]),
                 real_rows(f["logits"], f["attention_mask"]), ATOL, RTOL)
