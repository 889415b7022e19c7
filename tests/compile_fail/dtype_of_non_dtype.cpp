// expect: hybra: this C\+\+ type is not a hybra dtype; use float, double
// dtype_of<T> (core/dtype.hpp) names the rule for a type that is no dtype.
#include <hybra/eager.hpp>

int main() {
  hybra::Tensor a({4}, hybra::dtype_of_v<long double>);
  return a.ndim();
}
