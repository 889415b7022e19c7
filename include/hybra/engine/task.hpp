#pragma once
// The closure an engine op runs. It is built in place inside a pooled op
// record and never moved, so closures up to inline_size bytes cost a push no
// heap allocation; std::function would allocate above 16 bytes and needs
// copyable closures. A tensor op's closure holds Tensor copies (176 bytes
// each): `y = x + 1` captures 368 bytes, and fitting it in the record is
// measurably faster than a malloc/free pair, split across the pushing and the
// running thread, per op (docs/benchmarks.md, "Figures behind constants of
// the code").
#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace hybra::engine::detail {

class Task {
 public:
  static constexpr std::size_t inline_size = 384;

  Task() = default;
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() { reset(); }

  template <class F>
  void emplace(F&& f) {
    using Fn = std::decay_t<F>;
    reset();
    if constexpr (sizeof(Fn) <= inline_size && alignof(Fn) <= alignof(std::max_align_t)) {
      ::new (static_cast<void*>(buf_)) Fn(std::forward<F>(f));
      call_ = [](void* p) { (*static_cast<Fn*>(p))(); };
      destroy_ = [](void* p) noexcept { static_cast<Fn*>(p)->~Fn(); };
    } else {
      ::new (static_cast<void*>(buf_)) Fn*(new Fn(std::forward<F>(f)));
      call_ = [](void* p) { (**static_cast<Fn**>(p))(); };
      destroy_ = [](void* p) noexcept { delete *static_cast<Fn**>(p); };
    }
  }

  void operator()() { call_(buf_); }

  // Destroys the closure and what it captured.
  void reset() noexcept {
    if (auto destroy = std::exchange(destroy_, nullptr)) destroy(buf_);
  }

 private:
  // The pointers first: a small closure then shares their cache line.
  void (*call_)(void*) = nullptr;
  void (*destroy_)(void*) noexcept = nullptr;
  alignas(std::max_align_t) unsigned char buf_[inline_size];
};

}  // namespace hybra::engine::detail
