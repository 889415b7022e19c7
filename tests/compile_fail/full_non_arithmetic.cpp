// expect: hybra::full: the fill value must be an arithmetic scalar
#include <hybra/eager.hpp>
#include <string>

int main() {
  hybra::Tensor a = hybra::full({4}, std::string("1"));
  return a.ndim();
}
