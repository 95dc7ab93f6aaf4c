"""The functional API over PyTorch tensors, mirroring the C++ calls.

Shapes and strides come from the tensors, so non-contiguous views work without a copy; outputs
are allocated when not given; kernels run on the current PyTorch stream of the tensors' device
unless ``stream=`` is given. Eager calls go straight to the extension; under ``torch.compile``
(or any tracing with tensor subclasses) the same call goes through the registered custom ops
(``torch.ops.astrai_jit.*``), so the graph has no break.
"""
from __future__ import annotations

import linecache
import math
import numbers
from typing import Optional, Tuple, Union

import torch

from . import _library  # noqa: F401  (registers torch.ops.astrai_jit.*)
from ._loader import import_extension

_C = import_extension()

Tensor = torch.Tensor
# A call is eager, and goes straight to the extension, for a plain tensor outside torch.compile:
# `type(q) is Tensor and not _compiling()`, tested inline in the calls _call makes (a helper's
# call costs more than the test). Under torch.compile, or for a tensor subclass (fake,
# functional, proxy tensors while tracing), it goes through the custom op so it is recorded.
_compiling = torch.compiler.is_compiling


def _resolve_scale(scale: float) -> float:
    # A given scale must be positive: the runtime reads scale <= 0 (None here) as 1/sqrt(head_dim).
    scale = float(scale)
    if not scale > 0.0 or math.isinf(scale):
        raise ValueError(f"scale {scale} is not a positive finite number (allowed: > 0, or None for "
                         f"1/sqrt(head_dim))")
    return scale


def stream_handle(device: torch.device, stream) -> int:
    """The raw CUstream for a call: ``stream`` (a torch.cuda.Stream, or an int handle), else
    the current PyTorch stream of ``device`` (0 for a device that is not CUDA)."""
    if stream is not None:
        handle = getattr(stream, "cuda_stream", stream)
        if not isinstance(handle, int):
            raise TypeError(f"stream {stream!r} is not a stream (allowed: torch.cuda.Stream, an int "
                            f"CUstream handle, or None for the current stream)")
        return handle
    if device.type != "cuda":
        return 0
    return torch._C._cuda_getCurrentRawStream(device.index)


# Recent PyTorch (2.11 does) publishes DLPack's C exchange API: the extension then reads each
# tensor with one C call and asks PyTorch for the current stream itself (stream None). Older
# versions hand the extension each tensor through __dlpack__, and the stream is looked up here.
_EXTENSION_FINDS_STREAM = _C._reads_type_directly(torch.Tensor)

# torch.cuda.current_device() less its Python-level lazy-init check (the C call initializes CUDA
# itself). Only called with a CUDA tensor at hand, so a PyTorch without CUDA never calls it.
_cuda_device = getattr(torch._C, "_cuda_getDevice", None)


def _stream(t: Tensor, stream):
    # The extension's stream argument: None lets it ask PyTorch for the current stream.
    return None if stream is None and _EXTENSION_FINDS_STREAM else stream_handle(t.device, stream)


def _op_stream(t: Tensor, stream) -> int:
    # The custom ops take -1 for the current stream when the op runs.
    return -1 if stream is None else stream_handle(t.device, stream)


