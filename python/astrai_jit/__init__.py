"""astrai-jit for Python: attention kernels compiled by NVRTC at first use, cached on disk.

    import torch, astrai_jit
    out = astrai_jit.paged_decode(q, k_cache, v_cache, page_table, seq_lens)

Kernels (PyTorch tensors on one CUDA device; each also a custom op, ``torch.ops.astrai_jit.*``):
    paged_decode   decode over a paged KV cache (GQA, masks, FP8 cache, fused append, q_len 2..8)
    decode         decode over a contiguous KV cache
    prefill        prefill over contiguous K and V (causal or not; FP8 q, k and v on sm_90a)
    paged_prefill  prefill over a paged KV cache
    mla_decode     MLA decode, absorbed form (576-wide q against one paged latent head)
    rotary_emb     rotary embedding of interleaved pairs, in place or not
    merge_state, merge_state_in_place, merge_states
                   attention states merged by their LSEs (cascade attention, split passes)
    cascade, CascadeLevel, CascadeAttention
                   attention over KV levels shared by groups of requests (shared prefixes)
The JIT and its cache (no GPU and no PyTorch needed):
    warm(...)          compile variants ahead of time, with the choices of ``astrai-jit warm``
    cache_info()       the disk cache: directory, mode, entries, total bytes, cap
    loaded_variants()  the variants this process has loaded
    cache_metrics()    this process's cache counters (hits and misses per tier, compiles, times)
    cache_metrics_prometheus()  the same as Prometheus text, for a server's /metrics
    cli_path()         the packaged ``astrai-jit`` executable (also ``python -m astrai_jit``)
    __version__        the package's version (``astrai-jit --version`` prints the same)
Errors: Error and its subclasses InvalidArgument, CompileError, CudaError, ConfigError,
CacheMissError. ``astrai_jit._C`` takes any DLPack tensor with the outputs given.
AstrAI runs on these kernels through its own loader (``python -m astrai_jit.astrai_install``,
``astrai_jit.astrai_csrc``).

Importing the package needs no GPU and no PyTorch; the kernels need PyTorch
(``pip install 'astrai-jit[torch]'``). Each function's help() has its arguments.
"""
from __future__ import annotations

from ._build_config import VERSION as __version__
from ._loader import import_extension as _import_extension

_C = _import_extension()

Error = _C.Error
InvalidArgument = _C.InvalidArgument
CompileError = _C.CompileError
CudaError = _C.CudaError
ConfigError = _C.ConfigError
CacheMissError = _C.CacheMissError

from ._jit import cache_info, cli_path, loaded_variants, warm  # noqa: E402
from ._metrics import cache_metrics, cache_metrics_prometheus  # noqa: E402

import sys as _sys

_TORCH_API = ("paged_decode", "decode", "prefill", "paged_prefill", "mla_decode", "rotary_emb", "merge_state",
              "merge_state_in_place", "merge_states")
_CASCADE_API = ("cascade", "CascadeLevel", "CascadeAttention")


def _needs_torch(name: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"astrai_jit.{name} needs PyTorch, which is not installed: pip install 'astrai-jit[torch]' "
        f"(or torch itself). Without it, warm(), cache_info(), the astrai-jit CLI and the DLPack "
        f"module astrai_jit._C still work.", name="torch")


def __getattr__(name):
    # PyTorch is imported on first use of the functional API (the CLI and the DLPack module
    # don't need it); importing it registers the custom ops.
    if name in _TORCH_API or name in _CASCADE_API:
        try:
            from . import _cascade, _ops
        except ModuleNotFoundError as error:
            if error.name != "torch":
                raise
            raise _needs_torch(name) from error
        return getattr(_ops if name in _TORCH_API else _cascade, name)
    raise AttributeError(f"module 'astrai_jit' has no attribute {name!r}")


if "torch" in _sys.modules:  # a PyTorch program: register torch.ops.astrai_jit.* now
    from ._ops import (decode, merge_state, merge_state_in_place, merge_states, mla_decode,  # noqa: E402,F401
                       paged_decode, paged_prefill, prefill, rotary_emb)
    from ._cascade import CascadeAttention, CascadeLevel, cascade  # noqa: E402,F401

__all__ = [
    "Error", "InvalidArgument", "CompileError", "CudaError", "ConfigError", "CacheMissError",
    "paged_decode", "decode", "prefill", "paged_prefill", "mla_decode", "rotary_emb",
    "merge_state", "merge_state_in_place", "merge_states", "cascade", "CascadeLevel", "CascadeAttention",
    "warm", "cache_info", "loaded_variants", "cli_path",
    "cache_metrics", "cache_metrics_prometheus",
]
