#pragma once
// Whether the code running now is training (Dropout drops, and later
// BatchNorm uses batch statistics) or predicting. Gluon's
// autograd.train_mode()/predict_mode(): a scope sets it for the calling thread.
namespace hybra::autograd {

namespace detail {
inline thread_local bool training = false;
}

inline bool is_training() { return detail::training; }

// Sets the mode for the current thread until the end of the scope.
class mode_scope {
 public:
  explicit mode_scope(bool train) : saved_(detail::training) { detail::training = train; }
  mode_scope(const mode_scope&) = delete;
  mode_scope& operator=(const mode_scope&) = delete;
  ~mode_scope() { detail::training = saved_; }

 private:
  bool saved_;
};

struct train_mode : mode_scope {
  train_mode() : mode_scope(true) {}
};
struct predict_mode : mode_scope {
  predict_mode() : mode_scope(false) {}
};

}  // namespace hybra::autograd
