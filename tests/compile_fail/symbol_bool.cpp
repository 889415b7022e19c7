// expect: hybra: `if` on a symbol cannot be captured into a graph
#include <hybra/hybra.hpp>

int main() {
  hybra::Symbol x = hybra::sym::var("data");
  if (x) return 1;
  return 0;
}
