// Optimizers (optim/): SGD and Adam against plain loops of MXNet's update
// rules over several steps, per-index state, create() by name, operand
// errors, in-place updates, and that an update queues its work without
// waiting; learning-rate schedules against MXNet's values, the Trainer
// following one, clipping by global norm, the Trainer's state saved and
// resumed, and a run's progress shown and kept (Progress).
#include <hybra/optim/clip.hpp>
#include <hybra/optim/lr_scheduler.hpp>
#include <hybra/optim/optimizer.hpp>
#include <hybra/optim/progress.hpp>
#include <hybra/optim/trainer.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "reference.hpp"

using namespace hybra;
using optim::Adam;
using optim::SGD;

namespace {

template <class T>
std::vector<T> normal_values(std::size_t n, unsigned seed, double scale = 1) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// The hyperparameters, as the kernels use them: converted to the weight's type.
template <class T>
T clip(T g, double c) {
  if (c <= 0) return g;
  const T b = static_cast<T>(c);
  return g > b ? b : (g < -b ? -b : g);
}

// MXNet's sgd_update / sgd_mom_update, element by element.
template <class T>
struct SgdLoop {
  double lr, momentum, wd, rescale = 1, clip_gradient = 0;
  std::vector<T> mom;

  void step(std::vector<T>& w, const std::vector<T>& grad) {
    if (mom.empty()) mom.assign(w.size(), T(0));
    for (std::size_t i = 0; i < w.size(); ++i) {
      const T g = clip(static_cast<T>(rescale) * grad[i], clip_gradient);
      if (momentum == 0) {
        w[i] = (T(1) - static_cast<T>(lr) * static_cast<T>(wd)) * w[i] - static_cast<T>(lr) * g;
      } else {
        mom[i] = static_cast<T>(momentum) * mom[i] - static_cast<T>(lr) * static_cast<T>(wd) * w[i] -
                 static_cast<T>(lr) * g;
        w[i] = w[i] + mom[i];
      }
    }
  }
};

// MXNet's adam_update with the Python optimizer's bias correction.
template <class T>
struct AdamLoop {
  double lr, beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8, wd = 0, rescale = 1, clip_gradient = 0;
  std::vector<T> mean, var;
  int t = 0;

  void step(std::vector<T>& w, const std::vector<T>& grad) {
    if (mean.empty()) mean.assign(w.size(), T(0)), var.assign(w.size(), T(0));
    ++t;
    const double lr_t = lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t));
    const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const T g = clip(static_cast<T>(rescale) * grad[i] + static_cast<T>(wd) * w[i], clip_gradient);
      mean[i] = b1 * mean[i] + (T(1) - b1) * g;
      var[i] = b2 * var[i] + (T(1) - b2) * g * g;
      w[i] = w[i] - static_cast<T>(lr_t) * mean[i] / (std::sqrt(var[i]) + static_cast<T>(epsilon));
    }
  }
};

// Elementwise |got - want| <= atol + rtol * |want|, with float32 or float64 tolerances.
template <class T>
void check_close(const Tensor& got_t, const std::vector<T>& want, const char* what) {
  const auto got = got_t.to_vector<T>();
  REQUIRE(got.size() == want.size());
  const double rtol = std::is_same_v<T, float> ? 1e-5 : 1e-12, atol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double excess = std::abs(static_cast<double>(got[i]) - want[i]) - (atol + rtol * std::abs(static_cast<double>(want[i])));
    if (excess > worst) worst = excess, at = i;
  }
  INFO(std::string(what), ": worst element ", at, " got ", got[at], " want ", want[at]);
  CHECK(worst == 0);
}

template <class T>
Tensor tensor_of(const std::vector<T>& v, const Shape& shape, Device device = cpu()) {
  return array<T>(v, shape, device);
}

}  // namespace

TEST_CASE_TEMPLATE("optim: SGD matches MXNet's sgd_update / sgd_mom_update over several steps", T, float, double) {
  struct Config {
    double lr, momentum, wd, rescale, clip;
  };
  const Config configs[] = {
      {0.1, 0, 0, 1, 0},          // plain SGD
      {0.05, 0, 0.01, 0.25, 0.3}, // weight decay, rescaling, clipping, no state
      {0.1, 0.9, 0, 1, 0},        // momentum
      {0.05, 0.9, 0.01, 0.5, 0.3} // everything
  };
  for (const Shape& shape : {Shape{7, 33}, Shape{3, 40000}}) {
    for (const auto& c : configs) {
      CAPTURE(c.lr);
      CAPTURE(c.momentum);
      CAPTURE(c.wd);
      CAPTURE(c.clip);
      const auto n = static_cast<std::size_t>(checked_numel(shape));
      std::vector<T> want = normal_values<T>(n, 1);
      Tensor w = tensor_of(want, shape);
      SGD sgd(c.lr, c.momentum, c.wd);
      sgd.set_clip_gradient(c.clip);
      SgdLoop<T> loop{c.lr, c.momentum, c.wd, c.rescale, c.clip, {}};
      for (int step = 0; step < 6; ++step) {
        if (step == 3) {  // a schedule: the next updates use the new rate
          sgd.set_learning_rate(c.lr / 2);
          loop.lr = c.lr / 2;
        }
        sgd.set_rescale_grad(c.rescale);  // as the Trainer does each step
        const auto grad = normal_values<T>(n, 100 + step, 2.0);
        sgd.update(3, w, tensor_of(grad, shape));
        loop.step(want, grad);
      }
      check_close(w, want, "weight");
      CHECK(sgd.update_count(3) == 6);
      CHECK(sgd.num_update() == 6);
      if (c.momentum == 0) {
        CHECK(sgd.state(3).empty());
      } else {
        REQUIRE(sgd.state(3).size() == 1);
        CHECK(sgd.state(3)[0].dtype() == dtype_of_v<T>);
        check_close(sgd.state(3)[0], loop.mom, "momentum");
      }
    }
  }
}

