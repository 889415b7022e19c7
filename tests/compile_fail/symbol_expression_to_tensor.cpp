// expect: hybra: an expression over symbols has no values to evaluate
#include <hybra/hybra.hpp>

int main() {
  hybra::Symbol x = hybra::sym::var("data", hybra::Shape{3});
  hybra::Tensor t = hybra::eval(x * 2);
  return t.defined() ? 0 : 1;
}
