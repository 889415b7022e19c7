// What hybridize() does to a user's block (D2L 13.1, "Compilers and
// Interpreters", hybrid programming): the chapter's HybridNet prints its
// argument type F and its input x inside hybrid_forward.
//
//  - Eagerly, hybrid_forward runs on every call, with F = hybra::Tensor and x
//    holding numbers.
//  - After hybridize(), the first call runs hybrid_forward ONCE with
//    F = hybra::Symbol (x is `<Symbol data (1, 3)>`, a placeholder) to capture
//    the graph; later calls with the same input shape run the compiled graph
//    and never enter hybrid_forward, so they print nothing. Any C++ in
//    hybrid_forward (here: printing) happens only while capturing.
//
//   hybrid_net           prints what the chapter shows
//   hybrid_net --smoke   the same, and checks the number of prints and the outputs
#include <cstdio>
#include <hybra/hybra.hpp>
#include <iostream>
#include <memory>
#include <type_traits>

#include "../common/command_line.hpp"

namespace nn = hybra::nn;

class HybridNet : public nn::HybridBlock<HybridNet> {
 public:
  HybridNet() : HybridBlock("hybridnet") {
    hidden = register_child(nn::Dense(4));
    output = register_child(nn::Dense(2));
  }

  template <class F>
  F hybrid_forward(const F& x) {
    ++prints;
    std::cout << "F: " << (std::is_same_v<F, hybra::Tensor> ? "hybra::Tensor" : "hybra::Symbol") << "\n";
    std::cout << "x: " << x << "\n";
    F h = relu((*hidden)(x));
    return (*output)(h);
  }

  int prints = 0;  // how many times hybrid_forward ran

 private:
  std::shared_ptr<nn::Dense> hidden, output;
};

int main(int argc, char** argv) {
  const bool smoke = example::smoke_run(argc, argv,
      "hybrid_net: what hybridize() does to a block (D2L 13.1). hybrid_forward runs on every eager call,\n"
      "and once, on Symbols, when hybridized.",
      "the same, checking the prints and the outputs");
  bool ok = true;
  auto check = [&](bool cond, const char* what) {
    if (!cond) {
      std::printf("CHECK FAILED: %s\n", what);
      ok = false;
    }
  };

  HybridNet net;
  net.initialize();
  hybra::Tensor x = hybra::random_normal({1, 3});

  std::cout << "== eager: 2 calls\n";
  hybra::Tensor eager1 = net(x);
  hybra::Tensor eager2 = net(x);
  const int eager_prints = net.prints;
  std::cout << "-> hybrid_forward ran " << eager_prints << " times\n";

  net.hybridize();
  std::cout << "\n== hybridized: 3 calls\n";
  std::vector<hybra::Tensor> hybrid;
  for (int call = 1; call <= 3; ++call) {
    std::cout << "-- call " << call << "\n";
    hybrid.push_back(net(x));
  }
  const int hybrid_prints = net.prints - eager_prints;
  std::cout << "-> hybrid_forward ran " << hybrid_prints << " time" << (hybrid_prints == 1 ? "" : "s")
            << " (the capture); calls 2 and 3 ran the compiled graph\n";

  std::cout << "\noutput, eager:      " << eager1.to_vector<float>()[0] << ' ' << eager1.to_vector<float>()[1]
            << "\noutput, hybridized: " << hybrid[2].to_vector<float>()[0] << ' ' << hybrid[2].to_vector<float>()[1]
            << "\n";
  check(eager_prints == 2, "eager: 2 calls print twice");
  check(hybrid_prints == 1, "hybridized: 3 calls print once");
  check(net.captured() == 1, "one signature captured");
  const auto expected = eager1.to_vector<float>();
  bool same = eager2.to_vector<float>() == expected;
  for (const auto& out : hybrid) same = same && out.shape() == eager1.shape() && out.to_vector<float>() == expected;
  check(same, "every call gives the same output");

  if (smoke || !ok) std::printf("\n%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
  return ok ? 0 : 1;
}
