// expect: hybra::Tensor::data<T>: T must be float, double, std::int32_t, std::int64_t or std::uint8_t
// Tensor::data<T>() only accepts the five dtypes' C++ types.
#include <hybra/eager.hpp>

int main() {
  hybra::Tensor a = hybra::zeros({4});
  return a.data<short>()[0];
}
