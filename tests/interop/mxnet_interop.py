"""hybra <-> MXNet 1.9.1 model-file interop, run by tests/interop/run.sh.

  mxnet_interop.py export DIR [NAME...]
                                MXNet exports its models (all, or those named) into DIR:
                                <name>-symbol.json, <name>-0000.params, and <name>-io.params
                                (the input and MXNet's output, for the other side to compare with)
  mxnet_interop.py check DIR    MXNet imports the models hybra exported into DIR and
                                compares its outputs with hybra's <name>-io.params; NumPy
                                reads hybra's arrays.npy and arrays.npz

Besides small models of hybra's own tests, every family of MXNet's vision model zoo, built by the zoo's
own classes: with narrow widths and small inputs where the classes take them (the 4096-wide Dense layers
of AlexNet and VGG narrowed to 64), at full size where they do not (SqueezeNet, Inception v3).
Outputs agree when max |a - b| / max |b| <= TOLERANCE.
"""
import contextlib
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon, nd
from mxnet.gluon.model_zoo import vision

TOLERANCE = 1e-4


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


def embedding():
    # Tokens: whole numbers as float32, as Gluon's data are.
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Embedding(20, 8), gluon.nn.Dense(6, activation="tanh"), gluon.nn.Dense(3))
    return net, (2, 7), 20


@contextlib.contextmanager
def dense_at_most(units):
    """Gluon's Dense layers made in this block have at most `units` outputs."""
    real = gluon.nn.Dense
    gluon.nn.Dense = lambda n, *args, **kwargs: real(min(n, units), *args, **kwargs)
    try:
        yield
    finally:
        gluon.nn.Dense = real


def alexnet():
    with dense_at_most(64):
        return vision.AlexNet(classes=10), (1, 3, 67, 67)


def vgg(batch_norm):
    def make():
        with dense_at_most(64):
            net = vision.VGG([1, 1, 2, 2, 2], [8, 16, 16, 32, 32], classes=10, batch_norm=batch_norm)
        return net, (1, 3, 32, 32)
    return make


def resnet(version, block, channels):
    def make():
        net = (vision.ResNetV1 if version == 1 else vision.ResNetV2)(block, [1, 1, 1, 1], channels, classes=10)
        # Channels grow at every stage: the zoo adds a downsampling path only where they change.
        return net, (2, 3, 40, 40)
    return make


ZOO = {
    "alexnet": alexnet,
    "vgg11_narrow": vgg(False),
    "vgg11_bn_narrow": vgg(True),
    "resnet_v1_basic": resnet(1, vision.BasicBlockV1, [8, 8, 16, 24, 32]),
    "resnet_v1_bottleneck": resnet(1, vision.BottleneckV1, [8, 16, 24, 32, 48]),
    "resnet_v2_basic": resnet(2, vision.BasicBlockV2, [8, 8, 16, 24, 32]),
    "resnet_v2_bottleneck": resnet(2, vision.BottleneckV2, [8, 16, 24, 32, 48]),
    "mobilenet_0.25": lambda: (vision.MobileNet(0.25, classes=10), (2, 3, 64, 64)),
    "mobilenetv2_0.25": lambda: (vision.MobileNetV2(0.25, classes=10), (2, 3, 64, 64)),
    "squeezenet1.0": lambda: (vision.SqueezeNet("1.0", classes=10), (1, 3, 224, 224)),
    "squeezenet1.1": lambda: (vision.SqueezeNet("1.1", classes=10), (1, 3, 224, 224)),
    "densenet_narrow": lambda: (vision.DenseNet(16, 8, [2, 2, 2, 2], bn_size=2, classes=10), (1, 3, 224, 224)),
    "inceptionv3": lambda: (vision.Inception3(classes=10), (1, 3, 299, 299)),
}

MODELS = dict({"mlp": mlp, "convnet": convnet, "preactivation": preactivation, "embedding": embedding}, **ZOO)


