#!/usr/bin/env python3
"""Issue 9's targets read from one run: astrai-bench's JSON and bench/torch_reference.py's output
(PyTorch's cuDNN attention on the same shapes, timed on the same GPU right after the bench, with
--sustained). Prints a Markdown table, one row a target: our figure, the reference, the ratio,
the target and whether it is met. A row whose figures the run lacks (a filtered bench, no
PyTorch, a failed case) says "not measured", never "yes".

Like is compared with like: the bench times graph replays of back-to-back calls, so its prefill
rows, which run at the H200's power cap, meet cuDNN's SUSTAINED figure (back-to-back calls over
S seconds), not its TIME one (calls after idle gaps, at a higher clock; docs/performance.md,
"Method"). The decode rows, bound by memory, meet cuDNN's TIME figure, as in every earlier run.

    scripts/bench/hopper_targets.py --bench bench-out/bench.json [--reference bench-out/reference.txt]

scripts/bench/run_bench.sh writes both files and runs this. Exit status: 0 when every target was
measured and met, 1 otherwise, 2 on unreadable input."""
import argparse
import json
import os
import re
import sys

# The labels' module sits in bench/; a run from the source tree leaves no __pycache__ in it.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from reference_labels import decode_label, prefill_label  # noqa: E402

REFERENCE_LINE = re.compile(r"^(TIME|SUSTAINED) (torch-\S+ .*?): ([\d.]+) (us|ms) ([\d.]+) (TB/s|TFLOP/s)")


def read_bench(path):
    """{case name: case} of the cases that ran, and the JSON's ceilings."""
    with open(path) as file:
        data = json.load(file)
    cases = {case["name"]: case for case in data.get("cases", []) if case.get("status") == "ok"}
    return cases, data.get("ceilings", {})


def read_reference(path):
    """{(TIME or SUSTAINED, label): {"us": time a call, "rate": TB/s or TFLOP/s}} from
    torch_reference.py's output."""
    rows = {}
    if path is None:
        return rows
    with open(path) as lines:
        for line in lines:
            match = REFERENCE_LINE.match(line.strip())
            if match:
                time = float(match.group(3)) * (1e3 if match.group(4) == "ms" else 1.0)
                rows[(match.group(1), match.group(2))] = {"us": time, "rate": float(match.group(5))}
    return rows


def targets(cases, ceilings, reference):
    """Rows of (target, ours, reference, ratio, bound, met) with None for what was not measured."""
    rows = []

    def case_field(name, field):
        case = cases.get(name)
        if case is None:
            return None
        return case["us_per_call"]["median"] if field == "us" else case.get(field)

    def add(what, ours, ours_text, ref, ref_text, ratio, bound, met):
        rows.append((what, ours_text if ours is not None else None, ref_text if ref is not None else None,
                     ratio, bound, met))

    gemm = ceilings.get("gemm", {})
    gemm_tflops = gemm.get("tflops") if gemm.get("status") == "measured" else None
    add("wgmma GEMM bf16 8192^3", gemm_tflops, f"{gemm_tflops:.1f} TFLOP/s" if gemm_tflops else "", None, "",
        None, ">= 600 TFLOP/s", None if gemm_tflops is None else gemm_tflops >= 600)

    # Prefill: TFLOP/s against cuDNN's on the same shape (higher is better).
    for name, label, bound in (
        ("prefill/hd128.causal.B2x8192", prefill_label("cudnn", 128, 2, 8192, True), 1.05),
        ("prefill/hd128.full.B4x4096", prefill_label("cudnn", 128, 4, 4096, False), 1.05),
        ("prefill/hd64.causal.B2x8192", prefill_label("cudnn", 64, 2, 8192, True), 1.0),
        ("prefill/hd256.causal.B2x8192", prefill_label("cudnn", 256, 2, 8192, True), 1.0),
    ):
        ours = case_field(name, "rate")
        ref = reference.get(("SUSTAINED", label), {}).get("rate")
        ratio = ours / ref if ours is not None and ref else None
        add(name, ours, f"{ours:.1f} TFLOP/s" if ours else "", ref,
            f"cuDNN sustained {ref:.1f} TFLOP/s" if ref else "",
            ratio, f">= {bound:.2f}x cuDNN", None if ratio is None else ratio >= bound)

    paged = case_field("paged_prefill/hd128.ps16.causal.B2x8192", "rate")
    contiguous = case_field("prefill/hd128.causal.B2x8192", "rate")
    ratio = paged / contiguous if paged is not None and contiguous else None
    add("paged_prefill/hd128.ps16.causal.B2x8192", paged, f"{paged:.1f} TFLOP/s" if paged else "", contiguous,
        f"prefill {contiguous:.1f} TFLOP/s" if contiguous else "", ratio, ">= 0.95x prefill",
        None if ratio is None else ratio >= 0.95)

    # Decode: time a call against cuDNN's contiguous decode of the same shape (ratio = theirs / ours).
    for name, label, bound in (
        ("paged_decode/hd128.ps16.B64xL8192", decode_label("cudnn", 128, 32, 8, 64, 8192), 0.97),
        ("paged_decode/hd128.ps16.B16xL32768", decode_label("cudnn", 128, 32, 8, 16, 32768), 0.97),
        ("paged_decode/hd128.ps16.B32xL4096", decode_label("cudnn", 128, 32, 8, 32, 4096), 0.9),
    ):
        ours = case_field(name, "us")
        ref = reference.get(("TIME", label), {}).get("us")
        ratio = ref / ours if ours and ref is not None else None
        add(name, ours, f"{ours:.1f} us" if ours else "", ref, f"cuDNN {ref:.1f} us" if ref else "", ratio,
            f">= {bound:.2f}x cuDNN", None if ratio is None else ratio >= bound)

    name = "paged_decode/hd64.h24kv4.ps16.B32xL4096"
    percent = case_field(name, "percent_of_ceiling")
    add(name, percent, f"{percent:.1f}% of read" if percent else "", None, "", None, ">= 85% of read",
        None if percent is None else percent >= 85.0)

    name = "paged_decode/hd128.ps16.B1xL1024"
    us = case_field(name, "us")
    add(name, us, f"{us:.2f} us" if us else "", None, "", None, "<= 6 us", None if us is None else us <= 6.0)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", required=True, help="astrai-bench --json output")
    parser.add_argument("--reference", help="bench/torch_reference.py output (TIME lines)")
    args = parser.parse_args()
    try:
        cases, ceilings = read_bench(args.bench)
        reference = read_reference(args.reference)
    except (OSError, ValueError, KeyError) as error:
        print(f"hopper_targets.py: cannot read the run: {error}", file=sys.stderr)
        return 2
    rows = targets(cases, ceilings, reference)
    print("| target | ours | reference | ratio | bound | met |")
    print("|---|---|---|---|---|---|")
    for what, ours, ref, ratio, bound, met in rows:
        verdict = "not measured" if met is None else ("yes" if met else "no")
        print(f"| {what} | {ours or '-'} | {ref or '-'} | {f'{ratio:.2f}x' if ratio else '-'} | {bound} | {verdict} |")
    return 0 if all(row[5] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
