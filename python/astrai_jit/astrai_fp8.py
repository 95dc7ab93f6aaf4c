"""AstrAI's ``fp8_mm`` module (its FP8 GEMMs and quantizer, 2026-08), served without nvcc.

AstrAI's ``csrc/kernels/fp8`` is a GEMM family, not attention: per-tensor scaled E4M3/E5M2
matrix products with FP32 accumulation, and a BF16 -> FP8 quantizer with a fused amax. Without
its nvcc build AstrAI would find no ``fp8_mm`` module and skip its FP8 path, so the stand-in
module of that name (``python -m astrai_jit.astrai_install``) takes these functions, with the
signatures, dtypes and output conventions of AstrAI's bindings. They are written on PyTorch's own
operators: the product on ``torch._scaled_mm`` (cuBLASLt FP8 GEMMs) wherever its shape and
format rules hold, else on the dequantized operands in float32, which are exact (an FP8 value is
exact in float32 and so is the product of two), so both paths give AstrAI's result up to the
order of the sums. (decision 0032)

Scales are quantization steps, as in AstrAI: ``x8 = saturate(x / scale)``, and a product of
``a8`` and ``b8`` is multiplied back by ``scale_a * scale_b``. The one exception is ``mm_fp8``'s
``out_scale``: as in AstrAI's kernel (and ``torch._scaled_mm``'s ``scale_result``) it multiplies
the product before the FP8 output is saturated. ``fmt`` 0 is E4M3, 1 is E5M2.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

Tensor = torch.Tensor

_FORMATS = {0: torch.float8_e4m3fn, 1: torch.float8_e5m2}


def _format(fmt: int) -> torch.dtype:
    try:
        return _FORMATS[int(fmt)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"fmt {fmt!r} is not valid (allowed: 0 = E4M3, 1 = E5M2)") from None


def _require(call: str, name: str, t: Tensor, dtypes: Sequence[torch.dtype], dims: Optional[int] = None) -> None:
    if not isinstance(t, Tensor) or not t.is_cuda:
        raise ValueError(f"{call}: {name} must be a CUDA tensor (got {type(t).__name__} on "
                         f"{getattr(t, 'device', 'no device')})")
    if t.dtype not in dtypes:
        raise ValueError(f"{call}: {name} has dtype {t.dtype} (allowed: {', '.join(map(str, dtypes))})")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{call}: {name} has shape {list(t.shape)} (allowed: {dims}-D)")


def _require_scale(call: str, name: str, scale: Tensor, like: Tensor) -> None:
    if (not isinstance(scale, Tensor) or scale.dtype != torch.float32 or scale.numel() != 1
            or scale.device != like.device):
        raise ValueError(f"{call}: {name} must be a float32 tensor of one element on {like.device} (got "
                         f"{getattr(scale, 'dtype', type(scale).__name__)}, shape "
                         f"{list(getattr(scale, 'shape', []))})")


def _saturate(x: Tensor, dtype: torch.dtype) -> Tensor:
    # To FP8, clamped to the format's largest finite value first (a plain cast would give NaN).
    limit = torch.finfo(dtype).max
    return x.clamp(-limit, limit).to(dtype)


def quantize(x: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """x / scale in FP8, saturated to the format's largest finite value (NaN stays NaN)."""
    return _saturate(x.float() / scale.float().reshape(()), dtype)


def scaled_product(a8: Tensor, b8: Tensor, scale_a: Tensor, scale_b: Tensor, bias: Optional[Tensor] = None,
                   out_dtype: torch.dtype = torch.bfloat16, out_scale: Optional[Tensor] = None) -> Tensor:
    """``a8 [m, k] @ b8[n, k]^T * scale_a * scale_b (+ bias)`` in float32, then bf16, or, given
    out_scale, that product times out_scale saturated to FP8 (out_dtype)."""
    sa, sb = scale_a.float().reshape(()), scale_b.float().reshape(())
    a8, b8 = a8.contiguous(), b8.contiguous()
    if out_scale is None:  # bf16: the bias rides in cuBLASLt's epilogue
        product = _cublas_product(a8, b8, sa, sb, bias, out_dtype)
        if product is not None:
            return product
    else:  # FP8: quantized here, saturating, from the float32 product
        product = _cublas_product(a8, b8, sa, sb, None, torch.float32)
    if product is None:
        product = (a8.float() @ b8.float().t()) * (sa * sb)
    if bias is not None:
        product = product + bias.float()
    if out_scale is None:
        return product.to(out_dtype)
    return _saturate(product * out_scale.float().reshape(()), out_dtype)


