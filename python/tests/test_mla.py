"""mla_decode from Python: against a float64 reference (bf16 and fp16, q_len 1 and 2, pages of 1
and 64, heads 16 and 128, offsets, int64 tables, a 4-D cache view), its op under opcheck, and
its argument errors (on the CPU, before any launch)."""
import math

import pytest
import torch

import astrai_jit
from reference import assert_lse_close, assert_rows_close, attention_ref, causal_keep

SCALE = 1.0 / math.sqrt(192)


def mla_case(batch, heads, q_len, page_size, max_pages, dtype, device="cuda", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    num_pages = batch * max_pages + 2
    q = torch.randn(batch, q_len, heads, 576, generator=g).to(dtype).to(device)
    cache = torch.randn(num_pages, page_size, 576, generator=g).to(dtype).to(device)
    table = torch.randperm(num_pages, generator=g)[: batch * max_pages].reshape(batch, max_pages).int().to(device)
    lens = torch.randint(0, max_pages * page_size + 1, (batch,), generator=g).int()
    lens[0] = max_pages * page_size
    return q, cache, table, lens.to(device)


def mla_ref(q, cache, table, lens):
    page_size = cache.shape[1]
    q_len = q.shape[1]
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(lens[b])
        pos = torch.arange(n, device=q.device)
        rows = cache[table[b].long()[pos // page_size], pos % page_size]
        keep = causal_keep(1, q_len, n, n - q_len, q.device)
        o, l = attention_ref(q[b][None], rows[None, :, None], rows[None, :, None, :512], keep, SCALE)
        outs.append(o[0])
        lses.append(l[0])
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,q_len,page_size", [(16, 1, 64), (128, 1, 1), (16, 2, 64), (40, 3, 16)])
def test_mla_decode_matches_float64(dtype, heads, q_len, page_size):
    q, cache, table, lens = mla_case(3, heads, q_len, page_size, 256 // page_size + 1, dtype)
    out, lse = astrai_jit.mla_decode(q, cache, table, lens, scale=SCALE, return_lse=True)
    want, want_lse = mla_ref(q, cache, table, lens)
    assert out.shape == (3, q_len, heads, 512)
    assert_rows_close(out, want)
    assert_lse_close(lse, want_lse)
    if q_len == 1:  # the 3-D form of the same call
        flat = astrai_jit.mla_decode(q[:, 0], cache, table, lens, scale=SCALE)
        assert torch.equal(flat, out[:, 0])


@pytest.mark.gpu
def test_mla_decode_offsets_int64_tables_and_a_headed_cache_view():
    q, cache, table, lens = mla_case(2, 16, 1, 16, 20, torch.bfloat16, seed=3)
    offsets = torch.cat((torch.zeros(1, dtype=torch.int64, device="cuda"), lens.long().cumsum(0)))
    got = astrai_jit.mla_decode(q, cache[:, :, None], table.long(), None, scale=SCALE, kv_indptr=offsets)
    assert_rows_close(got, mla_ref(q, cache, table, lens)[0])


def test_mla_decode_errors_name_the_argument():
    q, cache, table, lens = mla_case(2, 16, 1, 16, 4, torch.bfloat16, device="cpu")
    with pytest.raises(TypeError, match="mla_decode: scale is a NoneType"):
        astrai_jit.mla_decode(q, cache, table, lens, scale=None)
    with pytest.raises(ValueError, match="q has shape .* 576"):
        astrai_jit.mla_decode(q[..., :512], cache, table, lens, scale=SCALE)
    with pytest.raises(ValueError, match="kv_cache"):
        astrai_jit.mla_decode(q, cache[..., :512], table, lens, scale=SCALE)
    with pytest.raises(ValueError, match="seq_lens and kv_indptr are both given"):
        astrai_jit.mla_decode(q, cache, table, lens, scale=SCALE, kv_indptr=lens)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_mla_decode_fp8_cache_matches_the_dequantized_reference(fp8):
    q, cache, table, lens = mla_case(2, 64, 1, 64, 5, torch.bfloat16, seed=5)
    kv_scale = torch.tensor([0.5], device="cuda")
    codes = (cache.float() / kv_scale).to(fp8)
    got = astrai_jit.mla_decode(q, codes, table, lens, scale=SCALE, kv_scale=kv_scale)
    assert_rows_close(got, mla_ref(q, codes.float() * kv_scale, table, lens)[0])


def test_mla_decode_fp8_needs_its_scale():
    q, cache, table, lens = mla_case(2, 16, 1, 16, 4, torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="kv_scale is missing"):
        astrai_jit.mla_decode(q, cache.to(torch.float8_e4m3fn), table, lens, scale=SCALE)
    with pytest.raises(ValueError, match="kv_scale is given but kv_cache has dtype"):
        astrai_jit.mla_decode(q, cache, table, lens, scale=SCALE, kv_scale=torch.ones(1))
