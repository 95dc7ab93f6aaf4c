"""astrai-jit for Python: attention kernels compiled by NVRTC at first use.

    import torch, astrai_jit
    out = astrai_jit.paged_decode(q, k_cache, v_cache, page_table, seq_lens)

The functional API (``paged_decode``, ``decode``, ``prefill``, ``paged_prefill``,
``rotary_emb``) takes PyTorch tensors; ``astrai_jit._C`` takes any DLPack tensor with the
outputs given. ``astrai_jit.astrai`` is AstrAI's attention interface on top of these.
Importing the package needs no GPU and no PyTorch; the functional API needs PyTorch.
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

import sys as _sys

_TORCH_API = ("paged_decode", "decode", "prefill", "paged_prefill", "rotary_emb")


def __getattr__(name):
    # PyTorch is imported on first use of the functional API (the CLI and the DLPack module
    # don't need it); importing it registers the custom ops.
    if name in _TORCH_API:
        from . import _ops
        return getattr(_ops, name)
    if name == "astrai":
        import importlib
        return importlib.import_module(".astrai", __name__)
    raise AttributeError(f"module 'astrai_jit' has no attribute {name!r}")


if "torch" in _sys.modules:  # a PyTorch program: register torch.ops.astrai_jit.* now
    from ._ops import decode, paged_decode, paged_prefill, prefill, rotary_emb  # noqa: E402,F401

__all__ = [
    "Error", "InvalidArgument", "CompileError", "CudaError", "ConfigError", "CacheMissError",
    "paged_decode", "decode", "prefill", "paged_prefill", "rotary_emb",
    "warm", "cache_info", "loaded_variants", "cli_path",
]
