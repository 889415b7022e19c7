// expect: hybra: an operand of an elementwise op must be a Tensor, a Symbol, a hybra expression or an arithmetic scalar
// A named op (expr/expression.hpp apply_op) rejects an operand that is neither a tensor nor a number.
#include <hybra/eager.hpp>
#include <string>

int main() {
  hybra::Tensor a = hybra::zeros({4});
  hybra::Tensor c = hybra::maximum(a, std::string("x"));
  return c.ndim();
}
