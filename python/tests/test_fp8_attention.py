"""FP8 attention in prefill: float8_e4m3fn q, k and v with their scales (floats, or f32 tensors
of one value or one per head) and a 16-bit output dtype. On the CPU: the argument checks (each
error names the argument, its value and what is allowed) and the marshalling, down to the
astrai::PrefillArgs the runtime would get (_C._prefill_args, in the extension's benchmark mode).
On an sm_90a GPU: the kernel against a float64 reference computed from the dequantized inputs,
with the bound of tests/gpu/test_fp8_attention.cpp."""
import math
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import astrai_jit
from astrai_jit import _C, _library, _ops

from reference import attention_ref, causal_keep

bf16, fp16, E4M3 = torch.bfloat16, torch.float16, torch.float8_e4m3fn


def raises(kind, pattern):
    return pytest.raises(kind, match=re.escape(pattern))


@pytest.fixture
def host_only():
    # The extension's benchmark mode: arguments checked and converted, CPU tensors accepted,
    # nothing launched.
    _C._set_host_only(True)
    yield
    _C._set_host_only(False)


def fp8_inputs(batch=2, q_len=5, kv_len=20, n_heads=8, n_kv_heads=2, head_dim=128):
    q = torch.randn(batch, q_len, n_heads, head_dim).to(E4M3)
    k = torch.randn(batch, kv_len, n_kv_heads, head_dim).to(E4M3)
    v = torch.randn(batch, kv_len, n_kv_heads, head_dim).to(E4M3)
    return q, k, v


def one():
    return torch.ones((), dtype=torch.float32)


SCALES = dict(q_scale=0.5, k_scale=0.25, v_scale=2.0)


def recorded(monkeypatch, run) -> tuple:
    # The extension's arguments in one eager prefill call.
    seen = []
    monkeypatch.setitem(_ops._PREFILL.__globals__, "_ext", lambda *args: seen.append(args))
    run()
    (args,) = seen
    return args


def options_of(args) -> dict:
    # The options pack of recorded prefill arguments, by name.
    names = re.findall(r"[(,] ?(\w+):", _C.prefill.__doc__.splitlines()[0])
    return dict(zip(_library._PACKED_NAMES, dict(zip(names, args))["options"]))


