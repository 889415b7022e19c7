#pragma once
// Initialisers, as Gluon's mx.init: each makes a parameter's first value
// from its shape. Random ones draw from a Generator (default: the global
// one), so `hybra::seed(s)` before initialize() makes a model reproducible.
#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "../core/creation.hpp"

namespace hybra::nn {

class Initializer {
 public:
  using Fill = std::function<Tensor(const Shape&, DType, Device, Generator&)>;
  Initializer(std::string name, Fill fill) : name_(std::move(name)), fill_(std::move(fill)) {}

  const std::string& name() const { return name_; }
  Tensor operator()(const Shape& shape, DType dtype, Device device, Generator& gen) const {
    return fill_(shape, dtype, device, gen);
  }

 private:
  std::string name_;
  Fill fill_;
};

namespace init {

// Uniform in [-scale, scale): Gluon's default initialiser.
inline Initializer Uniform(double scale = 0.07) {
  return {"Uniform(" + std::to_string(scale) + ")", [scale](const Shape& s, DType d, Device dev, Generator& g) {
            return random_uniform(s, -scale, scale, d, dev, g);
          }};
}
inline Initializer Normal(double sigma = 0.01) {
  return {"Normal(" + std::to_string(sigma) + ")", [sigma](const Shape& s, DType d, Device dev, Generator& g) {
            return random_normal(s, 0, sigma, d, dev, g);
          }};
}
inline Initializer Constant(double value) {
  return {"Constant(" + std::to_string(value) + ")",
          [value](const Shape& s, DType d, Device dev, Generator&) { return full(s, value, d, dev); }};
}
inline Initializer Zero() { return {"Zero", [](const Shape& s, DType d, Device dev, Generator&) { return zeros(s, d, dev); }}; }
inline Initializer One() { return {"One", [](const Shape& s, DType d, Device dev, Generator&) { return ones(s, d, dev); }}; }

// Glorot & Bengio: scale = sqrt(magnitude / factor), where factor is the
// fan-in, fan-out or their mean ("in", "out", "avg"); uniform in [-scale,
// scale) or normal with that deviation ("uniform", "gaussian").
inline Initializer Xavier(std::string rnd_type = "uniform", std::string factor_type = "avg", double magnitude = 3) {
  if (rnd_type != "uniform" && rnd_type != "gaussian")
    fail<ValueError>("init::Xavier: rnd_type '", rnd_type, "' is not uniform or gaussian");
  if (factor_type != "avg" && factor_type != "in" && factor_type != "out")
    fail<ValueError>("init::Xavier: factor_type '", factor_type, "' is not avg, in or out");
  return {"Xavier(" + rnd_type + ", " + factor_type + ", " + std::to_string(magnitude) + ")",
          [=](const Shape& s, DType d, Device dev, Generator& g) {
            if (s.size() < 2)
              fail<ShapeError>("init::Xavier: needs a weight of at least 2 dims, not ", to_string(s));
            double receptive = 1;
            for (std::size_t i = 2; i < s.size(); ++i) receptive *= static_cast<double>(s[i]);
            const double fan_in = static_cast<double>(s[1]) * receptive, fan_out = static_cast<double>(s[0]) * receptive;
            const double factor = factor_type == "avg" ? (fan_in + fan_out) / 2 : factor_type == "in" ? fan_in : fan_out;
            const double scale = std::sqrt(magnitude / std::max(factor, 1.0));
            return rnd_type == "uniform" ? random_uniform(s, -scale, scale, d, dev, g) : random_normal(s, 0, scale, d, dev, g);
          }};
}

}  // namespace init
}  // namespace hybra::nn
