"""Cascade attention over PyTorch tensors: requests that share KV prefixes read each shared part
once (the C++ call is ``Runtime::cascade``; see its ``CascadeArgs``)."""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple, Union

import torch

from ._ops import _call, _check_tensor, _lse, _options, _out_like

Tensor = torch.Tensor
_CASCADE = _call("cascade")


class CascadeLevel(NamedTuple):
    """One level of a cascade: q's rows ``qo_indptr[g] .. qo_indptr[g + 1]`` attend to the
    ``seq_lens[g]`` tokens of ``page_table`` row g (index tensors int32 or int64, on q's
    device). The groups of a level cover all of q's rows (a row with no part in a level sits in
    a group of length 0). ``causal``: the level holds the rows' new tokens (query i of a group of
    q_len rows sits at position ``seq_lens[g] - q_len + i`` and sees the keys up to it); False:
    the level precedes every query. ``max_q_len`` (the largest group's rows) sizes the grid;
    None uses all of q's rows, always enough, and needs no device-to-host copy."""
    qo_indptr: Tensor
    page_table: Tensor
    seq_lens: Tensor
    causal: bool = False
    max_q_len: Optional[int] = None


def _level_lists(call: str, levels: Sequence[CascadeLevel]):
    if isinstance(levels, CascadeLevel) or not isinstance(levels, (list, tuple)):
        raise TypeError(f"{call}: levels is a {type(levels).__name__} (allowed: a list of CascadeLevel)")
    qo, tables, lens, causal, max_q = [], [], [], [], []
    for i, level in enumerate(levels):
        if not isinstance(level, CascadeLevel):
            raise TypeError(f"{call}: levels[{i}] is a {type(level).__name__} (allowed: astrai_jit.CascadeLevel)")
        for name in ("qo_indptr", "page_table", "seq_lens"):
            _check_tensor(call, f"levels[{i}].{name}", getattr(level, name))
        qo.append(level.qo_indptr)
        tables.append(level.page_table)
        lens.append(level.seq_lens)
        causal.append(bool(level.causal))
        max_q.append(-1 if level.max_q_len is None else int(level.max_q_len))
    return qo, tables, lens, causal, max_q


def cascade(q: Tensor, k_cache: Tensor, v_cache: Tensor, levels: Sequence[CascadeLevel], *,
            out: Optional[Tensor] = None, scale: Optional[float] = None, return_lse: bool = False,
            logit_cap: float = 0.0, sinks: Optional[Tensor] = None, k_scale: Optional[Tensor] = None,
            v_scale: Optional[Tensor] = None, workspace: Optional[Tensor] = None,
            stream=None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention of q ``[total_q, n_heads, head_dim]`` over KV levels of one paged pool
    (k_cache, v_cache as for :func:`paged_decode`): each level runs as a paged prefill over its
    groups, and the levels merge by LSE. Typically level 0 is one group of every row over the
    shared prefix (read once for all of them, on tensor cores) and the last level one group a
    request over its own pages, causal. 1 to 4 levels. ``logit_cap`` and an FP8 cache apply to
    every level, ``sinks`` join the softmax once; a window and ALiBi are not served.
    A long shared level 0 is read in chunks by more CTAs and its chunks merged first.
    ``workspace`` (a contiguous scratch tensor of at least the bytes the C++
    ``cascade_workspace_bytes(args, num_sms)`` gives) is needed under CUDA graph capture;
    without it the runtime's per-stream workspace serves."""
    call = "cascade"
    out = _out_like(call, q, out)
    lse = _lse(q, q.shape[:2]) if return_lse else None
    scale, logit_cap, _ = _options(call, scale, logit_cap, -1, sinks, k_scale, v_scale)
    qo_indptrs, page_tables, seq_lens, causal, max_q_lens = _level_lists(call, levels)
    if workspace is not None:
        _check_tensor(call, "workspace", workspace)
    _CASCADE(q, k_cache, v_cache, qo_indptrs, page_tables, seq_lens, causal, max_q_lens, out, lse, scale, logit_cap,
             sinks, k_scale, v_scale, workspace, stream)
    return (out, lse) if return_lse else out


class CascadeAttention:
    """Plan once per batch layout, run once per layer, as serving engines drive attention:

        attention = astrai_jit.CascadeAttention()
        attention.plan([CascadeLevel(prefix_indptr, prefix_table, prefix_lens),
                        CascadeLevel(request_indptr, request_tables, request_lens, causal=True)])
        out = attention.run(q, k_cache, v_cache)

    plan() takes the levels' index tensors on q's device (their max_q_len, when not given, is
    read once here from qo_indptr, a device-to-host copy run() then never makes)."""

    def __init__(self):
        self._levels: Optional[Tuple[CascadeLevel, ...]] = None

    def plan(self, levels: Sequence[CascadeLevel]) -> None:
        _level_lists("cascade", levels)
        planned = []
        for level in levels:
            if level.max_q_len is None:
                counts = level.qo_indptr[1:] - level.qo_indptr[:-1]
                level = level._replace(max_q_len=int(counts.max()) if counts.numel() else 0)
            planned.append(level)
        self._levels = tuple(planned)

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, **options) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        if self._levels is None:
            raise RuntimeError("cascade: run() before plan() (allowed: plan the levels first)")
        return cascade(q, k_cache, v_cache, list(self._levels), **options)
