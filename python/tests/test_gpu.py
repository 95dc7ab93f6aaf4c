"""GPU suite (marked `gpu`, skipped without a CUDA device): every op against float64
references in bf16 and fp16 (rows and LSE checked apart, bounds by dtype: reference.py),
non-contiguous views, the fused append, CUDA graph capture and replay, torch.compile(fullgraph=True),
opcheck, and the JIT backend against the SDPA backend. Data come from generators seeded per test
(conftest.py); outputs are poisoned with NaN first."""

import pytest
import torch

import astrai_jit
from reference import (assert_lse_close, assert_rows_close, attention_ref, causal_keep,
                       rotary_ref, window_keep)

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float16]


def rand(*shape, dtype=torch.bfloat16):
    # Seeded per test (conftest.py); randn's tails give some rows larger scores than others.
    return torch.randn(*shape, device="cuda").to(dtype)


def poisoned(*shape, dtype):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def paged_case(batch, n_heads, n_kv_heads, head_dim, page_size, max_pages, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    num_pages = batch * max_pages + 3
    q = rand(batch, n_heads, head_dim, dtype=dtype)
    kc = rand(num_pages, page_size, n_kv_heads, head_dim, dtype=dtype)
    vc = rand(num_pages, page_size, n_kv_heads, head_dim, dtype=dtype)
    table = torch.randperm(num_pages, generator=g)[: batch * max_pages].reshape(batch, max_pages).int().cuda()
    lens = torch.randint(1, max_pages * page_size + 1, (batch,), generator=g).int().cuda()
    return q, kc, vc, table, lens


def paged_ref(q, kc, vc, table, lens, mask=None, req=None, scale=None, logit_cap=0.0, sinks=None, window_left=-1):
    """q [batch, n_heads, D], or [batch, q_len, n_heads, D] (multi-token decode: token i sits at
    position len - q_len + i and sees the keys up to it); out and lse shaped like q's rows."""
    page_size = kc.shape[1]
    tokens = q.dim() == 4
    q_len = q.shape[1] if tokens else 1
    outs, lses = [], []
    for b in range(q.shape[0]):
        row = table[b if req is None else int(req[b])].long()
        n = int(lens[b])
        pos = torch.arange(n, device=q.device)
        k = kc[row[pos // page_size], pos % page_size]
        v = vc[row[pos // page_size], pos % page_size]
        if window_left >= 0:
            keep = window_keep(1, q_len, n, n - q_len, window_left, q.device)
        else:
            keep = causal_keep(1, q_len, n, n - q_len, q.device)
        if mask is not None:
            keep = keep & mask[b, :n][None, None]
        o, l = attention_ref((q[b] if tokens else q[b][None])[None], k[None], v[None], keep, scale, logit_cap, sinks)
        outs.append(o[0] if tokens else o[0, 0])
        lses.append(l[0] if tokens else l[0, 0])
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads,page_size", [(64, 24, 4, 1), (128, 32, 8, 16),
                                                                  (256, 8, 8, 4), (96, 16, 2, 32)])
def test_paged_decode_matches_float64(dtype, head_dim, n_heads, n_kv_heads, page_size):
    q, kc, vc, table, lens = paged_case(4, n_heads, n_kv_heads, head_dim, page_size, 64 // page_size + 2, dtype)
    out = poisoned(*q.shape, dtype=dtype)
    got, lse = astrai_jit.paged_decode(q, kc, vc, table, lens, out=out, return_lse=True)
    assert got is out
    expected, expected_lse = paged_ref(q, kc, vc, table, lens)
    assert_rows_close(got, expected)
    assert_lse_close(lse, expected_lse)


def test_paged_decode_mask_req_indices_and_interleaved_pool():
    dtype = torch.bfloat16
    batch, max_pages, page_size = 3, 6, 8
    pool = rand(30, page_size, 2, 4, 128, dtype=dtype)  # K and V interleaved per token
    kc, vc = pool[:, :, 0], pool[:, :, 1]
    q_wide = rand(batch, 16, 2, 128, dtype=dtype)
    q = q_wide[:, :, 0]  # non-contiguous query view
    table = torch.randperm(30)[:24].reshape(4, max_pages).int().cuda()
    req = torch.tensor([3, 0, 2], dtype=torch.int32, device="cuda")
    lens = torch.tensor([5, 48, 17], dtype=torch.int32, device="cuda")
    mask = torch.rand(batch, max_pages * page_size, device="cuda") > 0.3
    got = astrai_jit.paged_decode(q, kc, vc, table, lens, out=poisoned(*q.shape, dtype=dtype), mask=mask,
                                  req_indices=req)
    expected, _ = paged_ref(q, kc, vc, table, lens, mask=mask, req=req)
    assert_rows_close(got, expected)


def test_paged_decode_fused_append_writes_the_cache():
    dtype = torch.bfloat16
    q, kc, vc, table, lens = paged_case(4, 16, 4, 128, 16, 4, dtype, seed=3)
    new_k, new_v = rand(4, 4, 128, dtype=dtype), rand(4, 4, 128, dtype=dtype)
    before_k, before_v = kc.clone(), vc.clone()
    got = astrai_jit.paged_decode(q, kc, vc, table, lens, out=poisoned(*q.shape, dtype=dtype), new_k=new_k, new_v=new_v)
    for b in range(4):
        t = int(lens[b]) - 1
        page, slot = int(table[b, t // 16]), t % 16
        assert torch.equal(kc[page, slot], new_k[b]) and torch.equal(vc[page, slot], new_v[b])
        before_k[page, slot], before_v[page, slot] = new_k[b], new_v[b]
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)  # nothing else written
    expected, _ = paged_ref(q, kc, vc, table, lens)
    assert_rows_close(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_decode_matches_float64(dtype, causal):
    q = rand(3, 1, 32, 128, dtype=dtype)
    k, v = rand(3, 300, 8, 128, dtype=dtype), rand(3, 300, 8, 128, dtype=dtype)
    mask = torch.rand(3, 300, device="cuda") > 0.2
    offset = 200 if causal else -1
    got, lse = astrai_jit.decode(q, k, v, out=poisoned(*q.shape, dtype=dtype), mask=mask, causal_offset=offset,
                                 return_lse=True)
    keep = mask[:, None, :].clone()
    if causal:
        keep &= causal_keep(3, 1, 300, 200, "cuda")
    expected, expected_lse = attention_ref(q, k, v, keep)
    assert_rows_close(got, expected)
    assert_lse_close(lse, expected_lse[:, 0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_prefill_matches_float64(dtype, head_dim):
    batch, q_len, kv_len = 2, 77, 130
    q = rand(batch, q_len, 8, head_dim, dtype=dtype)
    k, v = rand(batch, kv_len, 2, head_dim, dtype=dtype), rand(batch, kv_len, 2, head_dim, dtype=dtype)
    got = astrai_jit.prefill(q, k, v, out=poisoned(*q.shape, dtype=dtype), causal_offset=kv_len - q_len)
    expected, _ = attention_ref(q, k, v, causal_keep(batch, q_len, kv_len, kv_len - q_len, "cuda"))
    assert_rows_close(got, expected)


def test_prefill_bhld_views_and_3d_mask():
    dtype = torch.bfloat16
    q = rand(2, 8, 40, 64, dtype=dtype).transpose(1, 2)  # [b, l, h, d] view of bhld storage
    k = rand(2, 2, 90, 64, dtype=dtype).transpose(1, 2)
    v = rand(2, 2, 90, 64, dtype=dtype).transpose(1, 2)
    mask = torch.rand(2, 40, 90, device="cuda") > 0.4
    got = astrai_jit.prefill(q, k, v, out=poisoned(*q.shape, dtype=dtype), mask=mask)
    expected, _ = attention_ref(q, k, v, mask)
    assert_rows_close(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_prefill_matches_float64(dtype):
    page_size, max_pages = 16, 8
    q_lens, kv_lens = [5, 1, 40], [20, 100, 40]
    total = sum(q_lens)
    q = rand(total, 16, 128, dtype=dtype)
    kc, vc = rand(40, page_size, 4, 128, dtype=dtype), rand(40, page_size, 4, 128, dtype=dtype)
    table = torch.randperm(40)[:24].reshape(3, max_pages).int().cuda()
    lens = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
    indptr = torch.tensor([0, 5, 6, 46], dtype=torch.int32, device="cuda")
    got = astrai_jit.paged_prefill(q, kc, vc, table, lens, indptr, out=poisoned(*q.shape, dtype=dtype), max_q_len=40)
    start = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        pos = torch.arange(kl, device="cuda")
        row = table[b].long()
        k, v = kc[row[pos // page_size], pos % page_size], vc[row[pos // page_size], pos % page_size]
        expected, _ = attention_ref(q[start : start + ql][None], k[None], v[None],
                                    causal_keep(1, ql, kl, kl - ql, "cuda"))
        assert_rows_close(got[start : start + ql], expected[0])
        start += ql


# Variant features: soft-cap near the score range (scale 1 makes scores of several units), sinks
# of either sign, windows crossing page edges and longer than some sequences, and all three.
FEATURES = [dict(logit_cap=4.0), dict(sinks=True), dict(window_left=37),
            dict(logit_cap=4.0, sinks=True, window_left=37)]


def feature_args(n_heads, features):
    """The call's keyword arguments: sinks drawn at random, scale 1 beside a soft-cap."""
    args = dict(features)
    if args.get("sinks"):
        args["sinks"] = torch.randn(n_heads, device="cuda") * 2
    if "logit_cap" in args:
        args["scale"] = 1.0
    return args


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("features", FEATURES)
def test_paged_decode_features_match_float64(dtype, features):
    q, kc, vc, table, lens = paged_case(5, 16, 4, 128, 16, 8, dtype, seed=7)
    lens[0] = 1  # a one-token sequence
    args = feature_args(16, features)
    out = poisoned(*q.shape, dtype=dtype)
    got, lse = astrai_jit.paged_decode(q, kc, vc, table, lens, out=out, return_lse=True, **args)
    expected, expected_lse = paged_ref(q, kc, vc, table, lens, **args)
    assert_rows_close(got, expected)
    assert_lse_close(lse, expected_lse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_peaked_rows_through_the_split_merge(dtype):
    # Scale 1 and keys growing along each sequence: row maxima rise block after block and split
    # after split (sequences of thousands of tokens split), so the merge rescales earlier splits.
    q, kc, vc, table, lens = paged_case(3, 16, 4, 128, 16, 400, dtype, seed=13)
    lens.copy_(torch.tensor([6400, 3000, 17], dtype=torch.int32))
    positions = torch.arange(kc.shape[0] * 16, device="cuda").reshape(kc.shape[0], 16)
    for b in range(3):  # gain 1 + 4 t / len at token t of request b
        pages = table[b].long()
        t = positions[: pages.numel()] % 16 + (torch.arange(pages.numel(), device="cuda")[:, None] * 16)
        gain = 1 + 4 * t.double() / int(lens[b])
        kc[pages] = (kc[pages].double() * gain[:, :, None, None]).to(dtype)
    out = poisoned(*q.shape, dtype=dtype)
    got, lse = astrai_jit.paged_decode(q, kc, vc, table, lens, out=out, scale=1.0, return_lse=True)
    expected, expected_lse = paged_ref(q, kc, vc, table, lens, scale=1.0)
    assert_rows_close(got, expected)
    assert_lse_close(lse, expected_lse)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_len,n_heads,n_kv_heads,page_size,features", [
    (4, 32, 8, 16, {}), (8, 16, 2, 1, dict(window_left=37)), (3, 24, 4, 16, dict(sinks=True)),
    (2, 8, 8, 4, dict(logit_cap=4.0, sinks=True, window_left=5))])
def test_multi_token_paged_decode_matches_float64(dtype, q_len, n_heads, n_kv_heads, page_size, features):
    _, kc, vc, table, lens = paged_case(5, n_heads, n_kv_heads, 128, page_size, 96 // page_size + 2, dtype, seed=11)
    lens[0] = 1          # fewer keys than new tokens: the first tokens see nothing
    lens[1] = q_len      # exactly the new tokens
    q = rand(5, q_len, n_heads, 128, dtype=dtype)
    args = feature_args(n_heads, features)
    out = poisoned(*q.shape, dtype=dtype)
    got, lse = astrai_jit.paged_decode(q, kc, vc, table, lens, out=out, return_lse=True, **args)
    assert got is out and lse.shape == (5, q_len, n_heads)
    expected, expected_lse = paged_ref(q, kc, vc, table, lens, **args)
    assert_rows_close(got, expected)
    assert_lse_close(lse, expected_lse)


def test_multi_token_paged_decode_takes_strided_views():
    # q and out [batch, n_heads, q_len, D] in memory, viewed as [batch, q_len, n_heads, D].
    _, kc, vc, table, lens = paged_case(3, 16, 4, 64, 16, 20, torch.bfloat16, seed=12)
    q = rand(3, 16, 4, 64).transpose(1, 2)
    out = poisoned(3, 16, 4, 64, dtype=torch.bfloat16).transpose(1, 2)
    got = astrai_jit.paged_decode(q, kc, vc, table, lens, out=out)
    expected, _ = paged_ref(q, kc, vc, table, lens)
    assert_rows_close(got, expected)


@pytest.mark.parametrize("features", FEATURES)
def test_decode_features_match_float64(features):
    dtype = torch.bfloat16
    q = rand(3, 1, 32, 128, dtype=dtype)
    k, v = rand(3, 300, 8, 128, dtype=dtype), rand(3, 300, 8, 128, dtype=dtype)
    args = feature_args(32, features)
    got, lse = astrai_jit.decode(q, k, v, out=poisoned(*q.shape, dtype=dtype), causal_offset=250, return_lse=True,
                                 **args)
    window = args.get("window_left", -1)
    keep = causal_keep(3, 1, 300, 250, "cuda") if window < 0 else window_keep(3, 1, 300, 250, window, "cuda")
    expected, expected_lse = attention_ref(q, k, v, keep, scale=args.get("scale"), logit_cap=args.get("logit_cap", 0.0),
                                           sinks=args.get("sinks"))
    assert_rows_close(got, expected)
    assert_lse_close(lse, expected_lse[:, 0])


@pytest.mark.parametrize("features", FEATURES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_features_match_float64(features, head_dim):
    dtype = torch.bfloat16
    batch, q_len, kv_len = 2, 77, 130
    q = rand(batch, q_len, 8, head_dim, dtype=dtype)
    k, v = rand(batch, kv_len, 2, head_dim, dtype=dtype), rand(batch, kv_len, 2, head_dim, dtype=dtype)
    args = feature_args(8, features)
    out = poisoned(*q.shape, dtype=dtype)
    got = astrai_jit.prefill(q, k, v, out=out, causal_offset=kv_len - q_len, **args)
    window = args.get("window_left", -1)
    keep = (causal_keep(batch, q_len, kv_len, kv_len - q_len, "cuda") if window < 0
            else window_keep(batch, q_len, kv_len, kv_len - q_len, window, "cuda"))
    expected, _ = attention_ref(q, k, v, keep, scale=args.get("scale"), logit_cap=args.get("logit_cap", 0.0),
                                sinks=args.get("sinks"))
    assert_rows_close(got, expected)


@pytest.mark.parametrize("features", FEATURES)
def test_paged_prefill_features_match_float64(features):
    dtype = torch.bfloat16
    page_size, max_pages = 16, 8
    q_lens, kv_lens = [5, 1, 40], [20, 100, 40]
    q = rand(sum(q_lens), 16, 128, dtype=dtype)
    kc, vc = rand(40, page_size, 4, 128, dtype=dtype), rand(40, page_size, 4, 128, dtype=dtype)
    table = torch.randperm(40)[:24].reshape(3, max_pages).int().cuda()
    lens = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
    indptr = torch.tensor([0, 5, 6, 46], dtype=torch.int32, device="cuda")
    args = feature_args(16, features)
    got = astrai_jit.paged_prefill(q, kc, vc, table, lens, indptr, out=poisoned(*q.shape, dtype=dtype), max_q_len=40,
                                   **args)
    window = args.get("window_left", -1)
    start = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        pos = torch.arange(kl, device="cuda")
        row = table[b].long()
        k, v = kc[row[pos // page_size], pos % page_size], vc[row[pos // page_size], pos % page_size]
        keep = (causal_keep(1, ql, kl, kl - ql, "cuda") if window < 0
                else window_keep(1, ql, kl, kl - ql, window, "cuda"))
        expected, _ = attention_ref(q[start : start + ql][None], k[None], v[None], keep, scale=args.get("scale"),
                                    logit_cap=args.get("logit_cap", 0.0), sinks=args.get("sinks"))
        assert_rows_close(got[start : start + ql], expected[0])
        start += ql


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("per_head", [False, True])
def test_fp8_kv_cache_matches_the_dequantized_reference(fp8, per_head):
    dtype = torch.bfloat16
    q, kc, vc, table, lens = paged_case(4, 16, 4, 128, 16, 8, dtype, seed=11)
    shape = (4,) if per_head else ()
    k_scale, v_scale = torch.rand(shape, device="cuda") + 0.5, torch.rand(shape, device="cuda") + 0.5
    k8, v8 = kc.float().to(fp8), vc.float().to(fp8)
    heads = (1, 1, 4, 1) if per_head else ()
    k_real = k8.double() * (k_scale.double().view(heads) if per_head else k_scale.double())
    v_real = v8.double() * (v_scale.double().view(heads) if per_head else v_scale.double())
    out = poisoned(*q.shape, dtype=dtype)
    got = astrai_jit.paged_decode(q, k8, v8, table, lens, out=out, k_scale=k_scale, v_scale=v_scale)
    expected, _ = paged_ref(q, k_real, v_real, table, lens)
    assert_rows_close(got, expected)
    # Contiguous decode over the same FP8 values.
    k_flat = k8[table[0].long()].reshape(1, -1, 4, 128)[:, : int(lens[0])]
    v_flat = v8[table[0].long()].reshape(1, -1, 4, 128)[:, : int(lens[0])]
    got = astrai_jit.decode(q[:1, None], k_flat, v_flat, k_scale=k_scale, v_scale=v_scale)
    assert_rows_close(got[:, 0], expected[:1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_emb_matches_float64_in_place_and_out_of_place(dtype):
    x = rand(2, 33, 8, 128, dtype=dtype)
    angles = torch.rand(2, 33, 64, device="cuda") * 6
    freqs = torch.stack((angles.cos(), angles.sin()), dim=-1)
    expected = rotary_ref(x, freqs[:, :, None])
    got = astrai_jit.rotary_emb(x, freqs)
    assert_rows_close(got, expected)
    astrai_jit.rotary_emb(x, freqs, x)
    assert torch.equal(x, got)


def test_cuda_graph_capture_and_replay_after_one_warm_up():
    q, kc, vc, table, lens = paged_case(8, 32, 8, 128, 16, 64, torch.bfloat16)
    out = torch.empty_like(q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        astrai_jit.paged_decode(q, kc, vc, table, lens, out=out)  # warm-up: compile, workspace
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # capture on the stream that was warmed up
        astrai_jit.paged_decode(q, kc, vc, table, lens, out=out)
    eager = astrai_jit.paged_decode(q, kc, vc, table, lens)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    lens.add_(1).clamp_(max=64 * 16)  # the same graph stays valid as sequences grow
    graph.replay()
    assert torch.equal(out, astrai_jit.paged_decode(q, kc, vc, table, lens))


def test_torch_compile_fullgraph():
    def step(q, kc, vc, table, lens, x, freqs):
        x = astrai_jit.rotary_emb(x, freqs)
        return astrai_jit.paged_decode(q, kc, vc, table, lens) + 1, x

    q, kc, vc, table, lens = paged_case(4, 16, 4, 128, 16, 8, torch.bfloat16)
    x = rand(10, 16, 128)
    freqs = torch.randn(10, 64, 2, device="cuda")
    compiled = torch.compile(step, fullgraph=True)
    got = compiled(q, kc, vc, table, lens, x, freqs)
    expected = step(q, kc, vc, table, lens, x, freqs)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("name", ["paged_decode", "paged_decode_append", "decode", "prefill", "paged_prefill",
                                  "rotary_emb", "rotary_emb_", "mla_decode"])
def test_opcheck(name):
    from test_library import example_args
    args = example_args(name, "cuda")
    torch.library.opcheck(getattr(torch.ops.astrai_jit, name).default, args)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_two_gpus_are_refused():
    q, kc, vc, table, lens = paged_case(2, 8, 2, 64, 16, 4, torch.bfloat16)
    with pytest.raises(ValueError, match="k_cache is on cuda:1 but q is on cuda:0"):
        astrai_jit.paged_decode(q, kc.to("cuda:1"), vc, table, lens)


def test_second_gpu_runs_on_its_own_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    q, kc, vc, table, lens = (t.to("cuda:1") for t in paged_case(2, 8, 2, 64, 16, 4, torch.bfloat16))
    got = astrai_jit.paged_decode(q, kc, vc, table, lens)
    assert got.device == torch.device("cuda:1")
    assert_rows_close(got, paged_ref(q, kc, vc, table, lens)[0])


def test_loaded_variants_lists_what_ran():
    q, kc, vc, table, lens = paged_case(2, 8, 2, 64, 16, 4, torch.bfloat16)
    astrai_jit.paged_decode(q, kc, vc, table, lens)
    assert any(name.startswith("paged_decode.bf16.hd64.ps16.g4") for name in astrai_jit.loaded_variants())
