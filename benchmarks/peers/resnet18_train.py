"""D2L 8.5's ResNet-18 training step on Fashion-MNIST, in MXNet 1.9.1 Gluon or PyTorch 2, for
benchmarks/resnet18_train.sh to time beside hybra's examples/train_resnet: the same network (3x3 first
convolution, residual blocks with BatchNorm, global average pooling, Dense), the same SGD step
(lr 0.1, momentum 0.9, softmax cross-entropy), the same first N training images in batches of B, one epoch.

  resnet18_train.py mxnet|torch [--hybridize | --compile] --width 64 --batch-size 64 --train-size 2048
                    [--test-size 1000] [--data /usr/share/datasets/fashion-mnist] [--threads 2]

Prints one line: the mean time of a step after the first, the loss and the test accuracy after the epoch.
As hybra's example measures it: from the end of the first step (waited for) to the end of the last (waited
for), divided by the steps in between, since MXNet, like hybra, runs steps while later ones are pushed.
"""
import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(directory, train, n):
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(directory, prefix + "-images-idx3-ubyte.gz"))[:n]
    labels = read_idx(os.path.join(directory, prefix + "-labels-idx1-ubyte.gz"))[:n]
    return (images.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28), labels.astype(np.int64)


def batches(x, y, size, seed):
    order = np.random.RandomState(seed).permutation(len(x))
    for start in range(0, len(x), size):
        take = order[start:start + size]
        yield x[take], y[take]


def mxnet_run(args, train, test):
    import mxnet as mx
    from mxnet import autograd, gluon, nd
    from mxnet.gluon import nn

    class Residual(nn.HybridBlock):
        def __init__(self, channels, use_1x1conv=False, strides=1):
            super().__init__()
            self.conv1 = nn.Conv2D(channels, 3, strides, 1)
            self.conv2 = nn.Conv2D(channels, 3, 1, 1)
            self.conv3 = nn.Conv2D(channels, 1, strides) if use_1x1conv else None
            self.bn1 = nn.BatchNorm()
            self.bn2 = nn.BatchNorm()

        def hybrid_forward(self, F, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return F.relu(y + (self.conv3(x) if self.conv3 else x))

    def stage(channels, blocks, first):
        s = nn.HybridSequential()
        for i in range(blocks):
            s.add(Residual(channels, True, 2) if i == 0 and not first else Residual(channels))
        return s

    w = args.width
    net = nn.HybridSequential()
    net.add(nn.Conv2D(w, 3, 1, 1), nn.BatchNorm(), nn.Activation("relu"))
    net.add(stage(w, 2, True), stage(2 * w, 2, False), stage(4 * w, 2, False), stage(8 * w, 2, False))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(10))
    mx.random.seed(7)
    net.initialize(mx.init.Xavier())
    if args.hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses, steps = [], 0
    for x, y in batches(*train, args.batch_size, 42):
        X, Y = nd.array(x), nd.array(y)
        with autograd.record():
            loss = loss_fn(net(X), Y)
        loss.backward()
        trainer.step(len(x))
        losses.append(loss.sum())
        steps += 1
        if steps == 1:
            nd.waitall()
            start = time.perf_counter()
    nd.waitall()
    step = (time.perf_counter() - start) / max(steps - 1, 1)
    mean_loss = float(sum(l.asscalar() for l in losses)) / len(train[0])
    hits = 0
    for x, y in batches(*test, 1000, 0):
        hits += int((net(nd.array(x)).argmax(axis=1).asnumpy().astype(np.int64) == y).sum())
    return step, mean_loss, hits / len(test[0])


def torch_run(args, train, test):
    import torch
    from torch import nn

    class Residual(nn.Module):
        def __init__(self, cin, channels, use_1x1conv=False, strides=1):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, channels, 3, strides, 1)
            self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1)
            self.conv3 = nn.Conv2d(cin, channels, 1, strides) if use_1x1conv else None
            self.bn1 = nn.BatchNorm2d(channels)
            self.bn2 = nn.BatchNorm2d(channels)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (self.conv3(x) if self.conv3 is not None else x))

    def stage(cin, channels, blocks, first):
        layers = []
        for i in range(blocks):
            if i == 0 and not first:
                layers.append(Residual(cin, channels, True, 2))
            else:
                layers.append(Residual(channels if i else cin, channels))
        return nn.Sequential(*layers)

    w = args.width
    torch.manual_seed(7)
    net = nn.Sequential(nn.Conv2d(1, w, 3, 1, 1), nn.BatchNorm2d(w), nn.ReLU(),
                        stage(w, w, 2, True), stage(w, 2 * w, 2, False), stage(2 * w, 4 * w, 2, False),
                        stage(4 * w, 8 * w, 2, False), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, 10))
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
    model = torch.compile(net) if args.compile else net
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    losses, steps = [], 0
    net.train()
    for x, y in batches(*train, args.batch_size, 42):
        X, Y = torch.from_numpy(x), torch.from_numpy(y)
        optimizer.zero_grad()
        loss = loss_fn(model(X), Y)
        (loss / len(x)).backward()
        optimizer.step()
        losses.append(loss.detach())
        steps += 1
        if steps == 1:
            start = time.perf_counter()
    step = (time.perf_counter() - start) / max(steps - 1, 1)
    net.eval()
    hits = 0
    with torch.no_grad():
        for x, y in batches(*test, 1000, 0):
            hits += int((model(torch.from_numpy(x)).argmax(1).numpy() == y).sum())
    return step, float(sum(losses)) / len(train[0]), hits / len(test[0])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=["mxnet", "torch"])
    p.add_argument("--hybridize", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--train-size", type=int, default=2048)
    p.add_argument("--test-size", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    train, test = load(args.data, True, args.train_size), load(args.data, False, args.test_size)
    if args.framework == "torch":
        import torch
        torch.set_num_threads(args.threads)
        step, loss, acc = torch_run(args, train, test)
        mode = "torch.compile" if args.compile else "eager"
        name = "PyTorch " + torch.__version__
    else:
        # MXNet's OpenMP runtime reads its thread count when the library loads and runs one thread unless
        # OMP_NUM_THREADS says otherwise, so --threads must reach the environment before the import (run
        # alone, without benchmarks/resnet18_train.sh's export, it was silently ignored).
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        import mxnet
        step, loss, acc = mxnet_run(args, train, test)
        mode = "hybridized" if args.hybridize else "eager"
        name = "MXNet " + mxnet.__version__
    print("%s %s: loss %.4f, test acc %.4f, %.1f ms a step after the first" % (name, mode, loss, acc, 1e3 * step))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
