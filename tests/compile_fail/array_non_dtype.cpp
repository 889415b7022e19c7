// expect: hybra::array: element type must be float, double, std::int32_t, std::int64_t, std::uint8_t, hybra::float16_t or hybra::bfloat16_t
#include <hybra/eager.hpp>
#include <vector>

int main() {
  hybra::Tensor a = hybra::array(std::vector<short>{1, 2, 3});
  return a.ndim();
}
