"""engine_attention's one-token path (two batched matrix multiplies on CPU float32) equals SDPA with
grouped-query heads, a padding mask and the slab's strided K/V views."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from streamrl.policy.kv_cache import engine_attention


def test_one_token_attention_equals_sdpa_on_strided_slab_views():
    generator = torch.Generator().manual_seed(0)
    batch, kv_heads, groups, head_dim, capacity, keys = 5, 2, 3, 8, 12, 7
    query = torch.randn(batch, kv_heads * groups, 1, head_dim, generator=generator)
    slab_k = torch.randn(batch, kv_heads, capacity, head_dim, generator=generator)
    slab_v = torch.randn(batch, kv_heads, capacity, head_dim, generator=generator)
    key, value = slab_k[:, :, 2 : 2 + keys], slab_v[:, :, 2 : 2 + keys]  # strided, as in the slab
    mask = torch.rand(batch, 1, 1, keys, generator=generator) > 0.4
    mask[..., -1] = True
    mask[0, ..., :-1] = False  # an empty slot sees only its own new column

    out, _ = engine_attention(None, query, key, value, mask, 0.3)

    expected = F.scaled_dot_product_attention(
        query, key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1), attn_mask=mask, scale=0.3
    ).transpose(1, 2)
    assert out.shape == (batch, 1, kv_heads * groups, head_dim)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[0, 0], value[0, :, -1].repeat_interleave(groups, dim=0))