# Shapes and formats cuBLASLt refused though its documented rules held: not asked again.
_REFUSED = set()


def _cublas_product(a8: Tensor, b8: Tensor, sa: Tensor, sb: Tensor, bias: Optional[Tensor],
                    out_dtype: torch.dtype) -> Optional[Tensor]:
    """cuBLASLt's FP8 GEMM (torch._scaled_mm), or None where it does not serve: before sm_89,
    a dim not a multiple of 16, both operands E5M2 (its rules), or a call it refused."""
    if not a8.is_cuda or torch.cuda.get_device_capability(a8.device) < (8, 9):
        return None
    if a8.dtype == torch.float8_e5m2 and b8.dtype == torch.float8_e5m2:
        return None
    if a8.shape[0] % 16 or a8.shape[1] % 16 or b8.shape[0] % 16:
        return None
    key = (a8.dtype, b8.dtype, tuple(a8.shape), b8.shape[0], out_dtype, bias is not None)
    if key in _REFUSED:
        return None
    try:
        out = torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype,
                               use_fast_accum=False)
    except RuntimeError:
        _REFUSED.add(key)
        return None
    return out


def _amax(x: Tensor) -> Tensor:
    # AstrAI returns the amax as a float32 tensor of one element, zero for an empty x.
    if x.numel() == 0:
        return torch.zeros(1, dtype=torch.float32, device=x.device)
    return x.abs().amax().float().reshape(1)


def quantize_bf16(x: Tensor, scale: Tensor, fmt: int) -> Tuple[Tensor, Tensor]:
    """BF16 -> FP8 (``fmt``) with the amax of the raw values: ``(x8, amax)``."""
    _require("quantize_bf16", "x", x, (torch.bfloat16,))
    _require_scale("quantize_bf16", "scale", scale, x)
    return quantize(x, scale, _format(fmt)), _amax(x)


def mm_fp8(a: Tensor, b: Tensor, sa: Tensor, sb: Tensor, out_dtype: int = 0, out_scale: Optional[Tensor] = None
           ) -> Tensor:
    """Pre-quantized FP8 GEMM: ``a @ b^T * sa * sb``, bf16 (out_dtype 0) or E4M3 (1: times
    out_scale, saturated)."""
    call = "mm_fp8"
    fp8 = tuple(_FORMATS.values())
    _require(call, "a", a, fp8, 2)
    _require(call, "b", b, fp8, 2)
    if a.dtype != b.dtype:
        raise ValueError(f"{call}: a is {a.dtype} and b is {b.dtype} (allowed: the same FP8 format)")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{call}: a {list(a.shape)} and b {list(b.shape)} differ in their inner dim")
    _require_scale(call, "sa", sa, a)
    _require_scale(call, "sb", sb, a)
    if int(out_dtype) not in (0, 1):
        raise ValueError(f"{call}: out_dtype {out_dtype} is not valid (allowed: 0 = bf16, 1 = FP8 E4M3)")
    if int(out_dtype) == 1:
        if out_scale is None:
            raise ValueError(f"{call}: out_dtype 1 (FP8) needs out_scale")
        _require_scale(call, "out_scale", out_scale, a)
        return scaled_product(a, b, sa, sb, out_dtype=torch.float8_e4m3fn, out_scale=out_scale)
    return scaled_product(a, b, sa, sb)


