"""Model.apply_chat_template against transformers' apply_chat_template on real chat
templates (crates/qkv/tests/fixtures/chat/templates.json, made by
tools/fixtures/gen_chat_templates.py with transformers 4.57.1)."""

import json
import shutil

import pytest

import qkv
from conftest import FIXTURES, model_dir

CASES = json.loads((FIXTURES / "chat" / "templates.json").read_text())


def folder(tmp_path, template, bos, eos):
    """The tiny Qwen2 fixture with a word-level tokenizer of its 99 rows and a template."""
    dst = tmp_path / "chat"
    shutil.copytree(model_dir("qwen2"), dst)
    words = ["<|im_start|>", "<|im_end|>", "user", "assistant", "system", "hi", "\n"]
    vocab = {w: i for i, w in enumerate(words)}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": w, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, w in enumerate(words[:2])],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "hi"},
    }
    (dst / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = {"chat_template": template, "bos_token": bos, "eos_token": eos}
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("family", CASES, ids=[f["family"] for f in CASES])
def test_templates_render_as_transformers_renders_them(tmp_path, family):
    m = qkv.load(folder(tmp_path, family["template"], family["bos_token"], family["eos_token"]))
    for case in family["cases"]:
        kwargs = dict(case["extra"])
        args = (case["messages"],)
        if "expected" in case:
            got = m.apply_chat_template(*args, add_generation_prompt=case["add_generation_prompt"], **kwargs)
            assert got == case["expected"], case["name"]
        else:
            with pytest.raises(ValueError, match="roles must alternate"):
                m.apply_chat_template(*args, add_generation_prompt=case["add_generation_prompt"], **kwargs)


def test_tokenize_gives_the_ids_of_the_text_without_added_special_tokens(tmp_path):
    qwen = next(f for f in CASES if f["family"] == "qwen2.5")
    m = qkv.load(folder(tmp_path, qwen["template"], None, "<|im_end|>"))
    messages = [{"role": "user", "content": "hi"}]
    text = m.apply_chat_template(messages)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    ids = m.apply_chat_template(messages, tokenize=True)
    assert ids == m.encode(text, add_special_tokens=False)
    assert ids[0] == 0 and 1 in ids


def test_a_folder_without_a_template_says_so(tmp_path):
    m = qkv.load(model_dir("qwen2"))
    with pytest.raises(ValueError, match="no chat template"):
        m.apply_chat_template([{"role": "user", "content": "hi"}])
    m = qkv.load(folder(tmp_path, "{{ messages[0].content }}", None, None))
    with pytest.raises(ValueError, match="messages"):
        m.apply_chat_template({"role": "user"})


def test_a_template_that_builds_a_huge_string_stops_in_its_worker(tmp_path):
    # a string doubled 40 times (a terabyte) in a few hundred steps: the template renders
    # in a worker process whose memory is limited, so this process lives and gets a
    # ValueError naming the template
    doubling = "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"
    m = qkv.load(folder(tmp_path, doubling, None, None))
    with pytest.raises(ValueError, match=r"chat template.*MiB of memory while rendering"):
        m.apply_chat_template([{"role": "user", "content": "hi"}])
    # the next render starts a fresh worker
    m = qkv.load(folder(tmp_path / "plain", "{{ messages[0].content }}", None, None))
    assert m.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi"


def test_generate_answers_a_conversation_through_the_template(tmp_path):
    m = qkv.load(folder(tmp_path, "{% for m in messages %}{{ m['content'] }} {% endfor %}", None, None))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "user"}]
    ids = m.apply_chat_template(messages, tokenize=True)
    want = m.decode(m.generate(ids, max_new_tokens=4, greedy=True))
    assert m.generate(messages=messages, max_new_tokens=4, greedy=True) == want
    streamed = "".join(m.generate(messages=messages, max_new_tokens=4, greedy=True, stream=True))
    assert streamed == want
    with pytest.raises(ValueError, match="give `prompt` or `messages`"):
        m.generate("hi", messages=messages)
    with pytest.raises(ValueError, match="give `prompt` or `messages`"):
        m.generate()


def test_the_example_model_answers_a_conversation():
    # the README's Python line, on examples/tiny-chat
    from pathlib import Path

    m = qkv.load(Path(__file__).resolve().parents[3] / "examples" / "tiny-chat")
    answer = m.generate(messages=[{"role": "user", "content": "what is attention?"}])
    assert answer.startswith("attention mixes the values, weighted by how well each key matches the query.")
