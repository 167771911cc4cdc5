"""qkv.autograd (the forward and backward as a torch.autograd.Function) against
PyTorch's own autograd through SDPA. Needs torch; skipped, saying so, without it."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable: no autograd to compare with")


def test_gradients_equal_torch_autograd_through_sdpa():
    from qkv.autograd import attention

    g = torch.Generator().manual_seed(0)
    b, h, kv_heads, t, s, d = 2, 6, 2, 5, 9, 8
    q = torch.randn(b, h, t, d, generator=g, requires_grad=True)
    k = torch.randn(b, kv_heads, s, d, generator=g, requires_grad=True)
    v = torch.randn(b, kv_heads, s, d, generator=g, requires_grad=True)
    bias = torch.randn(1, h, t, s, generator=g, requires_grad=True)
    mask = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
    dense = bias.masked_fill(~mask, float("-inf"))

    out = attention(q, k, v, bias, mask=mask.numpy())
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True)
    upstream = torch.randn(out.shape, generator=g)
    ours = torch.autograd.grad(out, (q, k, v, bias), upstream)
    theirs = torch.autograd.grad(want, (q, k, v, bias), upstream)
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), atol=1e-5)
    for name, a, e in zip(("dq", "dk", "dv", "dbias"), ours, theirs):
        np.testing.assert_allclose(a.numpy(), e.numpy(), atol=1e-5, rtol=1e-4, err_msg=name)
