// Automatic parallelism (D2L 13.3): the engine runs ops that touch no common
// storage side by side, so work queued on two devices overlaps without any
// threading code in the program. hybra::cpu(i) are logical CPU devices, each
// with its own queue and worker thread; when several are in use the cores are
// split evenly among them (a device counts as in use from its first op on).
//
//  (1) Two independent chains of matrix products, A on cpu(0) and B on
//      cpu(1): each alone, then both queued before one waitall(). For
//      reference, the same 20 products on cpu(0) while it still had every core.
//  (2) Compute on cpu(0) and copy each result to cpu(1) as soon as it is
//      queued (the copy of step i overlaps with step i + 1), against computing
//      everything first and copying afterwards; with fresh results (to(cpu(1)))
//      and with tensors allocated once and rewritten (assign, copy_to).
//
//   auto_parallel           1000x1000 matrices (median of 3 runs), 2^22-element
//                           vectors (median of 5 runs)
//   auto_parallel --smoke   small sizes, one run; checks every result against a
//                           sequential computation on cpu(0) alone
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <hybra/hybra.hpp>
#include <thread>
#include <vector>

#include "../common/command_line.hpp"

using Clock = std::chrono::steady_clock;

// Wall time of f() from an idle engine to f's return, in milliseconds.
template <class F>
double time_ms(F f) {
  hybra::waitall();
  auto start = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// y <- x y, `steps` times, on the device of x and y. Each product needs the
// previous one, so a chain's only parallelism is inside each product (OpenBLAS,
// with its device's share of the cores).
hybra::Tensor matmul_chain(const hybra::Tensor& x, hybra::Tensor y, int steps) {
  for (int i = 0; i < steps; ++i) y = hybra::matmul(x, y);
  return y;
}

// One elementwise step of part (2), as an unevaluated expression (it holds
// references to x and y): one fused loop, about as costly as a copy of its
// result, so that hiding the copies can matter.
auto step(const hybra::Tensor& x, const hybra::Tensor& y) { return hybra::tanh(y) * x + 0.5f; }

double max_abs_diff(const hybra::Tensor& a, const hybra::Tensor& b) {
  auto u = a.to_vector<double>(), v = b.to_vector<double>();
  double worst = u.size() == v.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < std::min(u.size(), v.size()); ++i) worst = std::max(worst, std::abs(u[i] - v[i]));
  return worst;
}

