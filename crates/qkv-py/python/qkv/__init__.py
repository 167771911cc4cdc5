"""qkv: the Transformer's core mechanism in Rust, over NumPy arrays.

Attention (every mask kind, grouped-query heads, its backward), position encodings,
Hugging Face checkpoints (forward with attention maps, generation, sentence
embeddings) and the experiments that measure the articles' claims.

>>> import numpy as np, qkv
>>> q = np.random.default_rng(0).standard_normal((1, 4, 2, 8), dtype=np.float32)
>>> out, lse = qkv.attention(q, q, q, causal="top_left")
>>> out.shape, lse.shape
((1, 4, 2, 8), (1, 2, 4))

Layouts: ``q`` is ``[B, T, H, D]`` (qkv's own, read without a copy) or, with
``layout="bhtd"``, ``[B, H, T, D]`` as ``torch.nn.functional.scaled_dot_product_attention``
takes it. ``qkv.autograd`` wraps the pair as a ``torch.autograd.Function``.
"""

from ._qkv import (
    EXPERIMENTS,
    Model,
    Rope,
    Stream,
    __version__,
    alibi_slopes,
    attention,
    attention_backward,
    experiment,
    get_num_threads,
    load,
    relative_position_bucket,
    set_num_threads,
    sinusoidal_table,
    train,
)

__all__ = [
    "EXPERIMENTS",
    "Model",
    "Rope",
    "Stream",
    "__version__",
    "alibi_slopes",
    "attention",
    "attention_backward",
    "experiment",
    "get_num_threads",
    "load",
    "relative_position_bucket",
    "set_num_threads",
    "sinusoidal_table",
    "train",
]