def relative_difference(got, want):
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def export(directory, names):
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        sys.exit("no model named %s (%s)" % (", ".join(unknown), ", ".join(MODELS)))
    mx.random.seed(7)
    np.random.seed(7)
    for name, make in MODELS.items():
        if names and name not in names:
            continue
        net, shape, *tokens = make()
        # He's initialisation keeps deep ReLU networks' outputs from vanishing (Xavier's would leave
        # MobileNet's near 1e-15, where any answer would pass).
        net.initialize(mx.init.MSRAPrelu() if name in ZOO else mx.init.Xavier())
        if tokens:
            x = nd.array(np.random.randint(0, tokens[0], shape).astype(np.float32))
        else:
            x = nd.array(np.random.uniform(-1, 1, shape).astype(np.float32))
        net(x)
        # BatchNorm parameters and running statistics that are not 1, 0, 0 and 1, so that they matter.
        for key, p in net.collect_params().items():
            if key.endswith("running_mean"):
                p.set_data(nd.array(np.random.uniform(-0.5, 0.5, p.shape)))
            elif key.endswith("running_var"):
                p.set_data(nd.array(np.random.uniform(0.5, 2.0, p.shape)))
            elif name in ZOO and key.endswith("gamma"):
                p.set_data(nd.array(np.random.uniform(0.5, 1.5, p.shape)))
            elif name in ZOO and key.endswith("beta"):
                p.set_data(nd.array(np.random.uniform(-0.2, 0.2, p.shape)))
        net.hybridize()
        y = net(x)
        net.export(os.path.join(directory, name))
        nd.save(os.path.join(directory, name + "-io.params"), {"input": x, "output": y})
        print("mxnet exported %s: output %s" % (name, y.shape))


def check_arrays(directory):
    """NumPy reads the .npy and .npz files hybra wrote (interop.cpp writes these values)."""
    quarters = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    longs = np.array([-3, 0, 7, 2**40], dtype=np.int64)
    single = np.load(os.path.join(directory, "arrays.npy"))
    archive = np.load(os.path.join(directory, "arrays.npz"))
    if not (single.dtype == np.float32 and np.array_equal(single, quarters)):
        sys.exit("numpy read hybra's arrays.npy as %s %r" % (single.dtype, single))
    if sorted(archive.files) != ["longs", "quarters"] or not np.array_equal(archive["quarters"], quarters) \
            or not (archive["longs"].dtype == np.int64 and np.array_equal(archive["longs"], longs)):
        sys.exit("numpy read hybra's arrays.npz as %r" % {k: archive[k] for k in archive.files})
    print("numpy read hybra's arrays.npy and arrays.npz")
    halves = nd.load(os.path.join(directory, "float16.params"))["h"]
    want = np.array([1, 0.1, -65504, np.inf], dtype=np.float16)
    if not (halves.dtype == np.float16 and np.array_equal(halves.asnumpy().view(np.uint16), want.view(np.uint16))):
        sys.exit("mxnet read hybra's float16.params as %s %r" % (halves.dtype, halves.asnumpy()))
    print("mxnet read hybra's float16.params")


def check(directory):
    check_arrays(directory)
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
        worst = relative_difference(y, want)
        worst_all = max(worst_all, worst)
        print("mxnet ran hybra's %s: max relative difference %.1e" % (name, worst))
        if not worst <= TOLERANCE:
            sys.exit("%s: outputs differ (max relative difference %.1e > %.0e)" % (name, worst, TOLERANCE))
    print("mxnet agrees with hybra on %d models (max relative difference %.1e)" % (len(names), worst_all))


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("export", "check") or (sys.argv[1] == "check" and len(sys.argv) != 3):
        sys.exit(__doc__)
    if sys.argv[1] == "export":
        export(sys.argv[2], sys.argv[3:])
    else:
        check(sys.argv[2])