class TestMarshalling:
    def test_the_scales_and_p_fp16_trail_prefills_op_and_close_the_pack(self):
        assert [name for name, *_ in _library._PACKED_OPTIONS][-2:] == ["q_scale", "p_fp16"]
        assert _C._attention_option_fields()[-2:] == [("q_scale", "Tensor?", None), ("p_fp16", "bool", False)]
        schema = str(torch.ops.astrai_jit.prefill.default._schema)
        assert schema.endswith("Tensor? k_scale=None, Tensor? v_scale=None, Tensor? q_scale=None, bool p_fp16=False) "
                               "-> ()"), schema
        # paged_prefill takes them last too; the decode calls keep their signatures.
        schema = str(torch.ops.astrai_jit.paged_prefill.default._schema)
        assert schema.endswith("Tensor? alibi_slopes=None, Tensor? q_scale=None, bool p_fp16=False) -> ()"), schema
        for call in (_ops._DECODE, _ops._PAGED_DECODE):
            assert "q_scale" not in call.__code__.co_varnames and "p_fp16" not in call.__code__.co_varnames

    @pytest.mark.parametrize("p_dtype, want", [(None, False), (E4M3, False), (fp16, True)])
    def test_p_dtype_reaches_the_pack_and_the_runtime(self, monkeypatch, host_only, p_dtype, want):
        q, k, v = fp8_inputs()
        args = recorded(monkeypatch, lambda: astrai_jit.prefill(q, k, v, **SCALES, p_dtype=p_dtype, stream=0))
        assert options_of(args)["p_fp16"] is want
        assert _C._prefill_args(*args)["p_fp16"] is want

    def test_p_dtype_is_checked(self, host_only):
        q, k, v = fp8_inputs()
        with raises(TypeError, "prefill: p_dtype is torch.bfloat16 (allowed: None or torch.float8_e4m3fn, P rounded to "
                               "e4m3; torch.float16, P kept in f16)"):
            astrai_jit.prefill(q, k, v, **SCALES, p_dtype=bf16)
        q16, k16 = torch.randn(2, 5, 8, 128, dtype=bf16), torch.randn(2, 20, 2, 128, dtype=bf16)
        with raises(ValueError, "prefill: p_fp16 is set but qkv_dtype is same (allowed: with qkv_dtype e4m3 only"):
            astrai_jit.prefill(q16, k16, k16, p_dtype=fp16)
        with raises(TypeError, "prefill: p_fp16 is a int (allowed: a bool)"):
            pack = (0.0, 0.0, None, -1, None, None, None, None, 1)
            _C.prefill(q16, k16, k16, torch.empty_like(q16), None, None, -1, pack, 0)

    def test_tensor_scales_reach_the_pack_as_given(self, monkeypatch):
        q, k, v = fp8_inputs()
        qs, ks, vs = torch.ones(8), torch.ones(2), torch.ones(2)
        args = recorded(monkeypatch, lambda: astrai_jit.prefill(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs,
                                                                  causal_offset=15, stream=3))
        options = options_of(args)
        assert options["q_scale"] is qs and options["k_scale"] is ks and options["v_scale"] is vs
        assert options["sinks"] is None and options["alibi_slopes"] is None and options["window_left"] == -1

    def test_float_scales_become_f32_scalars_on_qs_device(self, monkeypatch):
        q, k, v = fp8_inputs()
        options = options_of(recorded(monkeypatch, lambda: astrai_jit.prefill(q, k, v, **SCALES, stream=3)))
        for name, value in SCALES.items():
            t = options[name]
            assert t.dtype == torch.float32 and t.shape == () and t.device == q.device and t.item() == value

    @pytest.mark.parametrize("out_dtype", [None, bf16, fp16])
    def test_out_is_allocated_in_out_dtype(self, monkeypatch, out_dtype):
        q, k, v = fp8_inputs()
        args = recorded(monkeypatch, lambda: astrai_jit.prefill(q, k, v, **SCALES, out_dtype=out_dtype, stream=3))
        out = args[3]
        assert out.dtype == (out_dtype or bf16) and out.shape == q.shape and out.is_contiguous()

    @pytest.mark.parametrize("per_head", [False, True])
    @pytest.mark.parametrize("out_dtype", [bf16, fp16])
    def test_what_reaches_the_runtime(self, monkeypatch, host_only, per_head, out_dtype):
        # The public call's extension arguments, converted as the extension converts them.
        q, k, v = fp8_inputs()
        qs = torch.rand(8) + 0.5 if per_head else torch.full((1,), 0.5)
        ks = torch.rand(2) + 0.5 if per_head else torch.full((), 0.25)
        vs = torch.rand(2) + 0.5 if per_head else torch.full((1,), 2.0)
        lse_args = recorded(monkeypatch, lambda: astrai_jit.prefill(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs,
                                                                      out_dtype=out_dtype, causal_offset=15,
                                                                      scale=0.125, return_lse=True, stream=0))
        a = _C._prefill_args(*lse_args)
        out, lse = lse_args[3], lse_args[4]
        assert a["qkv_dtype"] == "e4m3" and a["kv_dtype"] == "same"
        assert a["dtype"] == ("bf16" if out_dtype is bf16 else "fp16")
        assert (a["batch"], a["q_len"], a["kv_len"], a["n_heads"], a["n_kv_heads"], a["head_dim"]) == (2, 5, 20, 8, 2,
                                                                                                      128)
        assert a["q"] == q.data_ptr() and a["k"] == k.data_ptr() and a["v"] == v.data_ptr()
        assert a["out"] == out.data_ptr() and a["lse"] == lse.data_ptr() and a["mask"] == 0
        assert a["q_scale"] == qs.data_ptr() and a["k_scale"] == ks.data_ptr() and a["v_scale"] == vs.data_ptr()
        assert a["q_scale_per_head"] is per_head and a["kv_scale_per_head"] is per_head
        # Strides in elements, which for e4m3 are bytes.
        assert a["q_strides"] == (5 * 8 * 128, 8 * 128, 128) and a["k_strides"] == (20 * 2 * 128, 2 * 128, 128)
        assert a["out_strides"] == (5 * 8 * 128, 8 * 128, 128)
        assert a["causal_offset"] == 15 and a["logit_cap"] == 0.0 and a["window_left"] == -1
        assert a["scale"] == 0.125

    def test_strided_fp8_views_reach_the_runtime_with_their_strides(self, host_only):
        # k and v as halves of one [batch, kv_len, 2, n_kv_heads, head_dim] buffer.
        q, _, _ = fp8_inputs()
        kv = torch.randn(2, 20, 2, 2, 128).to(E4M3)
        out = torch.empty(q.shape, dtype=bf16)
        a = _C._prefill_args(q, kv[:, :, 0], kv[:, :, 1], out, None, None, -1, (0.0, 0.0, None, -1, one(), one(),
                                                                                 None, one()), 0)
        assert a["k"] == kv[:, :, 0].data_ptr() and a["v"] == kv[:, :, 1].data_ptr()
        assert a["k_strides"] == a["v_strides"] == (20 * 2 * 2 * 128, 2 * 2 * 128, 128)

    def test_a_16_bit_prefill_reaches_the_runtime_without_fp8(self, monkeypatch, host_only):
        q = torch.randn(2, 5, 8, 64, dtype=fp16)
        k = torch.randn(2, 20, 2, 64, dtype=fp16)
        a = _C._prefill_args(*recorded(monkeypatch, lambda: astrai_jit.prefill(q, k, k, stream=0)))
        assert a["qkv_dtype"] == "same" and a["dtype"] == "fp16"
        assert a["q_scale"] == a["k_scale"] == a["v_scale"] == 0 and not a["q_scale_per_head"]

    def test_a_traced_call_records_the_scales(self, monkeypatch):
        seen = []
        names = _library._TABLE["prefill"].names
        monkeypatch.setitem(_ops._PREFILL.__globals__, "_op0", lambda *args: seen.append(dict(zip(names, args))))
        with FakeTensorMode():
            q, k, v = fp8_inputs()
            qs, ks, vs = torch.ones(8), torch.ones(()), torch.ones(())
            out = astrai_jit.prefill(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs, out_dtype=fp16)
        (op,) = seen
        assert op["q_scale"] is qs and op["k_scale"] is ks and op["v_scale"] is vs and op["out"] is out
        assert out.dtype == fp16 and op["stream"] == -1


