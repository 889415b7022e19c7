#pragma once
// The ops of neural-network layers: fully_connected (MXNet's FullyConnected),
// flatten, dropout and the named activations; layer_norm and masked_softmax,
// compositions of the op table's ops, so that their gradients, fusion, GPU
// kernels and model-file spellings are those ops' own.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "half.hpp"
#include "../core/mode.hpp"
#include "../backend/cpu/gemv.hpp"
#include "../backend/cuda/cublaslt.hpp"
#include "../core/creation.hpp"
#include "../backend/cuda/random.hpp"
#include "dense_onednn.hpp"
#include "layout.hpp"
#include "linalg.hpp"
#include "reduce.hpp"
#include "softmax.hpp"

namespace hybra {

// (batch, d1, d2, ...) -> (batch, d1 * d2 * ...); a 1-d x becomes (n, 1).
template <tensor_like X>
Tensor flatten(X&& x_in) {
  Tensor x = eval(x_in);
  x.require("flatten");
  autograd::op_record rec("flatten", {x});
  if (x.ndim() == 0) fail<ShapeError>("flatten: a 0-d tensor (shape ()) has no batch axis");
  return rec.output(reshape(x, {x.shape()[0], x.shape()[0] == 0 ? 0 : -1}));
}

namespace detail::nn {

// out (M x N) = x (M x K) w^T + b, all contiguous, w being (N x K) and b
// (N) or null: the dense layer's kernel, shared by the eager op and captured
// graphs so that both give the same bits. float32 products of the shapes
// where it measured faster run on oneDNN (dense_onednn.hpp), which keeps its
// blocked copy of w with `weights`, w's storage (a tensor the caller holds,
// not a scratch buffer that other values reuse), where given. Otherwise up
// to gemv_max_rows rows are hybra's own GEMV, one pass over w for all of
// them (backend/cpu/gemv.hpp says why), each row's outputs those it has
// alone; the bias is added right after the product, while the rows are in
// cache.
template <class T>
void dense(const T* x, const T* w, const T* b, T* out, std::int64_t M, std::int64_t K, std::int64_t N,
           [[maybe_unused]] Storage* weights = nullptr) {
  namespace blas = backend::cpu::blas;
  if (M == 0 || N == 0) return;
#ifdef HYBRA_ONEDNN_CALLS
  if constexpr (std::is_same_v<T, float>)
    if (onednn_serves_dense(M, K, N)) return onednn_dense(x, w, b, out, M, K, N, weights);
#endif
  if (K == 0) std::fill_n(out, M * N, T(0));
  else if (M <= backend::cpu::gemv_max_rows) backend::cpu::gemv(w, K, x, out, N, K, M);
  else blas::gemm(false, true, M, N, K, T(1), x, K, w, K, T(0), out, N);
  if (!b) return;
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) out[i * N + j] += b[j];
}

// Per output element, one multiply-add per weight of one output unit.
inline std::int64_t dense_multiply_adds(const Tensor& w, const Tensor& out) {
  return out.size() * (w.ndim() ? w.size() / std::max<std::int64_t>(1, w.shape()[0]) : 0);
}

}  // namespace detail::nn

