#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<target>/ from the committed fixtures (python3
standard library only). Seeds are named `seed-*`; files libFuzzer adds keep its
hash names. Every seed stays under 64 KB.

    python3 fuzz/seed_corpus.py
"""

import json
import struct
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
FIX = FUZZ.parent / "crates" / "qkv" / "tests" / "fixtures"
CORPUS = FUZZ / "corpus"
LIMIT = 64 * 1024

# the config target's first byte picks one of these (fuzz_targets/config.rs: FAMILIES)
FAMILIES = [
    "bert",
    "gpt2",
    "llama_gqa",
    "mistral",
    "bloom",
    "marian",
    "t5",
    "t5_gated",
    "llama_mqa_tied",
    "llama_bf16",
]

DTYPE = {"F64": ("d", 8), "F32": ("f", 4), "I64": ("q", 8), "I32": ("i", 4), "U8": ("B", 1), "BOOL": ("?", 1)}


def read_st(path):
    """(header without __metadata__, metadata, data bytes) of a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    return header, meta, raw[8 + n :]


def tensor_bytes(path, names):
    """{name: (dtype, shape, bytes)} for the tensors `names` of a fixture."""
    header, _, data = read_st(path)
    out = {}
    for name in names:
        if name in header:
            t = header[name]
            a, b = t["data_offsets"]
            out[name] = (t["dtype"], t["shape"], data[a:b])
    return out


def st(tensors, metadata=None):
    """A safetensors file of {name: (dtype, shape, bytes or list of values)}."""
    header = {}
    blob = b""
    for name, (dtype, shape, values) in tensors.items():
        if not isinstance(values, bytes):
            fmt, _ = DTYPE[dtype]
            values = struct.pack("<%d%s" % (len(values), fmt), *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(values)]}
        blob += values
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + blob


def put(target, name, data):
    assert len(data) < LIMIT, (target, name, len(data))
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / ("seed-" + name)).write_bytes(data)


def safetensors_seeds():
    picks = [
        "ops/layer_norm",
        "ops/matmul",
        "position/t5_bias",
        "grad/softmax",
        "optim/adamw_defaults",
        "sdpa/bool_mask_per_batch",
        "sdpa/bool_mask_shared",
        "sdpa/fully_masked",
        "rnn/elman_padded",
        "grad/attention_key_padding",
        "models/bert/reference",
        "models/t5_gated/reference",
        "models/gpt2_sharded/model-00003-of-00003",
        "models/llama_f16/model",
        "models/llama_bf16/model",
    ]
    for p in picks:
        put("safetensors", p.replace("/", "_"), (FIX / (p + ".safetensors")).read_bytes())
    # the dtypes and shapes fixtures lack: f64, i32, u8, bool, scalars, empty tensors
    put(
        "safetensors",
        "dtypes",
        st(
            {
                "f64": ("F64", [2, 2], [0.5, -1.0, 1e300, -0.0]),
                "i32": ("I32", [3], [-1, 0, 2**31 - 1]),
                "u8": ("U8", [2, 2], [0, 1, 255, 7]),
                "bool": ("BOOL", [4], [True, False, True, True]),
                "scalar": ("F32", [], [3.5]),
                "empty": ("F32", [0, 4], []),
                "f16": ("F16", [2], b"\x00\x3c\x00\xc0"),
                "bf16": ("BF16", [2], b"\x80\x3f\x00\xc0"),
            },
            {"format": "pt", "note": "hand-made"},
        ),
    )
    put("safetensors", "empty_header", st({}))
    put("safetensors", "metadata_only", st({}, {"k": "v"}))


