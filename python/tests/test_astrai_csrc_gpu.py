"""AstrAI's kernel calls served by astrai-jit, on the GPU, against float64 references: both
paged-decode forms, the flat-pool paged prefill (gathered into 16-token pages, and in place),
int32 and int64 tables, ragged lengths with empty and one-token requests, 4-D masks; outputs
poisoned first where the call takes an output buffer."""
import pytest
import torch

import astrai_jit.astrai_csrc as C
from reference import assert_rows_close, attention_ref, causal_keep

pytestmark = pytest.mark.gpu
bf16 = torch.bfloat16
DEV = "cuda"


def _pool(slots, kvh, d):
    # Rising keys make peaked rows (a few keys dominate), as trained models' are.
    k = torch.randn(slots, kvh, d, device=DEV) * torch.linspace(0.5, 2.0, slots, device=DEV)[:, None, None]
    return k.to(bf16), torch.randn(slots, kvh, d, device=DEV, dtype=bf16)


def _ragged(lens):
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device=DEV)
    indptr[1:] = torch.tensor(lens, device=DEV).cumsum(0)
    return indptr


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("d,h,kvh", [(64, 24, 4), (128, 8, 8)])
def test_2026_08_paged_decode_over_the_pool(index_dtype, d, h, kvh):
    lens = [1, 300, 0, 1025, 77]
    batch, width = len(lens), 1100
    k_pool, v_pool = _pool(batch * width + 7, kvh, d)
    rtt = torch.randperm(batch * width, device=DEV).reshape(batch, width)[torch.tensor([3, 1, 0, 4, 2])]
    rtt = rtt.to(index_dtype)
    rows = torch.tensor([2, 1, 0, 4, 3], dtype=index_dtype, device=DEV)  # row b of rtt serves request rows[b]
    q = torch.randn(batch, h, d, device=DEV, dtype=bf16)
    new_k = torch.randn(batch, kvh, d, device=DEV, dtype=bf16)
    new_v = torch.randn(batch, kvh, d, device=DEV, dtype=bf16)
    out_buf = torch.full((batch + 3, h, d), float("nan"), device=DEV, dtype=bf16)
    o_part = torch.empty(batch * h * 32 * d, device=DEV)
    out = C.attn_paged_decode(q, k_pool, v_pool, rtt, rows, _ragged(lens), new_k=new_k, new_v=new_v, mask=None,
                              causal_offset=0, o_part_buf=o_part, out_buf=out_buf)
    assert out.data_ptr() == out_buf.data_ptr()
    for b, n in enumerate(lens):
        slots = rtt[rows[b].long(), :n].long()
        if n:
            assert torch.equal(k_pool[slots[-1]], new_k[b]) and torch.equal(v_pool[slots[-1]], new_v[b])
        want, _ = attention_ref(q[b : b + 1, None], k_pool[slots][None], v_pool[slots][None])
        assert_rows_close(out[b : b + 1, None], want, bf16)


def test_2026_07_paged_decode_with_int64_table_and_4d_mask():
    batch, h, kvh, d, kv_len = 3, 24, 4, 64, 700
    k_pool, v_pool = _pool(batch * 1024, kvh, d)
    table = torch.randperm(batch * 1024, device=DEV).reshape(batch, 1024)  # int64, as AstrAI's
    keep = torch.rand(batch, kv_len, device=DEV) > 0.3
    q = torch.randn(batch, 1, h, d, device=DEV, dtype=bf16)
    out = C.attn_paged_decode(q, table, k_pool[:, None], v_pool[:, None], 1, kv_len, mask=keep[:, None, None],
                              causal_offset=kv_len - 1, layout=1)
    slots = table[:, :kv_len]
    want, _ = attention_ref(q, k_pool[slots], v_pool[slots], keep=keep[:, None])
    assert_rows_close(out, want, bf16)


