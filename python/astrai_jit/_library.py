"""The kernels as PyTorch custom ops (``torch.ops.astrai_jit.*``).

Each op writes into tensors it is given and returns nothing; ``mutates_args`` names them (out,
the optional LSE, and for the fused append the two caches), so functionalization, torch.compile
and CUDA graph capture see every write. The fake implementations have nothing to compute (the
outputs already exist with their final shapes); they check that every tensor is on one device.
A stream of -1 means the current PyTorch stream when the op runs.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._loader import import_extension

_C = import_extension()

Tensor = torch.Tensor


def _stream(device: torch.device, stream: int) -> int:
    if stream != -1:
        return stream
    if device.type != "cuda":
        return 0
    return torch._C._cuda_getCurrentRawStream(device.index)


def _same_device(call: str, **tensors: Optional[Tensor]) -> None:
    # The extension's device check, on fake tensors while tracing (same message).
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if t is not None and t.device != first.device:
            raise ValueError(f"{call}: {name} is on {t.device} but {first_name} is on {first.device} "
                             f"(allowed: every tensor on one CUDA device)")


def _run(fn, device: torch.device, *args) -> None:
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            fn(*args)
    else:
        fn(*args)


@torch.library.custom_op("astrai_jit::paged_decode", mutates_args=("out", "lse", "workspace"))
def paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Optional[Tensor],
                 out: Tensor, lse: Optional[Tensor], mask: Optional[Tensor], req_indices: Optional[Tensor],
                 scale: float, logit_cap: float, sinks: Optional[Tensor], window_left: int,
                 k_scale: Optional[Tensor], v_scale: Optional[Tensor], stream: int,
                 seq_lens_are_offsets: bool = False, workspace: Optional[Tensor] = None) -> None:
    _run(_C.paged_decode, q.device, q, k_cache, v_cache, page_table, seq_lens, out, lse, mask, req_indices,
         None, None, scale, logit_cap, sinks, window_left, k_scale, v_scale, _stream(q.device, stream),
         seq_lens_are_offsets, workspace)


@paged_decode.register_fake
def _(q, k_cache, v_cache, page_table, seq_lens, out, lse, mask, req_indices, scale, logit_cap, sinks,
      window_left, k_scale, v_scale, stream, seq_lens_are_offsets=False, workspace=None) -> None:
    _same_device("paged_decode", q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table,
                 seq_lens=seq_lens, out=out, lse=lse, mask=mask, req_indices=req_indices, sinks=sinks,
                 k_scale=k_scale, v_scale=v_scale)


@torch.library.custom_op("astrai_jit::paged_decode_append",
                         mutates_args=("k_cache", "v_cache", "out", "lse", "workspace"))
def paged_decode_append(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor,
                        seq_lens: Optional[Tensor], out: Tensor, lse: Optional[Tensor], mask: Optional[Tensor],
                        req_indices: Optional[Tensor], new_k: Tensor, new_v: Tensor, scale: float,
                        logit_cap: float, sinks: Optional[Tensor], window_left: int, k_scale: Optional[Tensor],
                        v_scale: Optional[Tensor], stream: int, seq_lens_are_offsets: bool = False,
                        workspace: Optional[Tensor] = None) -> None:
    _run(_C.paged_decode, q.device, q, k_cache, v_cache, page_table, seq_lens, out, lse, mask, req_indices,
         new_k, new_v, scale, logit_cap, sinks, window_left, k_scale, v_scale, _stream(q.device, stream),
         seq_lens_are_offsets, workspace)


@paged_decode_append.register_fake
def _(q, k_cache, v_cache, page_table, seq_lens, out, lse, mask, req_indices, new_k, new_v, scale, logit_cap,
      sinks, window_left, k_scale, v_scale, stream, seq_lens_are_offsets=False, workspace=None) -> None:
    _same_device("paged_decode", q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table,
                 seq_lens=seq_lens, out=out, lse=lse, mask=mask, req_indices=req_indices, new_k=new_k,
                 new_v=new_v, sinks=sinks, k_scale=k_scale, v_scale=v_scale)


@torch.library.custom_op("astrai_jit::decode", mutates_args=("out", "lse"))
def decode(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor], mask: Optional[Tensor],
           causal_offset: int, scale: float, logit_cap: float, sinks: Optional[Tensor], window_left: int,
           k_scale: Optional[Tensor], v_scale: Optional[Tensor], stream: int) -> None:
    _run(_C.decode, q.device, q, k, v, out, lse, mask, causal_offset, scale, logit_cap, sinks, window_left,
         k_scale, v_scale, _stream(q.device, stream))


@decode.register_fake
def _(q, k, v, out, lse, mask, causal_offset, scale, logit_cap, sinks, window_left, k_scale, v_scale,
      stream) -> None:
    _same_device("decode", q=q, k=k, v=v, out=out, lse=lse, mask=mask, sinks=sinks, k_scale=k_scale,
                 v_scale=v_scale)


@torch.library.custom_op("astrai_jit::prefill", mutates_args=("out", "lse"))
def prefill(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor], mask: Optional[Tensor],
            causal_offset: int, scale: float, logit_cap: float, sinks: Optional[Tensor], window_left: int,
            stream: int) -> None:
    _run(_C.prefill, q.device, q, k, v, out, lse, mask, causal_offset, scale, logit_cap, sinks, window_left,
         _stream(q.device, stream))


@prefill.register_fake
def _(q, k, v, out, lse, mask, causal_offset, scale, logit_cap, sinks, window_left, stream) -> None:
    _same_device("prefill", q=q, k=k, v=v, out=out, lse=lse, mask=mask, sinks=sinks)


@torch.library.custom_op("astrai_jit::paged_prefill", mutates_args=("out", "lse"))
def paged_prefill(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
                  qo_indptr: Tensor, out: Tensor, lse: Optional[Tensor], mask: Optional[Tensor], max_q_len: int,
                  causal: bool, scale: float, logit_cap: float, sinks: Optional[Tensor], window_left: int,
                  k_scale: Optional[Tensor], v_scale: Optional[Tensor], stream: int,
                  req_indices: Optional[Tensor] = None, seq_lens_are_offsets: bool = False) -> None:
    _run(_C.paged_prefill, q.device, q, k_cache, v_cache, page_table, seq_lens, qo_indptr, out, lse, mask,
         max_q_len, causal, scale, logit_cap, sinks, window_left, k_scale, v_scale, _stream(q.device, stream),
         req_indices, seq_lens_are_offsets)


@paged_prefill.register_fake
def _(q, k_cache, v_cache, page_table, seq_lens, qo_indptr, out, lse, mask, max_q_len, causal, scale,
      logit_cap, sinks, window_left, k_scale, v_scale, stream, req_indices=None, seq_lens_are_offsets=False) -> None:
    _same_device("paged_prefill", q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table,
                 seq_lens=seq_lens, qo_indptr=qo_indptr, out=out, lse=lse, mask=mask, sinks=sinks,
                 k_scale=k_scale, v_scale=v_scale, req_indices=req_indices)


@torch.library.custom_op("astrai_jit::rotary_emb", mutates_args=("out",))
def rotary_emb(x: Tensor, freqs_cis: Tensor, out: Tensor, stream: int) -> None:
    _run(_C.rotary_emb, x.device, x, freqs_cis, out, _stream(x.device, stream))


@rotary_emb.register_fake
def _(x, freqs_cis, out, stream) -> None:
    _same_device("rotary_emb", x=x, freqs_cis=freqs_cis, out=out)


@torch.library.custom_op("astrai_jit::rotary_emb_", mutates_args=("x",))
def rotary_emb_(x: Tensor, freqs_cis: Tensor, stream: int) -> None:
    _run(_C.rotary_emb, x.device, x, freqs_cis, x, _stream(x.device, stream))


@rotary_emb_.register_fake
def _(x, freqs_cis, stream) -> None:
    _same_device("rotary_emb", x=x, freqs_cis=freqs_cis)


OPS = {
    "paged_decode": paged_decode,
    "paged_decode_append": paged_decode_append,
    "decode": decode,
    "prefill": prefill,
    "paged_prefill": paged_prefill,
    "rotary_emb": rotary_emb,
    "rotary_emb_": rotary_emb_,
}