class TestChecks:
    """Each refusal names the argument, its value and what is allowed, before anything runs."""

    @pytest.mark.parametrize("scales", [SCALES, dict(q_scale=torch.ones(8), k_scale=torch.ones(2),
                                                     v_scale=torch.ones(2)),
                                        dict(q_scale=torch.ones(1), k_scale=one(), v_scale=torch.ones(1))],
                             ids=["floats", "per-head", "tensors"])
    def test_fp8_q_k_and_v_pass_every_check(self, host_only, scales):
        q, k, v = fp8_inputs()
        out, lse = astrai_jit.prefill(q, k, v, **scales, causal_offset=15, return_lse=True)
        assert out.dtype == bf16 and out.shape == q.shape and lse.shape == (2, 5, 8)
        assert astrai_jit.prefill(q, k, v, **scales, out_dtype=fp16).dtype == fp16
        given = torch.empty(q.shape, dtype=fp16)
        assert astrai_jit.prefill(q, k, v, **scales, out=given) is given

    def test_cpu_tensors_are_refused_by_device_outside_benchmark_mode(self):
        with raises(ValueError, "prefill: q is on cpu (allowed: a CUDA device)"):
            astrai_jit.prefill(*fp8_inputs(), **SCALES)

    def test_fp8_q_with_a_16_bit_k_or_v(self, host_only):
        q, k, v = fp8_inputs()
        with raises(TypeError, "prefill: k has dtype bfloat16 (allowed: float8_e4m3fn, the dtype of q: FP8 attention "
                               "takes q, k and v in e4m3)"):
            astrai_jit.prefill(q, k.to(bf16), v, **SCALES)
        with raises(TypeError, "prefill: v has dtype float8_e5m2 (allowed: float8_e4m3fn, the dtype of q"):
            astrai_jit.prefill(q, k, v.float().to(torch.float8_e5m2), **SCALES)

    def test_fp8_k_or_v_with_a_16_bit_q(self, host_only):
        q, k, v = fp8_inputs()
        with raises(TypeError, "prefill: k has dtype float8_e4m3fn but q has dtype bfloat16 (allowed: bfloat16, the "
                               "dtype of q; or float8_e4m3fn q, k and v together, FP8 attention)"):
            astrai_jit.prefill(q.to(bf16), k, v)
        with raises(TypeError, "prefill: v has dtype float8_e4m3fn but q has dtype float16"):
            astrai_jit.prefill(q.to(fp16), k.to(fp16), v)

    def test_e5m2_q_is_refused(self, host_only):
        q, k, v = (t.float().to(torch.float8_e5m2) for t in fp8_inputs())
        with raises(TypeError, "prefill: q has dtype float8_e5m2 (allowed: bfloat16, float16, or float8_e4m3fn with "
                               "k and v float8_e4m3fn too)"):
            astrai_jit.prefill(q, k, v, **SCALES)

    @pytest.mark.parametrize("name", ["q_scale", "k_scale", "v_scale"])
    def test_scales_with_a_16_bit_q_are_refused(self, host_only, name):
        q = torch.randn(2, 5, 8, 128, dtype=bf16)
        k = torch.randn(2, 20, 2, 128, dtype=bf16)
        with raises(ValueError, f"prefill: {name} is given but q has dtype bfloat16 (allowed: None; scales come with "
                                f"float8_e4m3fn q, k and v, FP8 attention)"):
            astrai_jit.prefill(q, k, k, **{name: 1.0})
        with raises(ValueError, f"prefill: {name} is given but q has dtype bfloat16"):
            astrai_jit.prefill(q, k, k, **{name: torch.ones(1)})

    def test_each_scale_is_required(self, host_only):
        q, k, v = fp8_inputs()
        with raises(ValueError, "prefill: q has dtype float8_e4m3fn but q_scale is missing (allowed: an f32 scale, "
                                "[] or [1], or [n_heads])"):
            astrai_jit.prefill(q, k, v)
        with raises(ValueError, "prefill: k has dtype float8_e4m3fn but k_scale is missing (allowed: an f32 scale, "
                                "[] or [1], or [n_kv_heads])"):
            astrai_jit.prefill(q, k, v, q_scale=1.0, v_scale=1.0)
        with raises(ValueError, "prefill: k has dtype float8_e4m3fn but v_scale is missing"):
            astrai_jit.prefill(q, k, v, q_scale=1.0, k_scale=1.0)

    def test_scale_shapes_and_dtypes(self, host_only):
        q, k, v = fp8_inputs()
        with raises(ValueError, "prefill: q_scale has shape [3]: dim 0 is 3 (allowed: 8, n_heads of q, or 1 for one "
                                "scale)"):
            astrai_jit.prefill(q, k, v, q_scale=torch.ones(3), k_scale=1.0, v_scale=1.0)
        with raises(ValueError, "prefill: q_scale has shape [1, 8] (allowed: [] or [1] for one scale, or [n_heads])"):
            astrai_jit.prefill(q, k, v, q_scale=torch.ones(1, 8), k_scale=1.0, v_scale=1.0)
        with raises(ValueError, "prefill: k_scale has shape [8]: dim 0 is 8 (allowed: 2, n_kv_heads, or 1 for one "
                                "scale)"):
            astrai_jit.prefill(q, k, v, q_scale=1.0, k_scale=torch.ones(8), v_scale=torch.ones(8))
        with raises(ValueError, "prefill: v_scale has 1 values but k_scale has 2 (allowed: one scale each, or one per "
                                "KV head each)"):
            astrai_jit.prefill(q, k, v, q_scale=1.0, k_scale=torch.ones(2), v_scale=1.0)
        with raises(TypeError, "prefill: q_scale has dtype bfloat16 (allowed: float32)"):
            astrai_jit.prefill(q, k, v, q_scale=torch.ones(8, dtype=bf16), k_scale=1.0, v_scale=1.0)
        with raises(ValueError, "prefill: q_scale is not contiguous"):
            astrai_jit.prefill(q, k, v, q_scale=torch.ones(16)[::2], k_scale=1.0, v_scale=1.0)

    def test_float_scales_must_be_positive_finite_numbers(self, host_only):
        args = fp8_inputs()
        with raises(ValueError, "prefill: q_scale -1.0 is not a positive finite number (allowed: > 0)"):
            astrai_jit.prefill(*args, q_scale=-1.0, k_scale=1.0, v_scale=1.0)
        with raises(ValueError, "prefill: v_scale inf is not a positive finite number"):
            astrai_jit.prefill(*args, q_scale=1.0, k_scale=1.0, v_scale=math.inf)
        with raises(TypeError, "prefill: k_scale is a str (allowed: a float > 0, or an f32 tensor, [] or [1], or "
                               "[n_kv_heads])"):
            astrai_jit.prefill(*args, q_scale=1.0, k_scale="1", v_scale=1.0)
        with raises(TypeError, "prefill: q_scale is a bool (allowed: a float > 0, or an f32 tensor, [] or [1], or "
                               "[n_heads])"):
            astrai_jit.prefill(*args, q_scale=True, k_scale=1.0, v_scale=1.0)

    @pytest.mark.parametrize("head_dim", [96, 192])
    def test_head_dims_other_than_64_128_and_256_are_refused(self, host_only, head_dim):
        with raises(ValueError, f"prefill: head_dim {head_dim} is not served with qkv_dtype e4m3 (FP8 attention: "
                                f"float8_e4m3fn q, k and v) (allowed: 64, 128 or 256)"):
            astrai_jit.prefill(*fp8_inputs(head_dim=head_dim), **SCALES)

    @pytest.mark.parametrize("head_dim", [64, 256])
    def test_p_fp16_beside_head_dim_128_is_refused(self, host_only, head_dim):
        with raises(ValueError, "prefill: P in f16 (p_fp16; p_dtype torch.float16 in Python) is not served at "
                                f"head_dim {head_dim} with qkv_dtype e4m3"):
            astrai_jit.prefill(*fp8_inputs(head_dim=head_dim), **SCALES, p_dtype=torch.float16)

    def test_other_options_and_a_mask_are_refused(self, host_only):
        q, k, v = fp8_inputs()
        with raises(ValueError, "prefill: logit_cap 30 is not served with qkv_dtype e4m3 (FP8 attention: "
                                "float8_e4m3fn q, k and v) (allowed: none of logit_cap, sinks, window_left, "
                                "alibi_slopes)"):
            astrai_jit.prefill(q, k, v, **SCALES, logit_cap=30.0)
        with raises(ValueError, "prefill: window_left 4 is not served with qkv_dtype e4m3"):
            astrai_jit.prefill(q, k, v, **SCALES, causal_offset=15, window_left=4)
        with raises(ValueError, "prefill: sinks = 0x"):
            astrai_jit.prefill(q, k, v, **SCALES, sinks=torch.zeros(8))
        with raises(ValueError, "is not served with qkv_dtype e4m3 (FP8 attention: float8_e4m3fn q, k and v) "
                                "(allowed: none; causal_offset for a causal prefill)"):
            astrai_jit.prefill(q, k, v, **SCALES, mask=torch.ones(2, 20, dtype=torch.bool))

    def test_out_dtype(self, host_only):
        q, k, v = fp8_inputs()
        with raises(TypeError, "prefill: out_dtype is torch.float32 (allowed: torch.bfloat16, torch.float16, or None)"):
            astrai_jit.prefill(q, k, v, **SCALES, out_dtype=torch.float32)
        with raises(TypeError, "prefill: out has dtype torch.bfloat16 but out_dtype is torch.float16 (allowed: an out "
                               "of dtype out_dtype, or out_dtype None)"):
            astrai_jit.prefill(q, k, v, **SCALES, out=torch.empty(q.shape, dtype=bf16), out_dtype=fp16)
        with raises(TypeError, "prefill: out has dtype float32 (allowed: bfloat16, float16)"):
            astrai_jit.prefill(q, k, v, **SCALES, out=torch.empty(q.shape))
        q16, k16 = torch.randn(2, 5, 8, 128, dtype=bf16), torch.randn(2, 20, 2, 128, dtype=bf16)
        with raises(TypeError, "prefill: out_dtype is torch.float16 but q has dtype torch.bfloat16 (allowed: None or "
                               "torch.bfloat16, the dtype of q; another output dtype needs float8_e4m3fn q, k and v)"):
            astrai_jit.prefill(q16, k16, k16, out_dtype=fp16)
        assert astrai_jit.prefill(q16, k16, k16, out_dtype=bf16).dtype == bf16

    def test_decode_calls_refuse_fp8_q_by_name(self, host_only):
        q8 = torch.randn(7, 8, 128).to(E4M3)
        cache = torch.randn(10, 16, 2, 128, dtype=bf16)
        table = torch.zeros(2, 4, dtype=torch.int32)
        lens = torch.ones(2, dtype=torch.int32)
        allowed = "(allowed: bfloat16, float16; float8_e4m3fn q, k and v are served by prefill and paged_prefill only)"
        with raises(TypeError, f"paged_decode: q has dtype float8_e4m3fn {allowed}"):
            astrai_jit.paged_decode(q8[:2], cache, cache, table, lens)
        with raises(TypeError, f"decode: q has dtype float8_e4m3fn {allowed}"):
            astrai_jit.decode(q8[:2, None], *[torch.randn(2, 20, 2, 128).to(E4M3)] * 2, k_scale=one(), v_scale=one())
        with pytest.raises(TypeError, match="q_scale"):  # not an argument of the decode calls
            astrai_jit.paged_decode(q8[:2], cache, cache, table, lens, q_scale=1.0)

    def test_q_scale_in_another_calls_pack_is_refused(self, host_only):
        # A direct extension caller: q_scale is FP8 attention's, prefill's alone.
        q = torch.randn(2, 8, 64, dtype=bf16)
        cache = torch.randn(10, 16, 2, 64, dtype=bf16)
        table = torch.zeros(2, 4, dtype=torch.int32)
        pack = (0.0, 0.0, None, -1, None, None, None, torch.ones(1))
        with raises(ValueError, "paged_decode: q_scale is given but q is not float8_e4m3fn (allowed: None"):
            _C.paged_decode(q, cache, cache, table, None, torch.empty_like(q), None, None, None, None, None, pack, 0)


