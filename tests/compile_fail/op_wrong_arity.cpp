// expect: hybra: wrong number of operands for this op
// exp is unary; applying its op-table entry to two operands is rejected.
#include <hybra/eager.hpp>

int main() {
  hybra::Tensor a = hybra::ones({4}), b = hybra::ones({4});
  hybra::Tensor c = hybra::apply_op<hybra::op::exp>(a, b);
  return c.ndim();
}
