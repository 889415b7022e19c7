#pragma once
// Training as the tests that compare devices run it.
#include <hybra/hybra.hpp>

namespace hybra::test {

// `steps` steps of SGD (learning rate 0.1, momentum 0.9) on the softmax
// cross-entropy of net(X) against the labels y, a whole batch per step.
inline void train_steps(nn::HybridSequential& net, const Tensor& X, const Tensor& y, int steps) {
  Trainer trainer(net.collect_params(), "sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}});
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  for (int step = 0; step < steps; ++step) {
    Tensor loss;
    {
      autograd::record rec;
      loss = loss_fn(net(X), y);
    }
    loss.backward();
    trainer.step(X.shape()[0]);
  }
}

}  // namespace hybra::test