def paged_inputs(page_size=16, head_dim=128, cache_dtype=E4M3):
    # 2 requests (3 and 4 query rows) over a 10-page e4m3 cache.
    q = torch.randn(7, 8, head_dim).to(E4M3)
    cache = torch.randn(10, page_size, 2, head_dim).to(cache_dtype)
    table = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    lens = torch.tensor([20, 30], dtype=torch.int32)
    indptr = torch.tensor([0, 3, 7], dtype=torch.int32)
    return q, cache, cache.clone(), table, lens, indptr


class TestPaged:
    """paged_prefill with float8_e4m3fn q and cache: FP8 attention over pages."""

    @pytest.mark.parametrize("out_dtype", [None, fp16])
    def test_fp8_q_and_cache_pass_every_check(self, host_only, out_dtype):
        q, k, v, table, lens, indptr = paged_inputs()
        out = astrai_jit.paged_prefill(q, k, v, table, lens, indptr, **SCALES, out_dtype=out_dtype, max_q_len=4)
        assert out.dtype == (out_dtype or bf16) and out.shape == q.shape
        out, lse = astrai_jit.paged_prefill(q, k, v, table.long(), lens.long(), indptr.long(), q_scale=torch.ones(8),
                                            k_scale=torch.ones(2), v_scale=torch.ones(2), causal=False,
                                            return_lse=True)
        assert lse.shape == (7, 8) and lse.dtype == torch.float32

    def test_the_scales_reach_the_pack(self, monkeypatch):
        q, k, v, table, lens, indptr = paged_inputs()
        seen = []
        monkeypatch.setitem(_ops._PAGED_PREFILL.__globals__, "_ext", lambda *args: seen.append(args))
        astrai_jit.paged_prefill(q, k, v, table, lens, indptr, **SCALES, stream=3)
        (args,) = seen
        names = re.findall(r"[(,] ?(\w+):", _C.paged_prefill.__doc__.splitlines()[0])
        options = dict(zip(_library._PACKED_NAMES, dict(zip(names, args))["options"]))
        for name, value in SCALES.items():
            t = options[name]
            assert t.dtype == torch.float32 and t.shape == () and t.item() == value
        assert args[6].dtype == bf16 and args[6].shape == q.shape  # out

    @pytest.mark.parametrize("page_size", [1, 4])
    def test_pages_under_8_tokens_are_refused(self, host_only, page_size):
        with raises(ValueError, f"paged_prefill: page_size {page_size} is not served with qkv_dtype e4m3 (FP8 "
                                f"attention: float8_e4m3fn q, k and v) (allowed: 8 or more)"):
            astrai_jit.paged_prefill(*paged_inputs(page_size=page_size), **SCALES)

    def test_other_head_dims_options_and_a_mask_are_refused(self, host_only):
        with raises(ValueError, "paged_prefill: head_dim 192 is not served with qkv_dtype e4m3 (FP8 attention: "
                                "float8_e4m3fn q, k and v) (allowed: 64, 128 or 256)"):
            astrai_jit.paged_prefill(*paged_inputs(head_dim=192), **SCALES)
        args = paged_inputs()
        with raises(ValueError, "paged_prefill: window_left 8 is not served with qkv_dtype e4m3"):
            astrai_jit.paged_prefill(*args, **SCALES, window_left=8)
        with raises(ValueError, "(allowed: none; causal for a causal prefill)"):
            astrai_jit.paged_prefill(*args, **SCALES, mask=torch.ones(7, 64, dtype=torch.bool))

    def test_fp8_q_needs_an_e4m3_cache_and_every_scale(self, host_only):
        q, k, v, table, lens, indptr = paged_inputs(cache_dtype=bf16)
        with raises(TypeError, "paged_prefill: k_cache has dtype bfloat16 (allowed: float8_e4m3fn, the dtype of q: "
                               "FP8 attention takes q, k and v in e4m3)"):
            astrai_jit.paged_prefill(q, k, v, table, lens, indptr, **SCALES)
        q, k, v, table, lens, indptr = paged_inputs()
        with raises(ValueError, "paged_prefill: q has dtype float8_e4m3fn but q_scale is missing"):
            astrai_jit.paged_prefill(q, k, v, table, lens, indptr, k_scale=1.0, v_scale=1.0)
        with raises(ValueError, "paged_prefill: k_cache has dtype float8_e4m3fn but v_scale is missing"):
            astrai_jit.paged_prefill(q, k, v, table, lens, indptr, q_scale=1.0, k_scale=1.0)

    def test_a_16_bit_q_over_an_fp8_cache_is_the_caches_path(self, host_only):
        # k_scale and v_scale with a bfloat16 q: the FP8 cache, as before; q_scale is refused there.
        _, k, v, table, lens, indptr = paged_inputs()
        q16 = torch.randn(7, 8, 128, dtype=bf16)
        out = astrai_jit.paged_prefill(q16, k, v, table, lens, indptr, k_scale=one(), v_scale=one())
        assert out.dtype == bf16
        with raises(ValueError, "paged_prefill: q_scale is given but q has dtype bfloat16"):
            astrai_jit.paged_prefill(q16, k, v, table, lens, indptr, q_scale=1.0, k_scale=one(), v_scale=one())


