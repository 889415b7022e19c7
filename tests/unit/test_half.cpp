// float16 and bfloat16: conversions rounded once to nearest even, the dtype
// rules, and every op computing them in float32 and rounding its result once
// (so an op on 16-bit floats equals the float32 op on the same values,
// rounded), eager, recorded and hybridized; files; mixed-precision training.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <hybra/hybra.hpp>
#include <limits>
#include <vector>

#include "reference.hpp"

using namespace hybra;
namespace nn = hybra::nn;
using hybra::test::ScratchDir;

namespace {
constexpr DType half_dtypes[] = {DType::float16, DType::bfloat16};

std::vector<std::uint16_t> half_bits(const Tensor& t) {
  const Tensor c = t.contiguous();
  c.wait_to_read();
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(c.size()));
  if (!bits.empty()) std::memcpy(bits.data(), c.raw_data(), bits.size() * 2);
  return bits;
}

// The same values, bit for bit (NaN's sign and payload included).
void check_same_bits(const Tensor& got, const Tensor& want) {
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.shape() == want.shape());
  CHECK(half_bits(got) == half_bits(want));
}

Tensor uniform_values(const Shape& shape, DType dtype, double low = -2, double high = 2) {
  return random_uniform(shape, low, high, DType::float32).astype(dtype);
}
}  // namespace

// Rounding to nearest even, from the exact value; subnormals, infinities and NaN.
static_assert(float16_t(1.0).bits == 0x3c00 && float16_t(-2.0).bits == 0xc000);
static_assert(float16_t(65504.0).bits == 0x7bff && float16_t(65519.99).bits == 0x7bff && float16_t(65520.0).bits == 0x7c00);
static_assert(float16_t(5.960464477539063e-08).bits == 0x0001 && float16_t(2.98023223876953125e-08).bits == 0);
static_assert(float16_t(1.0 + 1.0 / 2048).bits == 0x3c00 && float16_t(1.0 + 3.0 / 2048).bits == 0x3c02);
static_assert(bfloat16_t(1.0f).bits == 0x3f80 && bfloat16_t(3.0e38).bits == 0x7f62 && bfloat16_t(1e39).bits == 0x7f80);
static_assert(static_cast<float>(float16_t::from_bits(0x3555)) == 0.333251953125f);
static_assert(static_cast<float>(bfloat16_t::from_bits(0x0001)) == 9.18354961579912e-41f);

