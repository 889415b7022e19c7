// expect: hybra: an elementwise op needs at least one Tensor, Symbol or expression operand
// hybra::pow on two plain numbers is not a tensor op.
#include <hybra/eager.hpp>

int main() {
  auto e = hybra::pow(2, 3);
  (void)e;
  return 0;
}
