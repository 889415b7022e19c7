// expect: hybra: an expression leaf must be a Tensor or an arithmetic scalar
// Yap's operators accept any right-hand side; evaluating the tree rejects a leaf that is no number.
#include <hybra/eager.hpp>
#include <string>

int main() {
  hybra::Tensor a = hybra::zeros({4});
  hybra::Tensor c = a + std::string("x");
  return c.ndim();
}
