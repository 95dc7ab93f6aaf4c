#!/usr/bin/env python3
"""AstrAI's own compiled kernels against astrai-jit's, on AstrAI's shapes, in one run.

AstrAI's modules are loaded from a checkout whose kernels AstrAI's own build compiled
(scripts/astrai/harness.py build-own); astrai-jit's are the functions its stand-in modules serve
(astrai_jit.astrai_csrc). Both are called exactly as AstrAI's wrappers call them, with the same
tensors, alternating A B B A; each figure is the median over rounds of the mean time of a burst of
calls (CUDA events; host time included, as AstrAI pays it). Outputs are compared too.

    python bench/astrai_side_by_side.py ASTRAI_CHECKOUT [--filter TEXT] [--json FILE]
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch

import astrai_jit.astrai_csrc as jit
from timing import time_call  # bench/, the script's own directory

bf16 = torch.bfloat16
DEV = "cuda"


def load_own(checkout: Path, name: str):
    """AstrAI's own build of kernel `name` (its extension module, loaded by file)."""
    lib = checkout / "astrai" / "extension" / "lib"
    own = lib / (name + importlib.machinery.EXTENSION_SUFFIXES[0])
    for candidate in (own, own.with_name(own.name + ".astrai-own")):
        if candidate.is_file():
            loader = importlib.machinery.ExtensionFileLoader(name, str(candidate))
            spec = importlib.util.spec_from_loader(name, loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            if getattr(module, "served_by", "") != "astrai-jit":
                return module
    raise SystemExit(f"astrai_side_by_side: no AstrAI build of {name} in {lib} (run harness.py build-own)")


def compare(own, ours, rounds: int = 7, burst: int = 20):
    for fn in (own, ours):
        fn()
    torch.cuda.synchronize()
    a, b = [], []
    for _ in range(rounds):  # A B B A
        a.append(time_call(own, burst))
        b.append(time_call(ours, burst))
        b.append(time_call(ours, burst))
        a.append(time_call(own, burst))
    return statistics.median(a), statistics.median(b)


def rel_err(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float((x - y).norm() / y.norm().clamp_min(1e-30))


def reference(kernel: str, args: tuple):
    """A float32 reference for the decode cases (where AstrAI's two builds disagree), else None."""
    if kernel == "attn_decode":
        q, k, v = args
    elif kernel == "attn_paged_decode" and not args[1].is_floating_point():  # 2026-07 pages, page size 1
        q, table, pool = args[0], args[1], args[2]
        k = v = pool[table.long(), 0]
    else:
        return None
    group = q.shape[2] // k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().repeat_interleave(group, dim=2).transpose(1, 2)
    vf = v.float().repeat_interleave(group, dim=2).transpose(1, 2)
    return torch.nn.functional.scaled_dot_product_attention(qf, kf, vf).transpose(1, 2)


def blhd(b, l, h, d, gen):
    return torch.randn(b, l, h, d, dtype=bf16, device=DEV, generator=gen)


def cases(commit: str):
    """(name, kernel, build(gen) -> (args, kwargs), flops or bytes for a ratio)."""
    out = []
    heads = [(64, 24, 4, "AstrAI hd64 24/4"), (128, 32, 8, "hd128 32/8")]
    for d, h, kvh, label in heads:
        for b, kv in ((1, 1024), (16, 2048), (64, 4096)):
            def decode(gen, b=b, kv=kv, d=d, h=h, kvh=kvh):
                q, k, v = blhd(b, 1, h, d, gen), blhd(b, kv, kvh, d, gen), blhd(b, kv, kvh, d, gen)
                return (q, k, v), dict(mask=None, causal_offset=kv - 1, layout=1)
            out.append((f"decode {label} B{b} x {kv}", "attn_decode", decode))
        for b, l in ((16, 1024), (4, 4096), (1, 8192)):
            def prefill(gen, b=b, l=l, d=d, h=h, kvh=kvh):
                q, k, v = blhd(b, l, h, d, gen), blhd(b, l, kvh, d, gen), blhd(b, l, kvh, d, gen)
                return (q, k, v), dict(mask=None, causal_offset=0, layout=1)
            out.append((f"prefill causal {label} B{b} x {l}", "attn_prefill", prefill))
        if commit == "530d280":
            for b, kv in ((32, 4096), (64, 1024)):
                def paged(gen, b=b, kv=kv, d=d, h=h, kvh=kvh):
                    slots = b * kv
                    pool = torch.randn(slots, 1, kvh, d, dtype=bf16, device=DEV, generator=gen)
                    table = torch.randperm(slots, device=DEV, generator=gen).reshape(b, kv)  # int64, as AstrAI's
                    q = blhd(b, 1, h, d, gen)
                    return (q, table, pool, pool, 1, kv), dict(mask=None, causal_offset=kv - 1, layout=1)
                out.append((f"paged_decode ps1 int64 table {label} B{b} x {kv}", "attn_paged_decode", paged))
        else:
            for b, kv in ((32, 4096), (64, 1024), (8, 16384)):
                def pool_decode(gen, b=b, kv=kv, d=d, h=h, kvh=kvh):
                    slots = b * kv + 1
                    k = torch.randn(slots, kvh, d, dtype=bf16, device=DEV, generator=gen)
                    v = torch.randn(slots, kvh, d, dtype=bf16, device=DEV, generator=gen)
                    rtt = torch.randperm(b * kv, device=DEV, generator=gen).to(torch.int32).reshape(b, kv)
                    lens = torch.randint(kv // 2, kv + 1, (b,), device=DEV, generator=gen)
                    indptr = torch.zeros(b + 1, dtype=torch.int32, device=DEV)
                    indptr[1:] = lens.cumsum(0)
                    rows = torch.arange(b, dtype=torch.int32, device=DEV)
                    q = torch.randn(b, h, d, dtype=bf16, device=DEV, generator=gen)
                    nk = torch.randn(b, kvh, d, dtype=bf16, device=DEV, generator=gen)
                    return (q, k, v, rtt, rows, indptr), dict(new_k=nk, new_v=nk.clone(), causal_offset=0)
                out.append((f"paged_decode pool ragged {label} B{b} x <={kv}", "attn_paged_decode", pool_decode))
            for b, ql, kv in ((16, 1024, 1024), (4, 512, 4096)):
                def pool_prefill(gen, b=b, ql=ql, kv=kv, d=d, h=h, kvh=kvh):
                    slots = b * kv
                    k = torch.randn(slots, kvh, d, dtype=bf16, device=DEV, generator=gen)
                    v = torch.randn(slots, kvh, d, dtype=bf16, device=DEV, generator=gen)
                    rtt = torch.randperm(slots, device=DEV, generator=gen).to(torch.int32).reshape(b, kv)
                    kv_indptr = torch.arange(0, (b + 1) * kv, kv, dtype=torch.int32, device=DEV)
                    qo = torch.arange(0, (b + 1) * ql, ql, dtype=torch.int32, device=DEV)
                    tiles = (ql + 63) // 64
                    t2b = torch.arange(b, dtype=torch.int32, device=DEV).repeat_interleave(tiles)
                    t2i = torch.arange(tiles, dtype=torch.int32, device=DEV).repeat(b)
                    rows = torch.arange(b, dtype=torch.int32, device=DEV)
                    q = torch.randn(b * ql, h, d, dtype=bf16, device=DEV, generator=gen)
                    return (q, k, v, rtt, rows, kv_indptr, qo, t2b, t2i), dict(mask=None, causal_offset=0)
                out.append((f"paged_prefill pool causal {label} B{b} q{ql} kv{kv}", "attn_paged_prefill",
                            pool_prefill))
                out.append((f"paged_prefill pool causal {label} B{b} q{ql} kv{kv} (one-token pages)",
                            "attn_paged_prefill", pool_prefill))
    for b, s in ((16, 1024), (1, 8192)):
        def rope(gen, b=b, s=s):
            x = blhd(b, s, 24, 64, gen)
            f = torch.randn(b, s, 32, 2, device=DEV, generator=gen)
            return (x, f), {}
        out.append((f"rotary_emb B{b} x {s} 24 heads hd64", "rotary_emb", rope))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path)
    parser.add_argument("--commit", choices=("530d280", "75304d0"), required=True)
    parser.add_argument("--filter", default="")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    modules = {}
    rows = []
    print("| case | AstrAI us | astrai-jit us | speed-up | rel. diff | AstrAI / astrai-jit vs f32 |")
    print("|---|---|---|---|---|---|")
    for name, kernel, build in cases(args.commit):
        if args.filter not in name:
            continue
        if kernel not in modules:
            modules[kernel] = getattr(load_own(args.checkout, kernel), kernel)
        # astrai-jit gathers a flat pool into 16-token pages for the Hopper prefill; this row times
        # the kernel that reads one-token pages in place instead.
        jit._GATHER_PAGES = "(one-token pages)" not in name
        gen = torch.Generator(device=DEV).manual_seed(1234)
        a_args, kwargs = build(gen)
        # The fused append writes the cache: each side gets its own copy of what it writes.
        b_args = tuple(x.clone() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in a_args)
        own_fn = lambda: modules[kernel](*a_args, **kwargs)  # noqa: E731
        ours_fn = lambda: getattr(jit, kernel)(*b_args, **kwargs)  # noqa: E731
        try:
            ours_out, own_out = ours_fn(), own_fn()
            diff = rel_err(ours_out, own_out)
            ref = reference(kernel, a_args)
            vs_ref = "" if ref is None else f"{rel_err(own_out, ref):.1e} / {rel_err(ours_out, ref):.1e}"
            del ref
            own_us, ours_us = compare(own_fn, ours_fn)
        except Exception as error:  # a case one side cannot run is reported, not hidden
            print(f"| {name} | error: {type(error).__name__}: {str(error)[:120]} | | | | |", flush=True)
            rows.append(dict(case=name, error=str(error)))
            continue
        rows.append(dict(case=name, astrai_us=own_us, jit_us=ours_us, speedup=own_us / ours_us, rel_diff=diff,
                         vs_f32=vs_ref))
        print(f"| {name} | {own_us:.1f} | {ours_us:.1f} | {own_us / ours_us:.2f}x | {diff:.1e} | {vs_ref} |",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(dict(commit=args.commit, device=torch.cuda.get_device_name(), rows=rows),
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
