"""AstrAI's interface: the SDPA backend against float64 references, backend selection, the JIT
backend's fallback (one log line per reason), apply_rotary_emb's dispatch (CPU)."""
import logging

import pytest
import torch

import astrai_jit.astrai as A
from reference import attention_ref, causal_keep, close, rotary_ref

torch.manual_seed(0)


@pytest.mark.parametrize("q_len,kv_len,causal", [(1, 17, False), (5, 5, True), (4, 11, True), (6, 9, False)])
@pytest.mark.parametrize("mask_rank", [0, 2, 3])
def test_sdpa_backend_matches_the_reference(q_len, kv_len, causal, mask_rank):
    batch, heads, kv_heads, dim = 2, 6, 2, 32
    q = torch.randn(batch, q_len, heads, dim, dtype=torch.float64)
    k = torch.randn(batch, kv_len, kv_heads, dim, dtype=torch.float64)
    v = torch.randn(batch, kv_len, kv_heads, dim, dtype=torch.float64)
    mask = None
    if mask_rank == 2:
        mask = torch.rand(batch, kv_len) > 0.3
    elif mask_rank == 3:
        mask = torch.rand(batch, q_len, kv_len) > 0.3
        mask[0, 0] = False  # a row with nothing to attend to gives zeros
    keep = None if mask is None else (mask[:, None] if mask.dim() == 2 else mask).expand(batch, q_len, kv_len)
    if causal:
        c = causal_keep(batch, q_len, kv_len, kv_len - q_len, q.device)
        keep = c if keep is None else keep & c
    expected, _ = attention_ref(q, k, v, keep)
    got = A.SdpaBackend().forward(q, k, v, mask=mask, is_causal=causal)
    ok, err = close(got, expected, atol=1e-9, rtol=1e-9)
    assert ok, err
    assert not torch.isnan(got).any()


def make_pool(batch=3, heads=4, kv_heads=2, dim=32, page_size=4, max_pages=5, num_pages=20, dtype=torch.float64):
    k_cache = torch.randn(num_pages, page_size, kv_heads, dim, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(num_pages)[: batch * max_pages].reshape(batch, max_pages).int()
    lens = torch.tensor([1, 7, page_size * max_pages], dtype=torch.int32)[:batch]
    q = torch.randn(batch, heads, dim, dtype=dtype)
    return q, k_cache, v_cache, table, lens


def gather(cache, table, lens, b):
    page_size = cache.shape[1]
    pos = torch.arange(int(lens[b]))
    return cache[table[b].long()[pos // page_size], pos % page_size]


def test_sdpa_paged_decode_with_fused_append_writes_the_cache():
    q, kc, vc, table, lens = make_pool()
    new_k = torch.randn(3, 2, 32, dtype=torch.float64)
    new_v = torch.randn(3, 2, 32, dtype=torch.float64)
    got = A.SdpaBackend().fwd_paged_decode(q, kc, vc, table, lens, new_k=new_k, new_v=new_v)
    for b in range(3):
        k = gather(kc, table, lens, b)
        v = gather(vc, table, lens, b)
        assert torch.equal(k[-1], new_k[b]) and torch.equal(v[-1], new_v[b])
        expected, _ = attention_ref(q[b][None, None], k[None], v[None])
        ok, err = close(got[b], expected[0, 0], atol=1e-9, rtol=1e-9)
        assert ok, err


def test_sdpa_paged_decode_flat_pool_and_req_indices():
    # AstrAI's layout: a flat token pool [slots, kv_heads, D] and req_to_token rows.
    slots = torch.randn(50, 2, 32, dtype=torch.float64)
    values = torch.randn(50, 2, 32, dtype=torch.float64)
    req_to_token = torch.randperm(50)[:40].reshape(4, 10).int()
    req = torch.tensor([2, 0], dtype=torch.int32)
    lens = torch.tensor([10, 3], dtype=torch.int32)
    q = torch.randn(2, 1, 4, 32, dtype=torch.float64)
    got = A.SdpaBackend().fwd_paged_decode(q, slots, values, req_to_token, lens, req_indices=req)
    assert got.shape == q.shape
    for b in range(2):
        ids = req_to_token[req[b]].long()[: lens[b]]
        expected, _ = attention_ref(q[b : b + 1], slots[ids][None], values[ids][None])
        assert close(got[b], expected[0], atol=1e-9, rtol=1e-9)[0]


def test_attn_backend_selects_and_restores():
    assert isinstance(A.get_attn_backend(), A.SdpaBackend)
    with A.attn_backend(A.ATTN_BACKEND.CUDA) as backend:
        assert isinstance(backend, A.JitBackend) and A.get_attn_backend() is backend
        with A.attn_backend("sdpa"):
            assert isinstance(A.get_attn_backend(), A.SdpaBackend)
        assert A.get_attn_backend() is backend
    assert isinstance(A.get_attn_backend(), A.SdpaBackend)
    assert A.ATTN_BACKEND.CUDA is A.ATTN_BACKEND.JIT
    with pytest.raises(ValueError, match="attention backend 'flash' is unknown"):
        with A.attn_backend("flash"):
            pass


def test_jit_backend_falls_back_to_sdpa_with_one_log_line(caplog):
    backend = A.JitBackend()
    q = torch.randn(2, 3, 4, 32)
    k = torch.randn(2, 8, 2, 32)
    with caplog.at_level(logging.WARNING, logger="astrai_jit"):
        for _ in range(5):
            got = backend.forward(q, k, k, is_causal=True)
    expected = A.SdpaBackend().forward(q, k, k, is_causal=True)
    assert torch.equal(got, expected)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["astrai_jit: attn_prefill falls back to sdpa: tensors on cpu, not a CUDA device"]


def test_jit_backend_falls_back_for_paged_decode_on_cpu(caplog):
    q, kc, vc, table, lens = make_pool(dtype=torch.bfloat16)
    backend = A.JitBackend()
    with caplog.at_level(logging.WARNING, logger="astrai_jit"):
        backend.fwd_paged_decode(q, kc, vc, table, lens)
        backend.fwd_paged_decode(q, kc, vc, table, lens)
    assert len(caplog.records) == 1 and "attn_paged_decode falls back" in caplog.records[0].getMessage()


def test_direct_kernel_calls_raise_instead_of_falling_back():
    q = torch.randn(2, 1, 4, 32, dtype=torch.bfloat16)
    k = torch.randn(2, 8, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="decode: q is on cpu"):
        A.attn_decode(q, k, k)


@pytest.mark.parametrize("shape,freqs_shape", [((6, 4, 16), (6, 8, 2)), ((2, 6, 4, 16), (2, 6, 8, 2)),
                                               ((2, 6, 4, 16), (6, 8, 2)), ((2, 6, 4, 16), (1, 6, 8, 2))])
def test_apply_rotary_emb_uses_the_complex_multiply_on_cpu(shape, freqs_shape):
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    angles = torch.rand(*freqs_shape[:-1], dtype=torch.float64) * 6
    freqs = torch.stack((angles.cos(), angles.sin()), dim=-1).float()
    got = A.apply_rotary_emb(x, freqs)
    f = freqs if len(freqs_shape) == len(shape) - 1 or freqs_shape[0] != 1 else freqs
    f = f.unsqueeze(-3) if f.dim() == len(shape) - 1 else f[None].unsqueeze(-3)
    expected = rotary_ref(x.detach(), f)
    assert close(got.detach(), expected, atol=1e-6, rtol=1e-6)[0]
    got.sum().backward()  # differentiable when grad is enabled
    assert x.grad is not None
