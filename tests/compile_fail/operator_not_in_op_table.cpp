// expect: hybra: this C\+\+ operator is not an op of hybra's op table
// `a % b` on Tensors does not even find an operator% (a plain "no match" error), so this builds the
// Yap node by hand, as a user transform could: evaluating it must name the op-table rule.
#include <hybra/eager.hpp>

int main() {
  namespace yap = boost::yap;
  hybra::Tensor a = hybra::ones({4}), b = hybra::ones({4});
  hybra::Tensor c = yap::make_expression<hybra::expression, yap::expr_kind::modulus>(a, b);
  return c.ndim();
}
