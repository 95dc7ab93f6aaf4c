"""An attention interface in AstrAI's conventions over astrai-jit.

Superseded for AstrAI itself: AstrAI runs unchanged on astrai-jit through its own loader of
compiled kernel modules (``python -m astrai_jit.astrai_install``; ``astrai_jit.astrai_csrc``
holds the functions with AstrAI's signatures). This module was written from a description of
AstrAI, not from its code, and does not match its interface; the GPU tests still use its SDPA
references.

Conventions (AstrAI's): q, k, v are ``[batch, seq, heads, head_dim]``; ``is_causal`` places the
queries at the end of the keys (query i of q_len attends to keys ``j <= kv_len - q_len + i``);
masks are bool, True = keep, ``[batch, kv_len]`` or ``[batch, q_len, kv_len]``; the scale is
``1/sqrt(head_dim)``. A query row with nothing to attend to gives zeros in both backends.

``attn_decode``, ``attn_prefill``, ``attn_paged_decode`` and ``rotary_emb`` call the kernels
and raise on input they cannot serve. The backends choose: ``SdpaBackend`` (PyTorch's
scaled_dot_product_attention) and ``JitBackend`` (the kernels, falling back to SDPA with one
log line per reason when there is no GPU or a call they cannot serve), selected with
``attn_backend(ATTN_BACKEND.JIT)`` (``ATTN_BACKEND.CUDA`` is the same backend).
``apply_rotary_emb`` uses the kernel in inference and PyTorch's complex multiply when grad is
enabled.
"""
from __future__ import annotations

import contextlib
import contextvars
import enum
import logging
from abc import ABC, abstractmethod
from typing import Iterator, Optional, Union

import torch
import torch.nn.functional as F

from . import _ops
from ._loader import import_extension

_C = import_extension()
Tensor = torch.Tensor
logger = logging.getLogger("astrai_jit")

_KERNEL_DTYPES = (torch.bfloat16, torch.float16)


# ---------------------------------------------------------------------------------------------
# Kernel calls with AstrAI's conventions


def attn_decode(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None,
                is_causal: bool = False) -> Tensor:
    """One query token per sequence over a contiguous cache. q ``[batch, 1, n_heads, D]``; k, v
    ``[batch, kv_len, n_kv_heads, D]``; mask ``[batch, kv_len]`` or ``[batch, 1, kv_len]``. The
    single query sits at the last position, so ``is_causal`` changes nothing."""
    return _ops.decode(q, k, v, mask=mask, causal_offset=k.shape[1] - 1 if is_causal else -1)


def attn_prefill(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None,
                 is_causal: bool = False) -> Tensor:
    """q ``[batch, q_len, n_heads, D]``; k, v ``[batch, kv_len, n_kv_heads, D]``; mask
    ``[batch, kv_len]`` or ``[batch, q_len, kv_len]``."""
    offset = k.shape[1] - q.shape[1] if is_causal else -1
    return _ops.prefill(q, k, v, mask=mask, causal_offset=offset)


def _paged_view(cache: Tensor) -> Tensor:
    # AstrAI's flat token pool [slots, n_kv_heads, D] is a paged cache with page_size 1.
    return cache.unsqueeze(1) if cache.dim() == 3 else cache


def attn_paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                      req_indices: Optional[Tensor] = None, new_k: Optional[Tensor] = None,
                      new_v: Optional[Tensor] = None, mask: Optional[Tensor] = None) -> Tensor:
    """Decode over a paged cache. q ``[batch, 1, n_heads, D]`` (or ``[batch, n_heads, D]``);
    k_cache, v_cache the flat pool ``[slots, n_kv_heads, D]`` (page_size 1, page_table holding
    token slots: ``req_to_token``) or ``[num_pages, page_size, n_kv_heads, D]``; page_table
    int32 ``[rows, max_pages]``; seq_lens int32 ``[batch]`` with the current token; req_indices
    picks each request's row; new_k, new_v ``[batch, 1, n_kv_heads, D]`` or ``[batch,
    n_kv_heads, D]`` are appended at ``seq_len - 1`` in the same call. Returns out like q."""
    if q.dim() == 4 and q.shape[1] != 1:  # the SDPA fallback decodes one token
        raise _C.InvalidArgument(f"attn_paged_decode: q has shape {list(q.shape)} (allowed: [batch, 1, n_heads, D] "
                                 "or [batch, n_heads, D]; astrai_jit.paged_decode takes several query tokens)")
    squeeze = q.dim() == 4
    q3 = q.squeeze(1) if squeeze else q
    nk = new_k.squeeze(1) if new_k is not None and new_k.dim() == 4 else new_k
    nv = new_v.squeeze(1) if new_v is not None and new_v.dim() == 4 else new_v
    out = _ops.paged_decode(q3, _paged_view(k_cache), _paged_view(v_cache), page_table, seq_lens,
                            req_indices=req_indices, new_k=nk, new_v=nv, mask=mask)
    return out.unsqueeze(1) if squeeze else out


