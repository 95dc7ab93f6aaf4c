"""AstrAI's compiled kernel modules, served by astrai-jit.

AstrAI loads its CUDA kernels as Python modules from ``astrai/extension/lib/`` (``attn_decode``,
``attn_prefill``, ``attn_paged_decode``, ``attn_paged_prefill``, ``rotary_emb``) and calls one
function of each with the signature of its ``csrc/`` sources. ``python -m astrai_jit.astrai_install``
puts a small compiled module under each of those names there; each one fills itself from this
file (:func:`populate`), so AstrAI's own wrappers, backends and tests run on these kernels with no
AstrAI file changed.

Both interfaces AstrAI has had are served by the same functions:

- 2026-07 (``530d280``): ``attn_paged_decode(q, page_table, k_cache, v_cache, page_size, kv_len,
  mask, causal_offset, scale, layout)`` over ``[num_pages, page_size, n_kv_heads, D]`` pages and an
  int64 page table;
- 2026-08 (``75304d0``): ``attn_paged_decode(q, k_cache, v_cache, req_to_token,
  req_pool_indices, kv_indptr, new_k, new_v, mask, causal_offset, scale, o_part_buf, ml_part_buf,
  out_buf)`` over a flat ``[slots, n_kv_heads, D]`` pool, and ``attn_paged_prefill``.

The second argument tells them apart (an index table or a KV pool). Index tensors may be int32
or int64 and are read in place. Calls these kernels cannot serve raise ``ValueError`` naming the
argument (listed in the README): per-head masks (``[batch, n_heads > 1, q_len, kv_len]``), and
the 2026-07 paged decode's ``kv_len`` beyond its table.
"""
from __future__ import annotations

import weakref
from typing import Optional

try:
    import torch

    from . import _ops
    from ._ops import _PAGED_DECODE
except ImportError as error:  # AstrAI's loader takes an ImportError as "kernel not built"
    raise ImportError(f"astrai-jit's AstrAI kernels need PyTorch ({error})") from error

Tensor = torch.Tensor

KERNEL_NAMES = ("attn_decode", "attn_prefill", "attn_paged_decode", "attn_paged_prefill", "rotary_emb")
_BHLD = 0  # AstrAI's TensorLayout: 0 = [batch, heads, seq, D], 1 = [batch, seq, heads, D]


def _scale(scale: float) -> Optional[float]:
    return float(scale) if scale and scale > 0.0 else None


def _blhd(t: Tensor, layout: int) -> Tensor:
    if layout not in (0, 1):
        raise ValueError(f"layout {layout} is not valid (allowed: 0 = [batch, heads, seq, D], "
                         f"1 = [batch, seq, heads, D])")
    return t.transpose(1, 2) if layout == _BHLD else t


def _like_q(q: Tensor) -> Tensor:
    # AstrAI's kernels return their output with q's shape (and strides, which empty_like keeps
    # for any dense q; the kernels write any strides).
    return torch.empty_like(q)


def _mask_rows(call: str, mask: Optional[Tensor]) -> Optional[Tensor]:
    """A 2-D, 3-D or 4-D AstrAI mask as the kernels take it (4-D ``[batch, 1, q_len, kv_len]`` is
    a view of its 3-D form; a per-head mask is refused by name)."""
    if mask is None or mask.dim() < 4:
        return mask
    if mask.dim() > 4:
        raise ValueError(f"{call}: mask has shape {list(mask.shape)} (allowed: 2-D, 3-D or 4-D)")
    if mask.shape[1] != 1:
        raise ValueError(f"{call}: mask has shape {list(mask.shape)}: one mask per head ({mask.shape[1]}) is not "
                         f"served (allowed: [batch, 1, q_len, kv_len], shared by the heads)")
    return mask[:, 0]


def attn_decode(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, causal_offset: int = -1,
                scale: float = 0.0, layout: int = 0, o_part_buf: Optional[Tensor] = None,
                ml_part_buf: Optional[Tensor] = None) -> Tensor:
    """Decode over a contiguous cache; q ``[batch, 1, n_heads, D]`` (layout 1) or ``[batch,
    n_heads, 1, D]`` (layout 0). The split buffers are accepted and unused: the runtime keeps
    its own workspace."""
    out = _like_q(q)
    mask = _mask_rows("attn_decode", mask)
    if mask is not None and mask.dim() == 3 and mask.shape[1] != 1:
        raise ValueError(f"attn_decode: mask has shape {list(mask.shape)} (allowed: one query row)")
    _ops.decode(_blhd(q, layout), _blhd(k, layout), _blhd(v, layout), out=_blhd(out, layout), mask=mask,
                causal_offset=int(causal_offset), scale=_scale(scale))
    return out


