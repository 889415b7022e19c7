// expect: hybra: Symbol::assign: a graph cannot be written in place
// In-place writes belong to tensors; a captured graph is a function.
#include <hybra/hybra.hpp>

int main() {
  hybra::Symbol x = hybra::sym::var("data", hybra::Shape{3});
  x.assign(x + 1);
  return 0;
}
