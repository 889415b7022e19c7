// expect: hybra: a HybridSequential or HybridConcurrent holds HybridBlocks only
// A plain Block's forward is arbitrary C++ and cannot be captured.
#include <hybra/hybra.hpp>

namespace nn = hybra::nn;

class Eager : public nn::Block {
 public:
  Eager() : Block("eager") {}
  hybra::Tensor forward(const hybra::Tensor& x) override { return x; }
};

int main() {
  nn::HybridSequential net;
  net.add(Eager());
  return 0;
}
