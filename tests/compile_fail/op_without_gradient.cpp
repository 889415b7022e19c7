// expect: hybra: every op needs gradient\(g\)
// An op-table entry with no gradient facet: the gradient rules, generated
// from the table, refuse it where they are made.
#include <hybra/hybra.hpp>

struct scale {
  static constexpr std::string_view name = "scale";
  static hybra::Tensor eval(std::span<const hybra::Tensor> in, const hybra::op::Attrs&) { return in[0]; }
};

int main() { return hybra::autograd::detail::rule_of<scale>() == nullptr; }