def _call(*entries: str, runs_on: Optional[str] = None):
    """The call of one extension that the op table's ``entries`` serve, generated from the table
    (_library._TABLE), where the argument orders are written. It takes the extension's arguments
    by position, in the extension's order, and the stream as the public call got it; ``runs_on``
    names the tensor whose device and stream it uses (default the first). Generated, not written
    with *args or **kwargs: keywords, or one more frame, would cost more than the rest of a call."""
    ops = [_library._TABLE[entry] for entry in entries]
    given = ops[0].ext_args
    params = list(dict.fromkeys(given))
    on = runs_on or params[0]
    # An attention call's options go as one tuple (_library._PACKED_OPTIONS), built inline: a
    # tuple display is the cheapest way to pack them.
    options = "(" + ", ".join(name if name in given else repr(default)
                              for name, _, default in _library._PACKED_OPTIONS) + ",)"
    ext_args = ", ".join(f"_stream({on}, stream)" if a == "stream" else options if a == "options" else a
                         for a in ops[0].ext_layout)
    # Traced, the first op that fits the values records the call: an extension argument it does not
    # take is None, one it fills with another of its arguments is that one (rotary_emb_: out is x).
    branches = []
    for i, op in enumerate(ops):
        assert op.ext == ops[0].ext and set(op.names) <= set(params), entries
        fits = []
        for name, taken in zip(given, op.ext_args):
            if taken not in op.names:
                fits.append(f"{name} is None")
            elif taken != name:
                fits.append(f"{name} is {taken}")
        op_args = ", ".join(f"_op_stream({on}, stream)" if a == "stream" else a for a in op.names)
        branches.append((" and ".join(fits), f"_op{i}({op_args})"))
    branches.sort(key=lambda branch: not branch[0])  # the op that always fits last
    assert [fits for fits, _ in branches].count("") == 1, entries
    # The later options trailing the parameters keep their defaults, so that a positional caller
    # written before one existed (astrai_csrc's hot path) still calls it right.
    later = {name: default for name, _, default in _library._TRAILING_DEFAULTS}
    signature = list(params)
    for i in reversed(range(len(params))):
        if params[i] not in later:
            break
        signature[i] = f"{params[i]}={later[params[i]]!r}"
    # The runtime launches on the current device's primary context: switch when the tensors live
    # on another GPU (the extension refuses tensors that are not on one).
    lines = [f"def {entries[0]}({', '.join(signature)}):",
             f"    if type({params[0]}) is Tensor and not _compiling():",
             f"        if {on}.is_cuda and {on}.get_device() != _cuda_device():",
             f"            with _device({on}.get_device()):",
             f"                _ext({ext_args})",
             "        else:",
             f"            _ext({ext_args})"]
    for fits, op_call in branches:
        lines += [f"    elif {fits}:" if fits else "    else:", f"        {op_call}"]
    source = "\n".join(lines) + "\n"
    filename = f"<astrai_jit call {entries[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for tracebacks
    namespace = {"Tensor": Tensor, "_compiling": _compiling, "_stream": _stream, "_op_stream": _op_stream,
                 "_cuda_device": _cuda_device, "_device": torch.cuda.device, "_ext": getattr(_C, ops[0].ext),
                 **{f"_op{i}": getattr(torch.ops.astrai_jit, entry) for i, entry in enumerate(entries)}}
    exec(compile(source, filename, "exec"), namespace)
    call = namespace[entries[0]]
    call.entries = entries
    return call


_PAGED_DECODE = _call("paged_decode", "paged_decode_append")
_DECODE = _call("decode")
_PREFILL = _call("prefill")
_PAGED_PREFILL = _call("paged_prefill")
_ROTARY_EMB = _call("rotary_emb", "rotary_emb_")
_MERGE_STATES = _call("merge_states", runs_on="out")
_MERGE_STATE_ = _call("merge_state_")
_MLA_DECODE = _call("mla_decode")


def _not_a_tensor(call: str, name: str, value) -> TypeError:
    return TypeError(f"{call}: {name} is a {type(value).__name__} (allowed: torch.Tensor)")


def _check_tensor(call: str, name: str, value) -> None:
    if not isinstance(value, Tensor):
        raise _not_a_tensor(call, name, value)


def _out_like(call: str, q: Tensor, out: Optional[Tensor]) -> Tensor:
    # Checked here, where a non-tensor would otherwise reach torch.empty_like or the custom op.
    if not isinstance(q, Tensor):
        raise _not_a_tensor(call, "q", q)
    if out is None:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    if not isinstance(out, Tensor):
        raise _not_a_tensor(call, "out", out)
    return out