def fp8_mm(a: Tensor, b: Tensor, sx: Tensor, sw: Tensor) -> Tensor:
    """BF16 in, E4M3 product, BF16 out: ``q(a) @ q(b)^T * sx * sw``."""
    call = "fp8_mm"
    _require(call, "a", a, (torch.bfloat16,), 2)
    _require(call, "b", b, (torch.bfloat16,), 2)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"{call}: a {list(a.shape)} and b {list(b.shape)} differ in their inner dim")
    _require_scale(call, "sx", sx, a)
    _require_scale(call, "sw", sw, a)
    e4m3 = torch.float8_e4m3fn
    return scaled_product(quantize(a, sx, e4m3), quantize(b, sw, e4m3), sx, sw)


def linear_forward_fp8(x: Tensor, w: Tensor, bias: Optional[Tensor], sx: Tensor, sw: Tensor
                       ) -> Tuple[Tensor, Tensor, Tensor]:
    """``x [..., k] @ w[n, k]^T (+ bias)`` through E4M3: ``(out [..., n], amax_x, amax_w)``."""
    call = "linear_forward_fp8"
    _require(call, "x", x, (torch.bfloat16,))
    _require(call, "w", w, (torch.bfloat16,), 2)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"{call}: x {list(x.shape)} and w {list(w.shape)} differ in their inner dim")
    _require_scale(call, "sx", sx, x)
    _require_scale(call, "sw", sw, x)
    if bias is not None and bias.numel() == 0:
        bias = None
    if bias is not None:
        _require(call, "bias", bias, (torch.bfloat16,))
        if bias.numel() != w.shape[0]:
            raise ValueError(f"{call}: bias has shape {list(bias.shape)} (allowed: [{w.shape[0]}])")
        bias = bias.reshape(-1)
    rows = x.reshape(-1, w.shape[1])
    e4m3 = torch.float8_e4m3fn
    out = scaled_product(quantize(rows, sx, e4m3), quantize(w, sw, e4m3), sx, sw, bias=bias)
    return out.reshape(*x.shape[:-1], w.shape[0]), _amax(rows), _amax(w)


def linear_backward_fp8(g: Tensor, x: Tensor, w: Tensor, masks: Sequence[int], sg: Tensor, sw: Tensor, sx: Tensor,
                        fmt: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of ``x @ w^T`` through FP8 (``fmt``): ``(grad_input, grad_weight, grad_bias,
    amax_g)``, each computed where ``masks`` (three flags) asks for it. As AstrAI's: the gradients
    not asked for are left uninitialized, grad_bias is empty unless asked for, and amax_g is the
    amax of g when grad_input is asked for or neither product is (else zero)."""
    call = "linear_backward_fp8"
    for name, t in (("g", g), ("x", x), ("w", w)):
        _require(call, name, t, (torch.bfloat16,))
    if len(masks) != 3:
        raise ValueError(f"{call}: masks has {len(masks)} values (allowed: 3)")
    dtype = _format(fmt)
    n, k = w.shape
    g2 = g.reshape(-1, n)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape != (g2.shape[0], k):
        raise ValueError(f"{call}: g {list(g.shape)}, x {list(x.shape)} and w {list(w.shape)} do not match")
    grad_input, grad_weight = torch.empty_like(x), torch.empty_like(w)
    amax_g = torch.zeros(1, dtype=torch.float32, device=g.device)
    if masks[0] or masks[1]:
        _require_scale(call, "sg", sg, g)
        g8 = quantize(g2, sg, dtype)  # elementwise: both products share it, one transposed
    if masks[0]:
        _require_scale(call, "sw", sw, g)
        amax_g = _amax(g2)
        grad_input.copy_(scaled_product(g8, quantize(w.t(), sw, dtype), sg, sw).reshape(x.shape))
    if masks[1]:
        _require_scale(call, "sx", sx, g)
        grad_weight.copy_(scaled_product(g8.t(), quantize(x2.t(), sx, dtype), sg, sx))
    if not masks[0] and not masks[1]:
        amax_g = _amax(g2)
    grad_bias = g2.sum(0).to(g.dtype) if masks[2] else torch.empty(0, dtype=g.dtype, device=g.device)
    return grad_input, grad_weight, grad_bias, amax_g


KERNEL_FUNCTIONS = ("fp8_mm", "quantize_bf16", "mm_fp8", "linear_forward_fp8", "linear_backward_fp8")
