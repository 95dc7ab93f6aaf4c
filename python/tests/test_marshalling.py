"""The Python API's extension calls are made from the op table (_library._TABLE): the table names
the extension's arguments as the extension does, the attention options' pack is laid out as the
extension's own table reads it, every call site passes the values the generated call names, and an
eager call hands each value to the extension argument of its name (CPU)."""
import ast
import inspect
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import astrai_jit
from astrai_jit import _C, _cascade, _library, _ops

CALLS = {name: call for module in (_ops, _cascade) for name, call in vars(module).items()
         if hasattr(call, "entries")}


def extension_parameters(ext: str):
    # nanobind's docstring opens with the signature: "name(a: type, b: type = default) -> None".
    return re.findall(r"[(,] ?(\w+):", getattr(_C, ext).__doc__.splitlines()[0])


def parameters(call):
    return list(inspect.signature(call).parameters)


def test_every_table_entry_is_called():
    assert {entry for call in CALLS.values() for entry in call.entries} == set(_library._TABLE)


@pytest.mark.parametrize("name", sorted(_library._TABLE))
def test_table_names_the_extension_arguments_in_its_order(name):
    op = _library._TABLE[name]
    names = extension_parameters(op.ext)
    assert len(op.ext_layout) == len(names)
    if len(set(op.ext_layout)) == len(op.ext_layout):  # not an in-place entry (rotary_emb_ passes x as out)
        assert op.ext_layout == names


def test_the_options_pack_is_the_extensions_table():
    # Names, order, schema kinds and defaults: a row added on one side only fails here.
    assert _C._attention_option_fields() == [tuple(row) for row in _library._PACKED_OPTIONS]


@pytest.mark.parametrize("name", sorted(_library._TABLE))
def test_an_ops_options_have_the_packs_kinds(name):
    op = _library._TABLE[name]
    kinds = {arg[0]: arg[1] for arg in op.args}
    packed = {name: kind for name, kind, _ in _library._PACKED_OPTIONS}
    if "options" not in op.ext_layout:  # mla_decode's scale is its own (MlaDecodeArgs has no options block)
        return
    for option in set(op.ext_args) & set(packed):
        assert kinds[option] == packed[option], option


@pytest.mark.parametrize("module", [_ops, _cascade], ids=lambda m: m.__name__)
def test_call_sites_pass_the_values_the_call_names(module):
    sites = 0
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLS:
            assert not node.keywords, node.func.id
            passed = [arg.id if isinstance(arg, ast.Name) else ast.unparse(arg) for arg in node.args]
            assert passed == parameters(CALLS[node.func.id]), f"{module.__name__}:{node.lineno}"
            sites += 1
    assert sites


def recorded(monkeypatch, call, run) -> tuple:
    # The extension's arguments in one eager call.
    seen = []
    monkeypatch.setitem(call.__globals__, "_ext", lambda *args: seen.append(args))
    run()
    (args,) = seen
    return args


def tensors(n, *shape):
    return [torch.full(shape or (1,), float(i)) for i in range(n)]


def packed(expected: dict) -> dict:
    # The extension's arguments by name: the options gathered into their pack where the first stands.
    names = [name for name, *_ in _library._PACKED_OPTIONS]
    out = {}
    for name, value in expected.items():
        if name not in names:
            out[name] = value
        elif "options" not in out:
            out["options"] = tuple(expected.get(n, default) for n, _, default in _library._PACKED_OPTIONS)
    return out


def same(value, want) -> bool:
    if isinstance(want, tuple):
        return isinstance(value, tuple) and len(value) == len(want) and all(map(same, value, want))
    return value is want or (not isinstance(want, torch.Tensor) and value == want)


def assert_passed(args, ext, expected):
    names = extension_parameters(ext)
    expected = packed(expected)
    assert list(expected) == names
    for name, value, want in zip(names, args, expected.values()):
        assert same(value, want), name