TEST_CASE_TEMPLATE("optim: Adam matches MXNet's adam_update with bias correction over several steps", T, float,
                   double) {
  struct Config {
    double lr, beta1, beta2, epsilon, wd, rescale, clip;
  };
  const Config configs[] = {
      {0.01, 0.9, 0.999, 1e-8, 0, 1, 0},         // defaults but the rate
      {0.02, 0.8, 0.99, 1e-6, 0.05, 0.5, 0.4},   // weight decay, rescaling, clipping
  };
  for (const Shape& shape : {Shape{5, 41}, Shape{2, 60000}}) {
    for (const auto& c : configs) {
      CAPTURE(c.wd);
      CAPTURE(c.clip);
      const auto n = static_cast<std::size_t>(checked_numel(shape));
      std::vector<T> want = normal_values<T>(n, 2);
      Tensor w = tensor_of(want, shape);
      Adam adam(c.lr, c.beta1, c.beta2, c.epsilon, c.wd);
      adam.set_rescale_grad(c.rescale);
      adam.set_clip_gradient(c.clip);
      AdamLoop<T> loop{c.lr, c.beta1, c.beta2, c.epsilon, c.wd, c.rescale, c.clip, {}, {}, 0};
      for (int step = 0; step < 7; ++step) {
        const auto grad = normal_values<T>(n, 200 + step, 1.5);
        adam.update(0, w, tensor_of(grad, shape));
        loop.step(want, grad);
      }
      check_close(w, want, "weight");
      REQUIRE(adam.state(0).size() == 2);
      check_close(adam.state(0)[0], loop.mean, "mean");
      check_close(adam.state(0)[1], loop.var, "var");
      CHECK(adam.update_count(0) == 7);
    }
  }
}

TEST_CASE("optim: the first Adam step moves every weight by about the learning rate") {
  // Bias correction: m / sqrt(v) = g / |g| at t = 1, so each weight moves by lr (less epsilon's share).
  Adam adam(0.1);
  Tensor w = zeros({4});
  adam.update(0, w, array<float>({3.f, -0.5f, 1e-3f, -200.f}));
  const auto v = w.to_vector<float>();
  CHECK(v[0] == doctest::Approx(-0.1).epsilon(1e-5));
  CHECK(v[1] == doctest::Approx(0.1).epsilon(1e-5));
  CHECK(v[2] == doctest::Approx(-0.1).epsilon(1e-4));
  CHECK(v[3] == doctest::Approx(0.1).epsilon(1e-5));
}

TEST_CASE("optim: state and update counts are per index") {
  SUBCASE("Adam: each index has its own moments and its own t") {
    Adam adam(0.01, 0.9, 0.999, 1e-8, 0.01);
    const Shape s0{6, 5}, s7{11};
    std::vector<double> w0v = normal_values<double>(30, 3), w7v = normal_values<double>(11, 4);
    Tensor w0 = tensor_of(w0v, s0), w7 = tensor_of(w7v, s7);
    AdamLoop<double> ref0{0.01, 0.9, 0.999, 1e-8, 0.01, 1, 0, {}, {}, 0};
    AdamLoop<double> ref7 = ref0;
    // Index 0 is updated three times, index 7 twice, interleaved.
    for (int k = 0; k < 5; ++k) {
      const bool first = k != 1 && k != 3;
      if (first) {
        const auto g = normal_values<double>(30, 300 + k);
        adam.update(0, w0, tensor_of(g, s0));
        ref0.step(w0v, g);
      } else {
        const auto g = normal_values<double>(11, 400 + k);
        adam.update(7, w7, tensor_of(g, s7));
        ref7.step(w7v, g);
      }
    }
    check_close(w0, w0v, "index 0");
    check_close(w7, w7v, "index 7");
    CHECK(adam.update_count(0) == 3);
    CHECK(adam.update_count(7) == 2);
    CHECK(adam.update_count(5) == 0);
    CHECK(adam.num_update() == 3);
    REQUIRE(adam.state(0).size() == 2);
    REQUIRE(adam.state(7).size() == 2);
    CHECK(adam.state(0)[0].shape() == s0);
    CHECK(adam.state(7)[1].shape() == s7);
    CHECK(adam.state(0)[0].storage() != adam.state(0)[1].storage());
    CHECK(adam.state(5).empty());
    check_close(adam.state(7)[0], ref7.mean, "index 7 mean");
  }
  SUBCASE("SGD: two weights of one shape keep separate momenta") {
    SGD sgd(0.1, 0.9);
    const Shape s{4, 4};
    std::vector<float> av = normal_values<float>(16, 5), bv = normal_values<float>(16, 6);
    Tensor a = tensor_of(av, s), b = tensor_of(bv, s);
    SgdLoop<float> ra{0.1, 0.9, 0, 1, 0, {}}, rb = ra;
    for (int k = 0; k < 3; ++k) {
      const auto ga = normal_values<float>(16, 500 + k), gb = normal_values<float>(16, 600 + k);
      sgd.update(0, a, tensor_of(ga, s));
      sgd.update(1, b, tensor_of(gb, s));
      ra.step(av, ga);
      rb.step(bv, gb);
    }
    check_close(a, av, "index 0");
    check_close(b, bv, "index 1");
    REQUIRE(sgd.state(0).size() == 1);
    CHECK(sgd.state(0)[0].storage() != sgd.state(1)[0].storage());
  }
  SUBCASE("a state made for another weight is an error, not a broadcast") {
    SGD sgd(0.1, 0.9);
    Tensor w = ones({2, 3});
    sgd.update(2, w, ones({2, 3}));
    Tensor other = ones({3, 2});
    CHECK_THROWS_WITH_AS(sgd.update(2, other, ones({3, 2})),
                         doctest::Contains("SGD.update (index 2): its momentum state was made for a weight of shape (2, 3)"),
                         ValueError);
    CHECK(sgd.update_count(2) == 1);
    CHECK(other.to_vector<float>() == std::vector<float>(6, 1.f));
  }
}