def rotary_emb(x: Tensor, freqs_cis: Tensor) -> Tensor:
    """The rotary kernel: x ``[batch, seq, n_heads, D]`` (or ``[tokens, n_heads, D]``),
    freqs_cis f32 ``[batch or 1, seq, D/2, 2]`` (or ``[seq, D/2, 2]``) holding (cos, sin)."""
    return _ops.rotary_emb(x, freqs_cis)


# ---------------------------------------------------------------------------------------------
# PyTorch references (the SDPA backend)


def _expand_mask(mask: Optional[Tensor], batch: int, q_len: int, kv_len: int, device) -> Optional[Tensor]:
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        raise TypeError(f"mask has dtype {mask.dtype} (allowed: torch.bool, True = keep)")
    if mask.dim() == 2:
        mask = mask[:, None, :]
    if mask.dim() != 3:
        raise ValueError(f"mask has shape {list(mask.shape)} (allowed: [batch, kv_len] or [batch, q_len, kv_len])")
    return mask.to(device).expand(batch, q_len, kv_len)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, is_causal: bool = False,
                   scale: Optional[float] = None) -> Tensor:
    """Attention with PyTorch's SDPA in AstrAI's conventions (``[batch, seq, heads, D]``,
    bottom-right causal, bool masks, GQA, rows with nothing to attend to give zeros)."""
    batch, q_len, n_heads, _ = q.shape
    kv_len, n_kv_heads = k.shape[1], k.shape[2]
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
    keep = _expand_mask(mask, batch, q_len, kv_len, q.device)
    if is_causal:
        rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
        causal = torch.arange(kv_len, device=q.device)[None, :] <= rows
        keep = causal.expand(batch, q_len, kv_len) if keep is None else keep & causal
    group = n_heads // n_kv_heads
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if group > 1:
        kt = kt.repeat_interleave(group, dim=1)
        vt = vt.repeat_interleave(group, dim=1)
    attn_mask = keep[:, None] if keep is not None else None
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn_mask, scale=scale)
    if keep is not None:  # SDPA gives NaN for a fully masked row; the kernels give zeros
        empty = ~keep.any(dim=-1)
        if bool(empty.any()):
            out = out.masked_fill(empty[:, None, :, None], 0)
    return out.transpose(1, 2)