def config_seeds():
    for i, fam in enumerate(FAMILIES):
        put("config", fam, bytes([i]) + (FIX / "models" / fam / "config.json").read_bytes())
    # transformers 5.x layouts and a qkv-native folder's config
    put("config", "llama_v5", bytes([FAMILIES.index("llama_gqa")]) + (FIX / "models/llama_v5/config.json").read_bytes())
    put("config", "t5_v5_untied", bytes([FAMILIES.index("t5_gated")]) + (FIX / "models/t5_v5_untied/config.json").read_bytes())
    put("config", "llama_f16", bytes([FAMILIES.index("llama_bf16")]) + (FIX / "models/llama_f16/config.json").read_bytes())
    # sizes and values at the edges the loader must refuse (or survive) before allocating
    edges = [
        ("marian", {"max_position_embeddings": 10**9}),
        ("llama_gqa", {"head_dim": 2**40}),
        ("llama_gqa", {"max_position_embeddings": 10**12, "rope_scaling": {"type": "linear", "factor": 0.0}}),
        ("bert", {"vocab_size": 10**12, "type_vocab_size": 0}),
        ("t5", {"relative_attention_num_buckets": 10**10, "relative_attention_max_distance": 0}),
        ("gpt2", {"n_layer": 10**9, "n_positions": 1}),
        ("mistral", {"sliding_window": 0, "num_key_value_heads": 3}),
        ("bloom", {"n_head": 3, "layer_norm_epsilon": -1.0}),
    ]
    for fam, changes in edges:
        c = json.loads((FIX / "models" / fam / "config.json").read_text())
        c.update(changes)
        name = fam + "_" + "_".join(sorted(changes))
        put("config", "edge_" + name, bytes([FAMILIES.index(fam)]) + json.dumps(c).encode())


MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def tokenizer_seeds():
    for name in ["wordpiece", "bytelevel", "unigram", "sentencepiece_bpe", "sentencepiece_unigram"]:
        put("tokenizer", name, b"\x00" + (FIX / "tokenizers" / name / "tokenizer.json").read_bytes())
    put("tokenizer", "modules", b"\x01" + json.dumps(MODULES, indent=2).encode())
    put("tokenizer", "modules_no_normalize", b"\x01" + json.dumps(MODULES[:2], indent=2).encode())


def batch_seeds():
    keep = ["input_ids", "attention_mask", "token_type_ids", "decoder_input_ids"]
    for fam in ["bert", "gpt2", "bloom", "marian", "t5"]:
        t = tensor_bytes(FIX / "models" / fam / "reference.safetensors", keep)
        put("batch", fam, st(t))
    # left padding (the reference's left_* tensors) and a minimal one-token batch
    t = tensor_bytes(FIX / "models/gpt2/reference.safetensors", ["left_input_ids", "left_attention_mask"])
    put("batch", "gpt2_left", st({"input_ids": t["left_input_ids"], "attention_mask": t["left_attention_mask"]}))
    put("batch", "one_token_i32", st({"input_ids": ("I32", [1, 1], [5])}))


def train_data_seeds():
    keep = ["input_ids", "attention_mask", "decoder_input_ids", "targets"]
    for fam in ["gpt2", "bert", "t5", "marian", "bloom"]:
        t = tensor_bytes(FIX / "train_model" / fam / "reference.safetensors", keep)
        put("train_data", fam, st(t))
    put(
        "train_data",
        "one_step",
        st({"input_ids": ("I64", [1, 1, 3], [1, 2, 3]), "targets": ("I64", [1, 1, 3], [2, 3, -100])}),
    )


def gguf_seeds():
    """The GGUF fixture (every tensor type qkv reads, every metadata type), the same
    header with no tensors, a vocabulary of each kind qkv reads (one with a chat template),
    and a small Q8_0 model."""
    data = (FIX / "gguf" / "tensors.gguf").read_bytes()
    put("gguf", "tensors", data)
    for name in ["llama_spm", "qwen2_bpe", "llama3_bpe"]:
        put("gguf", f"vocab_{name}", (FIX / "gguf" / "tokenizers" / f"{name}.gguf").read_bytes())
    put("gguf", "model_q8_0", (FIX / "gguf" / "models" / "llama_gqa_q8_0.gguf").read_bytes())
    # magic, version, tensor count 0, metadata count 1, then `general.architecture`
    key = b"general.architecture"
    value = b"llama"
    put(
        "gguf",
        "metadata_only",
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
        + struct.pack("<IQ", 8, len(value)) + value,
    )


if __name__ == "__main__":
    safetensors_seeds()
    gguf_seeds()
    config_seeds()
    tokenizer_seeds()
    batch_seeds()
    train_data_seeds()
    for d in sorted(CORPUS.iterdir()):
        files = list(d.iterdir())
        print(f"{d.name}: {len(files)} files, {sum(f.stat().st_size for f in files)} bytes")
