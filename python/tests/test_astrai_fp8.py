# AstrAI's fp8_mm module as astrai-jit serves it (astrai_jit/astrai_fp8.py): the quantizer and
# the float32 product path on the CPU against float64 math, and the argument checks. The CUDA
# entry points, cuBLASLt's path included, run in test_astrai_csrc_gpu.py.
import pytest

torch = pytest.importorskip("torch")

import astrai_jit.astrai_fp8 as F  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.mark.parametrize("dtype, limit", [(E4M3, 448.0), (E5M2, 57344.0)])
def test_quantize_divides_by_the_step_and_saturates(dtype, limit):
    x = torch.tensor([0.0, 1.0, -3.0, 1e6, -1e6, float("nan")])
    scale = torch.tensor([0.5])
    q = F.quantize(x, scale, dtype).float()
    assert q[:3].tolist() == [0.0, 2.0, -6.0]
    assert q[3].item() == limit and q[4].item() == -limit  # saturated, not NaN
    assert torch.isnan(q[5])


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (17, 9, 33), (32, 48, 96)])
def test_the_float32_product_is_the_scaled_product_of_the_fp8_values(m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    a = torch.randn(m, k, generator=gen) * 3
    b = torch.randn(n, k, generator=gen)
    sa, sb = torch.tensor([a.abs().max() / 448]), torch.tensor([0.01])
    a8, b8 = F.quantize(a, sa, E4M3), F.quantize(b, sb, E5M2)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    want = a8.double() @ b8.double().t() * sa.double() * sb.double() + bias.double()
    got = F.scaled_product(a8, b8, sa, sb, bias=bias)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    torch.testing.assert_close(got.double(), want, rtol=2 ** -8, atol=1e-6 * want.abs().max().item())
    # FP8 output: the product times out_scale (AstrAI's convention, not a step), saturated.
    want = a8.double() @ b8.double().t() * sa.double() * sb.double()
    out_scale = torch.tensor([100 / want.abs().max().item()])
    got8 = F.scaled_product(a8, b8, sa, sb, out_dtype=E4M3, out_scale=out_scale)
    assert got8.dtype == E4M3
    torch.testing.assert_close(got8.double(), want * out_scale.double(), rtol=2 ** -3, atol=2 ** -6)
    big = F.scaled_product(a8, b8, sa, sb, out_dtype=E4M3, out_scale=out_scale * 1e4).float()
    assert big.abs().max().item() == 448.0 and not big.isnan().any()  # saturated


def test_the_entry_points_name_what_they_refuse():
    a = torch.zeros(4, 8, dtype=torch.bfloat16)
    s = torch.ones(1)
    with pytest.raises(ValueError, match="fp8_mm: a must be a CUDA tensor"):
        F.fp8_mm(a, a, s, s)
    with pytest.raises(ValueError, match="quantize_bf16: x must be a CUDA tensor"):
        F.quantize_bf16(a, s, 0)
    with pytest.raises(ValueError, match=r"fmt 2 is not valid \(allowed: 0 = E4M3, 1 = E5M2\)"):
        F._format(2)
    with pytest.raises(ValueError, match="mm_fp8: a must be a CUDA tensor"):
        F.mm_fp8(a.to(E4M3), a.to(E4M3), s, s)
    with pytest.raises(ValueError, match="linear_backward_fp8: g must be a CUDA tensor"):
        F.linear_backward_fp8(a, a, a, [1, 1, 1], s, s, s, 1)
