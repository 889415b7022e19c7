#pragma once
// ResNet-18 as Dive into Deep Learning builds it for Fashion-MNIST (sections
// 7.6 and 8.5, "Concise Implementation for Multiple GPUs"): a 3x3 first
// convolution of stride 1 and no max pooling, four stages of two residual
// blocks with BatchNorm (the first block of stages 2-4 halving the size with
// a 1x1 convolution on its shortcut), global average pooling, one Dense.
//
//   auto net = hybra::nn::model_zoo::resnet18(10);   // 10 classes
//
// `width` is the first stage's channels (64 in the book; each later stage
// doubles them): tests and 2-core machines train narrower copies of the
// same network.
#include <cstdint>
#include <memory>

#include "../conv_layers.hpp"
#include "../layers.hpp"

namespace hybra::nn::model_zoo {

// Y = relu(bn2(conv2(relu(bn1(conv1(X))))) + shortcut(X)), the shortcut a 1x1
// convolution of the same stride where the block changes the shape (D2L 7.6).
class Residual : public HybridBlock<Residual> {
 public:
  explicit Residual(std::int64_t channels, bool use_1x1conv = false, Size2d strides = 1)
      : HybridBlock("residual"),
        conv1_(register_child(Conv2D(channels, 3, strides, 1))),
        conv2_(register_child(Conv2D(channels, 3, 1, 1))),
        bn1_(register_child(BatchNorm())),
        bn2_(register_child(BatchNorm())) {
    if (use_1x1conv) conv3_ = register_child(Conv2D(channels, 1, strides));
  }
  template <class F>
  F hybrid_forward(const F& x) {
    F y = relu((*bn1_)((*conv1_)(x)));
    y = (*bn2_)((*conv2_)(y));
    return relu(y + (conv3_ ? (*conv3_)(x) : x));
  }

 private:
  std::shared_ptr<Conv2D> conv1_, conv2_, conv3_;
  std::shared_ptr<BatchNorm> bn1_, bn2_;
};
}  // namespace hybra::nn::model_zoo
namespace hybra::nn {
HYBRA_SEPARABLE_CLASS(HybridBlock<model_zoo::Residual>);  // in HybridBlock's own namespace, as C++ requires
}  // namespace hybra::nn
namespace hybra::nn::model_zoo {

// D2L 8.5's resnet18(num_classes).
inline HybridSequential resnet18(std::int64_t classes, std::int64_t width = 64) {
  auto stage = [](std::int64_t channels, int blocks, bool first) {
    HybridSequential s;
    for (int i = 0; i < blocks; ++i) {
      if (i == 0 && !first) s.add(Residual(channels, true, 2));
      else s.add(Residual(channels));
    }
    return s;
  };
  HybridSequential net;
  net.add(Conv2D(width, 3, 1, 1), BatchNorm(), Activation("relu"));
  net.add(stage(width, 2, true), stage(2 * width, 2, false), stage(4 * width, 2, false), stage(8 * width, 2, false));
  net.add(GlobalAvgPool2D(), Dense(classes));
  return net;
}

}  // namespace hybra::nn::model_zoo