TEST_CASE("optim: create() by name with Gluon's option names") {
  SUBCASE("sgd") {
    auto opt = optim::create("sgd", {{"learning_rate", 0.2}, {"momentum", 0.9}, {"wd", 1e-4}, {"clip_gradient", 5},
                                     {"rescale_grad", 0.5}});
    CHECK(opt->name() == "SGD");
    CHECK(opt->learning_rate() == 0.2);
    CHECK(opt->wd() == 1e-4);
    CHECK(opt->clip_gradient() == 5);
    CHECK(opt->rescale_grad() == 0.5);
    auto* sgd = dynamic_cast<SGD*>(opt.get());
    REQUIRE(sgd != nullptr);
    CHECK(sgd->momentum() == 0.9);
  }
  SUBCASE("names are case-insensitive; defaults are MXNet's") {
    auto sgd = optim::create("SGD", {});
    CHECK(sgd->learning_rate() == 0.01);
    CHECK(dynamic_cast<SGD&>(*sgd).momentum() == 0);
    CHECK(sgd->wd() == 0);
    CHECK(sgd->clip_gradient() == 0);
    CHECK(sgd->rescale_grad() == 1);
    auto adam = optim::create("Adam");
    CHECK(adam->name() == "Adam");
    CHECK(adam->learning_rate() == 0.001);
    auto& a = dynamic_cast<Adam&>(*adam);
    CHECK(a.beta1() == 0.9);
    CHECK(a.beta2() == 0.999);
    CHECK(a.epsilon() == 1e-8);
  }
  SUBCASE("adam options") {
    auto opt = optim::create("ADAM", {{"learning_rate", 0.01}, {"beta1", 0.8}, {"beta2", 0.99}, {"epsilon", 1e-6},
                                      {"wd", 0.1}, {"clip_gradient", 2}, {"rescale_grad", 0.125}});
    auto& a = dynamic_cast<Adam&>(*opt);
    CHECK(a.learning_rate() == 0.01);
    CHECK(a.beta1() == 0.8);
    CHECK(a.beta2() == 0.99);
    CHECK(a.epsilon() == 1e-6);
    CHECK(a.wd() == 0.1);
    CHECK(a.clip_gradient() == 2);
    CHECK(a.rescale_grad() == 0.125);
  }
  SUBCASE("the created optimizer updates as the class does") {
    auto opt = optim::create("sgd", {{"learning_rate", 0.5}, {"momentum", 0.5}});
    Tensor w = ones({3});
    opt->update(0, w, array<float>({1.f, 2.f, -4.f}));
    opt->update(0, w, array<float>({1.f, 2.f, -4.f}));
    // mom1 = -0.5 g, mom2 = 0.5 mom1 - 0.5 g = -0.75 g; w = 1 - 1.25 g
    CHECK(w.to_vector<float>() == std::vector<float>{-0.25f, -1.5f, 6.f});
  }
  SUBCASE("errors name what is wrong and list what is valid") {
    CHECK_THROWS_WITH_AS(optim::create("rmsprop", {}),
                         "optim::create: unknown optimizer 'rmsprop'; the optimizers are sgd, adam", ValueError);
    CHECK_THROWS_WITH_AS(optim::create("sgd", {{"beta1", 0.9}}),
                         "optim::create: 'sgd' has no option 'beta1'; its options are learning_rate, momentum, wd, "
                         "clip_gradient, rescale_grad",
                         ValueError);
    CHECK_THROWS_WITH_AS(optim::create("adam", {{"momentum", 0.9}}),
                         doctest::Contains("'adam' has no option 'momentum'; its options are learning_rate, beta1, "
                                           "beta2, epsilon, wd, clip_gradient, rescale_grad"),
                         ValueError);
    CHECK_THROWS_WITH_AS(optim::create("sgd", {{"lr", 0.1}}), doctest::Contains("no option 'lr'"), ValueError);
    CHECK_THROWS_WITH_AS(optim::create("sgd", {{"learning_rate", -0.1}}),
                         "SGD: learning_rate must be a finite number >= 0, not -0.1", ValueError);
    CHECK_THROWS_WITH_AS(optim::create("adam", {{"learning_rate", -1}}), doctest::Contains("Adam: learning_rate"),
                         ValueError);
    CHECK_THROWS_WITH_AS(optim::create("adam", {{"beta1", 1}}), "Adam: beta1 must be in [0, 1), not 1", ValueError);
    CHECK_THROWS_AS(optim::create("sgd", {{"momentum", -0.5}}), ValueError);
    CHECK_THROWS_AS(optim::create("sgd", {{"wd", std::numeric_limits<double>::quiet_NaN()}}), ValueError);
  }
  SUBCASE("set_learning_rate rejects what the constructor rejects") {
    SGD sgd;
    CHECK_THROWS_AS(sgd.set_learning_rate(-0.01), ValueError);
    CHECK_THROWS_AS(sgd.set_learning_rate(std::numeric_limits<double>::infinity()), ValueError);
    CHECK(sgd.learning_rate() == 0.01);
    sgd.set_learning_rate(0);
    CHECK(sgd.learning_rate() == 0);
  }
}

