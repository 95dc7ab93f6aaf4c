"""Bad input raises TypeError / ValueError naming the argument, before any GPU work (CPU)."""
import re

import pytest
import torch

import astrai_jit
from astrai_jit import _library

bf16 = torch.bfloat16


def paged_inputs(batch=2, n_heads=8, n_kv_heads=2, head_dim=64, page_size=16, num_pages=10, max_pages=4,
                 device="cpu", dtype=bf16):
    q = torch.randn(batch, n_heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(num_pages, page_size, n_kv_heads, head_dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    table = torch.zeros(batch, max_pages, dtype=torch.int32, device=device)
    lens = torch.ones(batch, dtype=torch.int32, device=device)
    return q, k, v, table, lens


def raises(kind, pattern):
    return pytest.raises(kind, match=re.escape(pattern))


class TestPagedDecode:
    def test_cpu_tensors_are_refused_naming_the_device(self):
        with raises(ValueError, "paged_decode: q is on cpu (allowed: a CUDA device)"):
            astrai_jit.paged_decode(*paged_inputs())

    def test_invalid_argument_is_a_value_error_and_an_astrai_error(self):
        with pytest.raises(astrai_jit.InvalidArgument) as info:
            astrai_jit.paged_decode(*paged_inputs())
        assert isinstance(info.value, ValueError) and isinstance(info.value, astrai_jit.Error)

    def test_int16_page_table_is_a_type_error(self):
        q, k, v, table, lens = paged_inputs()
        with raises(TypeError, "paged_decode: page_table has dtype int16 (allowed: int32 or int64)"):
            astrai_jit.paged_decode(q, k, v, table.short(), lens)

    def test_float_seq_lens_is_a_type_error(self):
        q, k, v, table, lens = paged_inputs()
        with raises(TypeError, "paged_decode: seq_lens has dtype float32 (allowed: int32 or int64)"):
            astrai_jit.paged_decode(q, k, v, table, lens.float())

    def test_int64_tables_pass_the_dtype_checks(self):
        # Read in place at either width: the call gets as far as the device check.
        q, k, v, table, lens = paged_inputs()
        with raises(ValueError, "paged_decode: q is on cpu"):
            astrai_jit.paged_decode(q, k, v, table.long(), lens.long(), req_indices=torch.zeros(2, dtype=torch.long))

    def test_offsets_need_batch_plus_one(self):
        q, k, v, table, lens = paged_inputs()
        with raises(ValueError, "paged_decode: kv_indptr has shape [2]: dim 0 is 2 (allowed: 3"):
            astrai_jit.paged_decode(q, k, v, table, None, kv_indptr=lens)
        with raises(ValueError, "paged_decode: seq_lens and kv_indptr are both given"):
            astrai_jit.paged_decode(q, k, v, table, lens, kv_indptr=lens)

    def test_float32_q_is_a_type_error(self):
        q, k, v, table, lens = paged_inputs()
        with raises(TypeError, "paged_decode: q has dtype float32 (allowed: bfloat16, float16)"):
            astrai_jit.paged_decode(q.float(), k, v, table, lens)

    def test_cache_dtype_must_match_q(self):
        q, k, v, table, lens = paged_inputs()
        with raises(TypeError, "paged_decode: k_cache has dtype float16 (allowed: bfloat16 (the dtype of q), "
                               "float8_e4m3fn, float8_e5m2)"):
            astrai_jit.paged_decode(q, k.half(), v, table, lens)

    def test_head_dim_mismatch_names_both_shapes(self):
        q, k, v, table, lens = paged_inputs()
        with raises(ValueError, "paged_decode: k_cache has shape [10, 16, 2, 64]: dim 3 is 64 (allowed: 48"):
            astrai_jit.paged_decode(q[..., :48], k, v, table, lens)

    def test_v_cache_shape_must_match_k_cache(self):
        q, k, v, table, lens = paged_inputs()
        with raises(ValueError, "paged_decode: v_cache has shape [10, 8, 2, 64] (allowed: [10, 16, 2, 64]"):
            astrai_jit.paged_decode(q, k, v[:, :8], table, lens)

    def test_wrong_rank(self):
        q, k, v, table, lens = paged_inputs()
        with raises(ValueError, "paged_decode: q has shape [8, 64] (allowed: [batch, n_heads, head_dim] or "
                                "[batch, q_len, n_heads, head_dim])"):
            astrai_jit.paged_decode(q[0], k, v, table, lens)
        with raises(ValueError, "paged_decode: q has shape [2, 1, 1, 8, 64] (allowed: [batch, n_heads, head_dim] or "
                                "[batch, q_len, n_heads, head_dim])"):
            astrai_jit.paged_decode(q[:, None, None], k, v, table, lens)

    @pytest.mark.parametrize("q_len", [1, 2, 4, 8])
    def test_a_4d_q_carries_q_len_tokens(self, q_len):
        # Every shape check passes (multi-token decode); only the CPU device is refused.
        q, k, v, table, lens = paged_inputs()
        q4 = torch.randn(2, q_len, 8, 64, dtype=bf16)
        with raises(ValueError, "paged_decode: q is on cpu (allowed: a CUDA device)"):
            astrai_jit.paged_decode(q4, k, v, table, lens)
        with raises(ValueError, "paged_decode: q is on cpu"):  # [batch, n_heads, q_len, head_dim] storage
            astrai_jit.paged_decode(torch.randn(2, 8, q_len, 64, dtype=bf16).transpose(1, 2), k, v, table, lens,
                                    return_lse=True)

    @pytest.mark.parametrize("q_len", [0, 9])
    def test_q_len_outside_1_to_8_is_refused_by_name(self, q_len):
        q, k, v, table, lens = paged_inputs()
        with raises(ValueError, f"paged_decode: q_len {q_len} is not valid (allowed: 1..8)"):
            astrai_jit.paged_decode(torch.randn(2, q_len, 8, 64, dtype=bf16), k, v, table, lens)

    def test_fused_append_takes_one_token(self):
        q, k, v, table, lens = paged_inputs()
        new = torch.randn(2, 2, 64, dtype=bf16)
        with raises(ValueError, "is set with q_len 3: the fused append writes one token"):
            astrai_jit.paged_decode(torch.randn(2, 3, 8, 64, dtype=bf16), k, v, table, lens, new_k=new, new_v=new)

    def test_multi_token_out_must_match_q(self):
        q, k, v, table, lens = paged_inputs()
        q4 = torch.randn(2, 4, 8, 64, dtype=bf16)
        with raises(ValueError, "paged_decode: out has shape [2, 3, 8, 64] (allowed: [2, 4, 8, 64], the shape of q)"):
            astrai_jit.paged_decode(q4, k, v, table, lens, out=torch.empty(2, 3, 8, 64, dtype=bf16))
        with raises(ValueError, "paged_decode: out has shape [2, 8, 64] (allowed: [batch, n_heads, head_dim] or "
                                "[batch, q_len, n_heads, head_dim])"):
            astrai_jit.paged_decode(q4, k, v, table, lens, out=torch.empty(2, 8, 64, dtype=bf16))

    def test_seq_lens_batch(self):
        q, k, v, table, lens = paged_inputs()
        with raises(ValueError, "paged_decode: seq_lens has shape [3]: dim 0 is 3 (allowed: 2, batch of q)"):
            astrai_jit.paged_decode(q, k, v, table, torch.ones(3, dtype=torch.int32))

    @pytest.mark.parametrize("head_dim,message", [
        (72, "head_dim 72 is not a multiple of 16 (allowed: 32..256, step 16)"),
        (16, "head_dim 16"),
        (272, "head_dim 272"),
    ])
    def test_unsupported_head_dims_use_the_runtime_message(self, head_dim, message):
        with raises(ValueError, "paged_decode: " + message):
            astrai_jit.paged_decode(*paged_inputs(head_dim=head_dim))

    def test_page_size_not_a_power_of_two(self):
        with raises(ValueError, "page_size 12"):
            astrai_jit.paged_decode(*paged_inputs(page_size=12))

    def test_gqa_group_must_divide(self):
        with raises(ValueError, "n_heads 8"):
            astrai_jit.paged_decode(*paged_inputs(n_kv_heads=3))

    def test_mask_dtype_and_width(self):
        q, k, v, table, lens = paged_inputs()
        with raises(TypeError, "paged_decode: mask has dtype uint8 (allowed: bool)"):
            astrai_jit.paged_decode(q, k, v, table, lens, mask=torch.ones(2, 64, dtype=torch.uint8))
        with raises(ValueError, "paged_decode: mask has shape [2, 32]: dim 1 is 32 (allowed: 64, "
                                "max_pages_per_seq * page_size)"):
            astrai_jit.paged_decode(q, k, v, table, lens, mask=torch.ones(2, 32, dtype=torch.bool))

    def test_new_k_without_new_v(self):
        q, k, v, table, lens = paged_inputs()
        with raises(ValueError, "paged_decode: new_k is given but new_v is not (allowed: both or neither)"):
            astrai_jit.paged_decode(q, k, v, table, lens, new_k=torch.randn(2, 2, 64, dtype=bf16))

    def test_new_k_heads(self):
        q, k, v, table, lens = paged_inputs()
        new = torch.randn(2, 4, 64, dtype=bf16)
        with raises(ValueError, "paged_decode: new_k has shape [2, 4, 64]: dim 1 is 4 (allowed: 2, n_kv_heads"):
            astrai_jit.paged_decode(q, k, v, table, lens, new_k=new, new_v=new)

    def test_page_table_rows_without_req_indices(self):
        q, k, v, table, lens = paged_inputs()
        with raises(ValueError, "page_table has shape [1, 4]: 1 rows for batch 2"):
            astrai_jit.paged_decode(q, k, v, table[:1], lens)

    def test_req_indices_dtype(self):
        q, k, v, table, lens = paged_inputs()
        with raises(TypeError, "paged_decode: req_indices has dtype float32 (allowed: int32 or int64)"):
            astrai_jit.paged_decode(q, k, v, table, lens, req_indices=torch.zeros(2))

    def test_broadcast_view_is_refused(self):
        q, k, v, table, lens = paged_inputs()
        q = q[:1].expand(2, -1, -1)
        with raises(ValueError, "paged_decode: q has stride 0 in dim 0"):
            astrai_jit.paged_decode(q, k, v, table, lens)

    def test_non_contiguous_head_dim_is_refused(self):
        q, k, v, table, lens = paged_inputs(head_dim=64)
        wide = torch.randn(2, 8, 128, dtype=bf16)[..., ::2]
        with raises(ValueError, "paged_decode: q has stride 2 in its last dim"):
            astrai_jit.paged_decode(wide, k, v, table, lens)

    def test_strided_views_pass_the_checks(self):
        # A KV pool interleaving K and V: both views are non-contiguous and accepted (the call
        # then stops only at the device check).
        q, k, v, table, lens = paged_inputs()
        pool = torch.randn(10, 16, 2, 2, 64, dtype=bf16)
        with raises(ValueError, "paged_decode: q is on cpu"):
            astrai_jit.paged_decode(q, pool[:, :, 0], pool[:, :, 1], table, lens)

    def test_tensors_on_two_gpus_while_tracing(self):
        # Fake tensors carry their device without a GPU: the op's fake implementation refuses
        # a cache on another GPU (the extension gives the same message on real tensors). With a
        # GPU, PyTorch initializes each fake tensor's real device, so cuda:1 must exist.
        if torch.cuda.is_available() and torch.cuda.device_count() < 2:
            pytest.skip("one GPU: a fake cuda:1 tensor initializes a device that does not exist")
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            q, k, v, table, lens = paged_inputs(device="cuda:0")
            k1 = k.to("cuda:1")
            with raises(ValueError, "paged_decode: k_cache is on cuda:1 but q is on cuda:0 "
                                    "(allowed: every tensor on one CUDA device)"):
                astrai_jit.paged_decode(q, k1, v, table, lens)

    def test_cpu_and_cuda_tensors_mixed_while_tracing(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            q, k, v, table, lens = paged_inputs(device="cuda:0")
            with raises(ValueError, "paged_decode: page_table is on cpu but q is on cuda:0"):
                astrai_jit.paged_decode(q, k, v, table.cpu(), lens)

    def test_bad_scale(self):
        with raises(ValueError, "scale -1.0 is not a positive finite number"):
            astrai_jit.paged_decode(*paged_inputs(), scale=-1.0)

    def test_not_a_tensor(self):
        q, k, v, table, lens = paged_inputs()
        with raises(TypeError, "paged_decode: q is a list (allowed: torch.Tensor)"):
            astrai_jit.paged_decode([1.0], k, v, table, lens)


class TestDecodeAndPrefill:
    def test_decode_cpu(self):
        q = torch.randn(2, 1, 8, 64, dtype=bf16)
        k = torch.randn(2, 20, 2, 64, dtype=bf16)
        with raises(ValueError, "decode: q is on cpu (allowed: a CUDA device)"):
            astrai_jit.decode(q, k, k)

    def test_decode_q_len_must_be_one(self):
        q = torch.randn(2, 3, 8, 64, dtype=bf16)
        k = torch.randn(2, 20, 2, 64, dtype=bf16)
        with raises(ValueError, "decode: q has shape [2, 3, 8, 64]: dim 1 is 3 (allowed: 1"):
            astrai_jit.decode(q, k, k)

    def test_decode_mask_width(self):
        q = torch.randn(2, 1, 8, 64, dtype=bf16)
        k = torch.randn(2, 20, 2, 64, dtype=bf16)
        with raises(ValueError, "decode: mask has shape [2, 19]: dim 1 is 19 (allowed: 20, kv_len of k)"):
            astrai_jit.decode(q, k, k, mask=torch.ones(2, 19, dtype=torch.bool))

    def test_prefill_batch_mismatch(self):
        q = torch.randn(2, 5, 8, 64, dtype=bf16)
        k = torch.randn(3, 20, 2, 64, dtype=bf16)
        with raises(ValueError, "prefill: k has shape [3, 20, 2, 64]: dim 0 is 3 (allowed: 2, batch of q)"):
            astrai_jit.prefill(q, k, k)

    def test_prefill_mask_q_len(self):
        q = torch.randn(2, 5, 8, 64, dtype=bf16)
        k = torch.randn(2, 20, 2, 64, dtype=bf16)
        with raises(ValueError, "prefill: mask has shape [2, 4, 20]: dim 1 is 4 (allowed: 5, q_len of q, or 1)"):
            astrai_jit.prefill(q, k, k, mask=torch.ones(2, 4, 20, dtype=torch.bool))

    def test_prefill_bad_causal_offset(self):
        q = torch.randn(2, 5, 8, 64, dtype=bf16)
        k = torch.randn(2, 20, 2, 64, dtype=bf16)
        with raises(ValueError, "prefill: causal_offset -2"):
            astrai_jit.prefill(q, k, k, causal_offset=-2)

    def test_prefill_head_dim(self):
        q = torch.randn(2, 5, 8, 40, dtype=torch.float16)
        k = torch.randn(2, 20, 2, 40, dtype=torch.float16)
        with raises(ValueError, "prefill: head_dim 40 is not a multiple of 16"):
            astrai_jit.prefill(q, k, k)

    def test_prefill_out_shape(self):
        q = torch.randn(2, 5, 8, 64, dtype=bf16)
        k = torch.randn(2, 20, 2, 64, dtype=bf16)
        with raises(ValueError, "prefill: out has shape [2, 4, 8, 64] (allowed: [2, 5, 8, 64], the shape of q)"):
            astrai_jit.prefill(q, k, k, out=torch.empty(2, 4, 8, 64, dtype=bf16))

    def test_paged_prefill_indptr(self):
        q, k, v, table, lens = paged_inputs()
        q = torch.randn(7, 8, 64, dtype=bf16)
        with raises(ValueError, "paged_prefill: seq_lens has shape [2]: dim 0 is 2 (allowed: 1, batch, from "
                                "qo_indptr)"):
            astrai_jit.paged_prefill(q, k, v, table, lens, torch.tensor([0, 7], dtype=torch.int32))
        with raises(TypeError, "paged_prefill: qo_indptr has dtype float32 (allowed: int32 or int64)"):
            astrai_jit.paged_prefill(q, k, v, table, lens, torch.tensor([0.0, 3.0, 7.0]))
        with raises(ValueError, "paged_prefill: q is on cpu"):  # int64 offsets pass the dtype check
            astrai_jit.paged_prefill(q, k, v, table, lens, torch.tensor([0, 3, 7]))
        with raises(ValueError, "paged_prefill: q is on cpu"):
            astrai_jit.paged_prefill(q, k, v, table, lens, torch.tensor([0, 3, 7], dtype=torch.int32))


class TestRotary:
    def test_cpu(self):
        x = torch.randn(4, 6, 8, 64, dtype=bf16)
        f = torch.randn(4, 6, 32, 2)
        with raises(ValueError, "rotary_emb: x is on cpu (allowed: a CUDA device)"):
            astrai_jit.rotary_emb(x, f)

    def test_freqs_dtype(self):
        x = torch.randn(6, 8, 64, dtype=bf16)
        with raises(TypeError, "rotary_emb: freqs_cis has dtype bfloat16 (allowed: float32)"):
            astrai_jit.rotary_emb(x, torch.randn(6, 32, 2, dtype=bf16))

    def test_freqs_width(self):
        x = torch.randn(6, 8, 64, dtype=bf16)
        with raises(ValueError, "rotary_emb: freqs_cis has shape [6, 16, 2]: dim 1 is 16 (allowed: 32, "
                                "head_dim / 2 of x)"):
            astrai_jit.rotary_emb(x, torch.randn(6, 16, 2))

    def test_head_dim(self):
        x = torch.randn(6, 8, 12, dtype=bf16)
        with raises(ValueError, "rotary_emb: head_dim 12"):
            astrai_jit.rotary_emb(x, torch.randn(6, 6, 2))


class TestDlpack:
    def test_the_module_takes_any_dlpack_array(self):
        np = pytest.importorskip("numpy")
        x = np.zeros((6, 8, 64), dtype=np.float32)
        with raises(TypeError, "rotary_emb: x has dtype float32 (allowed: bfloat16, float16)"):
            astrai_jit._C.rotary_emb(x, np.zeros((6, 32, 2), dtype=np.float32), x, 0)
        x = np.zeros((6, 8, 64), dtype=np.float16)
        with raises(ValueError, "rotary_emb: x is on cpu"):
            astrai_jit._C.rotary_emb(x, np.zeros((6, 32, 2), dtype=np.float32), x, 0)

    def test_a_read_only_array_is_refused_as_an_output(self):
        np = pytest.importorskip("numpy")
        x = np.zeros((6, 8, 64), dtype=np.float16)
        x.flags.writeable = False
        with pytest.raises(TypeError, match="incompatible function arguments"):
            astrai_jit._C.rotary_emb(x, np.zeros((6, 32, 2), dtype=np.float32), x, 0)

    @pytest.mark.skipif(not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
                        reason="a PyTorch without DLPack's C exchange API")
    def test_torch_tensors_are_read_through_the_c_exchange_api(self):
        np = pytest.importorskip("numpy")
        assert astrai_jit._C._reads_type_directly(torch.Tensor)
        assert not astrai_jit._C._reads_type_directly(np.ndarray)


class TestFeatures:
    """logit_cap, sinks and window_left: bad values are refused by name before any launch."""

    def test_negative_logit_cap(self, host_only):
        with raises(ValueError, "paged_decode: logit_cap -1 is not valid (allowed: 0 for no soft-cap"):
            astrai_jit.paged_decode(*paged_inputs(), logit_cap=-1.0)

    def test_nan_logit_cap(self, host_only):
        with raises(ValueError, "decode: logit_cap nan is not valid"):
            astrai_jit.decode(torch.randn(2, 1, 8, 64, dtype=bf16), *[torch.randn(2, 20, 2, 64, dtype=bf16)] * 2,
                              logit_cap=float("nan"))

    def test_logit_cap_type(self):
        with raises(TypeError, "paged_decode: logit_cap is a str (allowed: a float >= 0, 0 for none)"):
            astrai_jit.paged_decode(*paged_inputs(), logit_cap="30")

    def test_window_type(self):
        with raises(TypeError, "prefill: window_left is a float (allowed: an int >= -1, -1 for none)"):
            astrai_jit.prefill(torch.randn(2, 5, 8, 64, dtype=bf16), *[torch.randn(2, 20, 2, 64, dtype=bf16)] * 2,
                               causal_offset=15, window_left=8.5)

    def test_window_below_minus_one(self, host_only):
        with raises(ValueError, "paged_decode: window_left -2 is not valid (allowed: -1 for no window, or >= 0)"):
            astrai_jit.paged_decode(*paged_inputs(), window_left=-2)

    def test_prefill_window_needs_a_causal_position(self, host_only):
        q = torch.randn(2, 5, 8, 64, dtype=bf16)
        k = torch.randn(2, 20, 2, 64, dtype=bf16)
        with raises(ValueError, "prefill: window_left 4 needs query positions"):
            astrai_jit.prefill(q, k, k, window_left=4)

    def test_sinks_shape_dtype_and_type(self, host_only):
        args = paged_inputs()
        with raises(ValueError, "paged_decode: sinks has shape [4]: dim 0 is 4 (allowed: 8, n_heads of q)"):
            astrai_jit.paged_decode(*args, sinks=torch.zeros(4))
        with raises(TypeError, "paged_decode: sinks has dtype bfloat16 (allowed: float32)"):
            astrai_jit.paged_decode(*args, sinks=torch.zeros(8, dtype=bf16))
        with raises(TypeError, "paged_decode: sinks is a list (allowed: torch.Tensor)"):
            astrai_jit.paged_decode(*args, sinks=[0.0] * 8)

    def test_alibi_slopes_shape_dtype_type_and_positions(self, host_only):
        args = paged_inputs()
        with raises(ValueError, "paged_decode: alibi_slopes has shape [4]: dim 0 is 4 (allowed: 8, n_heads of q)"):
            astrai_jit.paged_decode(*args, alibi_slopes=torch.zeros(4))
        with raises(TypeError, "paged_decode: alibi_slopes has dtype bfloat16 (allowed: float32)"):
            astrai_jit.paged_decode(*args, alibi_slopes=torch.zeros(8, dtype=bf16))
        with raises(TypeError, "paged_decode: alibi_slopes is a list (allowed: torch.Tensor)"):
            astrai_jit.paged_decode(*args, alibi_slopes=[0.0] * 8)
        q = torch.randn(2, 5, 8, 64, dtype=bf16)
        k = torch.randn(2, 20, 2, 64, dtype=bf16)
        with raises(ValueError, "prefill: alibi_slopes = 0x"):
            astrai_jit.prefill(q, k, k, alibi_slopes=torch.zeros(8))

    def test_fp8_cache_passes_the_checks_with_its_scales(self, host_only):
        q, k, v, table, lens = paged_inputs()
        for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            k8, v8 = k.to(dtype), v.to(dtype)
            astrai_jit.paged_decode(q, k8, v8, table, lens, k_scale=torch.ones(()), v_scale=torch.ones(()))
            astrai_jit.paged_decode(q, k8, v8, table, lens, k_scale=torch.ones(2), v_scale=torch.ones(2))

    def test_fp8_cache_needs_its_scales(self, host_only):
        q, k, v, table, lens = paged_inputs()
        k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        with raises(ValueError, "paged_decode: k_cache has dtype float8_e4m3fn but k_scale is missing"):
            astrai_jit.paged_decode(q, k8, v8, table, lens)
        with raises(ValueError, "paged_decode: k_cache has dtype float8_e4m3fn but v_scale is missing"):
            astrai_jit.paged_decode(q, k8, v8, table, lens, k_scale=torch.ones(()))

    def test_scales_without_fp8_are_refused(self, host_only):
        with raises(ValueError, "paged_decode: k_scale is given but k_cache has dtype bfloat16 (allowed: scales "
                                "with a float8_e4m3fn or float8_e5m2 cache only)"):
            astrai_jit.paged_decode(*paged_inputs(), k_scale=torch.ones(()), v_scale=torch.ones(()))

    def test_fp8_k_and_v_formats_must_match(self, host_only):
        q, k, v, table, lens = paged_inputs()
        with raises(TypeError, "paged_decode: v_cache has dtype float8_e5m2 (allowed: float8_e4m3fn, the dtype of "
                               "k_cache)"):
            astrai_jit.paged_decode(q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e5m2), table, lens,
                                    k_scale=torch.ones(()), v_scale=torch.ones(()))

    def test_scale_shapes(self, host_only):
        q, k, v, table, lens = paged_inputs()
        k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        with raises(ValueError, "paged_decode: k_scale has shape [3]: dim 0 is 3 (allowed: 2, n_kv_heads, or 1"):
            astrai_jit.paged_decode(q, k8, v8, table, lens, k_scale=torch.ones(3), v_scale=torch.ones(3))
        with raises(ValueError, "paged_decode: v_scale has 2 values but k_scale has 1"):
            astrai_jit.paged_decode(q, k8, v8, table, lens, k_scale=torch.ones(1), v_scale=torch.ones(2))
        with raises(TypeError, "paged_decode: k_scale has dtype bfloat16 (allowed: float32)"):
            astrai_jit.paged_decode(q, k8, v8, table, lens, k_scale=torch.ones(1, dtype=bf16), v_scale=torch.ones(1))

    def test_prefill_takes_no_fp8_cache(self, host_only):
        # An FP8 k is FP8 attention's, with q and v in e4m3 too (test_fp8_attention.py).
        q = torch.randn(2, 5, 8, 64, dtype=bf16)
        k = torch.randn(2, 20, 2, 64, dtype=bf16).to(torch.float8_e4m3fn)
        with raises(TypeError, "prefill: k has dtype float8_e4m3fn but q has dtype bfloat16 (allowed: bfloat16, the "
                               "dtype of q; or float8_e4m3fn q, k and v together, FP8 attention)"):
            astrai_jit.prefill(q, k, k)

    def test_every_feature_passes_the_checks(self, host_only):
        q, k, v, table, lens = paged_inputs()
        astrai_jit.paged_decode(q, k, v, table, lens, logit_cap=30.0, sinks=torch.zeros(8), window_left=64)
        qp = torch.randn(7, 8, 64, dtype=bf16)
        indptr = torch.tensor([0, 3, 7], dtype=torch.int32)
        astrai_jit.paged_prefill(qp, k, v, table, lens, indptr, logit_cap=50.0, sinks=torch.zeros(8),
                                 window_left=0)


@pytest.fixture
def host_only():
    # The extension's benchmark mode: arguments checked and converted, CPU tensors accepted,
    # nothing launched.
    astrai_jit._C._set_host_only(True)
    yield
    astrai_jit._C._set_host_only(False)


class TestOptionsPack:
    """The extension's `options` argument, called directly: the layout is _library._PACKED_OPTIONS."""

    @staticmethod
    def paged_decode(options):
        q, k, v, table, lens = paged_inputs()
        astrai_jit._C.paged_decode(q, k, v, table, lens, torch.empty_like(q), None, None, None, None, None, options,
                                   0)

    def test_a_shorter_pack_leaves_the_later_options_at_their_defaults(self, host_only):
        # A caller written before an option existed packs fewer values.
        self.paged_decode(tuple(default for *_, default in _library._PACKED_OPTIONS))
        self.paged_decode((0.25, 0.0, None, -1))
        self.paged_decode(())

    def test_a_longer_pack_is_refused_naming_the_options(self, host_only):
        count = len(_library._PACKED_OPTIONS)
        with raises(TypeError, f"paged_decode: options has {count + 1} values (allowed: at most {count}: scale, "
                               f"logit_cap, sinks, window_left, k_scale, v_scale"):
            self.paged_decode((0.0,) * (count + 1))

    def test_a_value_of_the_wrong_kind_is_named(self, host_only):
        with raises(TypeError, "paged_decode: logit_cap is a str (allowed: a float)"):
            self.paged_decode((0.0, "30"))
        with raises(TypeError, "paged_decode: window_left is a float (allowed: an int)"):
            self.paged_decode((0.0, 0.0, None, 1.5))
        with raises(TypeError, "paged_decode: sinks is a list (allowed: a tensor, or None)"):
            self.paged_decode((0.0, 0.0, [0.0] * 8))

    def test_a_per_head_option_is_checked_by_its_row(self, host_only):
        self.paged_decode((0.0, 0.0, torch.zeros(8)))
        with raises(ValueError, "paged_decode: sinks has shape [3]: dim 0 is 3 (allowed: 8, n_heads of q)"):
            self.paged_decode((0.0, 0.0, torch.zeros(3)))
        with raises(TypeError, "paged_decode: alibi_slopes has dtype float16 (allowed: float32)"):
            self.paged_decode((0.0, 0.0, None, -1, None, None, torch.zeros(8, dtype=torch.float16)))

    def test_contiguous_prefill_refuses_fp8_scales(self, host_only):
        q = torch.randn(1, 4, 8, 64, dtype=bf16)
        k = torch.randn(1, 16, 2, 64, dtype=bf16)
        with raises(ValueError, "prefill: k_scale is given but q has dtype bfloat16 (allowed: None; scales come with "
                                "float8_e4m3fn q, k and v, FP8 attention)"):
            astrai_jit._C.prefill(q, k, k, torch.empty_like(q), None, None, -1,
                                  (0.0, 0.0, None, -1, torch.ones(1), torch.ones(1)), 0)


class TestHostPath:
    def test_a_call_passes_every_check_on_cpu_in_benchmark_mode(self, host_only):
        q, k, v, table, lens = paged_inputs()
        pool = torch.randn(10, 16, 2, 2, 64, dtype=bf16)
        out, lse = astrai_jit.paged_decode(q, pool[:, :, 0], pool[:, :, 1], table, lens, return_lse=True)
        assert out.shape == q.shape and out.is_contiguous() and lse.shape == (2, 8)
        astrai_jit.paged_decode(q, k, v, table, lens, stream=0)

    def test_the_checks_still_run_in_benchmark_mode(self, host_only):
        q, k, v, table, lens = paged_inputs()
        with raises(TypeError, "paged_decode: page_table has dtype int16 (allowed: int32 or int64)"):
            astrai_jit.paged_decode(q, k, v, table.short(), lens)

    def test_stream_none_needs_a_framework_that_reports_it(self, host_only):
        np = pytest.importorskip("numpy")
        x = np.zeros((6, 8, 64), dtype=np.float16)
        freqs = np.zeros((6, 32, 2), dtype=np.float32)
        astrai_jit._C.rotary_emb(x, freqs, x, 0)
        with raises(ValueError, "rotary_emb: stream None needs the tensors' framework to report its current "
                                "stream"):
            astrai_jit._C.rotary_emb(x, freqs, x, None)

    def test_the_host_overhead_benchmark_runs_on_cpu(self):
        import pathlib
        import subprocess
        import sys
        bench = pathlib.Path(__file__).resolve().parents[1] / "bench" / "host_overhead.py"
        result = subprocess.run([sys.executable, str(bench), "--cpu", "--calls", "4", "--reps", "2"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "public Python call" in result.stdout and "extension call" in result.stdout
