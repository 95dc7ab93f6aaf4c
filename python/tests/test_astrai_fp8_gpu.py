"""AstrAI's fp8_mm module served by astrai-jit, on the GPU, against float64 products of the
quantized values: cuBLASLt's path (every dim a multiple of 16) and the float32 one (any other
shape, both operands E5M2), BF16 and FP8 outputs, the linear forward with and without bias, and
the backward under each mask."""
import pytest
import torch

import astrai_jit.astrai_fp8 as F

pytestmark = pytest.mark.gpu
bf16, E4M3, E5M2 = torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2
DEV = "cuda"
SHAPES = [(16, 8, 32), (17, 9, 33), (1, 1, 1), (64, 48, 96), (256, 128, 512)]


def _need_fp8():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("cuBLASLt's FP8 path needs sm_89 (the float32 path is tested on the CPU)")


def _step(x, limit=448.0):
    return (x.abs().amax().float() / limit).clamp_min(1e-12).reshape(1)


def _ref(a8, b8, sa, sb):
    """The float64 product of the quantized values, and beside it the sum of the absolute
    products each output adds up (what bounds a sum's rounding)."""
    scale = sa.double() * sb.double()
    return a8.double() @ b8.double().t() * scale, a8.double().abs() @ b8.double().abs().t() * scale


def _close(got, want_and_spread, rtol=2 ** -8, atol=1e-30):
    # bf16 rounding of the result (half an ulp), plus the rounding of the sum: cuBLASLt's FP8
    # tensor-core products on Hopper are added with fewer bits than float32 between promotions,
    # so each output is allowed 2^-11 of its sum of |a_i b_i|.
    want, spread = want_and_spread
    err = (got.double() - want).abs()
    bound = rtol * want.abs() + 2 ** -11 * spread + atol
    worst = (err / bound).max().item()
    of_sum = (err / (spread + 1e-30)).max().item()
    assert worst <= 1, (f"{(err > bound).sum().item()} of {err.numel()} outputs off; worst error {worst:.3g} "
                        f"of its bound, largest error {of_sum:.3g} of an output's sum of |products|")


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_fp8_mm_quantizes_both_operands_and_scales_back(m, n, k):
    _need_fp8()
    gen = torch.Generator(device=DEV).manual_seed(m + n + k)
    a = torch.randn(m, k, device=DEV, generator=gen).to(bf16)
    b = torch.randn(n, k, device=DEV, generator=gen).to(bf16)
    sa, sb = _step(a), _step(b)
    out = F.fp8_mm(a, b, sa, sb)
    assert out.dtype == bf16 and out.shape == (m, n)
    _close(out, _ref(F.quantize(a, sa, E4M3), F.quantize(b, sb, E4M3), sa, sb))


@pytest.mark.parametrize("fmt_a,fmt_b", [(E4M3, E4M3), (E5M2, E5M2)])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_mm_fp8_pre_quantized_bf16_and_fp8_out(fmt_a, fmt_b, m, n, k):
    _need_fp8()
    gen = torch.Generator(device=DEV).manual_seed(7 * m + n + k)
    a = torch.randn(m, k, device=DEV, generator=gen) * 5
    b = torch.randn(n, k, device=DEV, generator=gen)
    limit = torch.finfo(fmt_a).max
    sa, sb = _step(a, limit), _step(b, limit)
    a8, b8 = F.quantize(a, sa, fmt_a), F.quantize(b, sb, fmt_b)
    want, spread = _ref(a8, b8, sa, sb)
    _close(F.mm_fp8(a8, b8, sa, sb), (want, spread))
    # out_scale multiplies the product (AstrAI's kernel and its test), then saturation to E4M3.
    out_scale = (400 / want.abs().max().float()).reshape(1)
    out8 = F.mm_fp8(a8, b8, sa, sb, 1, out_scale)
    assert out8.dtype == E4M3 and out8.shape == (m, n)
    # Rounded from the summed product: within one E4M3 step (2^-3 relative, 2^-9 below its normal
    # range) of the exact one, besides the sum's own rounding.
    s = out_scale.double()
    _close(out8, (want * s, spread * s), rtol=2 ** -3, atol=2 ** -9)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_linear_forward_fp8_with_amax(bias, m, n, k):
    _need_fp8()
    gen = torch.Generator(device=DEV).manual_seed(3 * m + n + k)
    x = torch.randn(2, m, k, device=DEV, generator=gen).to(bf16)
    w = torch.randn(n, k, device=DEV, generator=gen).to(bf16)
    b = torch.randn(n, device=DEV, generator=gen).to(bf16) if bias else None
    sx, sw = _step(x), _step(w)
    out, amax_x, amax_w = F.linear_forward_fp8(x, w, b, sx, sw)
    assert out.shape == (2, m, n) and out.dtype == bf16
    want = _ref(F.quantize(x.reshape(-1, k), sx, E4M3), F.quantize(w, sw, E4M3), sx, sw)
    if bias:
        want = (want[0] + b.double(), want[1] + b.double().abs())
    _close(out.reshape(-1, n), want)
    assert amax_x.item() == x.abs().max().float().item() and amax_w.item() == w.abs().max().float().item()


@pytest.mark.parametrize("masks", [(1, 1, 1), (1, 0, 0), (0, 1, 1), (0, 0, 1)])
@pytest.mark.parametrize("fmt", [0, 1])
def test_linear_backward_fp8_under_each_mask(masks, fmt):
    _need_fp8()
    m, n, k = 48, 32, 64
    gen = torch.Generator(device=DEV).manual_seed(sum(masks) + fmt)
    g = torch.randn(m, n, device=DEV, generator=gen).to(bf16)
    x = torch.randn(m, k, device=DEV, generator=gen).to(bf16)
    w = torch.randn(n, k, device=DEV, generator=gen).to(bf16)
    dtype = (E4M3, E5M2)[fmt]
    limit = torch.finfo(dtype).max
    sg, sw, sx = _step(g, limit), _step(w, limit), _step(x, limit)
    gx, gw, gb, amax_g = F.linear_backward_fp8(g, x, w, list(masks), sg, sw, sx, fmt)
    if masks[0]:
        _close(gx, _ref(F.quantize(g, sg, dtype), F.quantize(w.t(), sw, dtype), sg, sw))
    if masks[1]:
        _close(gw, _ref(F.quantize(g.t(), sg, dtype), F.quantize(x.t(), sx, dtype), sg, sx))
    if masks[2]:
        _close(gb, (g.double().sum(0), g.double().abs().sum(0)))
    else:
        assert gb.numel() == 0
    amax_expected = g.abs().max().float().item() if masks[0] or not masks[1] else 0.0
    assert amax_g.item() == amax_expected


def test_cublas_serves_the_shapes_its_rules_allow():
    # The fast path must not be refused silently: every dim a multiple of 16, E4M3 (and E4M3 x
    # E5M2) operands, bf16 and float32 outputs, with a bias on the bf16 one.
    _need_fp8()
    a8 = torch.randn(64, 96, device=DEV).to(E4M3)
    one = torch.ones((), device=DEV)
    for b8 in (torch.randn(48, 96, device=DEV).to(E4M3), torch.randn(48, 96, device=DEV).to(E5M2)):
        assert F._cublas_product(a8, b8, one, one, None, torch.float32) is not None
        bias = torch.randn(48, device=DEV).to(bf16)
        assert F._cublas_product(a8, b8, one, one, bias, bf16) is not None
    assert F._cublas_product(a8[:17], a8[:16], one, one, None, bf16) is None
    assert not F._REFUSED
