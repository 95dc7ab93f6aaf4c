"""merge_state, merge_state_in_place, merge_states and cascade: argument errors on the CPU; on the
GPU (marked `gpu`) the merge against a float64 reference, the two halves of an attention call
merged back into the whole, in-place merges, and a cascade against attention over the joined keys."""
import re

import pytest
import torch

import astrai_jit
from astrai_jit import _C, _cascade
from reference import UNIT_ROUNDOFF, _rows_report, assert_lse_close, assert_rows_close, attention_ref

bf16 = torch.bfloat16


def raises(kind, pattern):
    return pytest.raises(kind, match=re.escape(pattern))


def merge_ref(v, s):
    """float64 merge of v [rows, states, heads, d] by s [rows, states, heads]."""
    s = s.double()
    m = s.max(dim=1, keepdim=True).values
    w = torch.where(s == float("-inf"), torch.zeros_like(s), torch.exp(s - torch.where(m == float("-inf"), 0.0, m)))
    total = w.sum(dim=1)
    vals = torch.where(w[..., None] > 0, v.double(), torch.zeros((), dtype=torch.float64, device=v.device))
    out = (w[..., None] * vals).sum(dim=1) / torch.where(total > 0, total, 1.0)[..., None]
    lse = torch.where(total > 0, m.squeeze(1) + torch.log(torch.where(total > 0, total, 1.0)),
                      torch.full_like(total, float("-inf")))
    return out, lse


def assert_merge_close(actual, expected):
    u = UNIT_ROUNDOFF[actual.dtype]
    ok, message = _rows_report(actual, expected, 2 * u, u * (1 + 2.0 ** -8), 2.0 ** -12)
    assert ok, message


class TestErrors:
    def test_cpu_tensors_reach_the_device_check(self):
        v = torch.randn(4, 2, 64, dtype=bf16)
        with raises(ValueError, "merge_states: out is on cpu (allowed: a CUDA device)"):
            astrai_jit.merge_state(v, torch.zeros(4, 2), v.clone(), torch.zeros(4, 2))

    def test_lse_must_be_float32(self):
        v = torch.randn(4, 2, 64, dtype=bf16)
        with raises(TypeError, "merge_states: s_b has dtype bfloat16 (allowed: float32)"):
            astrai_jit.merge_state(v, torch.zeros(4, 2), v.clone(), torch.zeros(4, 2, dtype=bf16))

    def test_shapes_must_match(self):
        v = torch.randn(4, 2, 64, dtype=bf16)
        with raises(ValueError, "merge_states: v_b has shape [4, 3, 64]: dim 1 is 3 (allowed: 2, n_heads of out)"):
            astrai_jit.merge_state(v, torch.zeros(4, 2), torch.randn(4, 3, 64, dtype=bf16), torch.zeros(4, 3))
        with raises(ValueError, "merge_states: s_a has shape [4, 3]: dim 1 is 3 (allowed: 2, n_heads of out)"):
            astrai_jit.merge_state(v, torch.zeros(4, 3), v.clone(), torch.zeros(4, 2))
        with raises(ValueError, "merge_states: v has shape [4, 2, 64] (allowed: [rows, states, n_heads, head_dim])"):
            astrai_jit.merge_states(v, torch.zeros(4, 2))

    def test_dtypes_must_match(self):
        v = torch.randn(4, 2, 64, dtype=bf16)
        with raises(TypeError, "merge_states: v_b has dtype float16 (allowed: bfloat16, the dtype of out)"):
            astrai_jit.merge_state(v, torch.zeros(4, 2), v.half(), torch.zeros(4, 2))

    def test_head_dim_must_be_a_multiple_of_8(self):
        v = torch.randn(4, 2, 60, dtype=bf16)
        with raises(ValueError, "merge_states: head_dim 60 is not supported (allowed: 8..1024, step 8)"):
            astrai_jit.merge_state(v, torch.zeros(4, 2), v.clone(), torch.zeros(4, 2))

    def test_an_output_overlapping_an_input_is_refused(self):
        v = torch.randn(4, 3, 2, 64, dtype=bf16)
        s = torch.zeros(4, 3, 2)
        with raises(ValueError, "merge_states: out overlaps a.v"):
            astrai_jit.merge_states(v, s, out=v[:, 0])

    def test_non_tensors_are_type_errors(self):
        with raises(TypeError, "merge_states: s is a list (allowed: torch.Tensor)"):
            astrai_jit.merge_states(torch.randn(4, 3, 2, 64, dtype=bf16), [0.0])


