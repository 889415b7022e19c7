#pragma once
// A named, shared parameter of a block (Gluon's Parameter). A Parameter is a
// handle: blocks, the ParameterDict and captured graphs share one state, so
// set_data is seen by all. A dimension of 0 in its shape is not known yet
// (Dense without in_units): initialisation waits until the first call
// completes the shape (deferred initialisation, as Gluon's).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../graph/symbol.hpp"
#include "init.hpp"

namespace hybra::nn {

class Parameter {
 public:
  Parameter(std::string name, Shape shape, DType dtype = DType::float32, std::optional<Initializer> init = std::nullopt)
      : s_(std::make_shared<State>()) {
    s_->name = std::move(name);
    s_->shape = std::move(shape);
    s_->dtype = dtype;
    s_->init = std::move(init);
  }

  const std::string& name() const { return s_->name; }
  const Shape& shape() const { return s_->shape; }
  DType dtype() const { return s_->dtype; }
  bool shape_known() const {
    for (auto d : s_->shape)
      if (d == 0) return false;
    return true;
  }
  bool initialized() const { return s_->data.defined(); }

  // Whether training is to update this parameter, as Gluon's grad_req:
  // "write" (the default), "add" (gradients accumulate) or "null": an
  // auxiliary state that the forward computes (BatchNorm's running
  // statistics) or a frozen parameter. Nothing trains yet; this is what
  // autograd and model files will read.
  const std::string& grad_req() const { return s_->grad_req; }
  void set_grad_req(std::string req) {
    if (req != "write" && req != "add" && req != "null")
      fail<ValueError>("Parameter '", s_->name, "': grad_req '", req, "' is not write, add or null");
    s_->grad_req = std::move(req);
  }

  Tensor data() const {
    if (!s_->data.defined()) {
      if (s_->pending)
        fail<ValueError>("Parameter '", s_->name, "' has not been initialized yet: its shape ", to_string(s_->shape),
                         " is completed by the first forward call");
      fail<ValueError>("Parameter '", s_->name, "' has not been initialized; call initialize() on its block first");
    }
    return s_->data;
  }

  // Replaces the value; the shape must match (unknown dims take the value's).
  void set_data(const Tensor& value) {
    complete_shape(value.require("set_data").shape());
    s_->data = value.dtype() == s_->dtype ? value.contiguous() : value.astype(s_->dtype);
    s_->pending.reset();
  }

  // Initialises with this parameter's own initialiser if it has one, else
  // `fallback`; waits for the shape if it is not known yet.
  void initialize(const Initializer& fallback, Device device, Generator& gen, bool force_reinit = false) {
    if (initialized() && !force_reinit) return;
    s_->pending = Pending{s_->init.value_or(fallback), device, &gen};
    if (shape_known()) finish();
  }

  // Fills in the unknown (0) dims from `shape` and runs a waiting
  // initialisation. Known dims must agree.
  void complete_shape(const Shape& shape) {
    bool agree = shape.size() == s_->shape.size();
    for (std::size_t i = 0; agree && i < shape.size(); ++i) agree = s_->shape[i] == 0 || s_->shape[i] == shape[i];
    if (!agree)
      fail<ShapeError>("Parameter '", s_->name, "': shape ", to_string(shape), " does not match its declared shape ",
                       to_string(s_->shape));
    if (s_->shape != shape) {
      s_->shape = shape;
      s_->symbol.reset();
    }
    if (s_->pending && !s_->data.defined()) finish();
  }

  // The parameter as an operand of a forward written once for both modes:
  // its value (Tensor) or its var in the graph (Symbol).
  template <class F>
  F as() const {
    if constexpr (std::is_same_v<F, Tensor>) {
      return data();
    } else {
      static_assert(std::is_same_v<F, Symbol>, "hybra: Parameter::as<F>: F is Tensor or Symbol");
      if (!s_->symbol)
        s_->symbol = sym::var(s_->name, shape_known() ? std::optional<Shape>(s_->shape) : std::nullopt, s_->dtype);
      return *s_->symbol;
    }
  }

  void rename(std::string name) {
    s_->name = std::move(name);
    s_->symbol.reset();
  }

  friend bool operator==(const Parameter& a, const Parameter& b) { return a.s_ == b.s_; }

 private:
  struct Pending {
    Initializer init;
    Device device;
    Generator* gen;
  };
  struct State {
    std::string name;
    Shape shape;
    DType dtype;
    std::optional<Initializer> init;
    Tensor data;
    std::optional<Pending> pending;
    std::optional<Symbol> symbol;
    std::string grad_req = "write";
  };
  void finish() {
    auto& p = *s_->pending;
    Tensor value = p.init(s_->shape, s_->dtype, p.device, *p.gen);
    s_->data = value;
    s_->pending.reset();
  }

  std::shared_ptr<State> s_;
};

// Parameters by name, in the order their blocks registered them.
class ParameterDict {
 public:
  void add(const Parameter& p) { params_.push_back(p); }
  std::size_t size() const { return params_.size(); }
  auto begin() const { return params_.begin(); }
  auto end() const { return params_.end(); }
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const Parameter* find(std::string_view name) const {
    for (const auto& p : params_)
      if (p.name() == name) return &p;
    return nullptr;
  }
  Parameter operator[](std::string_view name) const {
    if (auto* p = find(name)) return *p;
    fail<ValueError>("ParameterDict: no parameter named '", name, "'");
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> k;
    for (const auto& p : params_) k.push_back(p.name());
    return k;
  }
  // Every parameter's initialisation (see Parameter::initialize).
  void initialize(const Initializer& init = init::Uniform(), Device device = cpu(),
                  Generator& gen = default_generator(), bool force_reinit = false) {
    for (auto& p : params_) p.initialize(init, device, gen, force_reinit);
  }

 private:
  std::vector<Parameter> params_;
};

}  // namespace hybra::nn
