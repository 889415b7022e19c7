"""hybra <-> MXNet 1.9.1 model-file interop, run by tests/interop/run.sh.

  mxnet_interop.py export DIR   MXNet exports its models into DIR: <name>-symbol.json,
                                <name>-0000.params, and <name>-io.params (the input and
                                MXNet's output, for the other side to compare with)
  mxnet_interop.py check DIR    MXNet imports the models hybra exported into DIR and
                                compares its outputs with hybra's <name>-io.params
"""
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon, nd

TOLERANCE = 1e-5


def mlp():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Dense(8, activation="tanh"), gluon.nn.Dense(3))
    return net, (2, 10)


def convnet():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, padding=1, activation="relu"),
            gluon.nn.BatchNorm(),
            gluon.nn.MaxPool2D(2),
            gluon.nn.Conv2D(6, 3, strides=2, groups=2, use_bias=False),
            gluon.nn.AvgPool2D(2, strides=1, padding=1),
            gluon.nn.GlobalAvgPool2D(),
            gluon.nn.Flatten(),
            gluon.nn.Dense(5, activation="sigmoid"))
    return net, (3, 2, 12, 12)


def preactivation():
    # As resnet*_v2 begins: a BatchNorm without gamma (scale=False, exported as fix_gamma=True), which hybra
    # imports as a constant of ones; its first call once read that constant before it was written.
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.BatchNorm(scale=False, center=False),
            gluon.nn.Conv2D(4, 3, padding=1),
            gluon.nn.BatchNorm(),
            gluon.nn.Activation("relu"),
            gluon.nn.GlobalAvgPool2D(),
            gluon.nn.Flatten(),
            gluon.nn.Dense(3))
    return net, (2, 3, 10, 10)


MODELS = {"mlp": mlp, "convnet": convnet, "preactivation": preactivation}


def export(directory):
    mx.random.seed(7)
    np.random.seed(7)
    for name, make in MODELS.items():
        net, shape = make()
        net.initialize(mx.init.Xavier())
        x = nd.array(np.random.uniform(-1, 1, shape).astype(np.float32))
        net(x)
        # Running statistics that are not 0 and 1, so that they matter.
        for key, p in net.collect_params().items():
            if key.endswith("running_mean"):
                p.set_data(nd.array(np.random.uniform(-0.5, 0.5, p.shape)))
            elif key.endswith("running_var"):
                p.set_data(nd.array(np.random.uniform(0.5, 2.0, p.shape)))
        net.hybridize()
        y = net(x)
        net.export(os.path.join(directory, name))
        nd.save(os.path.join(directory, name + "-io.params"), {"input": x, "output": y})
        print("mxnet exported %s: output %s" % (name, y.shape))


def check(directory):
    names = sorted(f[: -len("-symbol.json")] for f in os.listdir(directory) if f.endswith("-symbol.json"))
    if not names:
        sys.exit("no *-symbol.json in %s" % directory)
    worst_all = 0.0
    for name in names:
        prefix = os.path.join(directory, name)
        io = nd.load(prefix + "-io.params")
        net = gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
        y = net(io["input"]).asnumpy()
        want = io["output"].asnumpy()
        if y.shape != want.shape:
            sys.exit("%s: MXNet's output has shape %s, hybra's %s" % (name, y.shape, want.shape))
        worst = float(np.max(np.abs(y - want) / np.maximum(np.abs(want), 1e-3)))
        worst_all = max(worst_all, worst)
        print("mxnet ran hybra's %s: max relative difference %.1e" % (name, worst))
        if not worst <= TOLERANCE:
            sys.exit("%s: outputs differ (max relative difference %.1e > %.0e)" % (name, worst, TOLERANCE))
    print("mxnet agrees with hybra on %d models (max relative difference %.1e)" % (len(names), worst_all))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("export", "check"):
        sys.exit(__doc__)
    {"export": export, "check": check}[sys.argv[1]](sys.argv[2])