# --- On the GPU -----------------------------------------------------------------------------

UNIT_ROUNDOFF = {bf16: 2.0 ** -8, fp16: 2.0 ** -11}


def _need_sm90a():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("FP8 attention runs on sm_90a (Hopper) only")


def _quantize(x, per_head):
    """x [B, L, H, D] as e4m3 codes and f32 scales (one, or one per head): each scale's largest
    magnitude lands on 448, as the C++ test quantizes."""
    amax = x.abs().amax(dim=(0, 1, 3)) if per_head else x.abs().amax().reshape(1)
    scales = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax)).float()
    codes = (x / (scales[None, None, :, None] if per_head else scales)).to(E4M3)
    return codes, scales


def _score_magnitude(qd, kd, keep):
    """[B, Lq, H]: the largest scaled sum of |q_d k_d| over the keys a row sees (0 for none). The
    tensor cores sum e4m3 products with fewer bits than f32 keeps, so a row's scores, and its LSE,
    come out low by a share of it (a shift common to the row that leaves O alone); the LSE is
    allowed SCORE_SUM_SHARE of it."""
    group = qd.shape[2] // kd.shape[2]
    sums = torch.einsum("bqhd,bkhd->bhqk", qd.abs(), kd.abs().repeat_interleave(group, dim=2)) / math.sqrt(qd.shape[3])
    if keep is not None:
        sums = sums.masked_fill(~keep[:, None], 0.0)
    return sums.amax(dim=-1).transpose(1, 2)


