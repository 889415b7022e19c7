#!/usr/bin/env python3
"""Shows the machine code of hybra's fused loops in bench_fusion.

Usage: python3 benchmarks/fusion_codegen.py build/benchmarks/bench_fusion [--print]

Disassembles (objdump) run_kernel, the loop every fused kernel runs, for the short chain
relu(a * b + c) * d + 1 and the long chain sigmoid(tanh(a * b + c) * exp(-d)) + a
(float32, contiguous operands), finds each one's innermost vector loop and reports
its vector registers and the functions it calls (libmvec: _ZGV<isa>N<lanes>v_<fn>),
and counts the prefetch instructions around it. --print also prints the loop.
"""
import re
import subprocess
import sys

# Markers in the demangled name of run_kernel's instantiation for each chain.
CHAINS = {
    "short": ("run_kernel<float, float", "op::relu", "op::multiply", "scalar_leaf<int>"),
    "long": ("run_kernel<float, float", "op::sigmoid", "op::tanh"),
}


def functions(binary):
    dis = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", binary],
                         capture_output=True, text=True, check=True).stdout
    for block in re.split(r"\n(?=[0-9a-f]+ <)", dis):
        head, _, body = block.partition("\n")
        insns = []
        for line in body.splitlines():
            m = re.match(r"\s*([0-9a-f]+):\s+(.*)", line)
            if m:
                insns.append((int(m.group(1), 16), m.group(2)))
        yield head, insns


def inner_loops(insns):
    """(start, end) index ranges of the innermost loops of a function: spans
    closed by a conditional backward jump that contain no other such span."""
    index = {addr: i for i, (addr, _) in enumerate(insns)}
    back = []
    for i, (addr, text) in enumerate(insns):
        m = re.match(r"j(?!mp)\w+\s+([0-9a-f]+)\b", text)  # conditional jumps only
        if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in index:
            back.append((index[int(m.group(1), 16)], i))
    return [(s, e) for s, e in back if not any(s <= s2 and e2 < e for s2, e2 in back if (s2, e2) != (s, e))]


def vector_insns(body):
    return sum(("ymm" in t or "zmm" in t) for t in body)


def callee(text):
    m = re.search(r"call\s+\S+\s+<([^>@+]+)", text)
    return m.group(1) if m else None


def main():
    binary, show = sys.argv[1], "--print" in sys.argv[2:]
    for chain, markers in CHAINS.items():
        best = None  # (vector instructions, loop body, prefetches) of the hottest loop
        for head, insns in functions(binary):
            if not all(m in head for m in markers):
                continue
            for start, end in inner_loops(insns):
                body = [t for _, t in insns[start:end + 1]]
                prefetches = sum(t.startswith("prefetch") for _, t in insns)
                if best is None or vector_insns(body) > best[0]:
                    best = (vector_insns(body), body, prefetches)
        if best is None:
            print(f"{chain} chain: fused loop not found (inlined differently?)")
            continue
        _, body, prefetches = best
        width = "zmm (512-bit)" if any("zmm" in t for t in body) else \
            "ymm (256-bit)" if any("ymm" in t for t in body) else "xmm/scalar"
        calls = [c for c in map(callee, body) if c]
        print(f"{chain} chain: hot loop of {len(body)} instructions on {width} vectors, "
              f"calls: {', '.join(calls) or 'none'}; {prefetches} prefetch instructions in the function")
        if show:
            print("\n".join("    " + re.sub(r"\s*<.*>", "", t) for t in body))


if __name__ == "__main__":
    main()
