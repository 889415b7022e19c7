// expect: hybra: an expression has no truth value.*where\(condition, a, b\)
// `if (x > 0)` written for tensors does not compile for symbols (nor for
// tensors: an expression has no single truth value).
#include <hybra/hybra.hpp>

template <class F>
F forward(const F& x) {
  if (x > 0) return hybra::relu(x);
  return x;
}

int main() {
  hybra::Symbol y = forward(hybra::sym::var("data", hybra::Shape{3}));
  return y.defined() ? 0 : 1;
}