// MXNet's FullyConnected: x is flattened to (batch, in_units), then
// out = x weight^T + bias, with weight (units, in_units) and bias (units,).
// Pass an empty Tensor as bias for no bias. One engine op.
template <tensor_like X>
Tensor fully_connected(X&& x_in, const Tensor& weight, const Tensor& bias = {}) {
  Tensor x = eval(x_in);
  x.require("fully_connected");
  weight.require("fully_connected");
  autograd::op_record rec("fully_connected", bias.defined() ? std::vector<Tensor>{x, weight, bias}
                                                            : std::vector<Tensor>{x, weight});
  // On a GPU, operands of one 16-bit float are a tensor-core product (cuBLASLt, accumulating in float32).
  const bool gpu_half = x.device().kind == DeviceKind::cuda && is_half(x.dtype()) && weight.dtype() == x.dtype() &&
                        (!bias.defined() || bias.dtype() == x.dtype());
  if (!gpu_half)
    if (auto r = detail::compute_in_float32({x, weight, bias}, [&](std::span<const Tensor> f) { return fully_connected(f[0], f[1], f[2]); }))
      return rec.output(*r);
  if (x.ndim() == 0) fail<ShapeError>("fully_connected: input of shape () has no batch axis");
  if (x.ndim() != 2) x = flatten(x);
  if (weight.ndim() != 2 || weight.shape()[1] != x.shape()[1])
    fail<ShapeError>("fully_connected: input of shape ", to_string(x.shape()), " (", x.shape()[1],
                     " features) does not match weight of shape ", to_string(weight.shape()),
                     " (expected (units, ", x.shape()[1], "))");
  if (bias.defined() && (bias.ndim() != 1 || bias.shape()[0] != weight.shape()[0]))
    fail<ShapeError>("fully_connected: bias of shape ", to_string(bias.shape()), " does not match weight of shape ",
                     to_string(weight.shape()), " (expected (", weight.shape()[0], ",))");
  require_same_device("fully_connected", x, weight);
  if (bias.defined()) require_same_device("fully_connected", x, bias);
  DType dtype = promote_types(x.dtype(), weight.dtype());
  if (bias.defined()) dtype = promote_types(dtype, bias.dtype());
  if (!is_floating(dtype))
    fail<DTypeError>("fully_connected: dtype ", name(dtype), " is not supported (float32 or float64)");
  x = detail::linalg::to_dtype(x, dtype).contiguous();
  Tensor w = detail::linalg::to_dtype(weight, dtype).contiguous();
  Tensor b = bias.defined() ? detail::linalg::to_dtype(bias, dtype).contiguous() : Tensor{};
  Tensor out({x.shape()[0], w.shape()[0]}, dtype, x.device());
  if (out.device().kind == DeviceKind::cuda) {
    // One cuBLASLt GEMM, its epilogue adding the bias.
    const std::int64_t M = x.shape()[0], K = x.shape()[1], N = w.shape()[0];
    if (K == 0)
      fail<ShapeError>("fully_connected: input of shape ", to_string(x.shape()), " has no features; on ", out.device(),
                       " a product needs at least one");
    if (M == 0 || N == 0) return rec.output(out);
    push_op_on(out.device(), "fully_connected", {x, w, b.defined() ? b : w}, {out}, [x, w, b, out, M, K, N] {
      backend::cuda::Gpu& gpu = backend::cuda::gpu(out.device().id);
      using backend::cuda::Epilogue;
      backend::cuda::dense_matmul(gpu, out.dtype(), M, N, K, b.defined() ? Epilogue::bias : Epilogue::none)
          .run(x.raw_data(), w.raw_data(), b.defined() ? b.raw_data() : nullptr, out.raw_data());
    });
    return rec.output(out);
  }
  push_kernel("fully_connected", {x, w, b.defined() ? b : w}, {out}, [x, w, b, out] {
    dispatch(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        detail::nn::dense(static_cast<const T*>(x.raw_data()), static_cast<const T*>(w.raw_data()),
                          b.defined() ? static_cast<const T*>(b.raw_data()) : nullptr, static_cast<T*>(out.raw_data()),
                          x.shape()[0], x.shape()[1], w.shape()[0], w.storage().get());
    });
  }, detail::nn::dense_multiply_adds(w, out));
  return rec.output(out);
}

// The act_types activation() takes.
inline constexpr std::array<std::string_view, 10> activation_names{
    "relu", "sigmoid", "tanh", "softrelu", "relu6", "gelu", "gelu_tanh", "silu", "elu", "selu"};

// The error activation() gives for a name it does not know, without building
// an expression: what a layer checks when it is made.
inline void check_activation(std::string_view act_type) {
  if (std::ranges::find(activation_names, act_type) != activation_names.end()) return;
  std::string known;
  for (std::string_view n : activation_names) known += (known.empty() ? "" : ", ") + std::string(n);
  fail<ValueError>("activation: unknown act_type '", act_type, "' (", known, ")");
}

// MXNet's Activation: act_type relu, sigmoid, tanh or softrelu (softplus),
// and relu6 (MobileNet v2's, which MXNet writes as clip); and, by the names of
// MXNet's LeakyReLU op and PyTorch, the parameter-free activations of current
// models: gelu, gelu_tanh, silu, elu (alpha 1) and selu. Works on tensors and
// symbols alike (it builds the op-table expression).
template <array_like X>
auto activation(X&& x, std::string_view act_type) {
  using R = std::conditional_t<tensor_like<X>, Tensor, Symbol>;
  check_activation(act_type);
  if (act_type == "relu") return R(relu(x));
  if (act_type == "sigmoid") return R(sigmoid(x));
  if (act_type == "tanh") return R(tanh(x));
  if (act_type == "softrelu") return R(softplus(x));
  if (act_type == "relu6") return R(relu6(x));
  if (act_type == "gelu") return R(gelu(x));
  if (act_type == "gelu_tanh") return R(gelu_tanh(x));
  if (act_type == "silu") return R(silu(x));
  if (act_type == "elu") return R(elu(x));
  if (act_type == "selu") return R(selu(x));
  fail<Error>("activation: act_type '", act_type, "' is in activation_names but has no expression");
}