def _options(call: str, scale, logit_cap, window_left, sinks, k_scale=None, v_scale=None, alibi_slopes=None) -> tuple:
    """scale, logit_cap and window_left as the extension takes them, after checking their types
    and that the optional tensors are tensors; the runtime checks the values (a negative or
    non-finite cap, a window below -1, sinks or scales of the wrong shape). Runs on every call,
    so the defaults (None, an exact float and int, no tensors) take the shortest path."""
    s = 0.0 if scale is None else _resolve_scale(scale)
    if type(logit_cap) is not float:
        if isinstance(logit_cap, bool) or not isinstance(logit_cap, numbers.Real):
            raise TypeError(f"{call}: logit_cap is a {type(logit_cap).__name__} (allowed: a float >= 0, 0 for "
                            f"none)")
        logit_cap = float(logit_cap)
    if type(window_left) is not int:
        if isinstance(window_left, bool) or not isinstance(window_left, numbers.Integral):
            raise TypeError(f"{call}: window_left is a {type(window_left).__name__} (allowed: an int >= -1, -1 "
                            f"for none)")
        window_left = int(window_left)
    if sinks is not None or k_scale is not None or v_scale is not None or alibi_slopes is not None:
        for name, value in (("sinks", sinks), ("k_scale", k_scale), ("v_scale", v_scale),
                            ("alibi_slopes", alibi_slopes)):
            if value is not None:
                _check_tensor(call, name, value)
    return s, logit_cap, window_left


_FEATURES_DOC = """
    Variant features (each compiles its own variant; the defaults cost nothing): ``logit_cap``
    > 0 turns each scaled score s into ``logit_cap * tanh(s / logit_cap)``; ``sinks`` f32
    ``[n_heads]`` adds one logit per query head to the softmax denominator only;
    ``window_left`` >= 0 lets a query at position p attend to keys ``p - window_left .. p``
    only (with a causal position: decode's is its last key); ``alibi_slopes`` f32 ``[n_heads]``
    adds ``slope * (key - query)`` to each scaled score (ALiBi; needs the causal positions too).

    FP8 KV cache (paged_decode, decode, paged_prefill): K and V of dtype ``torch.float8_e4m3fn``
    or ``torch.float8_e5m2`` are dequantized in the kernel as ``value * scale`` with ``k_scale``
    and ``v_scale`` f32 tensors, one scale (``[]`` or ``[1]``) or one per KV head
    (``[n_kv_heads]``); q and out stay bf16/fp16, and the fused append quantizes ``new_k`` and
    ``new_v`` (saturating). Strides of an FP8 cache must be multiples of 16 elements."""


def _lse(q: Tensor, shape) -> Tensor:
    return torch.empty(shape, dtype=torch.float32, device=q.device)


def paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Optional[Tensor], *,
                 out: Optional[Tensor] = None, scale: Optional[float] = None, mask: Optional[Tensor] = None,
                 req_indices: Optional[Tensor] = None, new_k: Optional[Tensor] = None,
                 new_v: Optional[Tensor] = None, return_lse: bool = False, logit_cap: float = 0.0,
                 sinks: Optional[Tensor] = None, window_left: int = -1, alibi_slopes: Optional[Tensor] = None,
                 k_scale: Optional[Tensor] = None,
                 v_scale: Optional[Tensor] = None, kv_indptr: Optional[Tensor] = None,
                 workspace: Optional[Tensor] = None, stream=None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Decode attention over a paged KV cache: one query token per sequence, or q_len of them.

    q ``[batch, n_heads, head_dim]``, or ``[batch, q_len, n_heads, head_dim]`` for q_len new
    tokens per request (1..8, speculative verification: token i sits at position
    ``seq_len - q_len + i`` and attends to the keys up to it; a token with none outputs zeros);
    k_cache, v_cache ``[num_pages, page_size, n_kv_heads, head_dim]`` (bf16 or fp16, any
    strides with a contiguous head_dim); page_table ``[rows, max_pages_per_seq]``; seq_lens
    ``[batch]`` with the current (new) tokens included, or None: every request fills its table
    row; ``kv_indptr`` ``[batch + 1]`` offsets instead of seq_lens (request b has
    ``kv_indptr[b + 1] - kv_indptr[b]`` tokens); index tensors are int32 or int64, read in place;
    mask bool ``[batch, max_pages_per_seq * page_size]`` (True = keep, shared by a request's
    tokens); req_indices ``[batch]`` picks each request's page-table row; new_k, new_v ``[batch, n_kv_heads,
    head_dim]`` are used at position ``seq_len - 1`` and written into the caches (fused append;
    one token, so not with q_len > 1). Returns out like q, and with ``return_lse`` the f32
    log-sum-exp ``[batch, n_heads]`` (``[batch, q_len, n_heads]`` for a 4-D q). ``workspace``, a
    contiguous CUDA tensor of any dtype, holds the split-KV partials instead of the runtime's own
    per-stream buffer (what CUDA graph capture on a fresh stream needs); a small one caps the split
    count.
    """
    call = "paged_decode"
    out = _out_like(call, q, out)
    lse = _lse(q, q.shape[:-1]) if return_lse else None
    scale, logit_cap, window_left = _options(call, scale, logit_cap, window_left, sinks, k_scale, v_scale,
                                             alibi_slopes)
    seq_lens_are_offsets = kv_indptr is not None
    if seq_lens_are_offsets:
        if seq_lens is not None:
            raise ValueError(f"{call}: seq_lens and kv_indptr are both given (allowed: one of them)")
        seq_lens = kv_indptr
    _PAGED_DECODE(q, k_cache, v_cache, page_table, seq_lens, out, lse, mask, req_indices, new_k, new_v, scale,
                  logit_cap, sinks, window_left, k_scale, v_scale, stream, seq_lens_are_offsets, workspace,
                  alibi_slopes)
    return (out, lse) if return_lse else out


def decode(q: Tensor, k: Tensor, v: Tensor, *, out: Optional[Tensor] = None, scale: Optional[float] = None,
           mask: Optional[Tensor] = None, causal_offset: int = -1, return_lse: bool = False,
           logit_cap: float = 0.0, sinks: Optional[Tensor] = None, window_left: int = -1,
           alibi_slopes: Optional[Tensor] = None, k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None, stream=None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Decode attention over a contiguous KV cache.

    q ``[batch, 1, n_heads, head_dim]`` (or ``[batch, n_heads, head_dim]``); k, v ``[batch,
    kv_len, n_kv_heads, head_dim]``; mask bool ``[batch, kv_len]`` or ``[batch, 1, kv_len]``;
    ``causal_offset`` -1 attends to every key, ``p >= 0`` to keys ``0..p``. Returns out like q
    (and the f32 LSE ``[batch, n_heads]`` with ``return_lse``).
    """
    call = "decode"
    out = _out_like(call, q, out)
    lse = _lse(q, (q.shape[0], q.shape[-2])) if return_lse else None
    scale, logit_cap, window_left = _options(call, scale, logit_cap, window_left, sinks, k_scale, v_scale,
                                             alibi_slopes)
    causal_offset = int(causal_offset)
    _DECODE(q, k, v, out, lse, mask, causal_offset, scale, logit_cap, sinks, window_left, k_scale, v_scale, stream,
            alibi_slopes)
    return (out, lse) if return_lse else out


_E4M3 = getattr(torch, "float8_e4m3fn", None)
_OUT_DTYPES = (torch.bfloat16, torch.float16)


def _fp8_attention_scale(call: str, name: str, value, q: Tensor):
    """A scale of FP8 attention as the extension takes it: a tensor as given (the extension checks
    its dtype and shape), a number as an f32 0-d tensor on q's device (made on the device, so
    that CUDA graph capture records it), None as None."""
    if value is None or isinstance(value, Tensor):
        return value
    heads = "n_heads" if name == "q_scale" else "n_kv_heads"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{call}: {name} is a {type(value).__name__} (allowed: a float > 0, or an f32 tensor, [] or "
                        f"[1], or [{heads}])")
    value = float(value)
    if not value > 0.0 or math.isinf(value):
        raise ValueError(f"{call}: {name} {value} is not a positive finite number (allowed: > 0)")
    return torch.full((), value, dtype=torch.float32, device=q.device)


