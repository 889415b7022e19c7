#pragma once
// A named, shared parameter of a block (Gluon's Parameter). A Parameter is a
// handle: blocks, the ParameterDict and captured graphs share one state, so
// set_data is seen by all. A dimension of 0 in its shape is not known yet
// (Dense without in_units): initialisation waits until the first call
// completes the shape (deferred initialisation, as Gluon's).
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../graph/symbol.hpp"
#include "init.hpp"

namespace hybra::nn {

namespace detail {
// The device of the tensor the running eager forward was called with
// (Block::operator() sets it): the device whose copy of each parameter
// Parameter::as<Tensor>() hands to the forward.
inline thread_local std::optional<Device> forward_device;

class forward_device_scope {
 public:
  explicit forward_device_scope(Device d) : saved_(forward_device) { forward_device = d; }
  forward_device_scope(const forward_device_scope&) = delete;
  forward_device_scope& operator=(const forward_device_scope&) = delete;
  ~forward_device_scope() { forward_device = saved_; }

 private:
  std::optional<Device> saved_;
};
}  // namespace detail

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
  bool initialized() const { return !s_->copies.empty(); }

  // Whether training is to update this parameter, as Gluon's grad_req:
  // "write" (the default), "add" (gradients accumulate) or "null": an
  // auxiliary state that the forward computes (BatchNorm's running
  // statistics) or a frozen parameter. Each copy of a parameter's value gets
  // its gradient buffer (Tensor::attach_grad) as soon as it has a value.
  const std::string& grad_req() const { return s_->grad_req; }
  void set_grad_req(std::string req) {
    autograd::parse_grad_req(req, "Parameter '" + s_->name + "'");
    s_->grad_req = std::move(req);
    attach_grads();
  }

  // The value: the copy on the device of the running forward's input when
  // there is one there, otherwise the first device's copy.
  Tensor data() const {
    require_initialized();
    if (detail::forward_device)
      for (const auto& t : s_->copies)
        if (t.device() == *detail::forward_device) return t;
    return s_->copies.front();
  }
  // The copy on `device` (a parameter initialised on several devices has one
  // on each): the parameter's own handle, as Gluon's data(ctx) is.
  const Tensor& data(Device device) const {
    require_initialized();
    for (const auto& t : s_->copies)
      if (t.device() == device) return t;
    std::ostringstream devices;
    for (const auto& t : s_->copies) devices << ' ' << t.device();
    fail<DeviceError>("Parameter '", s_->name, "' has no copy on ", device, " (it lives on", devices.str(),
                      "); initialize its block on that device");
  }
  // Every device's copy, in the order initialize() was given the devices.
  const std::vector<Tensor>& list_data() const {
    require_initialized();
    return s_->copies;
  }
  std::vector<Device> devices() const {
    std::vector<Device> d;
    for (const auto& t : s_->copies) d.push_back(t.device());
    return d;
  }

  // The gradient the last backward pass left in the copy data() returns / on `device` / on every device.
  Tensor grad() const { return require_gradient().data().grad(); }
  Tensor grad(Device device) const { return require_gradient().data(device).grad(); }
  std::vector<Tensor> list_grad() const {
    std::vector<Tensor> g;
    for (const auto& t : require_gradient().list_data()) g.push_back(t.grad());
    return g;
  }
  void zero_grad() const {
    if (s_->grad_req == "null") return;
    for (Tensor g : list_grad()) g.assign(zeros(g.shape(), g.dtype(), g.device()));
  }

  // Replaces the value on every device it lives on (the first device's
  // when it has none yet); the shape must match (unknown dims take the value's).
  void set_data(const Tensor& value) {
    complete_shape(value.require("set_data").shape());
    std::vector<Device> devices = this->devices();
    if (devices.empty()) devices.push_back(value.device());
    place(value.dtype() == s_->dtype ? value.contiguous() : value.astype(s_->dtype), devices);
    s_->pending.reset();
  }

  // Initialises with this parameter's own initialiser if it has one, else
  // `fallback`, on the first device, and copies that value to the others
  // (data-parallel replicas start equal); waits for the shape if it is not
  // known yet.
  void initialize(const Initializer& fallback, std::vector<Device> devices, Generator& gen, bool force_reinit = false) {
    if (devices.empty()) fail<ValueError>("Parameter '", s_->name, "': initialize needs at least one device");
    if (initialized() && !force_reinit) return;
    s_->pending = Pending{s_->init.value_or(fallback), std::move(devices), &gen};
    if (shape_known()) finish();
  }
  void initialize(const Initializer& fallback, Device device, Generator& gen, bool force_reinit = false) {
    initialize(fallback, std::vector<Device>{device}, gen, force_reinit);
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
    if (s_->pending && !initialized()) finish();
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

  // Converts the value on every device to `dtype`, each copy with a new
  // gradient buffer (Gluon's cast); before initialisation, the dtype it will
  // be initialised in.
  void cast(DType dtype) {
    s_->dtype = dtype;
    s_->symbol.reset();
    for (Tensor& t : s_->copies) t = t.astype(dtype).detach();
    attach_grads();
  }

  void rename(std::string name) {
    s_->name = std::move(name);
    s_->symbol.reset();
  }

  friend bool operator==(const Parameter& a, const Parameter& b) { return a.s_ == b.s_; }

 private:
  struct Pending {
    Initializer init;
    std::vector<Device> devices;
    Generator* gen;
  };
  struct State {
    std::string name;
    Shape shape;
    DType dtype;
    std::optional<Initializer> init;
    std::vector<Tensor> copies;  // one per device
    std::optional<Pending> pending;
    std::optional<Symbol> symbol;
    std::string grad_req = "write";
  };

  void require_initialized() const {
    if (initialized()) return;
    if (s_->pending)
      fail<ValueError>("Parameter '", s_->name, "' has not been initialized yet: its shape ", to_string(s_->shape),
                       " is completed by the first forward call");
    fail<ValueError>("Parameter '", s_->name, "' has not been initialized; call initialize() on its block first");
  }
  const Parameter& require_gradient() const {
    if (s_->grad_req == "null") fail<ValueError>("Parameter '", s_->name, "' has grad_req null: it has no gradient");
    return *this;
  }
  void place(const Tensor& value, const std::vector<Device>& devices) {
    s_->copies.clear();
    for (Device d : devices) s_->copies.push_back(d == value.device() ? value.detach() : value.to(d).detach());
    attach_grads();
  }
  void attach_grads() {
    for (auto& t : s_->copies) {
      if (s_->grad_req == "null") t.set_autograd_entry(nullptr);
      else t.attach_grad(s_->grad_req);
    }
  }
  void finish() {
    auto& p = *s_->pending;
    place(p.init(s_->shape, s_->dtype, p.devices.front(), *p.gen), p.devices);
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
    initialize(init, std::vector<Device>{device}, gen, force_reinit);
  }
  // Data parallelism: a copy of each parameter on every device, all equal.
  void initialize(const Initializer& init, const std::vector<Device>& devices, Generator& gen = default_generator(),
                  bool force_reinit = false) {
    for (auto& p : params_) p.initialize(init, devices, gen, force_reinit);
  }
  void zero_grad() const {
    for (const auto& p : params_) p.zero_grad();
  }

 private:
  std::vector<Parameter> params_;
};

}  // namespace hybra::nn
