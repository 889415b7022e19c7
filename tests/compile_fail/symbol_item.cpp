// expect: hybra: Symbol::item: a symbol has no value while its graph is built, so a branch on it cannot be captured
// A branch on a value (MXNet would freeze it silently; hybra refuses to compile).
#include <hybra/hybra.hpp>

template <class F>
F forward(const F& x) {
  if (hybra::sum(x).template item<float>() > 0) return hybra::relu(x);
  return x;
}

int main() {
  hybra::Symbol y = forward(hybra::sym::var("data", hybra::Shape{3}));
  return y.defined() ? 0 : 1;
}