@pytest.mark.parametrize("gather", [True, False])
@pytest.mark.parametrize("d,h,kvh", [(64, 24, 4), (128, 16, 4)])
def test_2026_08_paged_prefill_over_the_pool(gather, d, h, kvh, monkeypatch):
    monkeypatch.setattr(C, "_GATHER_PAGES", gather)
    q_lens, kv_lens = [5, 0, 130, 1, 64], [9, 3, 130, 700, 64]
    batch, width = len(q_lens), 720
    k_pool, v_pool = _pool(batch * width, kvh, d)
    rtt = torch.randperm(batch * width, device=DEV, dtype=torch.int64).reshape(batch, width).to(torch.int32)
    rows = torch.tensor([4, 3, 2, 1, 0], dtype=torch.int32, device=DEV)
    q = torch.randn(sum(q_lens), h, d, device=DEV, dtype=bf16)
    tiles = torch.zeros(1, dtype=torch.int32, device=DEV)
    out = C.attn_paged_prefill(q, k_pool, v_pool, rtt, rows, _ragged(kv_lens), _ragged(q_lens), tiles, tiles,
                               None, causal_offset=0)
    start = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        slots = rtt[rows[b].long(), :kl].long()
        keep = causal_keep(1, ql, kl, kl - ql, DEV)
        want, _ = attention_ref(q[None, start : start + ql], k_pool[slots][None], v_pool[slots][None], keep=keep)
        assert_rows_close(out[None, start : start + ql], want, bf16)
        start += ql


def test_2026_08_paged_prefill_with_a_4d_mask():
    q_lens, kv_lens = [6, 3], [40, 3]
    batch, h, kvh, d, width = 2, 8, 2, 64, 48
    k_pool, v_pool = _pool(batch * width, kvh, d)
    rtt = torch.arange(batch * width, dtype=torch.int32, device=DEV).reshape(batch, width)
    rows = torch.arange(batch, dtype=torch.int32, device=DEV)
    keep = torch.rand(batch, 1, max(q_lens), width, device=DEV) > 0.4
    q = torch.randn(sum(q_lens), h, d, device=DEV, dtype=bf16)
    tiles = torch.zeros(1, dtype=torch.int32, device=DEV)
    out = C.attn_paged_prefill(q, k_pool, v_pool, rtt, rows, _ragged(kv_lens), _ragged(q_lens), tiles, tiles, keep,
                               causal_offset=-1)
    start = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        slots = rtt[b, :kl].long()
        want, _ = attention_ref(q[None, start : start + ql], k_pool[slots][None], v_pool[slots][None],
                                keep=keep[b, :, :ql, :kl])
        assert_rows_close(out[None, start : start + ql], want, bf16)
        start += ql


@pytest.mark.parametrize("layout", [0, 1])
def test_contiguous_decode_and_prefill_with_4d_masks(layout):
    batch, h, kvh, d, q_len, kv_len = 2, 12, 4, 64, 33, 90
    q = torch.randn(batch, q_len, h, d, device=DEV, dtype=bf16)
    k = torch.randn(batch, kv_len, kvh, d, device=DEV, dtype=bf16)
    v = torch.randn(batch, kv_len, kvh, d, device=DEV, dtype=bf16)
    keep = torch.rand(batch, 1, q_len, kv_len, device=DEV) > 0.3
    t = (lambda x: x.transpose(1, 2).contiguous()) if layout == 0 else (lambda x: x)
    back = (lambda x: x.transpose(1, 2)) if layout == 0 else (lambda x: x)
    out = back(C.attn_prefill(t(q), t(k), t(v), mask=keep, causal_offset=kv_len - q_len, layout=layout))
    want, _ = attention_ref(q, k, v, keep=keep[:, 0] & causal_keep(batch, q_len, kv_len, kv_len - q_len, DEV))
    assert_rows_close(out, want, bf16)
    q1 = q[:, -1:]
    out = back(C.attn_decode(t(q1), t(k), t(v), mask=keep[:, :, -1:], causal_offset=kv_len - 1, layout=layout))
    want, _ = attention_ref(q1, k, v, keep=keep[:, 0, -1:])
    assert_rows_close(out, want, bf16)
