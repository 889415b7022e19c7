"""Summarises the per-call times of benchmarks/zoo_under_load.sh as a Markdown table.

  zoo_calls.py LOG

LOG holds lines "load:<k> <system> <case> calls_ms <t1> <t2> ..." (bench_zoo --calls and
peers/zoo_inference.py --calls, prefixed with the number of busy loops that ran beside them). The calls of
every round of a (case, load, system) are pooled; a row gives their median, 90th percentile and maximum, and
the median and 90th percentile over the same system's quiet median (load 0): the slowdown.
"""
import collections
import math
import statistics
import sys


def percentile(values, p):
    """The nearest-rank percentile: the smallest value with at least p% of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def main(path):
    calls = collections.defaultdict(list)
    for line in open(path):
        fields = line.split()
        if len(fields) < 5 or not fields[0].startswith("load:") or fields[3] != "calls_ms":
            continue
        # "hybra-0.1.0" -> "hybra", "torch-2.15.0/passive" -> "torch/passive"
        name, _, policy = fields[1].partition("/")
        system = name.split("-")[0] + ("/" + policy if policy else "")
        load, case = int(fields[0][5:]), fields[2]
        calls[case, load, system] += [float(t) for t in fields[4:]]
    if not calls:
        sys.exit("zoo_calls.py: no 'load:<k> <system> <case> calls_ms ...' line in " + path)
    print("| case | busy loops | system | calls | median | p90 | max | median / quiet | p90 / quiet |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (case, load, system) in sorted(calls):
        times = calls[case, load, system]
        quiet = calls.get((case, 0, system))
        base = statistics.median(quiet) if quiet else float("nan")
        median, p90 = statistics.median(times), percentile(times, 90)
        print("| %s | %d | %s | %d | %.1f | %.1f | %.1f | %.2f | %.2f |"
              % (case, load, system, len(times), median, p90, max(times), median / base, p90 / base))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
