#!/usr/bin/env python3
"""Prints bench_fusion's medians as a table, with hybra/eigen, hybra/unfused and hybra/thrust.

Usage: python3 benchmarks/fusion_table.py build/bench_fusion.json [--markdown]

A ratio is a throughput ratio (other impl's median time / hybra's median
time): above 1 means hybra is faster. The goal is hybra/eigen >= 0.95.
"""
import json
import re
import sys


def main():
    path = sys.argv[1]
    markdown = "--markdown" in sys.argv[2:]
    with open(path) as f:
        data = json.load(f)
    median = {}  # (chain, impl, threads) -> (ms, GB/s)
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        m = re.fullmatch(r"BM_fusion_(\w+)/(\w+)_t(\d+)(/real_time)?", b["run_name"])
        if not m:
            continue
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        median[m.group(1), m.group(2), int(m.group(3))] = (b["real_time"] * scale, b["bytes_per_second"] / 1e9)

    impls = [i for i in ("hybra", "thrust", "unfused", "eigen", "loop") if any(k[1] == i for k in median)]
    others = [o for o in ("eigen", "unfused", "thrust") if o in impls]
    rows = []
    for chain in ("short", "long", "sum"):
        for threads in (1, 2):
            row = [f"{chain} t{threads}"]
            for impl in impls:
                ms, gbs = median.get((chain, impl, threads), (float("nan"), float("nan")))
                row.append(f"{ms:.1f} ms {gbs:.1f} GB/s")
            hybra = median.get((chain, "hybra", threads), (float("nan"),))[0]
            for other in others:
                row.append(f"{median.get((chain, other, threads), (float('nan'),))[0] / hybra:.2f}")
            rows.append(row)
    head = ["case"] + impls + [f"hybra/{o}" for o in others]

    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
        for r in [head] + rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    # Over the cases measured: a --benchmark_filter may leave some out.
    measured = [(c, t) for c in ("short", "long") for t in (1, 2)
                if (c, "eigen", t) in median and (c, "hybra", t) in median]
    ok = all(median[c, "eigen", t][0] / median[c, "hybra", t][0] >= 0.95 for c, t in measured)
    if measured:
        cases = ", ".join(f"{c} t{t}" for c, t in measured)
        print(f"\ngoal hybra/eigen >= 0.95 on {cases}: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
