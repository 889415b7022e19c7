#pragma once
// fully_connected's product on oneDNN's inner product (backend/cpu/onednn.hpp),
// for the float32 shapes where it measured faster than hybra's GEMV and
// OpenBLAS (onednn_serves_dense; the table is docs/benchmarks.md's
// "fully_connected on oneDNN"). Its kernels read the weights in a blocked
// layout: the caller names their storage, and the blocked copy is kept with
// it while they stay unchanged (core/derived_forms.hpp), so an inference
// reorders each weight once, where OpenBLAS packs it again on every call.
//
// The result does not depend on the thread count, bit for bit (tested):
// oneDNN splits a product's sums over its threads when the rows are few, so
// the units are cut here into parts fixed by the shapes (DenseParts), each
// computed by a one-thread primitive.
#include "../backend/cpu/onednn.hpp"
#ifdef HYBRA_ONEDNN_CALLS
#include <algorithm>
#include <array>
#include <cstdint>
#include <unordered_map>

#include "../backend/cpu/gemv.hpp"
#include "../core/storage.hpp"

namespace hybra::detail::nn {

// Where oneDNN wins (docs/benchmarks.md): beyond the rows hybra's GEMV takes
// (gemv_max_rows), every weight of at least 4096 elements (below,
// microseconds either way), where OpenBLAS packs the weight again on every
// call; up to them, from 3 rows, weights of at least 2^22 elements, where the
// GEMV's one pass over the weight is slower than oneDNN's blocked kernel
// (below, oneDNN's parts cost more than they save). One and two rows stay the
// GEMV, which reads the weight once at about the memory's speed: oneDNN's
// kernel for two rows gained at most a sixth over it on Zen 5 and lost a
// quarter to a half on Zen 4 (VGG's and AlexNet's classifiers at batch 2).
inline bool onednn_serves_dense(std::int64_t M, std::int64_t K, std::int64_t N) {
  if (!backend::cpu::onednn::enabled() || M == 0 || K == 0 || N == 0) return false;
  if (backend::cpu::onednn::use() == backend::cpu::onednn::Use::always) return true;
  const std::int64_t weights = K * N;
  if (M > backend::cpu::gemv_max_rows) return weights >= 4096;
  return M >= 3 && weights >= (std::int64_t{1} << 22);
}

// The units (the weight's rows) cut into about `target` parts of a width
// that is a multiple of 64, at least 64: fixed by N alone, so that each
// output is summed by the same kernel in the same order whatever the thread
// count. The last part may be narrower.
struct DenseParts {
  static constexpr std::int64_t target = 8, granule = 64;
  std::int64_t width, parts;
  explicit DenseParts(std::int64_t N)
      : width(std::max(granule, ((N + target - 1) / target + granule - 1) / granule * granule)),
        parts((N + width - 1) / width) {}
  std::int64_t first(std::int64_t s) const { return s * width; }
  std::int64_t count(std::int64_t s, std::int64_t N) const { return std::min(width, N - s * width); }
};

namespace onednn_dense_detail {

namespace cpu = backend::cpu::onednn;
using tag = dnnl::memory::format_tag;

inline dnnl::memory::desc plain(const dnnl::memory::dims& d, tag t) { return {d, dnnl::memory::data_type::f32, t}; }

struct Primitive {
  dnnl::primitive run;
  dnnl::memory::desc weights, scratchpad;
};

// M rows of K features into N units, with or without a bias, on one thread.
using Key = std::array<std::int64_t, 4>;
inline cpu::Cache<Key, Primitive>& primitives() {
  static cpu::Cache<Key, Primitive> cache;
  return cache;
}
inline const Primitive& primitive(std::int64_t M, std::int64_t K, std::int64_t N, bool bias) {
  return primitives().get({M, K, N, bias}, [&] {
    const dnnl::inner_product_forward::primitive_desc pd(
        {dnnl::prop_kind::forward_inference, plain({M, K}, tag::nc), plain({N, K}, tag::any),
         bias ? plain({N}, tag::x) : dnnl::memory::desc(), plain({M, N}, tag::nc)},
        cpu::scratchpad_from_caller(), cpu::engine());
    return Primitive{dnnl::inner_product_forward(pd), pd.weights_desc(), pd.scratchpad_desc()};
  });
}

}  // namespace onednn_dense_detail

// out (M x N) = x (M x K) w^T + b, as dense() (ops/nn.hpp). `weights`: the
// storage of w, where its blocked copy may be kept with it, or null.
inline void onednn_dense(const float* x, const float* w, const float* b, float* out, std::int64_t M, std::int64_t K,
                         std::int64_t N, Storage* weights) {
  namespace o = onednn_dense_detail;
  const DenseParts cut(N);
  backend::cpu::onednn::for_each_part("fully_connected", cut.parts, M * K * cut.width, [&](std::int64_t s) {
    const std::int64_t n0 = cut.first(s), units = cut.count(s, N);
    const auto& p = o::primitive(M, K, units, b != nullptr);
    const float* part_w = w + n0 * K;
    const dnnl::memory plain_w(o::plain({units, K}, o::tag::oi), o::cpu::engine(), const_cast<float*>(part_w));
    // One part writes out directly; several write each its columns through
    // the thread's buffer (oneDNN's kernels take no row stride there).
    const dnnl::memory::desc result_desc = o::plain({M, units}, o::tag::nc);
    const auto w_in_layout = o::cpu::kept_weights(p.weights, plain_w, part_w, weights);
    const dnnl::memory result = cut.parts == 1 ? dnnl::memory(result_desc, o::cpu::engine(), out)
                                               : o::cpu::thread_buffer(2, result_desc);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(o::plain({M, K}, o::tag::nc), o::cpu::engine(), const_cast<float*>(x))},
        {DNNL_ARG_WEIGHTS, o::cpu::in_layout(p.weights, w_in_layout.memory, 1)},
        {DNNL_ARG_DST, result}};
    if (b)
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(o::plain({units}, o::tag::x), o::cpu::engine(), const_cast<float*>(b + n0)));
    if (p.scratchpad.get_size() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, o::cpu::thread_buffer(3, p.scratchpad));
    p.run.execute(o::cpu::stream(), args);
    o::cpu::stream().wait();
    if (cut.parts == 1) return;
    const float* part_out = static_cast<const float*>(result.get_data_handle());
    for (std::int64_t m = 0; m < M; ++m) std::copy_n(part_out + m * units, units, out + m * N + n0);
  });
}

}  // namespace hybra::detail::nn

#endif
