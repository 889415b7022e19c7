// ResNet-18 on Fashion-MNIST as D2L 8.5 ("Concise Implementation for Multiple
// GPUs") trains it: hybra::nn::model_zoo::resnet18 (a 3x3 first convolution,
// residual blocks with BatchNorm, global average pooling), SGD with a Trainer
// over split_and_load on the devices given, eager or hybridized.
//
//   train_resnet [--devices cpu0,cpu1 | cuda0,cuda1] [--epochs 10] [--batch-size 256] [--lr 0.1]
//                [--width 64] [--train-size N] ...
//   train_resnet --help    every option
//   train_resnet --smoke   a network of width 8, 2048 images in batches of 64 on cpu0 and cpu1, lr 0.05, 2 epochs
//
// The book's network is 64 channels wide at first (--width 64): a step of 256
// images is seconds on a 2-core CPU, so --train-size trains on the first N
// images. The options, the loop, the progress bar and the learning curve (CSV
// and SVG) are examples/common/fashion_mnist_training.hpp's.
#include "../common/fashion_mnist_training.hpp"

int main(int argc, char** argv) {
  example::Program program{.name = "train_resnet", .model = "ResNet-18",
                           .about = "train_resnet: D2L's ResNet-18 trained on Fashion-MNIST as its chapter \"Concise "
                                    "Implementation for Multiple GPUs\" does,\non hybra's CPU devices, GPUs or a mix."};
  program.smoke = {.devices = {hybra::cpu(0), hybra::cpu(1)}, .epochs = 2, .batch_size = 64, .lr = 0.05,
                   .train_size = 2048, .test_size = 512};
  // Chance is 0.1. The smoke run repeats its bits from run to run, but its figure moves with the kernels'
  // rounding. After one epoch the running statistics BatchNorm predicts with lag a network still moving fast,
  // and the test accuracy swung from 0.15 to 0.66 between builds and learning rates; after two it was 0.48-0.78
  // (docs/benchmarks.md, "BatchNorm's gradient in closed form"): the bound leaves room for another CPU's.
  program.smoke_accuracy = 0.3;
  program.model_options = [](example::po::options_description& model) {
    model.add_options()("width", example::po::value<std::int64_t>(),
                        "channels of the first convolution (D2L's: 64, the default; --smoke's: 8)");
  };
  return example::train(argc, argv, program, [](const example::Options& o, const example::po::variables_map& given) {
    const std::int64_t width = given.count("width") ? given["width"].as<std::int64_t>() : o.smoke ? 8 : 64;
    if (width < 1) example::bad_command_line("train_resnet", "--width takes a positive number of channels");
    std::printf("ResNet-18 of width %lld (D2L's: 64)\n", static_cast<long long>(width));
    return hybra::nn::model_zoo::resnet18(10, width);
  });
}
