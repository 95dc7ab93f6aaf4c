"""float64 references for the kernels, written from their definitions (not from SDPA)."""
import math

import torch


def attention_ref(q, k, v, keep=None, scale=None, logit_cap=0.0, sinks=None):
    """q [B, Lq, H, D], k/v [B, Lk, Hkv, D], keep bool [B, Lq, Lk] or None. logit_cap > 0 turns
    each scaled score s into cap * tanh(s / cap); sinks [H] are logits that join each row's
    softmax denominator only. Rows with nothing kept give zeros. Returns out float64
    [B, Lq, H, D] and lse [B, Lq, H] (the sink included)."""
    q, k, v = q.double(), k.double(), v.double()
    batch, q_len, n_heads, head_dim = q.shape
    group = n_heads // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if keep is not None:
        scores = scores.masked_fill(~keep[:, None], float("-inf"))
    if sinks is None:
        lse = torch.logsumexp(scores, dim=-1)
    else:
        sink = sinks.double()[None, :, None, None].expand(batch, n_heads, q_len, 1)
        lse = torch.logsumexp(torch.cat((scores, sink), dim=-1), dim=-1)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", weights, v)
    return out, lse.transpose(1, 2)


def causal_keep(batch, q_len, kv_len, offset, device):
    rows = torch.arange(q_len, device=device)[:, None] + offset
    return (torch.arange(kv_len, device=device)[None, :] <= rows).expand(batch, q_len, kv_len)


def window_keep(batch, q_len, kv_len, offset, window_left, device):
    """Causal rows at positions offset + i that see keys [position - window_left, position]."""
    rows = torch.arange(q_len, device=device)[:, None] + offset
    keys = torch.arange(kv_len, device=device)[None, :]
    return ((keys <= rows) & (keys >= rows - window_left)).expand(batch, q_len, kv_len)


def rotary_ref(x, freqs):
    """x [..., D] with freqs [..., D/2, 2] broadcastable: interleaved pairs, float64."""
    pairs = x.double().reshape(*x.shape[:-1], -1, 2)
    c, s = freqs.double()[..., 0], freqs.double()[..., 1]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


# The bounds of tests/support/numerics.cpp (the derivations are there). u: the dtype's unit
# roundoff. Attention: a row's relative norm error within 2.5 u (bf16, 1e-2) or 4 u (fp16, 2e-3),
# each element within 4 u (|want| + the row's rms). Rotary: one rounding, u |want|. LSE (f32):
# 2e-5 + 2e-6 |want|.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
ROW_BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


# The output format's spacing near zero (numerics.hpp, Tolerance::floor): below fp16's normal range
# the rounding error stops shrinking with the value (rows a heavy sink leaves near 1e-7).
SPACING_FLOOR = {torch.bfloat16: 2.0 ** -133, torch.float16: 2.0 ** -24}


def _rows_report(actual, expected, row_bound, elem_rel, elem_row, floor=0.0):
    """(ok, message) for every row over the last dim of actual against expected (float64)."""
    got = actual.double()
    want = expected.double().to(got.device)
    if got.shape != want.shape:
        return False, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not bool(got.isfinite().all()):
        return False, "non-finite output (poison left, or NaN)"
    err = (got - want).abs()
    norm_want = want.norm(dim=-1)
    norm_err = err.norm(dim=-1)
    rel = torch.where(norm_want > 0, norm_err / norm_want.clamp_min(1e-300),
                      torch.where(norm_err > 0, torch.full_like(norm_err, float("inf")), torch.zeros_like(norm_err)))
    rms = norm_want / max(want.shape[-1], 1) ** 0.5
    elem_bound = elem_rel * want.abs() + elem_row * rms[..., None] + floor
    elem_bad = err > elem_bound
    worst = float(rel.max()) if rel.numel() else 0.0
    if bool(elem_bad.any()):
        at = tuple(int(i) for i in elem_bad.nonzero()[0])
        return False, (f"element {at}: got {float(got[at]):.6g} want {float(want[at]):.6g} "
                       f"(bound {float(elem_bound[at]):.3g}); worst row {worst:.3g}")
    row_bad = (rel > row_bound) & (norm_err > row_bound * norm_want + floor * max(want.shape[-1], 1) ** 0.5)
    if bool(row_bad.any()):
        at = tuple(int(i) for i in row_bad.nonzero()[0])
        return False, f"row {at}: relative error {worst:.3g} > {row_bound:.3g}"
    return True, f"worst row {worst:.3g} of {row_bound:.3g}"


def assert_rows_close(actual, expected, dtype=None, slack=1.0):
    """Attention outputs: every row (last dim) within the bounds of its dtype. slack > 1 only
    where the expected side carries its own rounding (another 16-bit implementation)."""
    dtype = dtype or actual.dtype
    u = UNIT_ROUNDOFF[dtype]
    ok, message = _rows_report(actual, expected, ROW_BOUND[dtype] * slack, 4 * u * slack, 4 * u * slack,
                               SPACING_FLOOR[dtype])
    assert ok, message


def assert_rotary_close(actual, expected):
    u = UNIT_ROUNDOFF[actual.dtype]
    ok, message = _rows_report(actual, expected, u, u * (1 + 2.0 ** -10), 2.0 ** -16, SPACING_FLOOR[actual.dtype])
    assert ok, message


def assert_lse_close(actual, expected):
    """-inf exactly where the reference has no key (nor sink), else within 2e-5 + 2e-6 |want|."""
    got = actual.double()
    want = expected.double().to(got.device)
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    empty = want == float("-inf")
    assert torch.equal(got[empty], want[empty]), "LSE of a row with nothing to attend to is not -inf"
    err = (got[~empty] - want[~empty]).abs()
    bound = 2e-5 + 2e-6 * want[~empty].abs()
    assert bool(got[~empty].isfinite().all()), "non-finite LSE"
    bad = err > bound
    assert not bool(bad.any()), (f"LSE off by {float(err.max()):.3g} (bound {float(bound[bad][0]):.3g} "
                                 f"at the first failure)")


def close(actual, expected, atol, rtol):
    """|err| <= atol + rtol * |ref| everywhere: for float64 paths (the CPU fallbacks), where the
    bounds are near zero and the dtype bounds above do not apply."""
    err = (actual.double() - expected.double()).abs()
    bound = atol + rtol * expected.double().abs()
    return bool((err <= bound).all()), float(err.max()) if err.numel() else 0.0
