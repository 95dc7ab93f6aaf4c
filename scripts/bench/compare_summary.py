#!/usr/bin/env python3
"""Summarizes scripts/bench/compare_builds.sh's output directory: for every row timed in both builds, the
mean per build over its passes, how much faster B is than A (positive: B is faster), and each
build's spread between its passes ((max - min) / mean: a change inside it is not a verdict).

    scripts/bench/compare_summary.py OUT_DIR

Rows: `astrai-sm90-check` timing lines (sm90-A.txt, sm90-B.txt; TFLOP/s, burst and sustained)
and `astrai-bench` JSON files (bench-A-N.json, bench-B-N.json; median us a call)."""
import collections
import glob
import json
import os
import re
import sys

SM90_LINE = re.compile(r"^(TIME|SUSTAINED) prefill (.*?): sm90 [\d.]+ ms ([\d.]+) TFLOP/s")


def sm90_rows(path):
    """{row: [TFLOP/s per pass]} from astrai-sm90-check lines."""
    rows = collections.defaultdict(list)
    if os.path.exists(path):
        with open(path) as lines:
            for line in lines:
                match = SM90_LINE.match(line)
                if match:
                    kind = "burst" if match.group(1) == "TIME" else "sustained"
                    rows[f"prefill {match.group(2)} ({kind})"].append(float(match.group(3)))
    return rows


def bench_rows(paths):
    """{row: [us a call per pass]} from astrai-bench JSON files."""
    rows = collections.defaultdict(list)
    for path in paths:
        with open(path) as file:
            for case in json.load(file).get("cases", []):
                if case.get("status") == "ok" and "us_per_call" in case:
                    rows[case["name"]].append(case["us_per_call"]["median"])
    return rows


def mean(values):
    return sum(values) / len(values)


def spread(values):
    return (max(values) - min(values)) / mean(values)


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print("usage: compare_summary.py OUT_DIR (as scripts/bench/compare_builds.sh leaves it)", file=sys.stderr)
        return 2
    out = sys.argv[1]
    tables = [
        ("TFLOP/s", True, sm90_rows(os.path.join(out, "sm90-A.txt")), sm90_rows(os.path.join(out, "sm90-B.txt"))),
        ("us/call", False, bench_rows(sorted(glob.glob(os.path.join(out, "bench-A-*.json")))),
         bench_rows(sorted(glob.glob(os.path.join(out, "bench-B-*.json"))))),
    ]
    printed = 0
    for unit, higher_is_faster, a_rows, b_rows in tables:
        common = [row for row in a_rows if row in b_rows]
        if not common:
            continue
        width = max(len(row) for row in common)
        print(f"{'row':{width}}  {'A ' + unit:>14}  {'B ' + unit:>14}  B faster by")
        for row in common:
            a, b = mean(a_rows[row]), mean(b_rows[row])
            faster = (b / a if higher_is_faster else a / b) - 1.0
            passes = (f"({len(a_rows[row])} and {len(b_rows[row])} passes; spread "
                      f"{100 * spread(a_rows[row]):.1f}% and {100 * spread(b_rows[row]):.1f}%)")
            print(f"{row:{width}}  {a:14.2f}  {b:14.2f}  {100 * faster:+6.2f}%  {passes}")
            printed += 1
        print()
    if printed == 0:
        print(f"compare_summary.py: no row timed in both builds under {out}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