def attn_prefill(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, causal_offset: int = -1,
                 scale: float = 0.0, layout: int = 0) -> Tensor:
    """Prefill over contiguous K/V; ``causal_offset`` >= 0 puts query 0 at that key position."""
    out = _like_q(q)
    _ops.prefill(_blhd(q, layout), _blhd(k, layout), _blhd(v, layout), out=_blhd(out, layout),
                 mask=_mask_rows("attn_prefill", mask), causal_offset=int(causal_offset), scale=_scale(scale))
    return out


def _paged_decode_pages(q: Tensor, page_table: Tensor, k_cache: Tensor, v_cache: Tensor, page_size: int,
                        kv_len: int, mask: Optional[Tensor] = None, causal_offset: int = -1,
                        scale: float = 0.0, layout: int = 0) -> Tensor:
    # The 2026-07 form: every request has kv_len tokens in its table row (shorter ones are masked).
    # A hot path (a call a layer a token): each tensor attribute is read once.
    call = "attn_paged_decode"
    page_size, kv_len = int(page_size), int(kv_len)
    cache_shape, width = k_cache.shape, page_table.shape[1]
    if len(cache_shape) != 4 or cache_shape[1] != page_size:
        raise ValueError(f"{call}: k_cache has shape {list(cache_shape)} for page_size {page_size} (allowed: "
                         f"[num_pages, page_size, n_kv_heads, head_dim])")
    if causal_offset >= 0:  # the query sits at causal_offset and sees keys up to it
        kv_len = min(kv_len, int(causal_offset) + 1)
    pages = -(-kv_len // page_size)
    if kv_len < 0 or pages > width:
        raise ValueError(f"{call}: kv_len {kv_len} does not fit the page table's {width} pages of "
                         f"{page_size} (allowed: 0..{width * page_size})")
    out = torch.empty_like(q)
    # q and out [batch, 1, n_heads, D] are the one-token case of the kernels' multi-token form.
    table = page_table if pages == width else page_table[:, :pages]
    seq_lens = None
    if pages * page_size != kv_len:
        seq_lens = torch.full((q.shape[0],), kv_len, dtype=torch.int32, device=q.device)
    if mask is not None:
        mask = _mask_rows(call, mask)
        mask = mask.reshape(mask.shape[0], mask.shape[-1]) if mask.dim() == 3 else mask
        mask = _fit_mask(mask, pages * page_size)
    # The generated call itself, without the public wrapper's checks and defaults: AstrAI's
    # arguments are already the kernel's (a scale of 0 is the default 1/sqrt(D) there too).
    # Positional, in the op table's order (_PAGED_DECODE_ORDER; test_marshalling.py holds the two
    # together; an option added to the table later takes its default): by keyword the call cost
    # 1.3 us more.
    kernel_q, kernel_out = (q, out) if layout == 1 else (_blhd(q, layout), _blhd(out, layout))
    _PAGED_DECODE(kernel_q, k_cache, v_cache, table, seq_lens, kernel_out, None, mask, None, None, None,
                  _scale(scale) or 0.0, 0.0, None, -1, None, None, None, False, None, None)
    return out


# The argument order the 2026-07 paged decode's direct call above is written in.
_PAGED_DECODE_ORDER = ("q", "k_cache", "v_cache", "page_table", "seq_lens", "out", "lse", "mask", "req_indices",
                       "new_k", "new_v", "scale", "logit_cap", "sinks", "window_left", "k_scale", "v_scale",
                       "stream", "seq_lens_are_offsets", "workspace", "alibi_slopes")


def _fit_mask(mask: Tensor, width: int) -> Tensor:
    # The kernels take a mask as wide as the table; AstrAI's may be narrower (its kernels read
    # only the positions below each length) or wider.
    if mask.shape[-1] >= width:
        return mask[..., :width]
    return torch.nn.functional.pad(mask, (0, width - mask.shape[-1]), value=False)


def _paged_decode_pool(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                       req_pool_indices: Tensor, kv_indptr: Tensor, new_k: Optional[Tensor] = None,
                       new_v: Optional[Tensor] = None, mask: Optional[Tensor] = None, causal_offset: int = -1,
                       scale: float = 0.0, o_part_buf: Optional[Tensor] = None,
                       ml_part_buf: Optional[Tensor] = None, out_buf: Optional[Tensor] = None) -> Tensor:
    # The 2026-08 form: a flat token pool is a paged cache of one-token pages, req_to_token its
    # page table. The query is each request's last token, so causal_offset changes nothing.
    call = "attn_paged_decode"
    if k_cache.dim() != 3:
        raise ValueError(f"{call}: k_cache has shape {list(k_cache.shape)} (allowed: [pool_size, n_kv_heads, "
                         f"head_dim])")
    if out_buf is not None:
        if out_buf.shape[0] < q.shape[0] or out_buf.shape[1:] != q.shape[1:]:
            raise ValueError(f"{call}: out_buf has shape {list(out_buf.shape)} for q {list(q.shape)} (allowed: "
                             f"[>= batch, n_heads, head_dim])")
        out = out_buf[: q.shape[0]]
    else:  # contiguous whatever q's strides, as AstrAI's kernel allocates it
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if mask is not None:
        if mask.dim() != 2:
            raise ValueError(f"{call}: mask has shape {list(mask.shape)} (allowed: [batch, max_context_len])")
        mask = _fit_mask(mask, req_to_token.shape[1])
    # AstrAI's split buffers hold the partials when given: preallocated by its engine, they keep the
    # call free of allocations under CUDA graph capture on any stream.
    # (The extension checks that it is contiguous and on q's device.)
    workspace = o_part_buf
    _ops.paged_decode(q, k_cache.unsqueeze(1), v_cache.unsqueeze(1), req_to_token, None, out=out, mask=mask,
                      req_indices=req_pool_indices, kv_indptr=kv_indptr, new_k=new_k, new_v=new_v,
                      scale=_scale(scale), workspace=workspace)
    return out


def attn_paged_decode(q: Tensor, *args, **kwargs) -> Tensor:
    """AstrAI's paged decode, in the form of the call: ``(q, page_table, k_cache, v_cache,
    page_size, kv_len, ...)`` (2026-07) or ``(q, k_cache, v_cache, req_to_token,
    req_pool_indices, kv_indptr, ...)`` (2026-08)."""
    if not kwargs and args and type(args[0]) is Tensor and args[0].dtype in _INDEX_DTYPES:
        return _paged_decode_pages(q, *args)  # AstrAI's 2026-07 call, all positional
    second = args[0] if args else kwargs.get("page_table", kwargs.get("k_cache"))
    if "page_table" in kwargs or (isinstance(second, Tensor) and second.dtype in _INDEX_DTYPES):
        return _paged_decode_pages(q, *args, **kwargs)
    return _paged_decode_pool(q, *args, **kwargs)


_INDEX_DTYPES = (torch.int32, torch.int64)


def attn_paged_prefill(q: Tensor, k_cache: Tensor, v_cache: Tensor, req_to_token: Tensor,
                       req_pool_indices: Tensor, kv_indptr: Tensor, qo_indptr: Tensor, q_tile_to_batch: Tensor,
                       q_tile_to_index: Tensor, mask: Optional[Tensor] = None, causal_offset: int = -1,
                       scale: float = 0.0) -> Tensor:
    """Ragged prefill over the flat pool (2026-08). The query tile maps are AstrAI's own launch
    plan and are not needed here. mask ``[batch, kv]`` (shared by a request's rows) or ``[batch,
    1, q_rows, kv]`` (row i of request b is its i-th query), kv up to max_context_len."""
    call = "attn_paged_prefill"
    if k_cache.dim() != 3:
        raise ValueError(f"{call}: k_cache has shape {list(k_cache.shape)} (allowed: [pool_size, n_kv_heads, "
                         f"head_dim])")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    max_q_len = None
    if mask is not None:
        mask = _mask_rows(call, mask)
        if mask.dim() == 2:  # one row per request, broadcast over its queries
            mask = mask[:, None, :]
        if mask.dim() != 3:
            raise ValueError(f"{call}: mask has shape {list(mask.shape)} (allowed: [batch, kv] or "
                             f"[batch, 1, q_len, kv])")
        mask = _fit_mask(mask, req_to_token.shape[1])
        # A mask with one row per query sizes the grid (AstrAI's kernel reads its rows the same way).
        max_q_len = mask.shape[1] if mask.shape[1] > 1 else None
    lengths = _longest_request(qo_indptr, kv_indptr)
    if max_q_len is None and lengths is not None:
        max_q_len = lengths[0]
    if mask is None and lengths is not None and _GATHER_PAGES and _hopper_prefill(q):
        return _paged_prefill_gathered(q, k_cache, v_cache, req_to_token, req_pool_indices, kv_indptr, qo_indptr,
                                       int(causal_offset) >= 0, max_q_len, lengths[1], _scale(scale), out)
    _ops.paged_prefill(q, k_cache.unsqueeze(1), v_cache.unsqueeze(1), req_to_token, None, qo_indptr, out=out,
                       mask=mask, causal=int(causal_offset) >= 0, max_q_len=max_q_len, scale=_scale(scale),
                       req_indices=req_pool_indices, kv_indptr=kv_indptr)
    return out


# The last (qo_indptr, kv_indptr) pair seen, as weak references with their content versions, and
# their longest request's query count and KV length.
_longest = [None, None, None]
_GATHER_PAGES = True  # the side-by-side bench turns it off to time the one-token-page kernel
_GATHER_PAGE = 16  # the smallest page the Hopper prefill takes
_hopper_devices: dict = {}


def _hopper_prefill(q: Tensor) -> bool:
    # Where the wgmma prefill runs: sm_90 devices, its head dims (runtime/families/prefill_launch).
    index = q.device.index
    if index not in _hopper_devices:
        _hopper_devices[index] = torch.cuda.get_device_capability(q.device) == (9, 0)
    return _hopper_devices[index] and q.shape[-1] in (64, 128, 192, 256)


def _longest_request(qo_indptr: Tensor, kv_indptr: Tensor):
    """(longest query count, longest KV length) of a ragged batch, or None while a graph is being
    captured. The first sizes the prefill grid (else every row of q, always enough). Reading them
    costs a device-to-host copy, so they are remembered for the same two tensor objects at the same
    content versions: an engine's layers share one per step (a new tensor, even at a reused
    address, is read again)."""
    if not qo_indptr.is_cuda or qo_indptr.numel() < 2 or torch.cuda.is_current_stream_capturing():
        return None
    return _remembered_lengths(qo_indptr, kv_indptr)


def _remembered_lengths(qo_indptr: Tensor, kv_indptr: Tensor):
    seen = _longest[0]
    if (seen is None or seen[0]() is not qo_indptr or seen[1]() is not kv_indptr or
            _longest[1] != (qo_indptr._version, kv_indptr._version)):
        both = torch.stack([(qo_indptr[1:] - qo_indptr[:-1]).max(), (kv_indptr[1:] - kv_indptr[:-1]).max()])
        _longest[0] = (weakref.ref(qo_indptr), weakref.ref(kv_indptr))
        _longest[1], _longest[2] = (qo_indptr._version, kv_indptr._version), both.tolist()
    return max(_longest[2][0], 0), max(_longest[2][1], 0)


def _paged_prefill_gathered(q, k_cache, v_cache, req_to_token, rows, kv_indptr, qo_indptr, causal, max_q_len,
                            max_kv, scale, out):
    # A flat pool is a cache of one-token pages, which the Hopper prefill does not take (its copies
    # move boxes of 8+ rows): each request's first max_kv tokens are gathered into 16-token pages,
    # a copy linear in the KV against the quadratic attention it speeds up.
    batch, page = rows.shape[0], _GATHER_PAGE
    width = max(-(-max_kv // page), 1) * page
    slots = req_to_token.index_select(0, rows.long())
    slots = slots[:, :width] if slots.shape[1] >= width else torch.nn.functional.pad(slots, (0, width - slots.shape[1]))
    # Entries past a request's length may hold anything; they are never read, but must index the pool.
    slots = slots.clamp(0, k_cache.shape[0] - 1).reshape(-1)
    shape = (batch * width // page, page, k_cache.shape[1], k_cache.shape[2])
    k = k_cache.index_select(0, slots).view(shape)
    v = v_cache.index_select(0, slots).view(shape)
    table = torch.arange(shape[0], dtype=torch.int32, device=q.device).view(batch, width // page)
    _ops.paged_prefill(q, k, v, table, None, qo_indptr, out=out, causal=causal, max_q_len=max_q_len, scale=scale,
                       kv_indptr=kv_indptr)
    return out


def rotary_emb(x: Tensor, freqs_cis: Tensor) -> Tensor:
    """Interleaved-pair rotary embedding: x ``[batch, seq, heads, D]`` or ``[tokens, heads, D]``,
    freqs_cis f32 (cos, sin) pairs with the same leading axes then ``[D / 2, 2]``."""
    x = x if x.is_contiguous() else x.contiguous()
    freqs_cis = freqs_cis if freqs_cis.is_contiguous() else freqs_cis.contiguous()
    return _ops.rotary_emb(x, freqs_cis)


# AstrAI's FP8 GEMM module (2026-08): five functions, from astrai_fp8.
FP8_KERNEL = "fp8_mm"


def populate(module) -> None:
    """Fill one of the compiled stand-in modules (named after a kernel) with its function(s)."""
    name = module.__name__.rsplit(".", 1)[-1]
    if name == FP8_KERNEL:
        from . import astrai_fp8
        for function in astrai_fp8.KERNEL_FUNCTIONS:
            setattr(module, function, getattr(astrai_fp8, function))
    elif name in KERNEL_NAMES:
        setattr(module, name, globals()[name])
    else:
        raise ImportError(f"astrai-jit serves no AstrAI kernel named {name!r} (served: "
                          f"{', '.join(KERNEL_NAMES + (FP8_KERNEL,))})")
    module.__doc__ = f"AstrAI's {name} kernel module, served by astrai-jit."
    module.served_by = "astrai-jit"


__all__ = list(KERNEL_NAMES) + ["KERNEL_NAMES", "FP8_KERNEL", "populate"]
