"""qkv.ray's callables: on batches as Ray Data makes them (dicts of NumPy arrays,
pandas frames), and through a local Ray Data pipeline of two one-thread workers, whose
results equal the same model's in this process. Model.classify against transformers'
pipeline scores (the DistilBERT SST-2 fixture's reference, tools/fixtures)."""

import os

import numpy as np
import pandas as pd
import pytest

import qkv
import qkv.ray
from conftest import FIXTURES, assert_close, fixture, required

SST = FIXTURES / "classify" / "distilbert_sst"
TINY_CHAT = FIXTURES.parents[3] / "examples" / "tiny-chat"
TEXTS = [
    "The animal didn't cross the street because it was too tired.",
    "a cat sat on the mat",
    "attention lets every word look at every other word",
    "the keys are matched against the query",
    "softmax turns scores into weights",
    "position encodings give the model an order",
]


def minilm():
    return required("QKV_MINILM_DIR", "the real all-MiniLM-L6-v2 folder (tools/fetch_minilm.sh)")


def test_classify_gives_the_pipelines_labels_and_scores():
    reference = fixture("classify/distilbert_sst", "reference")
    params = reference.params
    m = qkv.load(SST)
    assert m.info["labels"] == params["labels"]
    # the classifier's tokenizer serves the model's encode as well (read once at load);
    # the reference's ids are cut to 16 with a closing [SEP]
    ids = reference["input_ids"][0].tolist()
    assert m.encode(params["texts"][0])[:15] == ids[:15]
    r = m.classify(params["texts"], truncate="cut")  # the pipeline cut them too
    assert_close("logits", r["logits"], reference["logits"], atol=1e-5)
    assert_close("scores", r["scores"], reference["pipeline_scores"], atol=1e-6)
    top = reference["pipeline_scores"].argmax(axis=1)
    assert r["label"] == [params["labels"][i] for i in top]
    assert_close("score", r["score"], reference["pipeline_scores"].max(axis=1), atol=1e-6)


def test_classify_refuses_what_it_cannot_read():
    m = qkv.load(SST)
    with pytest.raises(ValueError, match="pairs: 1 given for 2 texts"):
        m.classify(["a", "b"], pairs=["c"])
    with pytest.raises(ValueError, match="`truncate`: `never`: one of warn, cut, refuse"):
        m.classify(["a"], truncate="never")
    long = "word " * 40
    with pytest.raises(ValueError, match=r"text 1 is \d+ tokens, more than the 16 .*\(`truncate` refuse\)"):
        m.classify(["short", long], truncate="refuse")
    with pytest.warns(UserWarning, match="text 0 is .*: cut to them"):
        m.classify([long])
    with pytest.raises(ValueError, match="not a …ForSequenceClassification folder"):
        qkv.load(FIXTURES / "models" / "bert").classify(["a"])


def test_embed_maps_numpy_and_pandas_batches():
    m = qkv.load(minilm())
    expected = m.embed(TEXTS)
    embed = qkv.ray.Embed(str(minilm()), batch_size=4)
    ids = np.arange(len(TEXTS))
    out = embed({"id": ids, "text": np.array(TEXTS, dtype=object)})
    assert set(out) == {"id", "text", "embedding"} and (out["id"] == ids).all()
    assert_close("numpy batch", out["embedding"], expected, atol=1e-6)
    frame = embed(pd.DataFrame({"id": ids, "text": TEXTS}))
    assert list(frame.columns) == ["id", "text", "embedding"]
    assert_close("pandas batch", np.stack(frame["embedding"]), expected, atol=1e-6)


def test_the_callables_name_a_bad_column():
    embed = qkv.ray.Embed(str(minilm()))
    with pytest.raises(KeyError, match="no column `text` \\(columns: body\\)"):
        embed({"body": np.array(["a"], dtype=object)})
    with pytest.raises(ValueError, match="column `text` row 1 of the batch is NoneType"):
        embed({"text": np.array(["a", None], dtype=object)})
    with pytest.raises(ValueError, match="already computes on"):
        qkv.ray.Embed(str(minilm()), threads=qkv.get_num_threads() + 1)


def test_classify_and_generate_map_batches():
    m = qkv.load(SST)
    expected = m.classify(TEXTS, truncate="cut")
    out = qkv.ray.Classify(str(SST), truncate="cut", prefix="sst_")(
        {"text": np.array(TEXTS, dtype=object)}
    )
    assert list(out["sst_label"]) == expected["label"]
    assert_close("score", out["sst_score"], expected["score"], atol=0)
    assert_close("scores", out["sst_scores"], expected["scores"], atol=0)

    chat = qkv.load(TINY_CHAT)
    prompts = ["what is attention?", "what is a key?"]
    generate = qkv.ray.Generate(str(TINY_CHAT), chat=True, greedy=True, max_new_tokens=12)
    out = generate(pd.DataFrame({"prompt": prompts}))
    for prompt, got in zip(prompts, out["generated"]):
        want = chat.generate(messages=[{"role": "user", "content": prompt}], greedy=True,
                             max_new_tokens=12)
        assert got == want
    plain = qkv.ray.Generate(str(TINY_CHAT), greedy=True, max_new_tokens=8)
    out = plain({"prompt": np.array(prompts, dtype=object)})
    assert list(out["generated"]) == chat.generate(prompts, greedy=True, max_new_tokens=8)


def test_ray_data_with_two_workers_equals_one_process():
    try:
        import ray
    except ImportError:
        if os.environ.get("QKV_PY_REQUIRE_ALL"):
            pytest.fail("ray is not importable (crates/qkv-py/requirements-test.txt installs it)")
        pytest.skip("ray is not importable")
    texts = [f"{t} ({i})" for i in range(8) for t in TEXTS]
    expected = qkv.load(minilm()).embed(texts)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
        ds = ds.map_batches(
            qkv.ray.Embed,
            fn_constructor_kwargs={"path": str(minilm()), "threads": 1},
            concurrency=2,
            num_cpus=1,
            batch_size=8,
        )
        rows = sorted(ds.take_all(), key=lambda r: r["id"])
    finally:
        ray.shutdown()
    assert [r["id"] for r in rows] == list(range(len(texts)))
    assert [r["text"] for r in rows] == texts
    got = np.stack([r["embedding"] for r in rows])
    assert_close("two Ray workers", got, expected, atol=1e-5)