TEST_CASE("optim: mismatched operands are errors of the call, naming the optimizer, index and shapes") {
  SGD sgd(0.1, 0.9);
  Adam adam;
  for (optim::Optimizer* opt : {static_cast<optim::Optimizer*>(&sgd), static_cast<optim::Optimizer*>(&adam)}) {
    const std::string who = std::string(opt->name()) + ".update (index 4): ";
    CAPTURE(who);
    Tensor w = ones({2, 3});
    const std::string shape_msg = who + "gradient of shape (3, 2) does not match weight of shape (2, 3)";
    CHECK_THROWS_WITH_AS(opt->update(4, w, ones({3, 2})), shape_msg.c_str(), ShapeError);
    // A gradient that would broadcast is still the wrong gradient.
    const std::string broadcast_msg = who + "gradient of shape (3,) does not match weight of shape (2, 3)";
    CHECK_THROWS_WITH_AS(opt->update(4, w, ones({3})), broadcast_msg.c_str(), ShapeError);
    const std::string dtype_msg = who + "gradient of dtype float64 does not match weight of dtype float32 (shape (2, 3))";
    CHECK_THROWS_WITH_AS(opt->update(4, w, ones({2, 3}, DType::float64)), dtype_msg.c_str(), DTypeError);
    const std::string device_msg =
        who + "gradient on cpu(1) but weight of shape (2, 3) on cpu(0); copy one with to(device) first";
    CHECK_THROWS_WITH_AS(opt->update(4, w, ones({2, 3}, DType::float32, cpu(1))), device_msg.c_str(), DeviceError);
    Tensor iw = ones({2, 3}, DType::int32);
    const std::string int_msg = who + "weight has dtype int32; optimizers update float32 or float64 weights";
    CHECK_THROWS_WITH_AS(opt->update(4, iw, ones({2, 3}, DType::int32)), int_msg.c_str(), DTypeError);
    CHECK_THROWS_WITH_AS(opt->update(4, w, Tensor{}), doctest::Contains("the gradient is empty"), ValueError);
    // Nothing happened: no count, no state, the weight unchanged.
    CHECK(opt->update_count(4) == 0);
    CHECK(opt->num_update() == 0);
    CHECK(opt->state(4).empty());
    CHECK(w.to_vector<float>() == std::vector<float>(6, 1.f));
  }
  waitall();  // no op was queued that could fail later
}

