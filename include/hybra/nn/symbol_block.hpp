#pragma once
// A block made from a graph rather than from C++ code: Gluon's SymbolBlock.
// SymbolBlock::imports reads a model that export_model wrote (or MXNet's
// own export), so a program runs the model with none of its code. Its
// parameters keep the names of the file; its inputs and outputs keep theirs.
#include <filesystem>
#include <string>
#include <unordered_map>
#include <vector>

#include "../io/mxnet_graph.hpp"
#include "../io/ndarray_list.hpp"
#include "../io/symbol_json.hpp"
#include "block.hpp"

namespace hybra::nn {

class SymbolBlock : public HybridBase {
 public:
  // The graph computing `outputs` from the vars named in `inputs`; every
  // other var becomes a parameter of that name (its shape and dtype those of
  // the var, which must be known).
  SymbolBlock(const std::vector<Symbol>& outputs, std::vector<std::string> inputs)
      : HybridBase("symbolblock", ""), graph_(graph::trace(outputs)), inputs_(std::move(inputs)) {
    if (inputs_.empty()) fail<ValueError>("SymbolBlock: needs at least one input name");
    for (int v : graph_.vars()) {
      const graph::Node& var = graph_.nodes[static_cast<std::size_t>(v)];
      if (std::find(inputs_.begin(), inputs_.end(), var.name) != inputs_.end()) continue;
      if (!var.meta.shape || !var.meta.dtype)
        fail<ValueError>("SymbolBlock: var '", var.name, "' is not an input and its shape is unknown, so it cannot be a "
                         "parameter; name it as an input, or give it a shape");
      params_by_var_.emplace(var.name, register_parameter(var.name, *var.meta.shape, *var.meta.dtype));
    }
    for (const auto& in : inputs_) {
      bool found = false;
      for (int v : graph_.vars()) found = found || graph_.nodes[static_cast<std::size_t>(v)].name == in;
      if (!found) fail<ValueError>("SymbolBlock: input '", in, "' is not a var of the graph");
    }
  }

  // Reads `<prefix>-symbol.json` (and its `.params`, when given: without it
  // the parameters wait for initialize() or load_parameters()). The block is
  // hybridized: calls run the optimised plan.
  static SymbolBlock imports(const std::filesystem::path& symbol_file, std::vector<std::string> inputs,
                             const std::filesystem::path& param_file = {}, Device device = cpu()) {
    const io::SymbolFile file = io::load_symbol_json(symbol_file);
    std::unordered_map<std::string, Tensor> params;
    if (!param_file.empty()) {
      for (auto& [key, value] : io::load_ndarray_list(param_file)) {
        std::string_view name = key;
        if (name.starts_with("arg:") || name.starts_with("aux:")) name.remove_prefix(4);
        params.emplace(std::string(name), value.to(device));
      }
    }
    const std::string file_name = symbol_file.string();
    auto var = [&](const io::SymbolNode& n) {
      if (std::find(inputs.begin(), inputs.end(), n.name) != inputs.end()) return sym::var(n.name);
      if (auto it = params.find(n.name); it != params.end()) return sym::var(n.name, it->second.shape(), it->second.dtype());
      for (const auto& [k, v] : n.attrs) {
        if (k != "__shape__" || !param_file.empty()) continue;
        auto dims = op::parse_tuple(v, "__shape__");
        bool known = !dims.empty();
        for (auto d : dims) known = known && d > 0;
        if (known) return sym::var(n.name, Shape(dims.begin(), dims.end()));
      }
      fail<ValueError>("SymbolBlock::imports: '", file_name, "': var '", n.name, "' is neither an input (",
                       join(inputs), ") nor in the parameter file",
                       param_file.empty() ? " (none was given, and the graph does not give its shape)" : "");
    };
    SymbolBlock block(io::from_mxnet(file, file_name, var), inputs);
    for (auto& [name, p] : block.params_by_var_)
      if (auto it = params.find(name); it != params.end()) p.set_data(it->second);
    block.hybridize();
    return block;
  }

  std::vector<std::string> input_names() const override { return inputs_; }
  // MXNet's names of the outputs: `<node name>_output`.
  std::vector<std::string> output_names() const {
    std::vector<std::string> names;
    for (int o : graph_.outputs) {
      const graph::Node& n = graph_.nodes[static_cast<std::size_t>(o)];
      names.push_back((n.name.empty() ? n.op : n.name) + "_output");
    }
    return names;
  }
  // The graph as it was imported (before optimisation).
  const graph::Graph& graph() const { return graph_; }

  // One input, one output.
  Tensor forward(const Tensor& x) override { return single(run_eager(std::span(&x, 1))); }
  Symbol forward(const Symbol& x) override { return single(forward_all({x})); }
  using Block::operator();
  // Every input, in input_names() order; every output.
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) {
    return hybridized() ? call_captured(inputs) : run_eager(inputs);
  }

 protected:
  std::vector<std::string> graph_input_names(std::size_t) const override { return inputs_; }
  std::vector<Symbol> forward_all(const std::vector<Symbol>& inputs) override {
    require_arity(inputs.size());
    return graph::replay(graph_, [&](const graph::Node& var) {
      auto at = std::find(inputs_.begin(), inputs_.end(), var.name);
      if (at != inputs_.end()) return inputs[static_cast<std::size_t>(at - inputs_.begin())];
      return params_by_var_.at(var.name).as<Symbol>();
    });
  }

 private:
  static std::string join(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  }
  void require_arity(std::size_t n) const {
    if (n != inputs_.size())
      fail<ValueError>("SymbolBlock: takes ", inputs_.size(), " inputs (", join(inputs_), "), not ", n);
  }
  template <class T>
  T single(std::vector<T> outs) const {
    if (outs.size() != 1)
      fail<ValueError>("SymbolBlock: the graph has ", outs.size(), " outputs; call it with a vector of inputs to get them all");
    return outs.front();
  }
  std::vector<Tensor> run_eager(std::span<const Tensor> inputs) {
    require_arity(inputs.size());
    std::unordered_map<std::string, Tensor> values;
    for (std::size_t k = 0; k < inputs.size(); ++k) values.emplace(inputs_[k], inputs[k]);
    for (const auto& [name, p] : params_by_var_) values.emplace(name, p.data());
    return graph::run(graph_, values);
  }

  graph::Graph graph_;
  std::vector<std::string> inputs_;
  std::unordered_map<std::string, Parameter> params_by_var_;
};

}  // namespace hybra::nn