def _p_fp16(call: str, p_dtype) -> bool:
    """FP8 attention's P format as the extension takes it: True for torch.float16 (P kept in f16
    for P V), False for None or torch.float8_e4m3fn (the default, P rounded to e4m3)."""
    if p_dtype is None or p_dtype == _E4M3:
        return False
    if p_dtype == torch.float16:
        return True
    raise TypeError(f"{call}: p_dtype is {p_dtype!r} (allowed: None or torch.float8_e4m3fn, P rounded to e4m3; "
                    f"torch.float16, P kept in f16)")


def _prefill_out(call: str, q: Tensor, out: Optional[Tensor], out_dtype) -> Tensor:
    """out as given or allocated: q's dtype, or with float8_e4m3fn q out_dtype (default
    bfloat16); out_dtype must agree with a given out, and without FP8 q be q's dtype."""
    if not isinstance(q, Tensor):
        raise _not_a_tensor(call, "q", q)
    fp8 = q.dtype == _E4M3
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        raise TypeError(f"{call}: out_dtype is {out_dtype!r} (allowed: torch.bfloat16, torch.float16, or None)")
    if out is not None:
        if not isinstance(out, Tensor):
            raise _not_a_tensor(call, "out", out)
        if out_dtype is not None and out.dtype != out_dtype:
            raise TypeError(f"{call}: out has dtype {out.dtype} but out_dtype is {out_dtype} (allowed: an out of "
                            f"dtype out_dtype, or out_dtype None)")
    if not fp8:
        if out_dtype is not None and out_dtype != q.dtype:
            raise TypeError(f"{call}: out_dtype is {out_dtype} but q has dtype {q.dtype} (allowed: None or "
                            f"{q.dtype}, the dtype of q; another output dtype needs float8_e4m3fn q, k and v)")
        return _out_like(call, q, out)
    if out is not None:
        return out
    return torch.empty(q.shape, dtype=out_dtype or torch.bfloat16, device=q.device)


