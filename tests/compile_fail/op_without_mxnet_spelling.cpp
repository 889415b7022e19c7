// expect: hybra: an op needs its MXNet spelling
// An op-table entry with no model-file facet (mxnet, write, read) that
// gradients alone do not make: the table's contract check refuses it.
#include <hybra/hybra.hpp>

struct scale {
  static constexpr std::string_view name = "scale";
  static hybra::Tensor eval(std::span<const hybra::Tensor> in, const hybra::op::Attrs&) { return in[0]; }
  template <class G> static auto gradient(const G& g) { return g.grads(g.dy); }
};

int main() { return hybra::op::detail::follows_contract<scale>(); }