def test_an_eager_paged_decode_hands_each_value_to_its_argument(monkeypatch):
    q, kc, vc, table, lens, out, mask, rows, new_k, new_v, sinks, ks, vs, indptr, ws, alibi = tensors(16)
    args = recorded(monkeypatch, _ops._PAGED_DECODE, lambda: astrai_jit.paged_decode(
        q, kc, vc, table, None, out=out, scale=0.5, mask=mask, req_indices=rows, new_k=new_k, new_v=new_v,
        logit_cap=30.0, sinks=sinks, window_left=7, alibi_slopes=alibi, k_scale=ks, v_scale=vs, kv_indptr=indptr,
        workspace=ws, stream=1234))
    expected = dict(q=q, k_cache=kc, v_cache=vc, page_table=table, seq_lens=indptr, out=out, lse=None, mask=mask,
                    req_indices=rows, new_k=new_k, new_v=new_v, scale=0.5, logit_cap=30.0, sinks=sinks,
                    window_left=7, k_scale=ks, v_scale=vs, stream=1234, seq_lens_are_offsets=True, workspace=ws,
                    alibi_slopes=alibi)
    assert_passed(args, "paged_decode", expected)


def test_an_eager_paged_prefill_hands_each_value_to_its_argument(monkeypatch):
    q, kc, vc, table, lens, qo, out, mask, sinks, ks, vs, rows, alibi = tensors(13)
    args = recorded(monkeypatch, _ops._PAGED_PREFILL, lambda: astrai_jit.paged_prefill(
        q, kc, vc, table, lens, qo, out=out, scale=0.25, mask=mask, causal=False, max_q_len=3, logit_cap=20.0,
        sinks=sinks, window_left=5, alibi_slopes=alibi, k_scale=ks, v_scale=vs, req_indices=rows, stream=99))
    expected = dict(q=q, k_cache=kc, v_cache=vc, page_table=table, seq_lens=lens, qo_indptr=qo, out=out, lse=None,
                    mask=mask, max_q_len=3, causal=False, scale=0.25, logit_cap=20.0, sinks=sinks, window_left=5,
                    k_scale=ks, v_scale=vs, stream=99, req_indices=rows, seq_lens_are_offsets=False,
                    alibi_slopes=alibi)
    assert_passed(args, "paged_prefill", expected)


@pytest.mark.parametrize("name", ["decode", "prefill"])
def test_an_eager_contiguous_call_hands_each_value_to_its_argument(monkeypatch, name):
    q, k, v, out, mask, sinks, ks, vs, alibi = tensors(9)
    scales = dict(k_scale=ks, v_scale=vs) if name == "decode" else {}
    call = _ops._DECODE if name == "decode" else _ops._PREFILL
    args = recorded(monkeypatch, call, lambda: getattr(astrai_jit, name)(
        q, k, v, out=out, scale=2.0, mask=mask, causal_offset=4, logit_cap=10.0, sinks=sinks, window_left=3,
        alibi_slopes=alibi, stream=7, **scales))
    expected = dict(q=q, k=k, v=v, out=out, lse=None, mask=mask, causal_offset=4, scale=2.0, logit_cap=10.0,
                    sinks=sinks, window_left=3, **scales, stream=7, alibi_slopes=alibi)
    assert_passed(args, name, expected)


def test_an_eager_cascade_hands_each_value_to_its_argument(monkeypatch):
    q, kc, vc, qo, table, lens, out, sinks, ks, vs, ws = tensors(11)
    level = astrai_jit.CascadeLevel(qo, table, lens, causal=True, max_q_len=2)
    args = recorded(monkeypatch, _cascade._CASCADE, lambda: astrai_jit.cascade(
        q, kc, vc, [level], out=out, scale=0.5, logit_cap=4.0, sinks=sinks, k_scale=ks, v_scale=vs, workspace=ws,
        stream=5))
    expected = dict(q=q, k_cache=kc, v_cache=vc, qo_indptrs=[qo], page_tables=[table], seq_lens=[lens],
                    causal=[True], max_q_lens=[2], out=out, lse=None, scale=0.5, logit_cap=4.0, sinks=sinks,
                    k_scale=ks, v_scale=vs, workspace=ws, stream=5)
    assert_passed(args, "cascade", expected)


