"""Custom ops: schemas declare what they mutate, fake implementations give shapes without a
GPU, and torch.compile(fullgraph=True) records the ops with no graph break (CPU)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import astrai_jit
from astrai_jit import _library

bf16 = torch.bfloat16

MUTATED = {
    "paged_decode": {"out", "lse", "workspace"},
    "paged_decode_append": {"k_cache", "v_cache", "out", "lse", "workspace"},
    "decode": {"out", "lse"},
    "prefill": {"out", "lse"},
    "paged_prefill": {"out", "lse"},
    "rotary_emb": {"out"},
    "rotary_emb_": {"x"},
    "merge_states": {"out", "lse"},
    "cascade": {"out", "lse", "workspace"},
    "merge_state_": {"v", "s"},
    "mla_decode": {"out", "lse", "workspace"},
}


@pytest.mark.parametrize("name", sorted(MUTATED))
def test_schema_declares_every_write(name):
    schema = getattr(torch.ops.astrai_jit, name).default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == MUTATED[name], str(schema)
    assert len(schema.returns) == 0


@pytest.mark.parametrize("name", sorted(MUTATED))
def test_autograd_registration_passes_opcheck(name):
    op = getattr(torch.ops.astrai_jit, name).default
    args = example_args(name, "cpu")
    torch.library.opcheck(op, args, test_utils="test_autograd_registration")


def example_args(name, device):
    q = torch.randn(2, 8, 64, dtype=bf16, device=device)
    kc = torch.randn(10, 16, 2, 64, dtype=bf16, device=device)
    table = torch.zeros(2, 4, dtype=torch.int32, device=device)
    lens = torch.ones(2, dtype=torch.int32, device=device)
    lse = torch.empty(2, 8, device=device)
    if name == "paged_decode":
        sinks = torch.zeros(8, device=device)  # the optional tensor among the feature arguments
        return (q, kc, kc.clone(), table, lens, torch.empty_like(q), lse, None, None, 0.0, 0.0, sinks, -1, None,
                None, -1, False, None)
    if name == "paged_decode_append":
        new = torch.randn(2, 2, 64, dtype=bf16, device=device)
        return (q, kc, kc.clone(), table, lens, torch.empty_like(q), lse, None, None, new, new.clone(), 0.0,
                0.0, None, -1, None, None, -1, False, None)
    if name in ("decode", "prefill"):
        q4 = torch.randn(2, 1 if name == "decode" else 5, 8, 64, dtype=bf16, device=device)
        k = torch.randn(2, 20, 2, 64, dtype=bf16, device=device)
        lse = torch.empty(2, 8, device=device) if name == "decode" else torch.empty(2, 5, 8, device=device)
        scales = (None, None) if name == "decode" else ()
        return (q4, k, k.clone(), torch.empty_like(q4), lse, None, -1, 0.0, 0.0, None, -1, *scales, -1)
    if name == "paged_prefill":
        qp = torch.randn(7, 8, 64, dtype=bf16, device=device)
        indptr = torch.tensor([0, 3, 7], dtype=torch.int32, device=device)
        return (qp, kc, kc.clone(), table, lens, indptr, torch.empty_like(qp), None, None, -1, True, 0.0, 0.0,
                None, -1, None, None, -1)
    if name == "cascade":
        qc = torch.randn(3, 8, 64, dtype=bf16, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        return (qc, kc, kc.clone(), [torch.tensor([0, 3], **i32), torch.tensor([0, 1, 2, 3], **i32)],
                [torch.zeros(1, 4, **i32), torch.zeros(3, 2, **i32)], [torch.ones(1, **i32), torch.ones(3, **i32)],
                [False, True], [3, 1], torch.empty_like(qc), torch.empty(3, 8, device=device), 0.0, 0.0, None, None,
                None, None, -1)
    if name == "mla_decode":
        qm = torch.randn(2, 16, 576, dtype=bf16, device=device)
        cache = torch.randn(10, 16, 576, dtype=bf16, device=device)
        return (qm, cache, table, lens, torch.empty(2, 16, 512, dtype=bf16, device=device),
                torch.empty(2, 16, device=device), 0.0721, -1, False, None, None)
    if name == "merge_states":
        v = torch.randn(5, 3, 4, 64, dtype=bf16, device=device)
        return (v, torch.randn(5, 3, 4, device=device), None, None, torch.empty(5, 4, 64, dtype=bf16, device=device),
                torch.empty(5, 4, device=device), -1)
    if name == "merge_state_":
        v = torch.randn(5, 4, 64, dtype=bf16, device=device)
        return (v, torch.randn(5, 4, device=device), v.clone(), torch.randn(5, 4, device=device), -1)
    x = torch.randn(6, 8, 64, dtype=bf16, device=device)
    f = torch.randn(6, 32, 2, device=device)
    return (x, f, torch.empty_like(x), -1) if name == "rotary_emb" else (x, f, -1)


@pytest.mark.parametrize("name", sorted(MUTATED))
def test_fake_implementations_run_on_fake_cuda_tensors(name):
    with FakeTensorMode():
        args = example_args(name, "cuda")
        assert getattr(torch.ops.astrai_jit, name)(*args) is None


def test_functional_api_infers_output_shapes_under_fake_tensors():
    with FakeTensorMode():
        q = torch.empty(3, 8, 128, dtype=bf16, device="cuda")
        kc = torch.empty(64, 16, 2, 128, dtype=bf16, device="cuda")
        table = torch.zeros(3, 8, dtype=torch.int32, device="cuda")
        lens = torch.ones(3, dtype=torch.int32, device="cuda")
        out, lse = astrai_jit.paged_decode(q, kc, kc, table, lens, return_lse=True)
        assert out.shape == q.shape and out.dtype == bf16 and out.device.type == "cuda"
        assert lse.shape == (3, 8) and lse.dtype == torch.float32
        qp = torch.empty(2, 5, 8, 128, dtype=torch.float16, device="cuda")
        kp = torch.empty(2, 9, 2, 128, dtype=torch.float16, device="cuda")
        out, lse = astrai_jit.prefill(qp, kp, kp, causal_offset=4, return_lse=True)
        assert out.shape == qp.shape and lse.shape == (2, 5, 8)
        x = torch.empty(2, 5, 8, 128, dtype=bf16, device="cuda")
        assert astrai_jit.rotary_emb(x, torch.empty(5, 64, 2, device="cuda")).shape == x.shape
        v = torch.empty(7, 3, 4, 512, dtype=torch.float16, device="cuda")
        out, lse = astrai_jit.merge_states(v, torch.empty(7, 3, 4, device="cuda"))
        assert out.shape == (7, 4, 512) and out.dtype == torch.float16 and lse.shape == (7, 4)
        out, lse = astrai_jit.merge_state(v[:, 0], torch.empty(7, 4, device="cuda"), v[:, 1],
                                          torch.empty(7, 4, device="cuda"))
        assert out.shape == (7, 4, 512) and lse.dtype == torch.float32


def test_compile_fullgraph_records_the_ops_without_a_break():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(q, kc, vc, table, lens, new_k, new_v, x, freqs):
        x = astrai_jit.rotary_emb(x, freqs, x)
        out = astrai_jit.paged_decode(q, kc, vc, table, lens, new_k=new_k, new_v=new_v)
        return out * 2, x

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    q = torch.randn(2, 8, 64, dtype=bf16)
    kc = torch.randn(10, 16, 2, 64, dtype=bf16)
    new = torch.randn(2, 2, 64, dtype=bf16)
    x = torch.randn(6, 8, 64, dtype=bf16)
    args = (q, kc, kc.clone(), torch.zeros(2, 4, dtype=torch.int32), torch.ones(2, dtype=torch.int32), new,
            new.clone(), x, torch.randn(6, 32, 2))
    # Tracing succeeds on CPU; running the graph reaches the kernel, which refuses CPU tensors.
    with pytest.raises(ValueError, match="is on cpu"):
        compiled(*args)
    assert len(graphs) == 1
    code = graphs[0].code
    assert "astrai_jit.paged_decode_append" in code and "astrai_jit.rotary_emb_" in code


def test_all_ops_are_registered():
    assert set(_library.OPS) == set(MUTATED)
