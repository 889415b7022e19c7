#pragma once
// Dynamic loss scaling for training in float16 (Gluon's amp, PyTorch's
// GradScaler): the loss is multiplied by a scale before backward, so that
// small gradients are not flushed to zero in float16, and Trainer::step
// divides the scale out of the update. A step whose gradients overflowed
// (an infinity or a NaN) is skipped and the scale divided by `factor`; after
// `window` finite steps in a row it is multiplied by `factor`.
//
//   optim::LossScaler scaler;
//   { autograd::record r; loss = ...; scaler.scale(loss).backward(); }
//   trainer.step(batch_size, scaler);   // false: skipped, the scale lowered
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../core/error.hpp"
#include "../core/tensor.hpp"

namespace hybra::optim {

class LossScaler {
 public:
  struct Options {
    double init_scale = 65536;
    double factor = 2;
    std::int64_t window = 2000;
    double min_scale = 1;  // the scale never goes below it
  };

  LossScaler() : LossScaler(Options{}) {}
  explicit LossScaler(Options o) : o_(o), scale_(o.init_scale) {
    if (!(o.init_scale >= o.min_scale && o.min_scale > 0 && std::isfinite(o.init_scale)) || !(o.factor > 1) ||
        o.window < 1)
      fail<ValueError>("LossScaler: needs init_scale >= min_scale > 0 (finite), factor > 1 and window >= 1; got ",
                       o.init_scale, ", ", o.min_scale, ", ", o.factor, " and ", o.window);
  }

  // The loss times the scale: what backward starts from.
  template <class L>
  Tensor scale(const L& loss) const {
    return loss * scale_;
  }
  double loss_scale() const { return scale_; }
  std::int64_t finite_steps() const { return finite_; }
  std::int64_t skipped_steps() const { return skipped_; }

  // A saved state (Trainer::save_states with a scaler) put back.
  bool valid_state(double scale, double finite, double skipped) const {
    return std::isfinite(scale) && scale >= o_.min_scale && finite >= 0 && finite < static_cast<double>(o_.window) &&
           skipped >= 0 && finite == std::floor(finite) && skipped == std::floor(skipped);
  }
  void restore(double scale, std::int64_t finite, std::int64_t skipped) {
    if (!valid_state(scale, static_cast<double>(finite), static_cast<double>(skipped)))
      fail<ValueError>("LossScaler::restore: scale ", scale, ", ", finite, " finite and ", skipped,
                       " skipped steps are not a state of this scaler");
    scale_ = scale;
    finite_ = finite;
    skipped_ = skipped;
  }

  // Takes one step's outcome: whether its gradients were finite. Returns it.
  bool update(bool finite) {
    if (!finite) {
      scale_ = std::max(o_.min_scale, scale_ / o_.factor);
      finite_ = 0;
      ++skipped_;
      return false;
    }
    if (++finite_ >= o_.window) {
      scale_ *= o_.factor;
      finite_ = 0;
    }
    return true;
  }

 private:
  Options o_;
  double scale_;
  std::int64_t finite_ = 0, skipped_ = 0;
};

}  // namespace hybra::optim