def test_rotary_and_merge_calls_pass_out_and_the_states(monkeypatch):
    x, freqs, out, v_a, s_a, v_b, s_b = tensors(7)
    assert_passed(recorded(monkeypatch, _ops._ROTARY_EMB, lambda: astrai_jit.rotary_emb(x, freqs, out, stream=3)),
                  "rotary_emb", dict(x=x, freqs_cis=freqs, out=out, stream=3))
    assert_passed(recorded(monkeypatch, _ops._ROTARY_EMB, lambda: astrai_jit.rotary_emb(x, freqs, x, stream=3)),
                  "rotary_emb", dict(x=x, freqs_cis=freqs, out=x, stream=3))
    assert_passed(recorded(monkeypatch, _ops._MERGE_STATE_,
                           lambda: astrai_jit.merge_state_in_place(v_a, s_a, v_b, s_b, stream=3)),
                  "merge_states", dict(v_a=v_a, s_a=s_a, v_b=v_b, s_b=s_b, out=v_a, lse=s_a, stream=3))
    v_a, v_b, out = tensors(3, 2, 1, 8)
    s_a, s_b, lse = tensors(3, 2, 1)
    assert_passed(recorded(monkeypatch, _ops._MERGE_STATES,
                           lambda: astrai_jit.merge_state(v_a, s_a, v_b, s_b, out=out, lse=lse, stream=3)),
                  "merge_states", dict(v_a=v_a, s_a=s_a, v_b=v_b, s_b=s_b, out=out, lse=lse, stream=3))
    (v,), (s,) = tensors(1, 2, 3, 1, 8), tensors(1, 2, 3, 1)
    assert_passed(recorded(monkeypatch, _ops._MERGE_STATES,
                           lambda: astrai_jit.merge_states(v, s, out=out, lse=lse, stream=3)),
                  "merge_states", dict(v_a=v, s_a=s, v_b=None, s_b=None, out=out, lse=lse, stream=3))


def recorded_ops(monkeypatch, call) -> list:
    # The ops that record the call (with fake tensors), and their arguments by name.
    seen = []
    for i, entry in enumerate(call.entries):
        names = _library._TABLE[entry].names
        monkeypatch.setitem(call.__globals__, f"_op{i}",
                            lambda *args, entry=entry, names=names: seen.append((entry, dict(zip(names, args)))))
    return seen


def test_a_traced_call_records_the_op_that_fits_the_values(monkeypatch):
    decode_ops = recorded_ops(monkeypatch, _ops._PAGED_DECODE)
    rotary_ops = recorded_ops(monkeypatch, _ops._ROTARY_EMB)
    with FakeTensorMode():
        q, kc, vc, table, lens, new_k, new_v, freqs, out = tensors(9)
        astrai_jit.paged_decode(q, kc, vc, table, lens, out=out)
        astrai_jit.paged_decode(q, kc, vc, table, lens, out=out, new_k=new_k, new_v=new_v, stream=8)
        astrai_jit.rotary_emb(q, freqs, q)
        astrai_jit.rotary_emb(q, freqs, out)
    (plain, a), (append, b) = decode_ops
    assert plain == "paged_decode" and a["seq_lens"] is lens and a["out"] is out and a["stream"] == -1
    assert append == "paged_decode_append" and b["new_k"] is new_k and b["new_v"] is new_v and b["stream"] == 8
    assert [entry for entry, _ in rotary_ops] == ["rotary_emb_", "rotary_emb"]
    assert rotary_ops[0][1]["x"] is q and rotary_ops[1][1]["out"] is out


def test_astrais_2026_07_paged_decode_calls_the_generated_call_in_the_tables_order(monkeypatch):
    # astrai_csrc calls _PAGED_DECODE positionally on its hot path: its order is the table's, and
    # any parameter after it (an option added later) has a default.
    from astrai_jit import astrai_csrc
    order = astrai_csrc._PAGED_DECODE_ORDER
    signature = inspect.signature(_ops._PAGED_DECODE).parameters
    assert tuple(signature)[:len(order)] == order
    assert all(p.default is not inspect.Parameter.empty for p in list(signature.values())[len(order):])
    q = torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16)
    kc = torch.zeros(9, 1, 2, 64, dtype=torch.bfloat16)
    vc = kc.clone()
    table = torch.zeros(2, 4, dtype=torch.int64)
    args = recorded(monkeypatch, _ops._PAGED_DECODE,
                    lambda: astrai_csrc.attn_paged_decode(q, table, kc, vc, 1, 4, None, -1, 0.25, 1))
    names = extension_parameters("paged_decode")
    passed = dict(zip(names, args))
    passed.update(zip(_library._PACKED_NAMES, passed.pop("options")))
    assert passed["q"] is q and passed["k_cache"] is kc and passed["v_cache"] is vc and passed["page_table"] is table
    assert passed["seq_lens"] is None and passed["lse"] is None and passed["mask"] is None
    assert passed["scale"] == 0.25 and passed["window_left"] == -1 and passed["seq_lens_are_offsets"] is False
    assert passed["out"].shape == q.shape and passed["out"] is not q
