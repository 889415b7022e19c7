// expect: hybra: Symbol::to_vector: a symbol has no values while its graph is built
// Reading values inside a forward that is being captured: there are none yet.
#include <hybra/hybra.hpp>

int main() {
  hybra::Symbol x = hybra::sym::var("data");
  return static_cast<int>(x.to_vector<float>().size());
}
