// LeNet on real Fashion-MNIST (Debian's dataset-fashion-mnist), trained with
// autograd, SGD and data parallelism over the device pool: D2L's "multi-GPU"
// and "concise multi-GPU" chapters, on hybra's CPU devices, GPUs or a mix.
//
//   train_lenet [--devices cpu0,cpu1 | cuda0,cuda1] [--epochs 10] [--batch-size 256] [--lr 0.1] ...
//   train_lenet --help      every option
//   train_lenet --smoke     4096 training images in batches of 64, 1 epoch: a quick check that it learns
//   mpirun -np 2 train_lenet  the same training over 2 processes: each takes its share of every batch and
//                             the Trainer sums gradients across them (built with hybra::mpi)
//
// The options, the loop, the progress bar and the learning curve (CSV and
// SVG) are examples/common/fashion_mnist_training.hpp's.
#include "../common/fashion_mnist_training.hpp"

namespace nn = hybra::nn;

int main(int argc, char** argv) {
  example::Program program{.name = "train_lenet", .model = "LeNet",
                           .about = "train_lenet: LeNet-5 (D2L 7.6) trained on Fashion-MNIST on hybra's CPU devices, "
                                    "GPUs or a mix,\nand across processes under mpirun."};
  program.smoke = {.epochs = 1, .batch_size = 64, .train_size = 4096, .test_size = 1024};
  // LeNet-5 as D2L's chapter 7.6 builds it, with ReLU and max pooling.
  return example::train(argc, argv, program, [](const example::Options&, const example::po::variables_map&) {
    nn::HybridSequential net;
    net.add(nn::Conv2D(6, 5, 1, 2, 1, 1, "relu"), nn::MaxPool2D(2),  // (6, 28, 28) -> (6, 14, 14)
            nn::Conv2D(16, 5, 1, 0, 1, 1, "relu"), nn::MaxPool2D(2),  // (16, 10, 10) -> (16, 5, 5)
            nn::Flatten(), nn::Dense(120, "relu"), nn::Dense(84, "relu"), nn::Dense(10));
    return net;
  });
}
