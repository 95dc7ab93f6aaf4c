"""The kernels as PyTorch custom ops (``torch.ops.astrai_jit.*``).

Each op writes into tensors it is given and returns nothing; ``mutates_args`` names them (out,
the optional LSE, and for the fused append the two caches), so functionalization, torch.compile
and CUDA graph capture see every write. The fake implementations have nothing to compute (the
outputs already exist with their final shapes); they check that every tensor is on one device.
A stream of -1 means the current PyTorch stream when the op runs.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._loader import import_extension

_C = import_extension()

Tensor = torch.Tensor


def _stream(device: torch.device, stream: int) -> int:
    if stream != -1:
        return stream
    if device.type != "cuda":
        return 0
    return torch._C._cuda_getCurrentRawStream(device.index)


def _same_device(call: str, **tensors) -> None:
    # The extension's device check, on fake tensors while tracing (same message); a list of
    # tensors (cascade's levels) counts entry by entry.
    flat = {}
    for name, t in tensors.items():
        if isinstance(t, (list, tuple)):
            flat.update({f"{name}[{i}]": entry for i, entry in enumerate(t)})
        else:
            flat[name] = t
    first_name, first = next(iter(flat.items()))
    for name, t in flat.items():
        if t is not None and t.device != first.device:
            raise ValueError(f"{call}: {name} is on {t.device} but {first_name} is on {first.device} "
                             f"(allowed: every tensor on one CUDA device)")


def _run(fn, device: torch.device, *args) -> None:
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            fn(*args)
    else:
        fn(*args)


# The ops as one table: each argument's name and schema type in the op's order, what the op
# writes, and the values its extension call takes (by name; None for an argument the op does not
# take; "stream" resolved when the op runs). The schemas, the implementations, the fake
# implementations and the Python API's calls (_ops._call) are made from it, so an argument is
# written down once here.
_OPTIONS = [("scale", "float"), ("logit_cap", "float"), ("sinks", "Tensor?"), ("window_left", "int")]
_KV_SCALES = [("k_scale", "Tensor?"), ("v_scale", "Tensor?")]
# Options added after the first ops' schemas, as trailing arguments with defaults (so that calls
# made with the earlier schemas keep working).
_LATER_OPTIONS = [("alibi_slopes", "Tensor?", None)]
# FP8 attention's options (prefill with float8_e4m3fn q, k and v), trailing prefill's arguments
# with defaults as the later options do: k_scale and v_scale as an FP8 cache's, q_scale, and
# p_fp16 (P kept in f16), the pack's last two (paged_prefill takes them last too; the other calls
# pack their defaults).
_FP8_ATTENTION_OPTIONS = [("k_scale", "Tensor?", None), ("v_scale", "Tensor?", None), ("q_scale", "Tensor?", None),
                          ("p_fp16", "bool", False)]
# Arguments that trail a generated call's parameters with these defaults (_ops._call).
_TRAILING_DEFAULTS = _LATER_OPTIONS + _FP8_ATTENTION_OPTIONS
# The attention calls take their options as one extension argument, `options`: a tuple of these
# values in this order (an option the op does not take goes as its default). The extension reads
# it by its own table (python/src/attention_options.hpp's kOptionFields), which
# test_marshalling.py holds to this one (names, order, kinds, defaults); a new option is appended
# here and there, and no extension signature changes.
# An option left out: the scale 1/sqrt(head_dim), no soft-cap, no window, no tensor.
_OPTION_DEFAULTS = {"scale": 0.0, "logit_cap": 0.0, "window_left": -1}
_PACKED_OPTIONS = [*[(name, kind, _OPTION_DEFAULTS.get(name)) for name, kind in _OPTIONS + _KV_SCALES],
                   *_LATER_OPTIONS, ("q_scale", "Tensor?", None), ("p_fp16", "bool", False)]
_PACKED_NAMES = [name for name, *_ in _PACKED_OPTIONS]
_LATER_NAMES = [name for name, *_ in _LATER_OPTIONS]
_PAGED_DECODE_HEAD = [("q", "Tensor"), ("k_cache", "Tensor"), ("v_cache", "Tensor"), ("page_table", "Tensor"),
                      ("seq_lens", "Tensor?"), ("out", "Tensor"), ("lse", "Tensor?"), ("mask", "Tensor?"),
                      ("req_indices", "Tensor?")]
# No defaults up to the written workspace: a dispatcher drops trailing arguments equal to their
# defaults before the in-place bookkeeping looks a written one up by position (PyTorch 2.11 failed
# with "tuple index out of range" on a call that left the workspace out).
_PAGED_DECODE_TAIL = [*_OPTIONS, *_KV_SCALES, ("stream", "int"), ("seq_lens_are_offsets", "bool"),
                      ("workspace", "Tensor?"), *_LATER_OPTIONS]
_PAGED_DECODE_EXT = ["q", "k_cache", "v_cache", "page_table", "seq_lens", "out", "lse", "mask", "req_indices",
                     "new_k", "new_v", "scale", "logit_cap", "sinks", "window_left", "k_scale", "v_scale", "stream",
                     "seq_lens_are_offsets", "workspace", *_LATER_NAMES]
_CONTIGUOUS_HEAD = [("q", "Tensor"), ("k", "Tensor"), ("v", "Tensor"), ("out", "Tensor"), ("lse", "Tensor?"),
                    ("mask", "Tensor?"), ("causal_offset", "int")]


class _Op:
    def __init__(self, ext: str, args: list, mutates: tuple, ext_args: list, call: str = None,
                 packs_options: bool = False):
        self.ext = ext
        self.call = call or ext  # the call its errors name
        self.args = args
        self.names = [a[0] for a in args]
        self.mutates = mutates
        self.ext_args = ext_args
        # The extension's arguments: ext_args, with an attention call's options (packs_options)
        # gathered into one tuple, `options`, where its first option stands.
        self.ext_layout = list(ext_args)
        if packs_options:
            first = min(ext_args.index(name) for name in _PACKED_NAMES if name in ext_args)
            self.ext_layout = [a for a in ext_args[:first] if a not in _PACKED_NAMES] + ["options"] + \
                              [a for a in ext_args[first:] if a not in _PACKED_NAMES]

    def packed(self, values: dict) -> tuple:
        """The options tuple from the values by name (the defaults for the options the op lacks)."""
        return tuple(values.get(name, default) if name in self.ext_args else default
                     for name, _, default in _PACKED_OPTIONS)

    def schema(self) -> str:
        fields = []
        aliases = iter("abcdefgh")
        for name, kind, *default in self.args:
            if name in self.mutates:
                optional = kind.endswith("?")
                kind = f"Tensor({next(aliases)}!){'?' if optional else ''}"
            text = f"{kind} {name}"
            if default:
                text += "=" + ("None" if default[0] is None else str(default[0]))
            fields.append(text)
        return "(" + ", ".join(fields) + ") -> ()"


_TABLE = {
    "paged_decode": _Op("paged_decode", _PAGED_DECODE_HEAD + _PAGED_DECODE_TAIL, ("out", "lse", "workspace"),
                        _PAGED_DECODE_EXT, packs_options=True),
    "paged_decode_append": _Op("paged_decode",
                               _PAGED_DECODE_HEAD + [("new_k", "Tensor"), ("new_v", "Tensor")] + _PAGED_DECODE_TAIL,
                               ("k_cache", "v_cache", "out", "lse", "workspace"), _PAGED_DECODE_EXT,
                               packs_options=True),
    "decode": _Op("decode", _CONTIGUOUS_HEAD + _OPTIONS + _KV_SCALES + [("stream", "int")] + _LATER_OPTIONS,
                  ("out", "lse"), [*[a[0] for a in _CONTIGUOUS_HEAD + _OPTIONS + _KV_SCALES], "stream", *_LATER_NAMES],
                  packs_options=True),
    "prefill": _Op("prefill", _CONTIGUOUS_HEAD + _OPTIONS + [("stream", "int")] + _LATER_OPTIONS +
                   _FP8_ATTENTION_OPTIONS, ("out", "lse"),
                   [*[a[0] for a in _CONTIGUOUS_HEAD + _OPTIONS], "stream", *_LATER_NAMES,
                    *[a[0] for a in _FP8_ATTENTION_OPTIONS]], packs_options=True),
    "paged_prefill": _Op(
        "paged_prefill",
        [("q", "Tensor"), ("k_cache", "Tensor"), ("v_cache", "Tensor"), ("page_table", "Tensor"),
         ("seq_lens", "Tensor"), ("qo_indptr", "Tensor"), ("out", "Tensor"), ("lse", "Tensor?"), ("mask", "Tensor?"),
         ("max_q_len", "int"), ("causal", "bool"), *_OPTIONS, *_KV_SCALES, ("stream", "int"),
         ("req_indices", "Tensor?", None), ("seq_lens_are_offsets", "bool", False), *_LATER_OPTIONS,
         ("q_scale", "Tensor?", None), ("p_fp16", "bool", False)],
        ("out", "lse"),
        ["q", "k_cache", "v_cache", "page_table", "seq_lens", "qo_indptr", "out", "lse", "mask", "max_q_len", "causal",
         "scale", "logit_cap", "sinks", "window_left", "k_scale", "v_scale", "stream", "req_indices",
         "seq_lens_are_offsets", *_LATER_NAMES, "q_scale", "p_fp16"], packs_options=True),
    "rotary_emb": _Op("rotary_emb", [("x", "Tensor"), ("freqs_cis", "Tensor"), ("out", "Tensor"), ("stream", "int")],
                      ("out",), ["x", "freqs_cis", "out", "stream"]),
    "rotary_emb_": _Op("rotary_emb", [("x", "Tensor"), ("freqs_cis", "Tensor"), ("stream", "int")], ("x",),
                       ["x", "freqs_cis", "x", "stream"]),
    "cascade": _Op("cascade", [("q", "Tensor"), ("k_cache", "Tensor"), ("v_cache", "Tensor"), ("qo_indptrs", "Tensor[]"),
                               ("page_tables", "Tensor[]"), ("seq_lens", "Tensor[]"), ("causal", "bool[]"),
                               ("max_q_lens", "int[]"), ("out", "Tensor"), ("lse", "Tensor?"), ("scale", "float"),
                               ("logit_cap", "float"), ("sinks", "Tensor?"), ("k_scale", "Tensor?"),
                               ("v_scale", "Tensor?"), ("workspace", "Tensor?"), ("stream", "int")],
                   ("out", "lse", "workspace"),
                   ["q", "k_cache", "v_cache", "qo_indptrs", "page_tables", "seq_lens", "causal", "max_q_lens", "out",
                    "lse", "scale", "logit_cap", "sinks", "k_scale", "v_scale", "workspace", "stream"],
                   packs_options=True),
    "mla_decode": _Op("mla_decode", [("q", "Tensor"), ("kv_cache", "Tensor"), ("page_table", "Tensor"),
                                     ("seq_lens", "Tensor"), ("out", "Tensor"), ("lse", "Tensor?"), ("scale", "float"),
                                     ("stream", "int"), ("seq_lens_are_offsets", "bool"), ("workspace", "Tensor?"),
                                     ("kv_scale", "Tensor?")],
                      ("out", "lse", "workspace"),
                      ["q", "kv_cache", "page_table", "seq_lens", "out", "lse", "scale", "stream",
                       "seq_lens_are_offsets", "workspace", "kv_scale"]),
    "merge_states": _Op("merge_states", [("v_a", "Tensor"), ("s_a", "Tensor"), ("v_b", "Tensor?"), ("s_b", "Tensor?"),
                                         ("out", "Tensor"), ("lse", "Tensor?"), ("stream", "int")],
                        ("out", "lse"), ["v_a", "s_a", "v_b", "s_b", "out", "lse", "stream"]),
    "merge_state_": _Op("merge_states", [("v", "Tensor"), ("s", "Tensor"), ("v_other", "Tensor"),
                                         ("s_other", "Tensor"), ("stream", "int")],
                        ("v", "s"), ["v", "s", "v_other", "s_other", "v", "s", "stream"]),
}


def _bound(op: _Op, args: tuple, kwargs: dict) -> dict:
    named = dict(zip(op.names, args))
    named.update(kwargs)
    for name, _, *default in op.args:
        if name not in named and default:
            named[name] = default[0]
    return named


def _register(name: str, op: _Op):
    ext = getattr(_C, op.ext)

    def run(*args, **kwargs) -> None:
        named = _bound(op, args, kwargs)
        device = named[op.names[0]].device
        named["stream"] = _stream(device, named["stream"])
        named["options"] = op.packed(named)
        _run(ext, device, *[named.get(arg) for arg in op.ext_layout])

    def fake(*args, **kwargs) -> None:
        named = _bound(op, args, kwargs)
        tensors = {n: named.get(n) for n, kind, *_ in op.args if kind.startswith("Tensor")}
        _same_device(op.call, **tensors)

    custom = torch.library.custom_op(f"astrai_jit::{name}", run, mutates_args=op.mutates, schema=op.schema())
    custom.register_fake(fake)
    return custom


OPS = {name: _register(name, op) for name, op in _TABLE.items()}