TEST_CASE("optim: updates are in place: every handle of the weight sees them") {
  SUBCASE("copies of the handle") {
    for (bool use_adam : {false, true}) {
      CAPTURE(use_adam);
      std::unique_ptr<optim::Optimizer> opt =
          use_adam ? optim::create("adam", {{"learning_rate", 0.1}}) : optim::create("sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}});
      Tensor w = array<double>({1.0, 2.0, 3.0});
      const Tensor alias = w;                 // e.g. the Parameter's own handle
      std::vector<Tensor> model{w};           // e.g. a block's list of parameters
      const auto* storage = w.storage().get();
      opt->update(0, w, array<double>({1.0, -1.0, 0.5}));
      opt->update(0, w, array<double>({1.0, -1.0, 0.5}));
      CHECK(w.storage().get() == storage);
      const auto after = alias.to_vector<double>();
      CHECK(model[0].to_vector<double>() == after);
      CHECK(w.to_vector<double>() == after);
      CHECK(after[0] < 1.0);
      CHECK(after[1] > 2.0);
      CHECK(after[2] < 3.0);
    }
  }
  SUBCASE("a strided view writes through to its storage") {
    Tensor base = array<float>({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
    Tensor view = transpose(base);  // (3, 2), not contiguous
    REQUIRE(view.storage() == base.storage());
    REQUIRE(!view.is_contiguous());
    SGD sgd(0.5);
    sgd.update(0, view, array<float>({{2.f, 4.f}, {6.f, 8.f}, {10.f, 12.f}}));
    // view - 0.5 * grad, transposed back into base.
    CHECK(base.to_vector<float>() == std::vector<float>{0.f, -1.f, -2.f, 2.f, 1.f, 0.f});
  }
  SUBCASE("a gradient that is another view of the weight is read before the weight is overwritten") {
    Tensor w = array<double>({{1.0, 2.0}, {3.0, 4.0}});
    SGD sgd(1.0);
    sgd.update(0, w, transpose(w));  // w - w^T
    CHECK(w.to_vector<double>() == std::vector<double>{0.0, -1.0, 1.0, 0.0});
    sgd.update(1, w, w);  // the same view: w - w
    CHECK(w.to_vector<double>() == std::vector<double>{0.0, 0.0, 0.0, 0.0});
  }
}

TEST_CASE("optim: an update queues its work and returns without waiting for the gradient") {
  test::EngineTypeScope threaded(engine::EngineType::threaded);
  for (bool use_adam : {false, true}) {
    CAPTURE(use_adam);
    SGD sgd(0.5, 0.5);
    Adam adam(0.5);
    optim::Optimizer& opt = use_adam ? static_cast<optim::Optimizer&>(adam) : sgd;
    Tensor w = ones({1000});
    Tensor grad(Shape{1000});
    auto open = std::make_shared<std::atomic<bool>>(false);
    auto finished = std::make_shared<std::atomic<bool>>(false);
    // The gradient is written by an op that runs only once the test opens it.
    push_op("gate", {}, {grad}, [grad, open, finished] {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!open->load() && std::chrono::steady_clock::now() < end) std::this_thread::yield();
      auto* p = static_cast<float*>(grad.raw_data());
      for (std::int64_t i = 0; i < grad.size(); ++i) p[i] = 2.f;
      finished->store(true);
    });
    opt.update(0, w, grad);  // creates the state and queues the update
    opt.update(0, w, grad);
    CHECK_FALSE(finished->load());  // both updates returned while the gradient was pending
    open->store(true);
    const auto v = w.to_vector<float>();
    // SGD: mom1 = -1, mom2 = -1.5, w = 1 - 2.5. Adam: each step moves by lr (t-corrected m / sqrt(v) = 1).
    const float want = use_adam ? 0.f : -1.5f;
    CHECK(v.front() == doctest::Approx(want).epsilon(1e-5));
    CHECK(v.back() == doctest::Approx(want).epsilon(1e-5));
  }
}

// The values MXNet 1.9.1's mx.lr_scheduler gives for the same settings, for
// num_update 1, 2, ... (printed from Python, rounded to 6 digits).
TEST_CASE("optim: learning-rate schedules give MXNet's rates, warm-up included") {
  auto check = [](const optim::LRScheduler& s, const std::vector<double>& mxnet) {
    for (std::size_t k = 0; k < mxnet.size(); ++k) {
      CAPTURE(k + 1);
      CHECK(s(static_cast<std::int64_t>(k + 1)) == doctest::Approx(mxnet[k]).epsilon(1e-6));
    }
  };
  check(optim::FactorScheduler({.step = 3, .factor = 0.5, .base_lr = 1, .stop_factor_lr = 0.2, .warmup = {2, 0.1}}),
        {0.55, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.2, 0.2, 0.2, 0.2});
  check(optim::MultiFactorScheduler({.steps = {2, 5}, .factor = 0.1, .base_lr = 1}),
        {1.0, 1.0, 0.1, 0.1, 0.1, 0.01, 0.01});
  check(optim::CosineScheduler({.max_update = 10, .base_lr = 1, .final_lr = 0.1, .warmup = {2, 0}}),
        {0.5, 1.0, 0.965746, 0.868198, 0.722208, 0.55, 0.377792, 0.231802, 0.134254, 0.1, 0.1, 0.1});
  check(optim::PolyScheduler({.max_update = 10, .base_lr = 1, .power = 2, .final_lr = 0.1}),
        {0.829, 0.676, 0.541, 0.424, 0.325, 0.244, 0.181, 0.136, 0.109, 0.1, 0.1, 0.1});
  check(optim::FactorScheduler({.step = 2, .factor = 0.5, .base_lr = 1, .warmup = {3, 0.25, optim::WarmupMode::constant}}),
        {0.25, 0.25, 0.5, 0.5, 0.25});
}

TEST_CASE("optim: a schedule's settings out of range are errors naming the scheduler") {
  CHECK_THROWS_WITH_AS(optim::FactorScheduler({.step = 0}), "FactorScheduler: step must be >= 1, not 0", ValueError);
  CHECK_THROWS_WITH_AS(optim::FactorScheduler({.step = 2, .factor = 1.5}),
                       "FactorScheduler: factor must lie in (0, 1], not 1.5", ValueError);
  CHECK_THROWS_WITH_AS(optim::MultiFactorScheduler({.steps = {5, 3}, .factor = 0.5}),
                       "MultiFactorScheduler: steps must increase from 1 up; step 1 is 3", ValueError);
  CHECK_THROWS_WITH_AS(optim::CosineScheduler({.max_update = 4, .warmup = {4, 0}}),
                       "CosineScheduler: max_update (4) must exceed warmup_steps (4)", ValueError);
  CHECK_THROWS_WITH_AS(optim::PolyScheduler({.max_update = 10, .base_lr = 0.1, .warmup = {2, 0.5}}),
                       "PolyScheduler: warmup_begin_lr must lie in [0, base_lr = 0.1], not 0.5", ValueError);
}

TEST_CASE("optim: the Trainer takes each step's rate from its scheduler, counted over the whole run") {
  nn::ParameterDict params;
  const nn::Parameter w("w", Shape{2});  // a handle: the dict's entry is the same parameter
  params.add(w);
  params.initialize(nn::init::Constant(1));
  Trainer trainer(params, "sgd", {{"learning_rate", 5}});
  trainer.set_lr_scheduler(std::make_shared<optim::MultiFactorScheduler>(
      optim::MultiFactorScheduler::Options{.steps = {2}, .factor = 0.5, .base_lr = 0.1}));
  CHECK_THROWS_WITH_AS(trainer.set_learning_rate(1), doctest::Contains("a learning-rate scheduler sets it"), ValueError);
  // Each step: w -= lr * grad with grad 1: 0.1, 0.1, then 0.05.
  std::vector<double> rates, values;
  for (int step = 0; step < 3; ++step) {
    w.grad().assign(ones({2}));
    trainer.step(1);
    rates.push_back(trainer.learning_rate());
    values.push_back(w.data().to_vector<double>()[0]);
  }
  CHECK(rates == std::vector<double>{0.1, 0.1, 0.05});
  CHECK(values[2] == doctest::Approx(1 - 0.1 - 0.1 - 0.05));
  trainer.set_lr_scheduler(nullptr);
  trainer.set_learning_rate(0.5);
  CHECK(trainer.learning_rate() == 0.5);
}

TEST_CASE("optim: clip_global_norm scales to max_norm only above it, and leaves non-finite gradients to the caller") {
  std::vector<Tensor> grads = {array({3.0f, 4.0f}), array({12.0})};
  CHECK(optim::clip_global_norm(grads, 20) == doctest::Approx(13));
  CHECK(grads[0].to_vector<float>() == std::vector<float>{3, 4});  // below max_norm: as they were
  CHECK(optim::clip_global_norm(grads, 6.5) == doctest::Approx(13));
  CHECK(grads[0].to_vector<double>()[1] == doctest::Approx(2).epsilon(1e-6));
  CHECK(grads[1].to_vector<double>()[0] == doctest::Approx(6).epsilon(1e-6));
  CHECK(grads[0].dtype() == DType::float32);
  std::vector<Tensor> bad = {array({1.0f, std::numeric_limits<float>::quiet_NaN()})};
  CHECK(std::isnan(optim::clip_global_norm(bad, 1)));
  CHECK(bad[0].to_vector<float>()[0] == 1);
  std::vector<Tensor> ints = {array({1, 2})};
  CHECK_THROWS_WITH_AS(optim::clip_global_norm(ints, 1), "clip_global_norm: arrays must be floating (float32, float64, float16, bfloat16), not int32",
                       DTypeError);
  CHECK_THROWS_WITH_AS(optim::clip_global_norm(grads, 0), "clip_global_norm: max_norm must be > 0, not 0", ValueError);
}

TEST_CASE("optim: the Trainer clips the summed gradients once per parameter and scales every device's copy") {
  nn::ParameterDict params;
  const nn::Parameter w("w", Shape{2});
  params.add(w);
  params.initialize(nn::init::Zero(), {cpu(0), cpu(1)});
  Trainer trainer(params, "sgd", {{"learning_rate", 1}});
  for (Tensor g : w.list_grad()) g.assign(array({1.5f, 2.0f}));
  trainer.allreduce_grads();  // each copy: (3, 4), norm 5
  CHECK(trainer.clip_global_norm(2.5) == doctest::Approx(5));
  for (const Tensor& g : w.list_grad()) {
    CHECK(g.to_vector<double>()[0] == doctest::Approx(1.5).epsilon(1e-6));
    CHECK(g.to_vector<double>()[1] == doctest::Approx(2).epsilon(1e-6));
  }
  trainer.update(1);
  CHECK(w.list_data()[0].to_vector<double>() == w.list_data()[1].to_vector<double>());
  CHECK_THROWS_WITH_AS(trainer.clip_global_norm(-1), "clip_global_norm: max_norm must be > 0, not -1", ValueError);
}

namespace {

// Two trained parameters around a frozen one, all starting at `start`.
nn::ParameterDict resumable_params(const std::vector<Device>& devices, float start, Shape b_shape = {4}) {
  nn::ParameterDict params;
  nn::Parameter a("a", Shape{3, 4}), frozen("frozen", Shape{2}), b("b", std::move(b_shape));
  frozen.set_grad_req("null");
  params.add(a);
  params.add(frozen);
  params.add(b);
  params.initialize(nn::init::Constant(start), devices);
  return params;
}

// Step k of a run: every copy's gradient depends on its weight (so a state
// restored wrong shows in later steps), summed over the copies, then
// divided by samples_per_copy times the copies: the same update on any
// number of devices.
void resumable_step(Trainer& trainer, int k, std::int64_t samples_per_copy) {
  std::int64_t copies = 1;
  for (const auto& p : trainer.params()) {
    if (p.grad_req() == "null") continue;
    std::vector<Tensor> grads = p.list_grad();
    copies = static_cast<std::int64_t>(grads.size());
    for (std::size_t c = 0; c < grads.size(); ++c) {
      const Tensor& w = p.list_data()[c];
      grads[c].assign(w * w * 0.5f - w + static_cast<float>(k) * 0.25f);
    }
  }
  trainer.step(samples_per_copy * copies);
}

}  // namespace

TEST_CASE("optim: a Trainer's state saved on two devices and loaded on one resumes the run bit for bit") {
  const auto file = std::filesystem::temp_directory_path() / "hybra_test_trainer.states";
  const std::vector<std::pair<std::string, optim::Options>> optimizers = {
      {"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.01}}},
      {"adam", {{"learning_rate", 0.05}, {"wd", 0.01}}}};
  const auto schedule = std::make_shared<optim::CosineScheduler>(
      optim::CosineScheduler::Options{.max_update = 6, .base_lr = 0.1, .warmup = {.steps = 2}});
  for (const auto& [optimizer, options] : optimizers) {
    CAPTURE(optimizer);
    const nn::ParameterDict whole = resumable_params({cpu()}, 0.25f);
    Trainer uninterrupted(whole, optimizer, options);
    uninterrupted.set_lr_scheduler(schedule);
    for (int k = 0; k < 6; ++k) resumable_step(uninterrupted, k, 4);

    const nn::ParameterDict first = resumable_params({cpu(0), cpu(1)}, 0.25f);
    Trainer before(first, optimizer, options);
    before.set_lr_scheduler(schedule);
    for (int k = 0; k < 3; ++k) resumable_step(before, k, 4);
    before.save_states(file);

    const nn::ParameterDict second = resumable_params({cpu()}, 9.0f);  // other values, loaded over
    for (const char* name : {"a", "b", "frozen"}) second[name].set_data(first[name].data().copy());
    Trainer after(second, optimizer, options);
    after.set_lr_scheduler(schedule);
    after.load_states(file);
    CHECK(after.optimizer().num_update() == 3);
    CHECK(after.learning_rate() == before.learning_rate());
    for (int k = 3; k < 6; ++k) resumable_step(after, k, 4);
    for (const char* name : {"a", "b", "frozen"}) {
      CAPTURE(name);
      CHECK(second[name].data().to_vector<float>() == whole[name].data().to_vector<float>());
    }
    CHECK(second["a"].data().to_vector<float>() != first["a"].data().to_vector<float>());  // it did train on
  }
  std::filesystem::remove(file);
}

TEST_CASE("optim: loading another optimizer's or another model's Trainer state is an error that changes nothing") {
  const auto file = std::filesystem::temp_directory_path() / "hybra_test_trainer_other.states";
  const nn::ParameterDict params = resumable_params({cpu()}, 0.5f);
  Trainer sgd(params, "sgd", {{"momentum", 0.9}});
  resumable_step(sgd, 0, 2);
  sgd.save_states(file);

  Trainer adam(resumable_params({cpu()}, 0.5f), "adam");
  CHECK_THROWS_WITH_AS(adam.load_states(file), doctest::Contains("holds the state of optimizer SGD, but this trainer's is Adam"),
                       ValueError);
  Trainer wider(resumable_params({cpu()}, 0.5f, {5}), "sgd", {{"momentum", 0.9}});
  resumable_step(wider, 0, 2);
  CHECK_THROWS_WITH_AS(wider.load_states(file),
                       doctest::Contains("trained parameter 1 was 'b' with momentum of shape (4,), float32; here it is "
                                         "'b' of shape (5,), float32"),
                       ValueError);
  CHECK(wider.optimizer().num_update() == 1);  // as it was
  nn::ParameterDict fewer;
  fewer.add(params["a"]);
  Trainer smaller(fewer, "sgd", {{"momentum", 0.9}});
  CHECK_THROWS_WITH_AS(smaller.load_states(file),
                       doctest::Contains("holds the state of 2 trained parameters, but this trainer has 1"), ValueError);
  Trainer plain(resumable_params({cpu()}, 0.5f), "sgd");  // no momentum: no state tensors to take
  CHECK_THROWS_WITH_AS(plain.load_states(file), doctest::Contains("holds 2 entries that this trainer's SGD does not keep"),
                       ValueError);
  io::save_ndarray_list(file, std::vector<std::pair<std::string, Tensor>>{{"a", ones({2})}});
  CHECK_THROWS_WITH_AS(sgd.load_states(file),
                       doctest::Contains("has no 'trainer:optimizer': it is not a Trainer::save_states file"), ValueError);
  std::filesystem::remove(file);
}

namespace {

// What a Progress printed to a temporary file.
struct Printed {
  std::FILE* file = std::tmpfile();
  ~Printed() { std::fclose(file); }
  std::string text() const {
    std::fflush(file);
    std::rewind(file);
    std::string all;
    for (int c; (c = std::fgetc(file)) != EOF;) all += static_cast<char>(c);
    return all;
  }
};

ProgressOptions curve_options(const test::ScratchDir& dir, std::FILE* out, int epochs, int first_epoch = 1) {
  return {.epochs = epochs, .batches = 4,
          .columns = {{"loss"}, {"test_acc"}, {"seconds", false}},
          .csv = dir / "curve.csv", .svg = dir / "curve.svg", .first_epoch = first_epoch, .out = out,
          .redraw = false};
}

void run_epoch(Progress& p, int epoch, std::vector<double> values) {
  p.begin_epoch(epoch);
  for (std::size_t b = 1; b <= 4; ++b) p.update(b, 64 * static_cast<std::int64_t>(b), values[0]);
  p.end_epoch(values);
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("optim: Progress keeps the learning curve after every epoch, and prints a bar and a line per epoch") {
  test::ScratchDir dir;
  Printed printed;
  Progress p(curve_options(dir, printed.file, 3));
  run_epoch(p, 1, {0.9, 0.5, 2.5});
  CHECK(io::read_file(dir / "curve.csv") == "epoch,loss,test_acc,seconds\n1,0.9,0.5,2.5\n");
  run_epoch(p, 2, {0.4, 0.75, 2});
  // Written after each epoch, not at the end of the run: a run stopped now keeps both rows.
  CHECK(io::read_file(dir / "curve.csv") == "epoch,loss,test_acc,seconds\n1,0.9,0.5,2.5\n2,0.4,0.75,2\n");
  const std::string svg = io::read_file(dir / "curve.svg");
  CHECK(count(svg, "<polyline") == 2);  // seconds is not plotted
  CHECK(svg.find(">test_acc</text>") != std::string::npos);
  CHECK(svg.find(">seconds</text>") == std::string::npos);
  const std::string text = printed.text();
  // Not redrawn in place: one bar per epoch, when its batches are done.
  CHECK(count(text, "] 100%") == 2);
  CHECK(count(text, "\r") == 0);
  CHECK(text.find("epoch 1/3 [##############################] 100%") != std::string::npos);
  CHECK(text.find("epoch 2: loss 0.4, test_acc 0.75, seconds 2\n") != std::string::npos);
  REQUIRE(p.curve().size() == 2);
  CHECK(p.curve()[1].values == std::vector<double>{0.4, 0.75, 2});
}

TEST_CASE("optim: Progress redrawn in place shows each batch with the epoch's time left") {
  test::ScratchDir dir;
  Printed printed;
  ProgressOptions o = curve_options(dir, printed.file, 1);
  o.redraw = true;
  o.csv = o.svg = "";
  Progress p(o);
  run_epoch(p, 1, {0.5, 0.5, 1});
  const std::string text = printed.text();
  CHECK(count(text, "\repoch 1/1 [") == 4);
  CHECK(count(text, "ETA ") == 3);
  CHECK(text.find("[#######.......................]  25%") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "curve.csv"));
}

TEST_CASE("optim: a resumed run's Progress keeps the earlier epochs' rows and trains the later ones again") {
  test::ScratchDir dir;
  {
    Progress whole(curve_options(dir, nullptr, 3));
    run_epoch(whole, 1, {0.9, 0.5, 2});
    run_epoch(whole, 2, {0.6, 0.6, 2});
    run_epoch(whole, 3, {0.5, 0.7, 2});
  }
  Progress resumed(curve_options(dir, nullptr, 4, 3));
  REQUIRE(resumed.curve().size() == 2);
  CHECK(resumed.curve()[1].epoch == 2);
  CHECK_THROWS_WITH_AS(resumed.begin_epoch(2), doctest::Contains("begin_epoch(2) where epoch 3 of 4 was next"),
                       ValueError);
  run_epoch(resumed, 3, {0.4, 0.8, 2});
  CHECK(io::read_file(dir / "curve.csv") == "epoch,loss,test_acc,seconds\n1,0.9,0.5,2\n2,0.6,0.6,2\n3,0.4,0.8,2\n");
}

TEST_CASE("optim: Progress's bad options, calls and CSV files are errors that name them and change no file") {
  test::ScratchDir dir;
  auto with = [&](auto change) {
    ProgressOptions o = curve_options(dir, nullptr, 2);
    change(o);
    return o;
  };
  CHECK_THROWS_WITH_AS(Progress(with([](auto& o) { o.columns.push_back({"test acc"}); })),
                       doctest::Contains("column name 'test acc'"), ValueError);
  CHECK_THROWS_WITH_AS(Progress(with([](auto& o) { o.columns.push_back({"loss"}); })),
                       doctest::Contains("column 'loss' is named twice"), ValueError);
  CHECK_THROWS_WITH_AS(Progress(with([](auto& o) { o.first_epoch = 3; })),
                       doctest::Contains("first_epoch 3 is not one of the epochs 1 to 2"), ValueError);
  CHECK_THROWS_WITH_AS(Progress(with([](auto& o) { o.batches = 0; })), doctest::Contains("2 epochs of 0 batches"),
                       ValueError);

  Progress p(curve_options(dir, nullptr, 2));
  CHECK_THROWS_WITH_AS(p.update(1, 64, 0.5), doctest::Contains("update outside an epoch"), ValueError);
  p.begin_epoch(1);
  CHECK_THROWS_WITH_AS(p.update(5, 64, 0.5), doctest::Contains("5 batches done of an epoch of 4"), ValueError);
  CHECK_THROWS_WITH_AS(p.end_epoch({0.5, 0.5}),
                       doctest::Contains("2 values for the 3 columns epoch,loss,test_acc,seconds"), ValueError);
  p.end_epoch({0.5, 0.5, 1});

  // Another run's curve is not overwritten by a resumed run of other columns.
  const std::string other = "epoch,loss,train_acc\n1,0.5,0.9\n";
  io::write_file_atomically(dir / "curve.csv", other);
  CHECK_THROWS_WITH_AS(Progress(curve_options(dir, nullptr, 2, 2)),
                       doctest::Contains("has the columns 'epoch,loss,train_acc', not 'epoch,loss,test_acc,seconds'"),
                       ValueError);
  CHECK(io::read_file(dir / "curve.csv") == other);
  io::write_file_atomically(dir / "curve.csv", "epoch,loss,test_acc,seconds\n1,0.5,0.9,x\n");
  const std::string bad_line = "line 2 of " + dir / "curve.csv" + " ('1,0.5,0.9,x')";
  CHECK_THROWS_WITH_AS(Progress(curve_options(dir, nullptr, 2, 2)), doctest::Contains(bad_line.c_str()), ValueError);
}
