"""`qkv serve` through OpenAI's own Python client (pinned in requirements-test.txt):
models, completions and chat, streamed and whole, equal to `qkv generate`; errors raised
as the client's exception types; embeddings (the client asks for base64) equal to
`qkv embed`. The server binds to 127.0.0.1 on a free port and is stopped by its PID."""

import json
import re
import shutil
import signal
import subprocess
import threading
import urllib.request

import jsonschema
import openai
import pytest

from conftest import FIXTURES, required

TOOLS = FIXTURES.parents[3] / "tools" / "fixtures"


def qkv_bin():
    return str(required("QKV_BIN", "the qkv binary to serve with (.ci/run sets target/debug/qkv)"))


def run(*args):
    out = subprocess.run([qkv_bin(), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


class Server:
    def __init__(self, folder, *args):
        # f32 weights, as `qkv generate` and `qkv embed` read them, whatever `--dtype auto` picks here
        self.proc = subprocess.Popen([qkv_bin(), "serve", "--model", str(folder), "--port", "0", "--dtype", "f32",
                                      *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            m = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if m:
                self.url = m.group(1)
                break
        else:
            raise AssertionError(f"qkv serve did not start: {self.proc.wait()}")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served") / "tiny"
    run("bench", "llama", "--save", str(folder), "--vocab", "323", "--d-model", "64", "--layers", "2",
        "--heads", "4", "--kv-heads", "2", "--max-len", "512", "--prefill", "4", "--decode", "1",
        "--rounds", "1", "--warmup", "0")
    shutil.copy(FIXTURES / "tokenizers" / "qwen2_bytelevel" / "tokenizer.json", folder)
    shutil.copy(TOOLS / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja", folder / "chat_template.jinja")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": None}))
    # --strict-model: another model's name is a 404 (by default any name is answered)
    server = Server(folder, "--name", "tiny", "--strict-model")
    yield folder, server
    server.stop()


def test_completions_and_chat_through_the_openai_client_equal_qkv_generate(chat_server):
    folder, s = chat_server
    assert [m.id for m in s.client.models.list()] == ["tiny"]

    want = run("generate", "--model", str(folder), "--prompt", "Attention is", "--max-new-tokens", "12",
               "--greedy").removesuffix("\n")
    r = s.client.completions.create(model="tiny", prompt="Attention is", max_tokens=12, temperature=0)
    assert r.choices[0].text == want
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 12)
    pieces = s.client.completions.create(model="tiny", prompt="Attention is", max_tokens=12,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in pieces) == want

    want = run("generate", "--model", str(folder), "--user", "What is attention?", "--max-new-tokens", "10",
               "--greedy").removesuffix("\n")
    messages = [{"role": "user", "content": "What is attention?"}]
    r = s.client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    assert (r.choices[0].message.role, r.choices[0].message.content) == ("assistant", want)
    chunks = list(s.client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                                   temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"


def test_errors_reach_the_client_as_its_exception_types(chat_server):
    _, s = chat_server
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        s.client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="over the server.s limit") as e:
        s.client.completions.create(model="tiny", prompt="hi", max_tokens=10**6)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError, match="temperature"):
        s.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                         temperature=5)
    assert s.client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    # a field qkv does not read is ignored (not --strict), as llama-server and vLLM ignore it
    r = s.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2, service_tier="auto")
    assert r.usage.completion_tokens == 2


def test_embeddings_through_the_openai_client_equal_qkv_embed():
    minilm = required("QKV_MINILM_DIR", "all-MiniLM-L6-v2 (tools/fetch_minilm.sh DIR)")
    texts = ["attention is all you need", "注意力机制"]
    want = json.loads(run("embed", "--model", str(minilm), "--json", *texts))
    s = Server(minilm, "--name", "minilm")
    try:
        got = s.client.embeddings.create(model="minilm", input=texts)
        floats = s.client.embeddings.create(model="minilm", input=texts[1], encoding_format="float")
    finally:
        s.stop()
    assert [d.index for d in got.data] == [0, 1]
    for d, w in zip(got.data, want):
        assert max(abs(a - b) for a, b in zip(d.embedding, w)) < 1e-5
    assert max(abs(a - b) for a, b in zip(floats.data[0].embedding, want[1])) < 1e-5
    assert got.usage.prompt_tokens > 0