// PyTorch's layer_norm and MXNet's LayerNorm: over `axis`, (x - mean) /
// sqrt(var + eps) * gamma + beta, with the biased variance of the centred
// values (two passes: no cancellation when the mean is large); gamma and beta
// hold one value per element of that axis.
template <array_like X, array_like G, array_like B>
auto layer_norm(X&& x_in, G&& gamma_in, B&& beta_in, std::int64_t axis = -1, double eps = 1e-5) {
  using R = std::conditional_t<tensor_like<X>, Tensor, Symbol>;
  const R x(x_in), gamma(gamma_in), beta(beta_in);
  const auto a = static_cast<std::size_t>(detail::checked_axis(axis, x.shape(), "layer_norm"));
  const Shape channels{x.shape()[a]};
  for (const R* p : {&gamma, &beta})
    if (p->shape() != channels)
      fail<ShapeError>("layer_norm: ", p == &gamma ? "gamma" : "beta", " of shape ", to_string(p->shape()),
                       " for input ", to_string(x.shape()), ", whose axis ", axis, " has ", channels[0], " elements");
  if (!(eps > 0)) fail<ValueError>("layer_norm: eps ", eps, " must be positive");
  Shape along(x.shape().size(), 1);
  along[a] = channels[0];
  const std::vector<std::int64_t> over{axis};
  const R centred(x - mean(x, over, true));
  const R var = mean(R(centred * centred), over, true);
  return R(centred / sqrt(var + eps) * reshape(gamma, along) + reshape(beta, along));
}

// MXNet's masked_softmax: softmax along `axis` over the elements where `mask`
// (broadcast against x) is nonzero; the others are 0, and so is a whole row
// with nothing unmasked. A masked element enters the softmax lowered by
// 1e30, whose exp is 0 beside any unmasked one (-inf would make a fully
// masked row NaN, in the gradient too), and the result is multiplied by the
// mask: arithmetic that MXNet's graph format writes as broadcast ops, where
// `where` with a scalar or a broadcast operand has no MXNet spelling. So a
// masked element's value still enters its row: a NaN or inf there makes the
// row NaN, as it would in MXNet's arithmetic masking.
template <array_like X, array_like M>
auto masked_softmax(X&& x_in, M&& mask_in, std::int64_t axis = -1) {
  using R = std::conditional_t<tensor_like<X>, Tensor, Symbol>;
  const R x(x_in), mask(mask_in);
  if (!is_floating(x.dtype()))
    fail<DTypeError>("masked_softmax: input of dtype ", name(x.dtype()), " is not floating");
  const R keep = R(mask != 0).astype(x.dtype());
  const R probabilities = softmax(R(x + (keep - 1) * 1e30), axis);
  return R(probabilities * keep);
}

// Zeroes each element with probability `rate` and scales the rest by
// 1 / (1 - rate) while training (autograd::train_mode); the identity when
// predicting. Element i is kept where the uniform random_uniform(0, 1) would
// draw for it is at least rate, on either device (a GPU draws the same
// numbers: backend/cuda/random.hpp); its gradient is the op table's.
template <tensor_like X>
Tensor dropout(X&& x_in, double rate) {
  Tensor x = eval(x_in);
  x.require("dropout");
  if (!(rate >= 0 && rate < 1)) fail<ValueError>("dropout: rate ", rate, " must be in [0, 1)");
  if (!autograd::is_training() || rate == 0) return x;
  if (!is_floating(x.dtype())) fail<DTypeError>("dropout: dtype ", name(x.dtype()), " is not floating");
  autograd::op_record rec("dropout", {x});
  auto attrs = [rate] { return op::Attrs{{"rate", op::attr_text(rate)}}; };
  if (auto r = detail::compute_in_float32({x}, [&](std::span<const Tensor> f) { return dropout(f[0], rate); })) return rec.output(*r, attrs);
  if (x.device().kind != DeviceKind::cuda) {
    const Tensor keep = random_uniform(x.shape(), 0, 1, x.dtype(), x.device());
    return rec.output(eval(where(keep >= rate, x / (1 - rate), 0)), attrs);
  }
  const Tensor xc = x.contiguous(), out(x.shape(), x.dtype(), x.device());
  Generator& gen = default_generator();
  const backend::cuda::DrawParams draws{gen.advance(Generator::blocks_for(x.size())), gen.key()[0], gen.key()[1], 0, 0};
  push_op_on(x.device(), "dropout", {xc}, {out},
             [xc, out, draws,
              kernel = backend::cuda::DropoutKernel(x.dtype(), x.size(), rate, backend::cuda::gpu(x.device().id))] {
               kernel.run(backend::cuda::gpu(out.device().id), xc.raw_data(), out.raw_data(), draws, nullptr);
             });
  return rec.output(out, attrs);
}