int main(int argc, char** argv) {
  const bool smoke = example::smoke_run(argc, argv,
      "auto_parallel: automatic parallelism (D2L 13.3). Two chains of matrix products on cpu(0) and cpu(1),\n"
      "alone and side by side, and results copied to cpu(1) while the next is computed (1000x1000 matrices,\n"
      "median of 3 runs; 2^22-element vectors, median of 5 runs).",
      "small sizes, one run; checks every result against a sequential run on cpu(0)");
  const std::int64_t n = smoke ? 96 : 1000, m = smoke ? 4096 : std::int64_t{1} << 22;
  const int steps = 10, runs1 = smoke ? 1 : 3, runs2 = smoke ? 1 : 5;
  const auto cpu0 = hybra::cpu(0), cpu1 = hybra::cpu(1);
  const auto f32 = hybra::DType::float32;
  const double scale = 1 / std::sqrt(double(n));  // keeps the chains' values near 1
  auto& engine = hybra::engine::get();
  const int cores = static_cast<int>(std::thread::hardware_concurrency());

  // ---- (1) two independent chains ------------------------------------------
  hybra::Tensor xa = hybra::random_normal({n, n}, 0, scale, f32, cpu0), ya = hybra::random_normal({n, n}, 0, 1, f32, cpu0);
  hybra::Tensor ra, rb;
  matmul_chain(xa, ya, 1).wait_to_read();  // warm-up: OpenBLAS's threads, page faults

  // Before cpu(1) is ever used, cpu(0) has every core.
  const int threads_alone = engine.device_threads(cpu0);
  std::vector<double> one_device;
  for (int r = 0; r < runs1; ++r)
    one_device.push_back(time_ms([&] {
      matmul_chain(xa, ya, steps);
      matmul_chain(xa, ya, steps).wait_to_read();
    }));

  // From here on cpu(0) and cpu(1) each get half of the cores.
  hybra::Tensor xb = hybra::random_normal({n, n}, 0, scale, f32, cpu1), yb = hybra::random_normal({n, n}, 0, 1, f32, cpu1);
  matmul_chain(xb, yb, 1).wait_to_read();
  const int threads_shared = engine.device_threads(cpu0);
  std::vector<double> a_alone, b_alone, together;
  for (int r = 0; r < runs1; ++r) {  // in turn, so that drift hits all three alike
    a_alone.push_back(time_ms([&] { (ra = matmul_chain(xa, ya, steps)).wait_to_read(); }));
    b_alone.push_back(time_ms([&] { (rb = matmul_chain(xb, yb, steps)).wait_to_read(); }));
    together.push_back(time_ms([&] {
      ra = matmul_chain(xa, ya, steps);  // returns at once ...
      rb = matmul_chain(xb, yb, steps);  // ... so this chain is queued while A runs
      hybra::waitall();
    }));
  }
  const double a_ms = median(a_alone), b_ms = median(b_alone), ab_ms = median(together),
               one_ms = median(one_device);

  std::printf("(1) two chains of %d matmuls, %lldx%lld float32, A on cpu(0), B on cpu(1); %d cores\n", steps,
              static_cast<long long>(n), static_cast<long long>(n), cores);
  std::printf("    A alone                  %8.1f ms   (each device has %d thread(s) once both are in use)\n", a_ms,
              threads_shared);
  std::printf("    B alone                  %8.1f ms\n", b_ms);
  std::printf("    A, then B                %8.1f ms   (the sum)\n", a_ms + b_ms);
  std::printf("    A and B queued together  %8.1f ms   speed-up %.2fx\n", ab_ms, (a_ms + b_ms) / ab_ms);
  std::printf("    A and B both on cpu(0)   %8.1f ms   (%d thread(s), measured before cpu(1) was used)\n", one_ms,
              threads_alone);

  // ---- (2) computing while copying -------------------------------------------
  // Two ways to hold the results: fresh tensors (y = step(...), y.to(cpu(1)):
  // every step and every copy allocates 16 MB), and tensors allocated once and
  // rewritten (assign, copy_to). Each is timed computing everything and then
  // copying, and copying each result as soon as its step is queued.
  hybra::Tensor x = hybra::random_uniform({m}, -1, 1, f32, cpu0), y0 = hybra::random_uniform({m}, -1, 1, f32, cpu0);
  std::vector<hybra::Tensor> on0(steps), on1(steps), buf0(steps), buf1(steps);
  for (int i = 0; i < steps; ++i) {
    buf0[i] = hybra::Tensor({m}, f32, cpu0);
    buf1[i] = hybra::Tensor({m}, f32, cpu1);
  }
  auto copy = [&](bool fresh, int i) {
    if (fresh)
      on1[i] = on0[i].to(cpu1);  // queued on cpu(1), after step i
    else
      buf0[i].copy_to(buf1[i]);
  };
  // The steps on cpu(0), each result's copy queued right behind it if asked:
  // then cpu(1) copies step i while cpu(0) computes step i + 1.
  auto compute = [&](bool fresh, bool copy_each = false) {
    for (int i = 0; i < steps; ++i) {
      const hybra::Tensor& prev = i == 0 ? y0 : fresh ? on0[i - 1] : buf0[i - 1];
      if (fresh)
        on0[i] = step(x, prev);
      else
        buf0[i].assign(step(x, prev));
      if (copy_each) copy(fresh, i);
    }
  };
  // [fresh, reused][compute only, copies only, compute then copy, copy each as done]
  std::vector<double> t[2][4];
  for (int r = 0; r < (smoke ? 1 : 2) + runs2; ++r) {  // the first rounds warm up
    for (bool fresh : {true, false}) {
      double ms[4] = {
          time_ms([&] { compute(fresh); hybra::waitall(); }),
          time_ms([&] { for (int i = 0; i < steps; ++i) copy(fresh, i); hybra::waitall(); }),
          time_ms([&] { compute(fresh); hybra::waitall(); for (int i = 0; i < steps; ++i) copy(fresh, i); hybra::waitall(); }),
          time_ms([&] { compute(fresh, true); hybra::waitall(); }),
      };
      if (r >= (smoke ? 0 : 2))
        for (int k = 0; k < 4; ++k) t[fresh ? 0 : 1][k].push_back(ms[k]);
    }
  }
  double med[2][4];
  for (int f = 0; f < 2; ++f)
    for (int k = 0; k < 4; ++k) med[f][k] = median(t[f][k]);

  std::printf("\n(2) %d steps y = tanh(y) * x + 0.5 over %lld float32 on cpu(0), each result copied to cpu(1)\n",
              steps, static_cast<long long>(m));
  std::printf("                              fresh tensors (to)   reused tensors (assign, copy_to)\n");
  const char* rows[4] = {"compute only", "copies only", "compute, then copy", "copy each as it is done"};
  for (int k = 0; k < 4; ++k)
    std::printf("    %-24s %10.1f ms %21.1f ms\n", rows[k], med[0][k], med[1][k]);
  std::printf("    %-24s %10.2fx %22.2fx\n", "overlap speed-up", med[0][2] / med[0][3], med[1][2] / med[1][3]);

  // ---- check: the same work, one op at a time, on cpu(0) alone ---------------
  const auto type = engine.type();
  engine.set_type(hybra::engine::EngineType::naive);  // every op on this thread, in program order
  hybra::Tensor ra_seq = matmul_chain(xa, ya, steps);
  hybra::Tensor rb_seq = matmul_chain(xb.to(cpu0), yb.to(cpu0), steps);
  hybra::Tensor y_seq = y0;
  for (int i = 0; i < steps; ++i) y_seq = step(x, y_seq);
  engine.set_type(type);
  double worst_copy = 0;
  for (int i = 0; i < steps; ++i)
    worst_copy = std::max({worst_copy, max_abs_diff(on0[i], on1[i]), max_abs_diff(buf0[i], buf1[i])});
  const double da = max_abs_diff(ra, ra_seq), db = max_abs_diff(rb, rb_seq),
               dy = std::max(max_abs_diff(on0.back(), y_seq), max_abs_diff(buf1.back(), y_seq));
  const bool ok = ra.device() == cpu0 && rb.device() == cpu1 && on1.back().device() == cpu1 && da <= 1e-4 &&
                  db <= 1e-4 && dy == 0 && worst_copy == 0;
  std::printf("\nresults vs a sequential run on cpu(0): A %.1e, B %.1e, steps %.1e, copies %.1e: %s\n", da, db, dy,
              worst_copy, ok ? "agree" : "DIFFER");

  if (type == hybra::engine::EngineType::naive) {
    std::printf("\n(NaiveEngine: every op ran on the calling thread, so nothing overlapped; run without\n"
                "HYBRA_ENGINE_TYPE to see the asynchronous engine.)\n");
  } else if (!smoke) {
    std::printf(
        "\nWhat this shows:\n"
        "(1) Queued together, the two chains took %.0f%% of the time they take one after the other\n"
        "    (%.2fx; two devices on %d cores can reach %dx): cpu(1)'s worker multiplied while cpu(0)'s\n"
        "    did, with no threading code in this program.\n",
        100 * ab_ms / (a_ms + b_ms), (a_ms + b_ms) / ab_ms, cores, std::min(2, cores));
    if (one_ms <= 1.1 * ab_ms)
      std::printf(
          "    But splitting the cores gained nothing over one device: cpu(0) alone, with all %d threads,\n"
          "    did the same 20 products in %.0f ms (%.2fx the together time), since OpenBLAS already\n"
          "    spreads one product over every core. Devices pay off when a stream of work cannot use\n"
          "    all the cores by itself (small or serial ops).\n",
          threads_alone, one_ms, one_ms / ab_ms);
    else
      std::printf(
          "    That also beats one device: cpu(0) alone, with all %d threads, took %.0f ms for the same\n"
          "    20 products (%.2fx the together time); one product at a time used the cores less well.\n",
          threads_alone, one_ms, one_ms / ab_ms);
    std::printf(
        "(2) Queuing the copy of each result right behind its step lets cpu(1) copy step i while\n"
        "    cpu(0) computes step i + 1. With reused tensors that took %.0f ms instead of %.0f ms\n"
        "    (%.2fx); the floor is the longer of compute alone (%.0f ms) and copies alone (%.0f ms).\n"
        "    With fresh tensors, %.0f ms instead of %.0f ms (%.2fx). Compute alone took %.0f ms with\n"
        "    fresh results and %.0f ms reused: the difference is allocating and first touching (page\n"
        "    faults) new %lld MB results, which varies with how malloc recycles the freed ones.\n",
        med[1][3], med[1][2], med[1][2] / med[1][3], med[1][0], med[1][1], med[0][3], med[0][2],
        med[0][2] / med[0][3], med[0][0], med[1][0], static_cast<long long>(m * 4 >> 20));
  }
  return ok ? 0 : 1;
}
