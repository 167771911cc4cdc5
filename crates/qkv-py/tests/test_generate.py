"""Model.generate on a list of prompts (through the server's engine: each prompt joins and
leaves on its own, and each row is what transformers' batched generate gives it), under a repetition penalty as transformers applies it, and
streamed (the pieces join to the whole output)."""

import json

import pytest

import qkv
from conftest import FIXTURES, fixture, model_dir

DECODERS = ["gpt2", "llama_gqa", "mistral", "qwen2", "bloom"]


def real_rows(prompt, mask):
    return [[int(t) for t, m in zip(row, keep) if m] for row, keep in zip(prompt, mask)]


def new_tokens(output, start, eos):
    """The tokens after `start`, up to and including the first EOS."""
    row = []
    for t in output[start:]:
        row.append(int(t))
        if int(t) in eos:
            break
    return row


@pytest.mark.parametrize("name", DECODERS)
def test_a_batch_of_prompts_equals_transformers_batched_generate(name):
    f = fixture(f"models/{name}", "reference")
    m = qkv.load(model_dir(name))
    prompts = real_rows(f["gen_batch_prompt"], f["gen_batch_mask"])
    assert len({len(p) for p in prompts}) > 1, "the rows differ in length: padding is tested"
    eos = f.params["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    got = m.generate(prompts, greedy=True, max_new_tokens=f.params["max_new_tokens"])
    width = f["gen_batch_prompt"].shape[1]
    assert got == [new_tokens(row, width, eos) for row in f["gen_batch_output"]]
    # and each prompt alone gives its row of the batch
    assert got == [m.generate(p, greedy=True, max_new_tokens=f.params["max_new_tokens"]) for p in prompts]


def test_sampled_prompts_of_a_list_each_equal_their_own_run_with_the_seed_plus_their_index():
    m = qkv.load(model_dir("llama_gqa"))
    prompts = [[5, 6, 7], [9], [3, 1, 4, 1, 5, 9, 2, 6], [11, 12]]
    kw = dict(temperature=0.9, top_k=20, max_new_tokens=12)
    got = m.generate(prompts, seed=7, **kw)
    assert got == [m.generate(p, seed=7 + i, **kw) for i, p in enumerate(prompts)]
    assert len({tuple(g) for g in got}) > 1


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2"])
def test_a_gguf_file_generates_as_the_folder_it_was_converted_from(name):
    f = fixture(f"models/{name}", "reference")
    path = model_dir(name).parent.parent / "gguf" / "models" / f"{name}.gguf"
    m = qkv.load(str(path))
    prompts = real_rows(f["gen_batch_prompt"], f["gen_batch_mask"])
    eos = f.params["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    got = m.generate(prompts, greedy=True, max_new_tokens=f.params["max_new_tokens"])
    width = f["gen_batch_prompt"].shape[1]
    assert got == [new_tokens(row, width, eos) for row in f["gen_batch_output"]]


def test_the_repetition_penalty_equals_transformers_generate():
    runs = json.loads((FIXTURES / "generate" / "llama_gqa_beams.json").read_text())["runs"]
    runs = [r for r in runs if "repetition_penalty" in r["kwargs"]]
    assert len(runs) >= 3
    m = qkv.load(model_dir("llama_gqa"))
    for r in runs:
        kw = r["kwargs"]
        [prompt] = r["input_ids"]
        got = m.generate(prompt, greedy=True, max_new_tokens=kw["max_new_tokens"],
                         num_beams=kw.get("num_beams"), repetition_penalty=kw["repetition_penalty"])
        assert got == new_tokens(r["output_ids"][0], len(prompt), [kw["eos_token_id"]]), kw


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"], "additionalProperties": False}


def test_json_schema_and_grammar_hold_the_output():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in requirements-test.txt")
    m = qkv.load(FIXTURES.parents[3] / "examples" / "tiny-chat")
    messages = [{"role": "user", "content": "Who are you?"}]
    for seed in range(3):
        text = m.generate(messages=messages, json_schema=PERSON, temperature=1.0, seed=seed, max_new_tokens=80)
        jsonschema.validate(json.loads(text), PERSON)
    # the schema as JSON text, streamed: the pieces join to the whole
    whole = m.generate("I am", json_schema=json.dumps(PERSON), greedy=True, max_new_tokens=80)
    jsonschema.validate(json.loads(whole), PERSON)
    assert "".join(m.generate("I am", json_schema=PERSON, greedy=True, max_new_tokens=80, stream=True)) == whole
    assert m.generate("I am", grammar='root ::= "yes" | "no"', greedy=True) in ("yes", "no")
    assert m.generate("I am", grammar='start: "yes" | "no"', greedy=True) in ("yes", "no")
    with pytest.raises(ValueError, match="one prompt"):
        m.generate(["a", "b"], json_schema=PERSON)
    with pytest.raises(ValueError, match="not both"):
        m.generate("a", json_schema=PERSON, grammar='root ::= "x"')
    with pytest.raises(ValueError, match="json_schema"):
        m.generate("a", json_schema={"type": "frob"})


TEXTS = ["The cat sat on the mat.", "猫坐在垫子上", "Attention is all you need, they said."]


def test_texts_in_a_batch_translate_as_each_alone(opus):
    m = qkv.load(opus)
    for kwargs in [{"greedy": True, "max_new_tokens": 8}, {"max_new_tokens": 6}]:
        assert m.generate(TEXTS, **kwargs) == [m.generate(t, **kwargs) for t in TEXTS], kwargs


def test_streamed_pieces_join_to_the_whole_output(opus):
    m = qkv.load(opus)
    for kwargs in [{"greedy": True, "max_new_tokens": 12}, {"max_new_tokens": 6}]:
        for text in TEXTS:
            stream = m.generate(text, stream=True, **kwargs)
            assert isinstance(stream, qkv.Stream)
            pieces = list(stream)
            assert all(isinstance(p, str) for p in pieces)
            assert "".join(pieces) == m.generate(text, **kwargs), (text, kwargs)
    llama = qkv.load(model_dir("llama_gqa"))
    ids = llama.generate([5, 6, 7], greedy=True, max_new_tokens=9)
    assert list(llama.generate([5, 6, 7], greedy=True, max_new_tokens=9, stream=True)) == ids


def test_a_stream_left_half_read_is_dropped_cleanly(opus):
    m = qkv.load(opus)
    stream = m.generate(TEXTS[0], greedy=True, max_new_tokens=12, stream=True)
    next(stream, None)
    del stream
    assert m.generate(TEXTS[0], greedy=True, max_new_tokens=3) is not None


@pytest.mark.parametrize("call,kind,fragment", [
    (lambda m: m.generate([[5, 6], [7]], stream=True), ValueError, "`stream` takes one prompt"),
    (lambda m: m.generate([]), ValueError, "`prompt` is empty"),
    (lambda m: m.generate([[5, 6], "text"]), TypeError, "`prompt`"),
    (lambda m: m.generate([[5, 2**70]]), ValueError, "`prompt`"),
])
def test_bad_batches_and_streams_are_named(call, kind, fragment):
    m = qkv.load(model_dir("llama_gqa"))
    with pytest.raises(kind, match=fragment.replace("(", r"\(")):
        call(m)
