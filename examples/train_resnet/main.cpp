// ResNet-18 on Fashion-MNIST as D2L 8.5 ("Concise Implementation for Multiple
// GPUs") trains it: hybra::nn::model_zoo::resnet18 (a 3x3 first convolution,
// residual blocks with BatchNorm, global average pooling), SGD with a Trainer
// over split_and_load on the devices given, eager or hybridized.
//
//   train_resnet [--devices cpu0,cpu1 | cuda0,cuda1] [--epochs 10] [--batch-size 256] [--lr 0.1]
//                [--width 64] [--hybridize | --no-hybridize] [--train-size N] [--test-size N]
//                [--csv FILE] [--svg FILE] [--data DIR]
//   train_resnet --smoke   a network of width 8, 2048 images in batches of 64 on cpu0 and cpu1, lr 0.05, 1 epoch
//
// The book's network is 64 channels wide at first (--width 64): a step of 256
// images is seconds on a 2-core CPU, so --train-size trains on the first N
// images. The options, the loop, the progress bar and the learning curve (CSV
// and SVG) are examples/common/fashion_mnist_training.hpp's.
#include "../common/fashion_mnist_training.hpp"

int main(int argc, char** argv) {
  std::int64_t width = 64;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) smoke |= std::string(argv[i]) == "--smoke";
  if (smoke) width = 8;
  example::Program program{.name = "train_resnet", .model = "ResNet-18"};
  program.smoke = {.devices = {hybra::cpu(0), hybra::cpu(1)}, .epochs = 1, .batch_size = 64, .lr = 0.05,
                   .train_size = 2048, .test_size = 512};
  program.smoke_accuracy = 0.4;
  program.model_options = {{"--width", [&](const std::string& text) {
                              width = static_cast<std::int64_t>(example::positive_number(program, "--width", text));
                            }}};
  program.model_usage = " [--width CHANNELS]";
  return example::train(argc, argv, program, [&] {
    std::printf("ResNet-18 of width %lld (D2L's: 64)\n", static_cast<long long>(width));
    return hybra::nn::model_zoo::resnet18(10, width);
  });
}