SCORE_SUM_SHARE = 1.0 / 64


def _dequantized(codes, scales):
    s = scales.double()
    return codes.double() * (s[None, None, :, None] if s.numel() > 1 else s)


CASES = [  # dtype, batch, q_len, kv_len, n_heads, n_kv_heads, causal_offset, per-head q, per-head k/v, peaked
    (bf16, 1, 1, 1, 4, 1, -1, False, False, False),
    (bf16, 2, 129, 129, 8, 2, 0, False, False, False),
    (bf16, 1, 200, 333, 4, 4, 333 - 200, True, True, False),
    (fp16, 2, 64, 1000, 16, 2, -1, False, True, False),
    (bf16, 1, 256, 256, 8, 1, 0, True, False, True),
    (fp16, 3, 65, 127, 4, 1, 127 - 65, False, False, True),
    (bf16, 1, 1024, 1024, 8, 8, 0, False, False, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}-B{}-q{}-kv{}-h{}/{}-c{}-qh{}-kvh{}-peaked{}".format(
    "bf16" if c[0] is bf16 else "fp16", *c[1:]))
@pytest.mark.parametrize("d", [64, 128, 256], ids=lambda d: f"hd{d}")
def test_fp8_attention_against_the_dequantized_reference(case, d):
    _need_sm90a()
    dtype, batch, q_len, kv_len, n_heads, n_kv_heads, causal_offset, per_head_q, per_head_kv, peaked = case
    dev = "cuda"

    def draw(*shape):
        # Normal values, a few of them (0.2%) 8 times larger: outliers set the scales.
        x = torch.randn(*shape, device=dev)
        return x * torch.where(torch.rand(*shape, device=dev) < 0.002, 8.0, 1.0)

    q, k, v = draw(batch, q_len, n_heads, d), draw(batch, kv_len, n_kv_heads, d), draw(batch, kv_len, n_kv_heads, d)
    group = n_heads // n_kv_heads
    if peaked:
        # q = 2.5 k_j + noise for a key j the row sees: a misplaced P column or V row shows as a
        # wrong row, not as noise.
        last = torch.arange(q_len, device=dev) + causal_offset if causal_offset >= 0 else \
            torch.full((q_len,), kv_len - 1, device=dev)
        last = last.clamp(max=kv_len - 1)
        j = (torch.rand(batch, q_len, n_heads, device=dev) * (last[None, :, None] + 1)).long()
        heads = torch.arange(n_heads, device=dev) // group
        b_index = torch.arange(batch, device=dev)[:, None, None]
        q = 2.5 * k[b_index, j, heads[None, None, :]] + 0.1 * torch.randn_like(q)
    q8, qs = _quantize(q, per_head_q)
    k8, ks = _quantize(k, per_head_kv)
    v8, vs = _quantize(v, per_head_kv)
    out, lse = astrai_jit.prefill(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, out_dtype=dtype,
                                  causal_offset=causal_offset, return_lse=True)
    torch.cuda.synchronize()
    assert out.dtype == dtype and out.shape == q8.shape

    qd, kd, vd = _dequantized(q8, qs), _dequantized(k8, ks), _dequantized(v8, vs)
    keep = causal_keep(batch, q_len, kv_len, causal_offset, dev) if causal_offset >= 0 else None
    want, lse_want = attention_ref(qd, kd, vd, keep)
    # The C++ test's bound: P's e4m3 rounding (2^-4 of each weight at most) over the values
    # averaged, plus the output format's rounding: 0.0625 v_max + 2 u |want| + 1e-6, v_max being
    # the largest |v| among the row's visible keys over the dims up to this one.
    # A row sees keys 0..last: the prefix maxima of |v| over the keys, at each row's last key.
    last = (torch.arange(q_len, device=dev) + causal_offset).clamp(max=kv_len - 1) if causal_offset >= 0 else \
        torch.full((q_len,), kv_len - 1, device=dev)
    prefix_max = vd.abs().cummax(dim=1).values  # [B, Lk, Hkv, D]
    column_max = prefix_max[:, last].repeat_interleave(group, dim=2)  # [B, Lq, H, D]
    v_max = column_max.cummax(dim=-1).values
    error = (out.double() - want).abs()
    bound = 0.0625 * v_max + 2 * UNIT_ROUNDOFF[dtype] * want.abs() + 1e-6
    bad = ~(error <= bound)
    assert not bad.any(), (f"{int(bad.sum())} elements past the bound, first at {bad.nonzero()[0].tolist()}: got "
                           f"{out.double()[bad][0].item()} want {want[bad][0].item()} bound {bound[bad][0].item()}")
    lse_error = (lse.double() - lse_want).abs()
    lse_bound = 2e-3 + 1e-5 * lse_want.abs() + SCORE_SUM_SHARE * _score_magnitude(qd, kd, keep)
    assert (lse_error <= lse_bound).all(), lse_error.max().item()
    # On average the roundings cancel: the RMS error stays well under the per-element bound.
    rms = math.sqrt((error ** 2).sum().item() / max((want ** 2).sum().item(), 1e-300))
    assert rms < 0.03, rms
    assert any(".qkv_e4m3.wgmma." in name for name in astrai_jit.loaded_variants())


