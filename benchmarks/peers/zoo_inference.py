"""MXNet model-zoo networks at 224x224, for benchmarks/zoo_inference.sh.

  zoo_inference.py export DIR          MXNet 1.9.1 exports the networks (random weights, 1000 classes) to DIR,
                                       as hybra's bench_zoo imports them
  zoo_inference.py mxnet DIR           MXNet runs the exported files (SymbolBlock.imports, static_alloc)
  zoo_inference.py torch               PyTorch 2 runs torchvision's same networks (eager, inference mode)
  options: --batches 1,2,32  --models resnet18_v1,...  --calls N

Each case: the time of one call, the caller waiting for the output, after 2 warm-up calls; calls repeated
for at least 1 s (and 3 calls), the median printed with min and max, in bench_zoo's units (ms).
With --calls N, each case times N calls after the warm-up instead and prints every call's time, as
bench_zoo --calls does (benchmarks/zoo_under_load.sh).
Thread counts come from the environment (zoo_inference.sh sets OMP_NUM_THREADS; torch.set_num_threads
follows it).
"""
import argparse
import os
import statistics
import sys
import time

# MXNet's name and torchvision's constructor of the same network.
MODELS = {
    "resnet18_v1": "resnet18",
    "resnet50_v1": "resnet50",
    "mobilenetv2_1.0": "mobilenet_v2",
    "densenet121": "densenet121",
    "vgg11": "vgg11",
    "alexnet": "alexnet",
}


CALLS = 0  # --calls


def timed(call):
    for _ in range(2):
        call()
    times = []
    start = time.perf_counter()
    def enough():
        if CALLS:
            return len(times) >= CALLS
        return len(times) >= 3 and time.perf_counter() - start >= 1.0

    while not enough():
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return times


def report(system, name, batch, times):
    ms = [1e3 * t for t in times]
    if CALLS:
        print("%s %s/batch:%d calls_ms %s" % (system, name, batch, " ".join("%.3f" % t for t in ms)), flush=True)
        return
    print("%s %s/batch:%d %.2f ms (median of %d; min %.2f, max %.2f)"
          % (system, name, batch, statistics.median(ms), len(ms), min(ms), max(ms)), flush=True)


def export(directory, models):
    import mxnet as mx
    from mxnet import nd
    from mxnet.gluon.model_zoo import vision
    os.makedirs(directory, exist_ok=True)
    for name in models:
        mx.random.seed(7)
        net = vision.get_model(name, pretrained=False)
        net.initialize(mx.init.MSRAPrelu())
        net.hybridize()
        net(nd.random.uniform(-1, 1, (1, 3, 224, 224)))
        net.export(os.path.join(directory, name))
        print("exported", name, flush=True)


def run_mxnet(directory, models, batches):
    if "OMP_NUM_THREADS" not in os.environ:
        # Unset, MXNet's runtime runs one OpenMP thread: a figure for another thread count than the peers'.
        sys.exit("zoo_inference.py mxnet: set OMP_NUM_THREADS (zoo_inference.sh does)")
    import mxnet as mx
    from mxnet import gluon, nd
    for name in models:
        prefix = os.path.join(directory, name)
        net = gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
        net.hybridize(static_alloc=True, static_shape=True)
        for batch in batches:
            x = nd.random.uniform(-1, 1, (batch, 3, 224, 224))
            report("mxnet-" + mx.__version__, name, batch, timed(lambda: net(x).wait_to_read()))


def run_torch(models, batches):
    import torch
    import torchvision
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    for name in models:
        net = getattr(torchvision.models, MODELS[name])(weights=None).eval()
        for batch in batches:
            x = torch.rand(batch, 3, 224, 224) * 2 - 1
            with torch.inference_mode():
                report("torch-" + torch.__version__, name, batch, timed(lambda: net(x)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["export", "mxnet", "torch"])
    p.add_argument("dir", nargs="?")
    p.add_argument("--batches", default="1,2,32")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--calls", type=int, default=0)
    args = p.parse_args()
    global CALLS
    CALLS = args.calls
    models = args.models.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    if args.mode == "export":
        export(args.dir, models)
    elif args.mode == "mxnet":
        run_mxnet(args.dir, models, batches)
    else:
        run_torch(models, batches)


if __name__ == "__main__":
    main()
