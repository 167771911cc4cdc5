"""qkv's attention as a ``torch.autograd.Function``: the forward and the hand-written
backward of :func:`qkv.attention`, so gradients can be checked against PyTorch's
autograd (``torch.autograd.grad``, ``torch.autograd.gradcheck`` in float32 terms).

Needs torch (not a dependency of qkv). Tensors are float32 on the CPU, in SDPA's layout
``[B, H, T, D]``; they cross to NumPy without a copy.

>>> import torch
>>> from qkv.autograd import attention
>>> q = torch.randn(1, 2, 4, 8, requires_grad=True)
>>> out = attention(q, q.detach(), q.detach(), causal="top_left")
>>> out.sum().backward()
"""

import torch

from ._qkv import attention as _forward
from ._qkv import attention_backward as _backward


class Attention(torch.autograd.Function):
    """``softmax(Q·Kᵀ·scale + bias)·V`` with qkv's kernels both ways.

    ``options`` are :func:`qkv.attention`'s keywords (``causal``, ``key_padding``,
    ``mask``, ``alibi_slopes``, ``window``, ``scale``, ``kernel``) as NumPy arrays or
    plain values; a dense ``bias`` is the fourth input so it can have a gradient.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, options):
        arrays = [t.detach().contiguous().numpy() for t in (q, k, v)]
        dense = None if bias is None else bias.detach().contiguous().numpy()
        out, lse = _forward(*arrays, bias=dense, layout="bhtd", **options)
        ctx.arrays, ctx.bias, ctx.options = arrays, dense, options
        ctx.out, ctx.lse = out, lse
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, d_out):
        want_dbias = ctx.bias is not None and ctx.needs_input_grad[3]
        grads = _backward(
            *ctx.arrays,
            ctx.out,
            ctx.lse,
            d_out.detach().contiguous().numpy(),
            bias=ctx.bias,
            return_dbias=want_dbias,
            layout="bhtd",
            **ctx.options,
        )
        dq, dk, dv = (torch.from_numpy(g) for g in grads[:3])
        dbias = torch.from_numpy(grads[3]) if want_dbias else None
        return dq, dk, dv, dbias, None


def attention(q, k, v, bias=None, **options):
    """:func:`qkv.attention` on torch tensors ``[B, H, T, D]``, differentiable in
    ``q``, ``k``, ``v`` and ``bias``; returns the output ``[B, H, T, Dv]``."""
    return Attention.apply(q, k, v, bias, options)