def test_sampling_knobs_n_and_logprobs_through_the_openai_client(chat_server):
    folder, s = chat_server
    greedy = s.client.completions.create(model="tiny", prompt="Attention is", max_tokens=10, temperature=0)
    # the client's own parameters, and the ones it passes in extra_body (vLLM's top_k, min_p, …)
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        r = s.client.completions.create(model="tiny", prompt="Attention is", max_tokens=10, temperature=1.2,
                                        seed=3, extra_body=extra)
        assert r.choices[0].text == greedy.choices[0].text, extra
    want = run("generate", "--model", str(folder), "--prompt", "Attention is", "--max-new-tokens", "10",
               "--greedy", "--repetition-penalty", "1.3").removesuffix("\n")
    r = s.client.completions.create(model="tiny", prompt="Attention is", max_tokens=10, temperature=0,
                                    extra_body={"repetition_penalty": 1.3})
    assert r.choices[0].text == want
    # a logit bias of 100 forces its token at every step
    ask = urllib.request.Request(s.url + "/tokenize", json.dumps({"content": "a", "add_special": False}).encode(),
                                 {"Content-Type": "application/json"})
    [a] = json.load(urllib.request.urlopen(ask))["tokens"]
    r = s.client.completions.create(model="tiny", prompt="Attention is", max_tokens=5, temperature=0,
                                    logit_bias={str(a): 100})
    assert r.choices[0].text == "aaaaa"
    # presence and frequency penalties: a greedy answer that repeats a token changes under them
    long = s.client.completions.create(model="tiny", prompt="Attention is", max_tokens=32, temperature=0,
                                       logprobs=0)
    tokens = long.choices[0].logprobs.tokens
    assert len(set(tokens)) < len(tokens), tokens
    for knob in ("presence_penalty", "frequency_penalty"):
        r = s.client.completions.create(model="tiny", prompt="Attention is", max_tokens=32, temperature=0,
                                        **{knob: 2.0})
        assert r.choices[0].text != long.choices[0].text, knob

    # n choices of several prompts: choice i is its prompt's request with seed + i
    r = s.client.completions.create(model="tiny", prompt=["Attention is", "Keys and"], n=2, max_tokens=8,
                                    temperature=0.9, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        alone = s.client.completions.create(model="tiny", prompt=["Attention is", "Keys and"][c.index // 2],
                                            max_tokens=8, temperature=0.9, seed=5 + c.index % 2)
        assert c.text == alone.choices[0].text
    texts = {}
    for chunk in s.client.completions.create(model="tiny", prompt=["Attention is", "Keys and"], n=2,
                                             max_tokens=8, temperature=0.9, seed=5, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in r.choices}

    # logprobs: completions with echo (the prompt's first token has none), chat with alternatives
    r = s.client.completions.create(model="tiny", prompt="Attention is", max_tokens=4, temperature=0,
                                    logprobs=2, echo=True)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None and all(x < 0 for x in lp.token_logprobs[1:])
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs)
    assert r.choices[0].text.startswith("Attention is")
    messages = [{"role": "user", "content": "What is attention?"}]
    r = s.client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                         logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 5 and all(len(t.top_logprobs) == 3 for t in content)
    assert all(t.logprob == t.top_logprobs[0].logprob for t in content)
    assert bytes(b for t in content for b in t.bytes).decode("utf-8", "replace") == r.choices[0].message.content
    streamed = [t for chunk in s.client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3, stream=True)
        for c in chunk.choices if c.logprobs for t in c.logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]


def test_api_keys_through_the_openai_client(chat_server):
    folder, _ = chat_server
    s = Server(folder, "--name", "tiny", "--api-key", "sk-qkv")
    try:
        with pytest.raises(openai.AuthenticationError, match="incorrect API key"):
            s.client.completions.create(model="tiny", prompt="hi", max_tokens=2)
        keyed = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-qkv", max_retries=0)
        assert keyed.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens == 2
        assert [m.id for m in keyed.models.list()] == ["tiny"]
    finally:
        s.stop()


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


def test_structured_output_through_the_openai_client_validates(chat_server):
    _, s = chat_server
    messages = [{"role": "user", "content": "A person, please"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in range(5):
        r = s.client.chat.completions.create(model="tiny", messages=messages, max_tokens=120, temperature=1.0,
                                             seed=seed, response_format=fmt)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    pieces = s.client.chat.completions.create(model="tiny", messages=messages, max_tokens=120, temperature=1.0,
                                              seed=1, response_format=fmt, stream=True)
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in pieces)), PERSON)
    with pytest.raises(openai.BadRequestError, match="json_schema"):
        s.client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}})
    # llama-server's GBNF grammar, passed through extra_body
    r = s.client.completions.create(model="tiny", prompt="Answer:", max_tokens=20, temperature=1.0, seed=3,
                                    extra_body={"grammar": 'root ::= ("yes" | "no") "." '})
    assert r.choices[0].text in ("yes.", "no.")


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                          "unit": {"enum": ["c", "f"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}}


def test_tool_calls_through_the_openai_client(chat_server):
    _, s = chat_server
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    r = s.client.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], tool_choice="required",
                                         max_tokens=200, temperature=1.0, seed=2)
    assert r.choices[0].finish_reason == "tool_calls"
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    # streamed: the client's deltas assemble to the same call
    name, args = None, ""
    for chunk in s.client.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], seed=2,
                                                  tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                                  max_tokens=200, temperature=1.0, stream=True):
        for d in chunk.choices[0].delta.tool_calls or []:
            name = d.function.name or name
            args += d.function.arguments or ""
    assert (name, json.loads(args)) == ("get_weather", json.loads(call.function.arguments))
    # "auto": a call the model writes in its template's form comes back as a call (the
    # model made to write one here by a grammar on its text)
    written = ('start: "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": '
               '{\\"city\\": \\"Oslo\\", \\"unit\\": \\"c\\"}}\\n</tool_call>"')
    auto = s.client.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], max_tokens=200,
                                            extra_body={"guided_grammar": written})
    assert auto.choices[0].finish_reason == "tool_calls"
    assert json.loads(auto.choices[0].message.tool_calls[0].function.arguments) == {"city": "Oslo", "unit": "c"}
    # the call and its result back in the history
    history = messages + [r.choices[0].message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "5 degrees"}]
    r = s.client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], max_tokens=5)
    assert r.usage.completion_tokens == 5
