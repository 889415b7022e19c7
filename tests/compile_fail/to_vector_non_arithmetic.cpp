// expect: hybra::Tensor::to_vector<T>: T must be an arithmetic type
#include <hybra/eager.hpp>
#include <string>

int main() {
  hybra::Tensor a = hybra::ones({4});
  return static_cast<int>(a.to_vector<std::string>().size());
}
