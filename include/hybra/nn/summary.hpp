#pragma once
// A network as text. `out << net` prints its tree of blocks, each as its type
// and settings, children by their local names (Gluon's print(net)).
// summary(net, x) runs x through the network eagerly, in predicting mode
// and not recorded, and tabulates every block it calls: output shape and the
// number of its own parameters, then the network's totals (Gluon's
// net.summary(x)). A hybridized network is run eagerly for it (so each
// block is seen) and stays hybridized; deferred shapes are completed, as a
// first call would.
#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "block.hpp"

namespace hybra::nn {

namespace detail {

inline std::string local_name(const Block& parent, const Block& child) {
  std::string part = child.prefix().substr(std::min(parent.prefix().size(), child.prefix().size()));
  if (part.ends_with('_')) part.pop_back();
  return part;
}

inline void print_block(std::ostream& out, const Block& block, const std::string& indent) {
  out << block.type_name() << '(' << block.settings();
  if (block.children().empty()) {
    out << ')';
    return;
  }
  out << (block.settings().empty() ? "" : ",") << '\n';
  for (const auto& child : block.children()) {
    out << indent << "  (" << local_name(block, *child) << "): ";
    print_block(out, *child, indent + "  ");
    out << '\n';
  }
  out << indent << ')';
}

inline std::int64_t elements(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace detail

inline std::ostream& operator<<(std::ostream& out, const Block& block) {
  detail::print_block(out, block, "");
  return out;
}

// One block's call in a summary: its depth below the network, its name there
// (the network's own name at depth 0), its type, output shape and own
// parameters' element count.
struct SummaryRow {
  int depth;
  std::string name, type;
  Shape output;
  std::int64_t params;
};

// The rows of summary(net, x), in call order; a block called twice has two.
inline std::vector<SummaryRow> summary_rows(Block& net, const Tensor& x) {
  struct Recorder : detail::CallObserver {
    struct Call {
      const Block* block;
      const Block* parent;
      int depth;
      Shape output;
    };
    std::vector<Call> calls;
    std::vector<const Block*> open;
    void enter(const Block& block) override {
      calls.push_back({&block, open.empty() ? nullptr : open.back(), static_cast<int>(open.size()), {}});
      open.push_back(&block);
    }
    void leave(const Block& block, const Tensor& output) override {
      auto call = std::find_if(calls.rbegin(), calls.rend(), [&](const Call& c) { return c.block == &block; });
      call->output = output.shape();
      open.pop_back();
    }
  } recorder;
  struct Observing {
    detail::CallObserver* before;
    explicit Observing(detail::CallObserver* r) : before(std::exchange(detail::call_observer, r)) {}
    ~Observing() { detail::call_observer = before; }
  };
  {
    Observing observing(&recorder);
    autograd::pause not_recorded(false);
    net(x).wait_to_read();
  }
  std::vector<SummaryRow> rows;
  for (const auto& c : recorder.calls) {
    std::int64_t params = 0;
    for (const auto& [local, p] : c.block->own_params()) params += detail::elements(p.shape());
    rows.push_back({c.depth, c.parent ? detail::local_name(*c.parent, *c.block) : c.block->name(),
                    c.block->type_name(), c.output, params});
  }
  return rows;
}

// Prints the table of summary_rows(net, x) and the network's parameter
// totals, each parameter counted once however many blocks share it.
inline void summary(Block& net, const Tensor& x, std::ostream& out = std::cout) {
  const std::vector<SummaryRow> rows = summary_rows(net, x);
  const int name_width = 44, shape_width = 22, params_width = 12;
  const std::string rule(name_width + shape_width + params_width, '=');
  out << std::left << std::setw(name_width) << "Block (type)" << std::setw(shape_width) << "Output shape" << std::right
      << std::setw(params_width) << "Parameters" << '\n'
      << rule << '\n';
  auto line = [&](const std::string& name, const Shape& shape, std::int64_t params) {
    out << std::left << std::setw(name_width) << name << std::setw(shape_width) << to_string(shape) << std::right
        << std::setw(params_width) << params << '\n';
  };
  line("input", x.shape(), 0);
  for (const auto& r : rows)
    line(std::string(2 * static_cast<std::size_t>(r.depth), ' ') + r.name + " (" + r.type + ")", r.output, r.params);
  std::int64_t trained = 0, not_trained = 0;
  for (const Parameter& p : net.collect_params())
    (p.grad_req() == "null" ? not_trained : trained) += detail::elements(p.shape());
  out << rule << '\n'
      << "parameters: " << trained + not_trained << " (trained " << trained << ", not trained " << not_trained << ")\n";
}

}  // namespace hybra::nn