@pytest.mark.gpu
def test_fp8_attention_refuses_a_missing_scale_on_the_gpu_too():
    q, k, v = (t.cuda() for t in fp8_inputs())
    with raises(ValueError, "prefill: q has dtype float8_e4m3fn but q_scale is missing"):
        astrai_jit.prefill(q, k, v, k_scale=1.0, v_scale=1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [8, 16, 64])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("p_dtype", [None, fp16])
def test_paged_fp8_attention_against_the_dequantized_reference(page_size, causal, p_dtype):
    # Two requests whose KV ends mid-page (the rest of the page: NaN codes, which no output may
    # show), q shorter than the KV (chunked prefill) and as long; per-head scales, GQA 4; P in
    # e4m3 or (p_dtype float16) in f16, under a tighter bound.
    _need_sm90a()
    dev, d, heads, kv_heads = "cuda", 128, 8, 2
    kv_lens, q_lens = [300, 77], [100, 77]
    k, v = torch.randn(2, 300, kv_heads, d, device=dev), torch.randn(2, 300, kv_heads, d, device=dev)
    q = torch.randn(2, 100, heads, d, device=dev)
    q8, qs = _quantize(q, True)
    k8, ks = _quantize(k, True)
    v8, vs = _quantize(v, True)
    pages_per_seq = -(-300 // page_size)
    table = torch.randperm(2 * pages_per_seq, device=dev, dtype=torch.int32).reshape(2, pages_per_seq)
    nan = torch.full((1,), 0x7F, dtype=torch.uint8, device=dev).view(E4M3)
    k_cache = nan.expand(2 * pages_per_seq * page_size * kv_heads * d).reshape(-1, page_size, kv_heads, d).clone()
    v_cache = k_cache.clone()
    for b in range(2):
        for j in range(0, kv_lens[b], page_size):
            n = min(page_size, kv_lens[b] - j)
            page = table[b, j // page_size]
            k_cache[page, :n] = k8[b, j:j + n]
            v_cache[page, :n] = v8[b, j:j + n]
    q_rows = torch.cat([q8[b, :q_lens[b]] for b in range(2)])
    indptr = torch.tensor([0, q_lens[0], q_lens[0] + q_lens[1]], dtype=torch.int32, device=dev)
    lens = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    out, lse = astrai_jit.paged_prefill(q_rows, k_cache, v_cache, table, lens, indptr, q_scale=qs, k_scale=ks,
                                        v_scale=vs, causal=causal, return_lse=True, max_q_len=max(q_lens),
                                        p_dtype=p_dtype)
    torch.cuda.synchronize()
    assert out.dtype == bf16 and out.shape == q_rows.shape
    qd, kd, vd = _dequantized(q8, qs), _dequantized(k8, ks), _dequantized(v8, vs)
    for b in range(2):
        rows = slice(int(indptr[b]), int(indptr[b + 1]))
        kv, ql = kv_lens[b], q_lens[b]
        keep = causal_keep(1, ql, kv, kv - ql, dev) if causal else None
        want, lse_want = attention_ref(qd[b:b + 1, :ql], kd[b:b + 1, :kv], vd[b:b + 1, :kv], keep)
        got = out[rows].double()[None]
        v_max = vd[b, :kv].abs().amax().item()
        error = (got - want).abs()
        bound = (0.004 if p_dtype is fp16 else 0.0625) * v_max + 2 * UNIT_ROUNDOFF[bf16] * want.abs() + 1e-6
        assert torch.isfinite(got).all(), f"request {b}: a NaN from the page's tail reached the output"
        assert (error <= bound).all(), (b, error.max().item())
        lse_bound = 2e-3 + 1e-5 * lse_want.abs() + SCORE_SUM_SHARE * _score_magnitude(qd[b:b + 1, :ql],
                                                                                    kd[b:b + 1, :kv], keep)
        assert ((lse[rows].double()[None] - lse_want).abs() <= lse_bound).all()
        rms = math.sqrt((error ** 2).sum().item() / max((want ** 2).sum().item(), 1e-300))
        assert rms < (0.005 if p_dtype is fp16 else 0.03), (b, rms)