def prefill(q: Tensor, k: Tensor, v: Tensor, *, out: Optional[Tensor] = None, scale: Optional[float] = None,
            mask: Optional[Tensor] = None, causal_offset: int = -1, return_lse: bool = False,
            logit_cap: float = 0.0, sinks: Optional[Tensor] = None, window_left: int = -1,
            alibi_slopes: Optional[Tensor] = None, q_scale: Union[float, Tensor, None] = None,
            k_scale: Union[float, Tensor, None] = None, v_scale: Union[float, Tensor, None] = None,
            out_dtype: Optional[torch.dtype] = None, p_dtype: Optional[torch.dtype] = None,
            stream=None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Prefill attention over a contiguous KV cache.

    q ``[batch, q_len, n_heads, head_dim]``; k, v ``[batch, kv_len, n_kv_heads, head_dim]``;
    mask bool ``[batch, kv_len]`` or ``[batch, q_len, kv_len]`` (a size-1 batch or q_len
    broadcasts); ``causal_offset`` -1 is non-causal, ``p >= 0`` puts the first query at
    position p (a fresh prompt: ``kv_len - q_len``). Returns out like q (and the f32 LSE
    ``[batch, q_len, n_heads]`` with ``return_lse``).

    FP8 attention (sm_90a only): q, k and v all of dtype ``torch.float8_e4m3fn`` are read as
    ``value * scale``, with ``q_scale``, ``k_scale`` and ``v_scale`` required: each a float, or
    an f32 tensor of one scale (``[]`` or ``[1]``) or one per head (``[n_heads]`` for q_scale,
    ``[n_kv_heads]`` for k_scale and v_scale, both the same shape). Both GEMMs run on e4m3
    operands and the softmax's P is rounded to e4m3 before P V (``p_dtype=torch.float16`` keeps
    P in f16 instead, V widened to f16, at the second GEMM's 16-bit rate). out is ``out_dtype``
    (``torch.bfloat16``, the default, or ``torch.float16``; a given out's dtype otherwise).
    Served: head_dim 64, 128 or 256 (``p_dtype=torch.float16`` at 128 only), contiguous KV, with
    or without ``causal_offset`` and ``return_lse``;
    a mask, ``logit_cap``, ``sinks``, ``window_left`` and ``alibi_slopes`` are refused, as are
    other head dims and FP8 q in the other calls (paged_prefill's FP8 cache takes a 16-bit q).
    """
    call = "prefill"
    out = _prefill_out(call, q, out, out_dtype)
    lse = _lse(q, q.shape[:3]) if return_lse else None
    scale, logit_cap, window_left = _options(call, scale, logit_cap, window_left, sinks, alibi_slopes=alibi_slopes)
    if q_scale is not None or k_scale is not None or v_scale is not None:
        q_scale = _fp8_attention_scale(call, "q_scale", q_scale, q)
        k_scale = _fp8_attention_scale(call, "k_scale", k_scale, q)
        v_scale = _fp8_attention_scale(call, "v_scale", v_scale, q)
    causal_offset = int(causal_offset)
    p_fp16 = _p_fp16(call, p_dtype)
    _PREFILL(q, k, v, out, lse, mask, causal_offset, scale, logit_cap, sinks, window_left, stream, alibi_slopes,
             k_scale, v_scale, q_scale, p_fp16)
    return (out, lse) if return_lse else out


def paged_prefill(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Optional[Tensor],
                  qo_indptr: Tensor, *, out: Optional[Tensor] = None, scale: Optional[float] = None,
                  mask: Optional[Tensor] = None, causal: bool = True, max_q_len: Optional[int] = None,
                  return_lse: bool = False, logit_cap: float = 0.0, sinks: Optional[Tensor] = None,
                  window_left: int = -1, alibi_slopes: Optional[Tensor] = None,
                  k_scale: Union[float, Tensor, None] = None, v_scale: Union[float, Tensor, None] = None,
                  req_indices: Optional[Tensor] = None, kv_indptr: Optional[Tensor] = None,
                  q_scale: Union[float, Tensor, None] = None, out_dtype: Optional[torch.dtype] = None,
                  p_dtype: Optional[torch.dtype] = None, stream=None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Prefill over a paged KV cache for a ragged batch (chunked prefill).

    q ``[total_q, n_heads, head_dim]``, request b's queries at rows ``qo_indptr[b] ..
    qo_indptr[b + 1]`` (``[batch + 1]``); paged KV as for :func:`paged_decode` (req_indices picks
    each request's table row), seq_lens the KV length including the new tokens, or ``kv_indptr``
    offsets instead; index tensors int32 or int64. mask bool ``[total_q, kv]`` (a row per row of
    q) or ``[batch, rows, kv]`` (rows numbered within each request, rows >= max_q_len), kv =
    max_pages_per_seq * page_size. ``max_q_len`` (the longest request's query count) sizes the
    grid; None uses total_q, always enough, and needs no device-to-host copy.

    FP8 attention (sm_90a only): q, k_cache and v_cache all of dtype ``torch.float8_e4m3fn``, with
    ``q_scale``, ``k_scale`` and ``v_scale`` required, ``out_dtype`` and ``p_dtype`` as for
    :func:`prefill`.
    Served: head_dim 64, 128 or 256 (``p_dtype=torch.float16`` at 128 only), pages of 8 tokens or
    more, causal or not, with or without ``return_lse``; a mask and the other options are refused. A 16-bit q over an FP8 cache
    (``k_scale`` and ``v_scale`` only) is the FP8 cache's path instead.
    """
    call = "paged_prefill"
    out = _prefill_out(call, q, out, out_dtype)
    lse = _lse(q, q.shape[:2]) if return_lse else None
    fp8_attention = isinstance(q, Tensor) and q.dtype == _E4M3
    if fp8_attention or q_scale is not None:
        q_scale = _fp8_attention_scale(call, "q_scale", q_scale, q)
        k_scale = _fp8_attention_scale(call, "k_scale", k_scale, q)
        v_scale = _fp8_attention_scale(call, "v_scale", v_scale, q)
    scale, logit_cap, window_left = _options(call, scale, logit_cap, window_left, sinks, k_scale, v_scale,
                                             alibi_slopes)
    max_q_len = -1 if max_q_len is None else int(max_q_len)
    seq_lens_are_offsets = kv_indptr is not None
    if seq_lens_are_offsets:
        if seq_lens is not None:
            raise ValueError(f"{call}: seq_lens and kv_indptr are both given (allowed: one of them)")
        seq_lens = kv_indptr
    elif seq_lens is None:
        raise ValueError(f"{call}: seq_lens is None (allowed: [batch] lengths, or kv_indptr offsets)")
    causal = bool(causal)
    p_fp16 = _p_fp16(call, p_dtype)
    _PAGED_PREFILL(q, k_cache, v_cache, page_table, seq_lens, qo_indptr, out, lse, mask, max_q_len, causal, scale,
                   logit_cap, sinks, window_left, k_scale, v_scale, stream, req_indices, seq_lens_are_offsets,
                   alibi_slopes, q_scale, p_fp16)
    return (out, lse) if return_lse else out


def rotary_emb(x: Tensor, freqs_cis: Tensor, out: Optional[Tensor] = None, *, stream=None) -> Tensor:
    """Rotary embedding over interleaved pairs.

    x ``[tokens, n_heads, head_dim]`` or ``[batch, seq, n_heads, head_dim]``; freqs_cis f32
    ``(cos, sin)`` pairs ``[tokens, head_dim / 2, 2]``, ``[batch or 1, seq, head_dim / 2, 2]``
    or ``[seq, head_dim / 2, 2]`` (shared over the batch). ``out=x`` rotates in place.
    """
    call = "rotary_emb"
    _check_tensor(call, "x", x)
    out = _out_like(call, x, out)
    _ROTARY_EMB(x, freqs_cis, out, stream)
    return out


def _merge_outputs(call: str, name: str, v: Tensor, rank: int, s: Tensor, out: Optional[Tensor],
                   lse: Optional[Tensor]):
    # out [rows, n_heads, head_dim] and lse [rows, n_heads] for the states v [rows, (states,)
    # n_heads, head_dim] and their LSEs s; the extension checks the rest.
    _check_tensor(call, "s", s)
    if v.dim() != rank:
        layout = "[rows, n_heads, head_dim]" if rank == 3 else "[rows, states, n_heads, head_dim]"
        raise _C.InvalidArgument(f"{call}: {name} has shape {list(v.shape)} (allowed: {layout})")
    if out is None:
        shape = (v.shape[0], *v.shape[-2:])
        out = torch.empty(shape, dtype=v.dtype, device=v.device)
    else:
        _check_tensor(call, "out", out)
    if lse is None:
        lse = torch.empty(tuple(out.shape[:2]), dtype=torch.float32, device=out.device)
    else:
        _check_tensor(call, "lse", lse)
    return out, lse


def merge_state(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor, *, out: Optional[Tensor] = None,
                lse: Optional[Tensor] = None, stream=None) -> Tuple[Tensor, Tensor]:
    """Two attention states of disjoint key sets merged into the attention over both.

    v_a, v_b ``[rows, n_heads, head_dim]`` (bf16/fp16; head_dim a multiple of 8 up to 1024) are
    normalized outputs, s_a, s_b f32 ``[rows, n_heads]`` their log-sum-exps (natural log, as
    ``lse=`` of the attention calls gives them). Returns ``(out, lse)``: out = (w_a v_a + w_b
    v_b) / (w_a + w_b) with w = exp(s - max(s_a, s_b)), lse = log(exp(s_a) + exp(s_b)). A state
    with LSE -inf (it saw no key) weighs nothing; a row of two empty states is zeros with LSE
    -inf. ``out=``/``lse=`` may be given (``out=v_a, lse=s_a`` merges in place).
    """
    call = "merge_states"
    _check_tensor(call, "v_a", v_a)
    out, lse = _merge_outputs(call, "v_a", v_a, 3, s_a, out, lse)
    _MERGE_STATES(v_a, s_a, v_b, s_b, out, lse, stream)
    return out, lse


def merge_state_in_place(v: Tensor, s: Tensor, v_other: Tensor, s_other: Tensor, *, stream=None) -> None:
    """merge_state with the result written over v and s (``[rows, n_heads, head_dim]`` and f32
    ``[rows, n_heads]``)."""
    call = "merge_states"
    _check_tensor(call, "v", v)
    _check_tensor(call, "s", s)
    _MERGE_STATE_(v, s, v_other, s_other, stream)


def merge_states(v: Tensor, s: Tensor, *, out: Optional[Tensor] = None, lse: Optional[Tensor] = None,
                 stream=None) -> Tuple[Tensor, Tensor]:
    """Any number of attention states merged: v ``[rows, states, n_heads, head_dim]``
    (bf16/fp16), s f32 ``[rows, states, n_heads]``; returns ``(out [rows, n_heads, head_dim],
    lse [rows, n_heads])`` as merge_state does for two."""
    call = "merge_states"
    _check_tensor(call, "v", v)
    out, lse = _merge_outputs(call, "v", v, 4, s, out, lse)
    v_a, s_a, v_b, s_b = v, s, None, None  # the extension's names for the states
    _MERGE_STATES(v_a, s_a, v_b, s_b, out, lse, stream)
    return out, lse


def mla_decode(q: Tensor, kv_cache: Tensor, page_table: Tensor, seq_lens: Optional[Tensor], *, scale: float,
               out: Optional[Tensor] = None, return_lse: bool = False, kv_indptr: Optional[Tensor] = None,
               kv_scale: Optional[Tensor] = None, workspace: Optional[Tensor] = None,
               stream=None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """MLA decode in the absorbed form (DeepSeek-V2/V3/R1, Kimi): every query head attends to one
    shared latent KV head.

    q ``[batch, n_heads, 576]`` or ``[batch, q_len, n_heads, 576]`` (512 latent dims, then the 64
    rotary dims; q_len 1..8 new tokens, token i at position ``seq_len - q_len + i``); kv_cache
    ``[num_pages, page_size, 576]`` (or ``[num_pages, page_size, 1, 576]``), rows [latent | rope],
    whose first 512 dims are the values; page_table ``[batch, max_pages_per_seq]``; seq_lens
    ``[batch]`` with the new tokens included, or ``kv_indptr`` ``[batch + 1]`` offsets; int32 or
    int64. ``scale`` is required: the model's softmax scale (DeepSeek-V3: 1/sqrt(192) times its
    YaRN factor squared), not 1/sqrt(576). Returns out ``[..., n_heads, 512]`` like q, and with
    ``return_lse`` the f32 log-sum-exp ``[batch, (q_len,) n_heads]``. bf16 or fp16, heads 1..128,
    page sizes 1..64; tensor cores only (sm_80+). An FP8 cache (``torch.float8_e4m3fn`` or
    ``torch.float8_e5m2``, strides multiples of 16) takes ``kv_scale``, one f32 scale (``[]`` or
    ``[1]``): value = fp8 * kv_scale.
    """
    call = "mla_decode"
    if not isinstance(q, Tensor):
        raise _not_a_tensor(call, "q", q)
    if out is None:
        out = torch.empty((*q.shape[:-1], 512), dtype=q.dtype, device=q.device)
    elif not isinstance(out, Tensor):
        raise _not_a_tensor(call, "out", out)
    lse = _lse(q, q.shape[:-1]) if return_lse else None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{call}: scale is a {type(scale).__name__} (allowed: the model's softmax scale, a float > 0)")
    scale = float(scale)  # its value is the runtime's to check
    seq_lens_are_offsets = kv_indptr is not None
    if seq_lens_are_offsets:
        if seq_lens is not None:
            raise ValueError(f"{call}: seq_lens and kv_indptr are both given (allowed: one of them)")
        seq_lens = kv_indptr
    if kv_scale is not None:
        _check_tensor(call, "kv_scale", kv_scale)
    _MLA_DECODE(q, kv_cache, page_table, seq_lens, out, lse, scale, stream, seq_lens_are_offsets, workspace,
                kv_scale)
    return (out, lse) if return_lse else out


for _documented in (paged_decode, decode, prefill, paged_prefill):
    _documented.__doc__ += _FEATURES_DOC