@pytest.mark.gpu
class TestGpu:
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    @pytest.mark.parametrize("head_dim", [8, 64, 128, 512])
    def test_merge_state_matches_the_reference(self, dtype, head_dim):
        v = torch.randn(37, 2, 5, head_dim, device="cuda").to(dtype)
        s = torch.rand(37, 2, 5, device="cuda") * 20 - 6
        s[3, 0] = float("-inf")  # an empty state weighs nothing, NaN values or not
        v[3, 0] = float("nan")
        s[4] = float("-inf")     # a row of empty states: zeros, LSE -inf
        out, lse = astrai_jit.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
        want, want_lse = merge_ref(v, s)
        assert_merge_close(out, want)
        assert_lse_close(lse, want_lse)
        assert bool((out[4] == 0).all())

    def test_merge_states_over_stacked_states(self):
        v = torch.randn(50, 9, 4, 128, device="cuda").to(bf16)
        s = torch.randn(50, 9, 4, device="cuda") * 30
        out, lse = astrai_jit.merge_states(v, s)
        want, want_lse = merge_ref(v, s)
        assert_merge_close(out, want)
        assert_lse_close(lse, want_lse)

    def test_in_place(self):
        v = torch.randn(20, 3, 64, device="cuda").to(bf16)
        s = torch.randn(20, 3, device="cuda")
        v2 = torch.randn_like(v)
        s2 = torch.randn_like(s)
        want, want_lse = merge_ref(torch.stack([v, v2], 1), torch.stack([s, s2], 1))
        astrai_jit.merge_state_in_place(v, s, v2, s2)
        assert_merge_close(v, want)
        assert_lse_close(s, want_lse)

    def test_two_halves_of_a_prefill_merge_into_the_whole(self):
        # The cascade pattern: attention over keys [0, 113) and [113, 300) apart, merged, is the
        # attention over all 300 (each half rounded once more than a single call: slack 1.5).
        q = torch.randn(2, 16, 8, 128, device="cuda").to(bf16)
        k = torch.randn(2, 300, 8, 128, device="cuda").to(bf16)
        v = torch.randn_like(k)
        first, first_lse = astrai_jit.prefill(q, k[:, :113], v[:, :113], return_lse=True)
        second, second_lse = astrai_jit.prefill(q, k[:, 113:], v[:, 113:], return_lse=True)
        rows = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731  [batch * q_len, heads, ...]
        out, lse = astrai_jit.merge_state(rows(first), rows(first_lse), rows(second), rows(second_lse))
        want, want_lse = attention_ref(q, k, v)
        assert_rows_close(out, rows(want), slack=1.5)
        assert_lse_close(lse, rows(want_lse))


def cascade_inputs(device="cpu", dtype=bf16, prefix_len=40, suffix_lens=(5, 0, 17), q_lens=(1, 2, 1), page_size=16):
    """A pool holding a shared prefix and each request's suffix, and the two levels over it."""
    pages = lambda n: (n + page_size - 1) // page_size  # noqa: E731
    total_pages = pages(prefix_len) + sum(pages(n) for n in suffix_lens)
    k = torch.randn(total_pages + 1, page_size, 2, 64, device=device).to(dtype)
    v = torch.randn_like(k)
    order = torch.randperm(total_pages)
    prefix_pages, used = order[: pages(prefix_len)], pages(prefix_len)
    width = max(1, max(pages(n) for n in suffix_lens))
    table = torch.full((len(suffix_lens), width), -1, dtype=torch.int32)
    for b, n in enumerate(suffix_lens):
        table[b, : pages(n)] = order[used: used + pages(n)]
        used += pages(n)
    i32 = dict(dtype=torch.int32, device=device)
    indptr = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], **i32)
    total_q = int(indptr[-1])
    levels = [astrai_jit.CascadeLevel(torch.tensor([0, total_q], **i32),
                                      prefix_pages.reshape(1, -1).to(**i32) if prefix_len else torch.full((1, 1), -1, **i32),
                                      torch.tensor([prefix_len], **i32)),
              astrai_jit.CascadeLevel(indptr, table.to(device), torch.tensor(suffix_lens, **i32), causal=True)]
    q = torch.randn(total_q, 8, 64, device=device).to(dtype)
    return q, k, v, levels, prefix_pages, table