namespace op {

struct flatten {
  static constexpr std::string_view name = "flatten";
  static Tensor eval(std::span<const Tensor> in, const op::Attrs&) { return hybra::flatten(in[0]); }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out,
                                                              const op::Attrs&, backend::cuda::Gpu& gpu) {
    return hybra::detail::copy_unless_view(in, out, name, gpu);
  }
  template <class G> static auto gradient(const G& g) { return g.grads(g.reshape(g.dy, g.shape(0))); }
  static constexpr std::array<std::string_view, 2> mxnet{"Flatten", "flatten"};
  template <class W> static auto write(const W& w) { return w.keep_all("Flatten"); }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    return r.make("flatten");
  }
};

// (data, weight) or (data, weight, bias).
struct fully_connected {
  static constexpr std::string_view name = "fully_connected";
  static constexpr int arity = -1;
  static constexpr bool product = true;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs&) {
    if (in.size() != 2 && in.size() != 3)
      fail<ValueError>("fully_connected: takes (data, weight) or (data, weight, bias), not ", in.size(), " inputs");
    return hybra::fully_connected(in[0], in[1], in.size() == 3 ? in[2] : Tensor{});
  }
  static std::int64_t multiply_adds(std::span<const Tensor> in, const Tensor& out) {
    return hybra::detail::nn::dense_multiply_adds(in[1], out);
  }
  template <class G>
  static auto gradient(const G& g) {
    auto r = g.grads();
    r.resize(g.in.size());
    if (g.wanted[0]) r[0] = g.reshape(g.matmul(g.dy, g.in[1]), g.shape(0));
    if (g.wanted[1]) r[1] = g.matmul(g.transpose(g.dy), g.flatten(g.in[0]));
    if (g.in.size() == 3 && g.wanted[2]) r[2] = g.sum(g.dy, std::int64_t{0}, false);
    return r;
  }
  static constexpr std::array<std::string_view, 1> mxnet{"FullyConnected"};
  template <class W>
  static auto write(const W& w) {
    const auto& weight = w.input(1).meta.shape;
    return w.keep_all("FullyConnected", {{"num_hidden", std::to_string(weight ? (*weight)[0] : 0)},
                                         {"no_bias", w.bool_text(w.node.inputs.size() == 2)},
                                         {"flatten", "True"}});
  }
  template <class R>
  static auto read(const R& r) {
    const bool no_bias = r.flag("no_bias", false);
    r.arity(no_bias ? 2 : 3, no_bias ? 2 : 3);
    if (!r.flag("flatten", true)) r.reject("flatten=False is not supported");
    const auto hidden = r.integer("num_hidden", 0);
    if (r.inputs[1].has_shape() && !r.inputs[1].shape().empty() && r.inputs[1].shape()[0] != hidden)
      r.reject("attr 'num_hidden' = " + std::to_string(hidden) + " does not match weight of shape " +
               to_string(r.inputs[1].shape()));
    return r.make("fully_connected");
  }
};

struct dropout {
  static constexpr std::string_view name = "dropout";
  static constexpr bool pure = false;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::dropout(in[0], op::double_attr(a, "rate", name));
  }
  // Predicting (or at rate 0) it is the identity: a view, no launch.
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out,
                                                              const op::Attrs& a, backend::cuda::Gpu& gpu) {
    const double rate = op::double_attr(a, "rate", name);
    if (!autograd::is_training() || rate == 0 || !is_floating(in[0].dtype())) return std::nullopt;
    return backend::cuda::cuda_dropout_launch(out.dtype(), out.size(), rate, gpu);
  }
  // Training dropout's kept elements are the nonzero results (a kept zero
  // gets no gradient, which matters only where x is exactly 0).
  template <class G>
  static auto gradient(const G& g) {
    const double rate = g.double_attr("rate");
    return g.grads(g.where(g.out != 0, g.dy * (1 / (1 - rate)), 0));
  }
  static constexpr std::array<std::string_view, 1> mxnet{"Dropout"};
  template <class W>
  static auto write(const W& w) { return w.keep_all("Dropout", {{"p", w.attr("rate")}, {"mode", "training"}}); }
  template <class R>
  static auto read(const R& r) {
    r.arity(1, 1);
    r.require("mode", "training", "training");  // 'always' drops while predicting too
    r.require("axes", "()", "()");              // one mask shared along axes
    return r.make("dropout", {{"rate", op::attr_text(r.real("p", 0.5))}});
  }
};

}  // namespace op

}  // namespace hybra
