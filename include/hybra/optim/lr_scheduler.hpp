#pragma once
// Learning-rate schedules, as MXNet's mx.lr_scheduler: the learning rate as
// a function of num_update, the most updates any parameter has had (the
// first update is number 1). Trainer::set_lr_scheduler sets the optimizer's
// learning rate from one before each step.
//
// MXNet's schedulers keep state (FactorScheduler lowers its base_lr as
// updates pass); these are pure functions of num_update with the same
// values, so a resumed run (its optimizer's update counts restored) gets the
// rate an uninterrupted run would have had. Every schedule may begin with a
// warm-up of warmup_steps updates, rising linearly from warmup_begin_lr to
// base_lr, or held at warmup_begin_lr (WarmupMode::constant).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "../core/error.hpp"

namespace hybra::optim {

enum class WarmupMode { linear, constant };


struct Warmup {
  std::int64_t steps = 0;
  double begin_lr = 0;
  WarmupMode mode = WarmupMode::linear;
};

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;

  // The learning rate of update number num_update (1 for the first).
  double operator()(std::int64_t num_update) const {
    if (num_update < warmup_.steps) return warmup_lr(num_update);
    return after_warmup(num_update);
  }

  double base_lr() const { return base_lr_; }

 protected:
  LRScheduler(const char* what, double base_lr, Warmup warmup) : base_lr_(base_lr), warmup_(warmup) {
    if (!(base_lr >= 0) || !std::isfinite(base_lr))
      fail<ValueError>(what, ": base_lr must be a finite number >= 0, not ", base_lr);
    if (warmup.steps < 0) fail<ValueError>(what, ": warmup_steps must be >= 0, not ", warmup.steps);
    if (warmup.steps > 0 && !(warmup.begin_lr >= 0 && warmup.begin_lr <= base_lr))
      fail<ValueError>(what, ": warmup_begin_lr must lie in [0, base_lr = ", base_lr, "], not ", warmup.begin_lr);
  }
  virtual double after_warmup(std::int64_t num_update) const = 0;
  std::int64_t warmup_steps() const { return warmup_.steps; }

 private:
  double warmup_lr(std::int64_t num_update) const {
    if (warmup_.mode == WarmupMode::constant) return warmup_.begin_lr;
    return warmup_.begin_lr +
           (base_lr_ - warmup_.begin_lr) * static_cast<double>(num_update) / static_cast<double>(warmup_.steps);
  }

  double base_lr_;
  Warmup warmup_;
};

// base_lr times factor for every `step` updates passed, never below
// stop_factor_lr: MXNet's FactorScheduler (which, where stop_factor_lr
// exceeds base_lr, would raise the rate to it; this keeps base_lr).
class FactorScheduler final : public LRScheduler {
 public:
  struct Options {
    std::int64_t step = 1;
    double factor = 1;
    double base_lr = 0.01;
    double stop_factor_lr = 1e-8;
    Warmup warmup = {};
  };
  explicit FactorScheduler(const Options& o) : LRScheduler("FactorScheduler", o.base_lr, o.warmup), o_(o) {
    if (o.step < 1) fail<ValueError>("FactorScheduler: step must be >= 1, not ", o.step);
    if (!(o.factor > 0 && o.factor <= 1))
      fail<ValueError>("FactorScheduler: factor must lie in (0, 1], not ", o.factor);
  }

 private:
  double after_warmup(std::int64_t num_update) const override {
    const std::int64_t decays = std::max<std::int64_t>(0, (num_update - 1) / o_.step);
    return std::max(o_.base_lr * std::pow(o_.factor, static_cast<double>(decays)),
                    std::min(o_.base_lr, o_.stop_factor_lr));
  }
  Options o_;
};

// base_lr times factor for each of the increasing update counts in `steps`
// passed: MXNet's MultiFactorScheduler.
class MultiFactorScheduler final : public LRScheduler {
 public:
  struct Options {
    std::vector<std::int64_t> steps;
    double factor = 1;
    double base_lr = 0.01;
    Warmup warmup = {};
  };
  explicit MultiFactorScheduler(Options o)
      : LRScheduler("MultiFactorScheduler", o.base_lr, o.warmup), o_(std::move(o)) {
    if (o_.steps.empty()) fail<ValueError>("MultiFactorScheduler: steps is empty");
    for (std::size_t k = 0; k < o_.steps.size(); ++k)
      if (o_.steps[k] < 1 || (k > 0 && o_.steps[k] <= o_.steps[k - 1]))
        fail<ValueError>("MultiFactorScheduler: steps must increase from 1 up; step ", k, " is ", o_.steps[k]);
    if (!(o_.factor > 0 && o_.factor <= 1))
      fail<ValueError>("MultiFactorScheduler: factor must lie in (0, 1], not ", o_.factor);
  }

 private:
  double after_warmup(std::int64_t num_update) const override {
    const auto passed = std::count_if(o_.steps.begin(), o_.steps.end(), [&](std::int64_t s) { return num_update > s; });
    return o_.base_lr * std::pow(o_.factor, static_cast<double>(passed));
  }
  Options o_;
};

// From base_lr at the end of warm-up down to final_lr at max_update, and
// final_lr after: base_lr's share left is a curve of t, the share of those
// updates done (0 to 1). MXNet's PolyScheduler and CosineScheduler.
class DecayScheduler : public LRScheduler {
 protected:
  DecayScheduler(const char* what, double base_lr, double final_lr, std::int64_t max_update, Warmup warmup)
      : LRScheduler(what, base_lr, warmup), final_lr_(final_lr), max_update_(max_update) {
    if (max_update <= warmup.steps)
      fail<ValueError>(what, ": max_update (", max_update, ") must exceed warmup_steps (", warmup.steps, ")");
  }
  // What is left of base_lr - final_lr at t: 1 at 0, 0 at 1.
  virtual double left(double t) const = 0;

 private:
  double after_warmup(std::int64_t num_update) const override {
    const double t = static_cast<double>(std::min(num_update, max_update_) - warmup_steps()) /
                     static_cast<double>(max_update_ - warmup_steps());
    return final_lr_ + (base_lr() - final_lr_) * left(t);
  }
  double final_lr_;
  std::int64_t max_update_;
};

// Along (1 - t)^power: MXNet's PolyScheduler.
class PolyScheduler final : public DecayScheduler {
 public:
  struct Options {
    std::int64_t max_update = 1;
    double base_lr = 0.01;
    double power = 2;
    double final_lr = 0;
    Warmup warmup = {};
  };
  explicit PolyScheduler(const Options& o)
      : DecayScheduler("PolyScheduler", o.base_lr, o.final_lr, o.max_update, o.warmup), power_(o.power) {}

 private:
  double left(double t) const override { return std::pow(1 - t, power_); }
  double power_;
};

// Along half a cosine: MXNet's CosineScheduler.
class CosineScheduler final : public DecayScheduler {
 public:
  struct Options {
    std::int64_t max_update = 1;
    double base_lr = 0.01;
    double final_lr = 0;
    Warmup warmup = {};
  };
  explicit CosineScheduler(const Options& o)
      : DecayScheduler("CosineScheduler", o.base_lr, o.final_lr, o.max_update, o.warmup) {}

 private:
  double left(double t) const override { return (1 + std::cos(std::numbers::pi * t)) / 2; }
};

}  // namespace hybra::optim