TEST_CASE("half: every float16 and bfloat16 survives a trip through float32, and float32 rounds as the hardware does") {
  int wrong = 0;
  for (unsigned b = 0; b < 65536; ++b) {
    const float h = static_cast<float>(float16_t::from_bits(static_cast<std::uint16_t>(b)));
    const float g = static_cast<float>(bfloat16_t::from_bits(static_cast<std::uint16_t>(b)));
    if (std::isnan(h) != ((b & 0x7c00) == 0x7c00 && (b & 0x3ff))) ++wrong;
    if (!std::isnan(h) && float16_t(h).bits != b) ++wrong;
    std::uint32_t gb;
    std::memcpy(&gb, &g, 4);
    if (gb != b << 16 || (!std::isnan(g) && bfloat16_t(g).bits != b)) ++wrong;
  }
  CHECK(wrong == 0);
  // float32 to bfloat16 is float32's upper half, rounded to nearest even: the
  // rule the bits of 2^20 float32 values check.
  for (std::uint32_t i = 0; i < (1u << 20); ++i) {
    const std::uint32_t x = i * 2654435761u;
    float f;
    std::memcpy(&f, &x, 4);
    if (std::isnan(f)) continue;
    const std::uint32_t rounded = (x + 0x7fff + ((x >> 16) & 1)) >> 16;
    if (bfloat16_t(f).bits != rounded) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(std::isnan(static_cast<float>(float16_t(std::numeric_limits<double>::quiet_NaN()))));
  CHECK(float16_t(-std::numeric_limits<double>::infinity()).bits == 0xfc00);
  CHECK(float16_t(-0.0).bits == 0x8000);
}

TEST_CASE("half: the dtypes, their names, sizes and promotion") {
  for (DType d : half_dtypes) {
    CHECK(size_of(d) == 2);
    CHECK(is_floating(d));
    CHECK(parse_dtype(name(d), "test") == d);
    CHECK(promote_types(d, d) == d);
    CHECK(promote_types(d, DType::int64) == d);
    CHECK(promote_types(DType::uint8, d) == d);
    CHECK(promote_types(d, DType::float32) == DType::float32);
    CHECK(promote_types(DType::float64, d) == DType::float64);
    CHECK(promote_types(d, false, DType::float64, true) == d);  // a C++ double scalar does not widen it
    CHECK(promote_types(d, false, DType::float32, true) == d);
  }
  CHECK(promote_types(DType::float16, DType::bfloat16) == DType::float32);
  CHECK(name(DType::bfloat16) == "bfloat16");
  CHECK_THROWS_AS(parse_dtype("half", "test"), DTypeError);
}

TEST_CASE("half: converting from float64 rounds once, not through float32") {
  // 1 + 2^-11 + 2^-40 is just above the tie between float16's 1 and 1 + 2^-10; through float32 it would be the tie.
  const double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  CHECK(half_bits(array<double>({x}).astype(DType::float16)) == std::vector<std::uint16_t>{0x3c01});
  CHECK(half_bits(array<double>({x}).astype(DType::float32).astype(DType::float16)) == std::vector<std::uint16_t>{0x3c00});
  // Every dtype to each 16-bit float and back; integers exactly where they fit.
  const Tensor ints = array<std::int64_t>({-3, 0, 7, 2048, 2049, 70000});
  CHECK(ints.astype(DType::float16).to_vector<double>() == std::vector<double>{-3, 0, 7, 2048, 2048, INFINITY});
  CHECK(ints.astype(DType::bfloat16).to_vector<double>() == std::vector<double>{-3, 0, 7, 2048, 2048, 70144});
  CHECK(array<double>({2.5, -1.75}).astype(DType::float16).astype(DType::int32).to_vector<int>() ==
        std::vector<int>{2, -1});
  CHECK(array<double>({0.1}).astype(DType::float16).astype(DType::bfloat16).to_vector<double>() ==
        std::vector<double>{0.10009765625});
  CHECK(array<std::uint8_t>({200}).astype(DType::bfloat16).astype(DType::uint8).to_vector<int>() ==
        std::vector<int>{200});
}

TEST_CASE("half: creation, views, copies and printing") {
  for (DType d : half_dtypes) {
    CAPTURE(name(d));
    CHECK(full({2, 3}, 1.5, d).to_vector<float>() == std::vector<float>(6, 1.5f));
    CHECK(zeros({3}, d).dtype() == d);
    CHECK(arange(0, 4, 1, d).to_vector<int>() == std::vector<int>{0, 1, 2, 3});
    const Tensor t = reshape(arange(0, 6, 1, d), {2, 3});
    CHECK(transpose(t).copy().to_vector<int>() == std::vector<int>{0, 3, 1, 4, 2, 5});
    CHECK(slice(t, 1, 1, 3).contiguous().to_vector<int>() == std::vector<int>{1, 2, 4, 5});
    CHECK(concat({t, t}, 0).to_vector<int>().size() == 12);
    Tensor target = zeros({2, 3}, d);
    target.assign(array<float>({1, 2, 3}));  // broadcast, converted
    CHECK(target.to_vector<int>() == std::vector<int>{1, 2, 3, 1, 2, 3});
    const Tensor random = random_normal({1000}, 0, 1, d);
    CHECK(random.dtype() == d);
    CHECK(std::abs(mean(random).item<double>()) < 0.2);
  }
  std::ostringstream os;
  os << array<float>({0.1f, 2}).astype(DType::float16);
  CHECK(os.str() == "[0.099975586 2.]\n<Tensor 2 float16 @cpu(0)>");
}

TEST_CASE("half: elementwise ops and expressions compute in float32 and round once") {
  for (DType d : half_dtypes) {
    CAPTURE(name(d));
    seed(1);
    const Tensor a = uniform_values({4, 5}, d), b = uniform_values({5}, d, 0.5, 3);
    const Tensor a32 = a.astype(DType::float32), b32 = b.astype(DType::float32);
    // One op: the float32 op on the same values, rounded.
    check_same_bits(a * b, Tensor(a32 * b32).astype(d));
    check_same_bits(exp(a), Tensor(exp(a32)).astype(d));
    check_same_bits(a / b, Tensor(a32 / b32).astype(d));
    check_same_bits(relu(a) + 1, Tensor(relu(a32) + 1).astype(d));
    check_same_bits(Tensor(a < b), Tensor(a32 < b32).astype(d));
    check_same_bits(where(a > 0, a, b), Tensor(where(a32 > 0, a32, b32)).astype(d));
    // A chain rounds after each op, as the eager float16 ops of other libraries do.
    const Tensor chain = tanh(a * b + 2);
    check_same_bits(chain, Tensor(tanh(Tensor(Tensor(a32 * b32).astype(d).astype(DType::float32) + 2).astype(d).astype(DType::float32))).astype(d));
    // With a float32 tensor the result is float32; with float64 scalars it keeps its dtype.
    CHECK(Tensor(a * a32).dtype() == DType::float32);
    CHECK(Tensor(a * 0.5).dtype() == d);
    CHECK(Tensor(a * 2).dtype() == d);
  }
}

TEST_CASE("half: reductions, products, softmax, convolution, pooling and normalisation equal float32's, rounded") {
  for (DType d : half_dtypes) {
    CAPTURE(name(d));
    seed(2);
    const Tensor x = uniform_values({3, 64}, d), w = uniform_values({8, 64}, d), bias = uniform_values({8}, d);
    const auto f = [](const Tensor& t) { return t.astype(DType::float32); };
    check_same_bits(sum(x), sum(f(x)).astype(d));
    check_same_bits(mean(x, {1}), mean(f(x), {1}).astype(d));
    check_same_bits(max(x, {0}), max(f(x), {0}).astype(d));
    CHECK(argmax(x, 1).to_vector<std::int64_t>() == argmax(f(x), 1).to_vector<std::int64_t>());
    check_same_bits(cumsum(x, 1), cumsum(f(x), 1).astype(d));
    check_same_bits(softmax(x), softmax(f(x)).astype(d));
    check_same_bits(log_softmax(x), log_softmax(f(x)).astype(d));
    check_same_bits(matmul(x, transpose(w)), matmul(f(x), transpose(f(w))).astype(d));
    check_same_bits(dot(x, transpose(w)), dot(f(x), transpose(f(w))).astype(d));
    check_same_bits(fully_connected(x, w, bias), fully_connected(f(x), f(w), f(bias)).astype(d));
    const Tensor image = uniform_values({2, 3, 6, 6}, d), kernel = uniform_values({4, 3, 3, 3}, d);
    check_same_bits(conv2d(image, kernel, {}, 1, 1), conv2d(f(image), f(kernel), {}, 1, 1).astype(d));
    check_same_bits(max_pool2d(image, 2, 2), max_pool2d(f(image), 2, 2).astype(d));
    check_same_bits(global_avg_pool2d(image), global_avg_pool2d(f(image)).astype(d));
    // batch_norm keeps float32 statistics and gives the input's dtype, as Gluon's BatchNorm does.
    const Tensor gamma = ones({3}), beta = zeros({3}), mean3 = full({3}, 0.1), var3 = full({3}, 2.0);
    check_same_bits(batch_norm(image, gamma, beta, mean3, var3), batch_norm(f(image), gamma, beta, mean3, var3).astype(d));
    const Tensor table = uniform_values({10, 4}, d), ids = array<std::int64_t>({3, 0, 9});
    check_same_bits(embedding(ids, table), embedding(ids, f(table)).astype(d));
    // A float32 operand makes the product float32.
    CHECK(matmul(x, transpose(f(w))).dtype() == DType::float32);
  }
}

TEST_CASE("half: gradients flow through 16-bit floats, and a hybridized model computes its eager values") {
  for (DType d : half_dtypes) {
    CAPTURE(name(d));
    seed(3);
    nn::HybridSequential net;
    net.add(nn::Dense({.units = 8, .activation = "relu"}), nn::LayerNorm(), nn::Dense({.units = 3}));
    net.initialize(nn::init::Xavier());
    const Tensor x = uniform_values({4, 6}, d);
    net(x.astype(DType::float32));
    net.cast(d);
    for (const auto& p : net.collect_params()) CHECK(p.data().dtype() == d);
    Tensor eager, loss;
    {
      autograd::record r;
      eager = net(x);
      loss = sum(eager * eager);
      loss.backward();
    }
    CHECK(eager.dtype() == d);
    const Tensor w = net.collect_params().begin()->data();
    const Tensor g = w.grad();
    CHECK(g.dtype() == d);
    CHECK(std::isfinite(sum(abs(g.astype(DType::float32))).item<double>()));
    net.hybridize();
    check_same_bits(net(x), eager);
    check_same_bits(net(x), eager);  // replayed
  }
}

TEST_CASE("half: parameters and arrays keep their 16-bit floats in model files and .npy") {
  ScratchDir dir;
  seed(4);
  const Tensor h = uniform_values({3, 4}, DType::float16), b = uniform_values({5}, DType::bfloat16);
  const std::vector<std::pair<std::string, Tensor>> arrays{{"h", h}, {"b", b}};
  io::save_ndarray_list(dir / "a.params", arrays);
  const auto loaded = io::load_ndarray_list(dir / "a.params");
  check_same_bits(loaded[0].second, h);
  check_same_bits(loaded[1].second, b);
  io::save_npy(dir / "h.npy", h);
  check_same_bits(io::load_npy(dir / "h.npy"), h);
  CHECK_THROWS_WITH_AS(io::save_npy(dir / "b.npy", b), doctest::Contains("NumPy has no bfloat16"), DTypeError);
  // NumPy's own float16 file: 1, 0.1, -65504 and infinity.
  const Tensor numpy = io::load_npy(std::filesystem::path(HYBRA_TEST_DATA_DIR) / "numpy" / "float16_4.npy");
  CHECK(half_bits(numpy) == std::vector<std::uint16_t>{0x3c00, 11878, 0xfbff, 0x7c00});
}

TEST_CASE("half: mixed precision: float16 weights with float32 masters and a loss scale train as float32 does") {
  // A linear regression, trained in float32 and in float16 with multi_precision and dynamic loss scaling.
  seed(5);
  const Tensor x = random_uniform({64, 8}, -1, 1), true_w = random_uniform({1, 8}, -1, 1);
  const Tensor y = fully_connected(x, true_w);
  auto train = [&](DType d, optim::LossScaler* scaler) {
    seed(6);
    nn::Dense net({.units = 1, .in_units = 8});
    net.initialize(nn::init::Normal(0.1));
    net.cast(d);
    Trainer trainer(net.collect_params(), "sgd", {{"learning_rate", 0.1}, {"multi_precision", 1}});
    const Tensor xd = x.astype(d), yd = y.astype(d);
    double loss_value = 0;
    for (int step = 0; step < 60; ++step) {
      Tensor loss;
      {
        autograd::record r;
        const Tensor e = net(xd) - yd;
        loss = sum(e * e);
        (scaler ? scaler->scale(loss) : loss).backward();
      }
      if (scaler) trainer.step(64, *scaler);
      else trainer.step(64);
      loss_value = loss.astype(DType::float32).item<double>() / 64;
    }
    return loss_value;
  };
  optim::LossScaler scaler({.init_scale = 1 << 20, .window = 20});
  const double float32_loss = train(DType::float32, nullptr), float16_loss = train(DType::float16, &scaler);
  CHECK(float32_loss < 0.05);
  CHECK(float16_loss == doctest::Approx(float32_loss).epsilon(0.05));
  // 2^20 overflows float16's gradients (65504 at most): steps were skipped, and the scale came down.
  CHECK(scaler.skipped_steps() > 0);
  CHECK(scaler.loss_scale() < (1 << 20));
  CHECK_THROWS_AS(optim::LossScaler({.factor = 1}), ValueError);
}

TEST_CASE("half: a resumed mixed-precision run equals the uninterrupted one, master weights and loss scale included") {
  ScratchDir dir;
  seed(7);
  const Tensor x = random_uniform({16, 4}, -1, 1).astype(DType::float16);
  auto make = [] {
    seed(8);
    auto net = std::make_shared<nn::Dense>(nn::Dense::Options{.units = 2, .in_units = 4});
    net->initialize(nn::init::Normal(0.1));
    net->cast(DType::float16);
    return net;
  };
  // A scale that overflows at first: the scaler's state matters to the resumed steps.
  const optim::LossScaler::Options scaling{.init_scale = 1 << 16, .window = 2};
  auto steps = [&](nn::Dense& net, Trainer& trainer, optim::LossScaler& scaler, int count) {
    for (int k = 0; k < count; ++k) {
      {
        autograd::record r;
        scaler.scale(sum(net(x) * net(x))).backward();
      }
      trainer.step(16, scaler);
    }
  };
  const std::map<std::string, double> options{{"learning_rate", 0.01}, {"momentum", 0.9}, {"multi_precision", 1}};
  auto whole = make();
  Trainer whole_trainer(whole->collect_params(), "sgd", options);
  optim::LossScaler whole_scaler(scaling);
  steps(*whole, whole_trainer, whole_scaler, 6);
  auto first = make();
  Trainer first_trainer(first->collect_params(), "sgd", options);
  optim::LossScaler first_scaler(scaling);
  steps(*first, first_trainer, first_scaler, 3);
  first->save_parameters(dir / "net.params");
  first_trainer.save_states(dir / "net.states", first_scaler);
  auto resumed = make();
  const auto saved = io::load_ndarray_list(dir / "net.params");  // in order: the nets' prefixes differ
  std::size_t k = 0;
  for (nn::Parameter p : resumed->collect_params()) p.set_data(saved[k++].second);
  Trainer resumed_trainer(resumed->collect_params(), "sgd", options);
  optim::LossScaler resumed_scaler(scaling);
  CHECK_THROWS_WITH_AS(resumed_trainer.load_states(dir / "net.states"), doctest::Contains("was saved with a LossScaler"),
                       ValueError);
  resumed_trainer.load_states(dir / "net.states", resumed_scaler);
  CHECK(resumed_scaler.loss_scale() == first_scaler.loss_scale());
  steps(*resumed, resumed_trainer, resumed_scaler, 3);
  CHECK(whole_scaler.skipped_steps() > 0);
  CHECK(resumed_scaler.loss_scale() == whole_scaler.loss_scale());
  CHECK(resumed_scaler.skipped_steps() == whole_scaler.skipped_steps());
  check_same_bits(resumed->collect_params().begin()->data(), whole->collect_params().begin()->data());
  // Without the float32 masters the file is of another run: refused.
  Trainer plain(resumed->collect_params(), "sgd", {{"learning_rate", 0.01}, {"momentum", 0.9}});
  optim::LossScaler plain_scaler(scaling);
  CHECK_THROWS_AS(plain.load_states(dir / "net.states", plain_scaler), ValueError);
}
