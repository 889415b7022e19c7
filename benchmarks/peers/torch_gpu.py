"""PyTorch on the same GPU, beside bench_cuda: the same workloads, timed the same way.

Run by scripts/gpu-run.sh on the lent GPU machine (between two runs of bench_cuda), with that image's PyTorch:

    python3 benchmarks/peers/torch_gpu.py --out torch_peer.json

Each case is timed as bench_cuda times hybra: wall time per call, the caller waiting for the GPU at the end of
every call (torch.cuda.synchronize, as hybra's wait_to_read), after warm-up calls (torch.compile's compile is
timed apart, as `first call`). Each case runs --reps blocks of calls of at least --block seconds; the JSON
holds each block's mean per call, and the table their median, min and max. Bandwidths count bytes read plus
bytes written, as bench_cuda does. --filter REGEX keeps the cases whose names it matches (re.search), the copy
always: given the regex given to bench_cuda's --benchmark_filter, the two run the same cases.
"""
import argparse
import json
import re
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

N = 1 << 26
GEMM_N = 4096


def timed(fn, reps, block, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    calls = 1
    while True:  # calls per block: enough for `block` seconds
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if dt >= block or calls >= 1 << 20:
            break
        calls = max(calls * 2, int(calls * block / max(dt, 1e-9)) + 1)
    means = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
        means.append((time.perf_counter() - t0) / calls)
    return means


def first_call(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def long_chain(a, b):
    return ((a * b + 2) * a - b) * 0.5 + a * b - 1


class Mlp(nn.Module):  # the chapter's MLP, as bench_cuda's BM_cuda_mlp builds it
    def __init__(self, classes):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x):
        return self.net(x)


class LeNet(nn.Module):  # train_lenet's and bench_cuda's LeNet-5
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))

    def forward(self, x):
        return self.net(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--block", type=float, default=0.3)
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile's cases")
    parser.add_argument("--filter", default="", help="run only the cases whose names this regex matches")
    args = parser.parse_args()

    def want(name):
        return re.search(args.filter, name) is not None
    dev = torch.device("cuda")
    results = []

    def record(name, means, bytes_moved=None, flops=None, **extra):
        r = {"name": name, "mean_s": means, "median_s": statistics.median(means), **extra}
        if bytes_moved:
            r["GB/s"] = bytes_moved / r["median_s"] / 1e9
        if flops:
            r["TFLOP/s"] = flops / r["median_s"] / 1e12
        results.append(r)
        rate = f"{r['GB/s']:8.0f} GB/s" if bytes_moved else (f"{r['TFLOP/s']:8.1f} TFLOP/s" if flops else "")
        print(f"{name:40s} {r['median_s'] * 1e6:12.1f} us  (min {min(means) * 1e6:.1f}, max {max(means) * 1e6:.1f})"
              f"  {rate}", flush=True)

    def case(name, fn, **extra):
        if want(name):
            record(name, timed(fn, **rep), **extra)

    def compiled(name, fn):
        if args.no_compile or not want(name):
            return None
        t = first_call(fn)
        print(f"{name}: first call (compile) {t:.1f} s", flush=True)
        return t

    rep = dict(reps=args.reps, block=args.block)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}", flush=True)

    src = torch.ones(N, device=dev)
    dst = torch.empty(N, device=dev)
    record("copy", timed(lambda: dst.copy_(src), **rep), bytes_moved=8 * N)
    a = torch.rand(N, device=dev) * 2 - 1
    b = torch.ones(N, device=dev)
    case("fusion_long/eager", lambda: long_chain(a, b), bytes_moved=12 * N)
    chain = torch.compile(long_chain)
    t = compiled("fusion_long/compile", lambda: chain(a, b))
    if t is not None:
        record("fusion_long/compile", timed(lambda: chain(a, b), **rep), bytes_moved=12 * N, first_call_s=t)
    case("sum", lambda: a.sum(), bytes_moved=4 * N)
    rows = torch.randn(N // 1024, 1024, device=dev)
    case("rows/sum", lambda: rows.sum(dim=1), bytes_moved=4 * N)
    case("rows/argmax", lambda: rows.argmax(dim=1), bytes_moved=4 * N)
    case("softmax", lambda: torch.softmax(rows, dim=1), bytes_moved=8 * N)
    # bench_cuda's cumsum shapes: one row, 64 rows of 2^20, rows of 1024, 1024 columns of 2^16.
    case("cumsum/row", lambda: torch.cumsum(a, 0), bytes_moved=8 * N)
    case("cumsum/rows_64", lambda: torch.cumsum(a.view(64, N // 64), 1), bytes_moved=8 * N)
    case("cumsum/rows", lambda: torch.cumsum(rows, 1), bytes_moved=8 * N)
    case("cumsum/columns", lambda: torch.cumsum(rows, 0), bytes_moved=8 * N)
    small_a, small_b = torch.ones(1024, device=dev), torch.ones(1024, device=dev)
    case("eager_small", lambda: torch.relu(small_a * small_b + 2))
    del src, dst, a, b, rows

    ga = torch.rand(GEMM_N, GEMM_N, device=dev) * 2 - 1
    gb = torch.rand(GEMM_N, GEMM_N, device=dev) * 2 - 1
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        case("gemm/" + ("tf32" if tf32 else "float32"), lambda: torch.mm(ga, gb), flops=2 * GEMM_N ** 3)
    torch.backends.cuda.matmul.allow_tf32 = False
    del ga, gb
    # bench_cuda's BM_cuda_dense: a linear layer 4096 x 4096 with a bias, per dtype.
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        dx = torch.rand(GEMM_N, GEMM_N, device=dev, dtype=dtype)
        dw = torch.rand(GEMM_N, GEMM_N, device=dev, dtype=dtype)
        db = torch.zeros(GEMM_N, device=dev, dtype=dtype)
        case("dense/" + str(dtype).split(".")[1], lambda: torch.nn.functional.linear(dx, dw, db), flops=2 * GEMM_N ** 3)
        del dx, dw, db

    with torch.no_grad():
        mlp = Mlp(2).to(dev).eval()
        x = torch.randn(1, 512, device=dev)
        case("mlp/eager", lambda: mlp(x))
        static_x = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                mlp(static_x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = mlp(static_x)
        case("mlp/cuda_graph", lambda: graph.replay())
        reduce = torch.compile(mlp, mode="reduce-overhead")
        t = compiled("mlp/compile_reduce_overhead", lambda: reduce(x))
        if t is not None:
            for _ in range(3):
                reduce(x)
            record("mlp/compile_reduce_overhead", timed(lambda: reduce(x), **rep), first_call_s=t)

    def train_case(name, model, features, compile_mode):
        if not want(name):
            return
        net = model.to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        X = torch.randn(*features, device=dev)
        y = torch.randint(0, 10, (features[0],), device=dev)
        forward = torch.compile(net, mode=compile_mode) if compile_mode else net

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(forward(X), y)
            loss.backward()
            opt.step()

        t = None
        if compile_mode:
            t = compiled(name, step)
            if t is None:
                return
        record(name, timed(step, **rep), **({"first_call_s": t} if t else {}))

    train_case("mlp_train/eager", Mlp(10), (256, 512), None)
    train_case("lenet_train/eager", LeNet(), (256, 1, 28, 28), None)
    train_case("lenet_train/compile", LeNet(), (256, 1, 28, 28), "default")

    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
