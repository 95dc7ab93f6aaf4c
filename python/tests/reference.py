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


def close(actual, expected, atol=0.02, rtol=0.02):
    """AstrAI's bound: |err| <= atol + rtol * |ref| everywhere."""
    err = (actual.double() - expected.double()).abs()
    bound = atol + rtol * expected.double().abs()
    return bool((err <= bound).all()), float(err.max()) if err.numel() else 0.0