class TestCascadeErrors:
    def test_cpu_tensors_reach_the_device_check(self):
        q, k, v, levels, *_ = cascade_inputs()
        with raises(ValueError, "cascade: q is on cpu (allowed: a CUDA device)"):
            astrai_jit.cascade(q, k, v, levels)

    def test_a_level_check_names_the_level(self):
        q, k, v, levels, *_ = cascade_inputs()
        levels[1] = levels[1]._replace(max_q_len=9)
        with raises(ValueError, "cascade: levels[1]: max_q_len 9 is not valid for total_q 4 over batch 3"):
            astrai_jit.cascade(q, k, v, levels)

    def test_levels_must_be_cascade_levels(self):
        q, k, v, levels, *_ = cascade_inputs()
        with raises(TypeError, "cascade: levels[0] is a tuple (allowed: astrai_jit.CascadeLevel)"):
            astrai_jit.cascade(q, k, v, [tuple(levels[0])])
        with raises(TypeError, "cascade: levels is a CascadeLevel (allowed: a list of CascadeLevel)"):
            astrai_jit.cascade(q, k, v, levels[0])

    def test_five_levels_are_refused(self):
        q, k, v, levels, *_ = cascade_inputs()
        with raises(ValueError, "cascade: levels has 5 entries (allowed: 1..4)"):
            astrai_jit.cascade(q, k, v, levels * 2 + levels[:1])

    def test_a_level_table_of_the_wrong_width_names_it(self):
        q, k, v, levels, *_ = cascade_inputs()
        levels[0] = levels[0]._replace(seq_lens=torch.tensor([40, 1], dtype=torch.int32))
        with raises(ValueError, "cascade: levels[0].seq_lens has shape [2]: dim 0 is 2 (allowed: 1, groups, from "
                                "qo_indptr)"):
            astrai_jit.cascade(q, k, v, levels)

    def test_an_option_cascade_does_not_serve_is_refused_by_name(self):
        # The extension's options pack carries every attention option; the runtime names those that
        # cascade does not serve.
        q, k, v, levels, *_ = cascade_inputs()
        lists = _cascade._level_lists("cascade", levels)
        with raises(ValueError, "cascade: window_left 4 is not served"):
            _C.cascade(q, k, v, *lists, torch.empty_like(q), None, (0.0, 0.0, None, 4), None, 0)

    def test_run_before_plan(self):
        with raises(RuntimeError, "cascade: run() before plan()"):
            astrai_jit.CascadeAttention().run(*cascade_inputs()[:3])


@pytest.mark.gpu
class TestCascadeGpu:
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_cascade_matches_attention_over_the_joined_keys(self, dtype):
        q, k, v, levels, prefix_pages, table = cascade_inputs("cuda", dtype, prefix_len=300, suffix_lens=(37, 3, 1, 90),
                                                              q_lens=(1, 3, 1, 8))
        attention = astrai_jit.CascadeAttention()
        attention.plan(levels)
        out, lse = attention.run(q, k, v, return_lse=True)
        indptr = levels[1].qo_indptr.tolist()
        suffix_lens = levels[1].seq_lens.tolist()
        for b in range(len(suffix_lens)):
            q_len = indptr[b + 1] - indptr[b]
            if q_len == 0:
                continue
            # The prefix's 300 tokens, then the request's own (each from its own pages).
            own = table[b][table[b] >= 0].long().cuda()
            kb = torch.cat([k[prefix_pages.cuda()].reshape(-1, 2, 64)[:300], k[own].reshape(-1, 2, 64)[:suffix_lens[b]]])
            vb = torch.cat([v[prefix_pages.cuda()].reshape(-1, 2, 64)[:300], v[own].reshape(-1, 2, 64)[:suffix_lens[b]]])
            keys = kb.shape[0]
            keep = torch.ones(1, q_len, keys, dtype=torch.bool, device="cuda")
            for i in range(q_len):  # every prefix key; own keys up to the query's position
                keep[0, i, 300 + suffix_lens[b] - q_len + i + 1:] = False
            rows = slice(indptr[b], indptr[b + 1])
            want, want_lse = attention_ref(q[rows][None], kb[None], vb[None], keep)
            assert_rows_close(out[rows], want[0], slack=1.5)
            assert_lse_close(lse[rows], want_lse[0])