def sdpa_paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                      req_indices: Optional[Tensor] = None, new_k: Optional[Tensor] = None,
                      new_v: Optional[Tensor] = None, mask: Optional[Tensor] = None) -> Tensor:
    """attn_paged_decode with PyTorch: gathers each request's tokens through the page table
    (the fused append is done first, as the kernel does), then SDPA."""
    squeeze = q.dim() == 4
    q3 = q.squeeze(1) if squeeze else q
    kc, vc = _paged_view(k_cache), _paged_view(v_cache)
    page_size = kc.shape[1]
    rows = page_table if req_indices is None else page_table[req_indices.long()]
    batch = q3.shape[0]
    capacity = rows.shape[1] * page_size
    positions = torch.arange(capacity, device=q3.device)
    pages = rows.long()[:, positions // page_size]            # [batch, capacity]
    slots = positions % page_size
    lens = seq_lens.long().clamp(0, capacity)
    if new_k is not None:
        nk = new_k.reshape(batch, *kc.shape[2:])
        nv = new_v.reshape(batch, *vc.shape[2:])
        last = (lens - 1).clamp(min=0)
        b = torch.arange(batch, device=q3.device)
        has = lens > 0
        kc[pages[b, last][has], slots[last][has]] = nk[has]
        vc[pages[b, last][has], slots[last][has]] = nv[has]
    k = kc[pages, slots[None, :].expand(batch, -1)]             # [batch, capacity, n_kv_heads, D]
    v = vc[pages, slots[None, :].expand(batch, -1)]
    keep = positions[None, :] < lens[:, None]
    if mask is not None:
        keep = keep & mask.to(torch.bool).reshape(batch, -1)[:, :capacity]
    out = sdpa_attention(q3[:, None], k, v, mask=keep)[:, 0]
    return out.unsqueeze(1) if squeeze else out


def torch_rotary_emb(x: Tensor, freqs_cis: Tensor) -> Tensor:
    """Rotary embedding with PyTorch's complex multiply (differentiable)."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    rot = torch.view_as_complex(pairs)
    freqs = torch.view_as_complex(freqs_cis.float().contiguous())
    if x.dim() == 4 and freqs.dim() == 2:      # [seq, D/2] shared over the batch
        freqs = freqs[None]
    freqs = freqs.unsqueeze(-2)                  # broadcast over heads
    out = torch.view_as_real(rot * freqs).flatten(-2)
    return out.to(x.dtype)


def apply_rotary_emb(x: Tensor, freqs_cis: Tensor) -> Tensor:
    """The kernel in inference (CUDA bf16/fp16 tensor, grad disabled), else the complex multiply."""
    if (not torch.is_grad_enabled() and x.is_cuda and freqs_cis.is_cuda and x.dtype in _KERNEL_DTYPES
            and freqs_cis.dtype == torch.float32 and x.shape[-1] % 8 == 0):
        return _ops.rotary_emb(x, freqs_cis)
    return torch_rotary_emb(x, freqs_cis)


# ---------------------------------------------------------------------------------------------
# Backends


class AttentionBackend(ABC):
    """Computes attention for the model; ``forward`` dispatches on the query length."""

    name = "abstract"

    @abstractmethod
    def fwd_decode(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None) -> Tensor: ...

    @abstractmethod
    def fwd_prefill(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None,
                    is_causal: bool = True) -> Tensor: ...

    @abstractmethod
    def fwd_paged_decode(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor,
                         seq_lens: Tensor, req_indices: Optional[Tensor] = None,
                         new_k: Optional[Tensor] = None, new_v: Optional[Tensor] = None,
                         mask: Optional[Tensor] = None) -> Tensor: ...

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None,
                is_causal: bool = True) -> Tensor:
        if q.shape[1] == 1:
            return self.fwd_decode(q, k, v, mask)
        return self.fwd_prefill(q, k, v, mask, is_causal)

    __call__ = forward

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SdpaBackend(AttentionBackend):
    """PyTorch's scaled_dot_product_attention; runs anywhere, supports autograd."""

    name = "sdpa"

    def fwd_decode(self, q, k, v, mask=None):
        return sdpa_attention(q, k, v, mask=mask)

    def fwd_prefill(self, q, k, v, mask=None, is_causal=True):
        return sdpa_attention(q, k, v, mask=mask, is_causal=is_causal)

    def fwd_paged_decode(self, q, k_cache, v_cache, page_table, seq_lens, req_indices=None, new_k=None,
                         new_v=None, mask=None):
        return sdpa_paged_decode(q, k_cache, v_cache, page_table, seq_lens, req_indices, new_k, new_v, mask)


TorchNativeBackend = SdpaBackend


def _unservable(*tensors: Optional[Tensor]) -> Optional[str]:
    """Why the kernels cannot take these tensors, or None. Cheap checks on metadata only."""
    q = tensors[0]
    if not q.is_cuda:
        return f"tensors on {q.device.type}, not a CUDA device"
    if q.dtype not in _KERNEL_DTYPES:
        return f"dtype {q.dtype} (the kernels take bfloat16, float16)"
    head_dim = q.shape[-1]
    if head_dim % 16 or not 32 <= head_dim <= 256:
        return f"head_dim {head_dim} (the kernels take multiples of 16 in 32..256)"
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return "inputs that require grad (the kernels have no backward)"
    return None


class JitBackend(AttentionBackend):
    """The astrai-jit kernels. A call they cannot serve (no GPU, a dtype or head_dim they do not
    take, inputs needing grad, an argument the kernel refuses) goes to SDPA instead, with one
    log line per reason."""

    name = "jit"

    def __init__(self, fallback: Optional[AttentionBackend] = None):
        self.fallback = fallback or SdpaBackend()
        self._logged: set = set()

    def _fall_back(self, call: str, reason: str) -> AttentionBackend:
        key = (call, reason)
        if key not in self._logged:
            self._logged.add(key)
            logger.warning("astrai_jit: %s falls back to %s: %s", call, self.fallback.name, reason)
        return self.fallback

    def _try(self, call: str, kernel, fallback, tensors, *args, **kwargs):
        reason = _unservable(*tensors)
        if reason is None:
            try:
                return kernel(*args, **kwargs)
            except (_C.InvalidArgument, TypeError) as error:  # refused before any GPU work
                reason = str(error)
        self._fall_back(call, reason)
        return fallback(*args, **kwargs)

    def fwd_decode(self, q, k, v, mask=None):
        return self._try("attn_decode", attn_decode, self.fallback.fwd_decode, (q, k, v), q, k, v, mask)

    def fwd_prefill(self, q, k, v, mask=None, is_causal=True):
        return self._try("attn_prefill", attn_prefill, self.fallback.fwd_prefill, (q, k, v), q, k, v, mask,
                         is_causal)

    def fwd_paged_decode(self, q, k_cache, v_cache, page_table, seq_lens, req_indices=None, new_k=None,
                         new_v=None, mask=None):
        return self._try("attn_paged_decode", attn_paged_decode, self.fallback.fwd_paged_decode,
                         (q, k_cache, v_cache, new_k, new_v), q, k_cache, v_cache, page_table, seq_lens,
                         req_indices, new_k, new_v, mask)


CudaBackend = JitBackend


class ATTN_BACKEND(enum.Enum):
    """Backend names for attn_backend(); CUDA is AstrAI's name for the kernel backend."""

    SDPA = "sdpa"
    TORCH = "sdpa"
    JIT = "jit"
    CUDA = "jit"


_BACKENDS = {"sdpa": SdpaBackend, "jit": JitBackend}
_instances: dict = {}
_current: contextvars.ContextVar = contextvars.ContextVar("astrai_jit_attn_backend", default=None)


def _instance(choice: Union[ATTN_BACKEND, str, AttentionBackend]) -> AttentionBackend:
    if isinstance(choice, AttentionBackend):
        return choice
    key = choice.value if isinstance(choice, ATTN_BACKEND) else str(choice).lower()
    key = {"torch": "sdpa", "cuda": "jit"}.get(key, key)
    if key not in _BACKENDS:
        raise ValueError(f"attention backend {choice!r} is unknown (allowed: ATTN_BACKEND.SDPA, "
                         f"ATTN_BACKEND.JIT / CUDA, 'sdpa', 'jit', or an AttentionBackend)")
    if key not in _instances:
        _instances[key] = _BACKENDS[key]()
    return _instances[key]


def get_attn_backend() -> AttentionBackend:
    """The backend in effect (SDPA outside any attn_backend block)."""
    backend = _current.get()
    return backend if backend is not None else _instance(ATTN_BACKEND.SDPA)


@contextlib.contextmanager
def attn_backend(backend: Union[ATTN_BACKEND, str, AttentionBackend]) -> Iterator[AttentionBackend]:
    """Selects the attention backend inside the block (like torch.nn.attention.sdpa_kernel)."""
    token = _current.set(_instance(backend))
    try:
        yield _current.get()
    finally:
        _current.reset(token)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, is_causal: bool = True) -> Tensor:
    """Attention through the backend in effect."""
    return get_attn_backend().forward(q, k, v, mask, is_causal)


def paged_decode_attention(q, k_cache, v_cache, page_table, seq_lens, req_indices=None, new_k=None, new_v=None,
                           mask=None) -> Tensor:
    """Paged decode through the backend in effect."""
    return get_attn_backend().fwd_paged_decode(q, k_cache, v_cache, page_table, seq_lens, req_indices,
                                               new_k, new_v, mask)
