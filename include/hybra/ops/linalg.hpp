#pragma once
// Matrix products with NumPy's shape rules: matmul (batched, broadcasting the
// batch dims) and dot. float32/float64 go to OpenBLAS. A product with a single
// row or column (M == 1 or N == 1, which includes every vector operand) is a
// GEMV (hybra's own, backend/cpu/gemv.hpp, where the matrix's rows are the
// summed dimension; else OpenBLAS's), and vector . vector calls DOT:
// OpenBLAS's GEMM has no fast path for a single row and is several times
// slower than GEMV there. A matrix that BLAS can read in place (a row-major one with any
// row stride, or a transposed view, given as a transpose flag) is passed as
// it is; any other layout is copied to contiguous once. Integer dtypes have no
// BLAS and use a plain row-times-matrix loop that accumulates modulo 2^64, so
// overflow wraps exactly as NumPy's integer matmul does.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "half.hpp"
#include "../backend/cpu/blas.hpp"
#include "../backend/cpu/gemv.hpp"
#include "../backend/cpu/threads.hpp"
#include "../backend/cuda/cublas.hpp"
#include "../expr/evaluate.hpp"
#include "../backend/cuda/launch.hpp"
#include "attrs.hpp"
#include "layout.hpp"

namespace hybra {

namespace detail::linalg {

// How BLAS reads the matrix held in t's last two dims: row-major with row
// stride ld, or (trans) column-major with column stride ld. Extents of 1 make
// their stride irrelevant, so ld is then the smallest value BLAS accepts.
struct blas_matrix {
  bool ok;
  bool trans;
  std::int64_t ld;
};
inline blas_matrix blas_layout(const Tensor& t) {
  const auto nd = static_cast<std::size_t>(t.ndim());
  const std::int64_t rows = t.shape()[nd - 2], cols = t.shape()[nd - 1];
  const std::int64_t rs = t.strides()[nd - 2], cs = t.strides()[nd - 1];
  if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cols)) return {true, false, rows == 1 ? cols : rs};
  if ((rows == 1 || rs == 1) && (cols == 1 || cs >= rows)) return {true, true, cols == 1 ? rows : cs};
  return {false, false, 0};
}

// Strides of t's batch dims (all but the last two) seen through broadcasting
// to `batch`: 0 where t has extent 1 or lacks the dim.
inline Strides batch_strides(const Tensor& t, const Shape& batch) {
  Strides s(batch.size(), 0);
  const std::size_t nb = static_cast<std::size_t>(t.ndim()) - 2, lead = batch.size() - nb;
  for (std::size_t i = 0; i < nb; ++i) s[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return s;
}
inline std::int64_t batch_offset(std::int64_t index, const Shape& batch, const Strides& strides) {
  std::int64_t off = 0;
  for (std::size_t d = batch.size(); d-- > 0;) {
    off += (index % batch[d]) * strides[d];
    index /= batch[d];
  }
  return off;
}

// OpenBLAS 0.3 runs a GEMM below 64^3 multiply-adds, and a GEMV below 9216
// matrix elements, on the calling thread; batches of products that small are
// spread over hybra's threads instead (larger ones are threaded by OpenBLAS).
inline constexpr std::int64_t small_gemm = 1 << 18, small_gemv = 9216;

// How a product walks its batch: the operands' BLAS layouts (both must be
// ok) and their batch strides. x @ W with one W for the whole batch folds
// the batch into the rows of a single product, which BLAS (or cuBLAS) runs
// far better than B small ones.
struct batched_product {
  blas_matrix la, lb;
  std::int64_t M, B;
  Strides sa, sb;

  batched_product(const Tensor& a, const Tensor& b, const Shape& batch, std::int64_t rows, std::int64_t K,
                  std::int64_t N, std::int64_t items)
      : la(blas_layout(a)), lb(blas_layout(b)), M(rows), B(items), sa(batch_strides(a, batch)),
        sb(batch_strides(b, batch)) {
    if (B > 1 && b.size() == K * N && a.size() == B * M * K && a.is_contiguous()) {
      M *= B;
      B = 1;
      la = {true, false, K};
    }
  }
  // Element offsets of batch item bi's matrices.
  std::int64_t a_offset(std::int64_t bi, const Shape& batch) const { return B > 1 ? batch_offset(bi, batch, sa) : 0; }
  std::int64_t b_offset(std::int64_t bi, const Shape& batch) const { return B > 1 ? batch_offset(bi, batch, sb) : 0; }
};

template <class T>
void blas_product(Tensor a, Tensor b, const Shape& batch, T* c, std::int64_t rows, std::int64_t K, std::int64_t N,
                  std::int64_t items) {
  namespace blas = backend::cpu::blas;
  if (!blas_layout(a).ok) a = a.contiguous();
  if (!blas_layout(b).ok) b = b.contiguous();
  const batched_product plan(a, b, batch, rows, K, N, items);
  const auto &la = plan.la, &lb = plan.lb;
  const std::int64_t M = plan.M, B = plan.B;
  const T* a0 = static_cast<const T*>(a.raw_data());
  const T* b0 = static_cast<const T*>(b.raw_data());
  const std::int64_t a_k = K == 1 ? 1 : a.strides()[static_cast<std::size_t>(a.ndim()) - 1];
  const std::int64_t b_k = K == 1 ? 1 : b.strides()[static_cast<std::size_t>(b.ndim()) - 2];
  auto one = [&](std::int64_t bi) {
    const T* pa = a0 + plan.a_offset(bi, batch);
    const T* pb = b0 + plan.b_offset(bi, batch);
    T* pc = c + bi * M * N;
    if (M == 1 && N == 1) {
      *pc = blas::dot(K, pa, a_k, pb, b_k);
    } else if (M == 1) {  // c = B^T a
      if (lb.trans && a_k == 1) backend::cpu::gemv(pb, lb.ld, pa, pc, N, K);
      else if (lb.trans) blas::gemv(false, N, K, T(1), pb, lb.ld, pa, a_k, T(0), pc, 1);
      else blas::gemv(true, K, N, T(1), pb, lb.ld, pa, a_k, T(0), pc, 1);
    } else if (N == 1) {  // c = A b
      if (!la.trans && b_k == 1) backend::cpu::gemv(pa, la.ld, pb, pc, M, K);
      else if (la.trans) blas::gemv(true, K, M, T(1), pa, la.ld, pb, b_k, T(0), pc, 1);
      else blas::gemv(false, M, K, T(1), pa, la.ld, pb, b_k, T(0), pc, 1);
    } else {
      blas::gemm(la.trans, lb.trans, M, N, K, T(1), pa, la.ld, pb, lb.ld, T(0), pc, N);
    }
  };
  if (B > 1 && M * N * K <= (M == 1 || N == 1 ? small_gemv : small_gemm)) {
    backend::cpu::parallel_for(B, M * N * K, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t bi = first; bi < last; ++bi) one(bi);
    });
  } else {
    for (std::int64_t bi = 0; bi < B; ++bi) one(bi);
  }
}

template <class T>
std::uint64_t widen(T v) {
  return static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
}

template <class T>
void integer_product(const Tensor& a, const Tensor& b, const Shape& batch, T* c, std::int64_t M, std::int64_t K,
                     std::int64_t N, std::int64_t B) {
  const Strides sa = batch_strides(a, batch), sb = batch_strides(b, batch);
  const auto na = static_cast<std::size_t>(a.ndim()), nb = static_cast<std::size_t>(b.ndim());
  const std::int64_t a_rs = a.strides()[na - 2], a_cs = a.strides()[na - 1];
  const std::int64_t b_rs = b.strides()[nb - 2], b_cs = b.strides()[nb - 1];
  const T* a0 = static_cast<const T*>(a.raw_data());
  const T* b0 = static_cast<const T*>(b.raw_data());
  backend::cpu::parallel_for(B * M, std::min<std::int64_t>(K * N, 1 << 20), [&](std::int64_t first, std::int64_t last) {
    std::vector<std::uint64_t> acc(static_cast<std::size_t>(N));
    for (std::int64_t r = first; r < last; ++r) {
      const std::int64_t bi = r / M, i = r % M;
      const T* pa = a0 + batch_offset(bi, batch, sa) + i * a_rs;
      const T* pb = b0 + batch_offset(bi, batch, sb);
      std::fill(acc.begin(), acc.end(), 0);
      for (std::int64_t k = 0; k < K; ++k) {
        const std::uint64_t av = widen(pa[k * a_cs]);
        const T* brow = pb + k * b_rs;
        for (std::int64_t j = 0; j < N; ++j) acc[static_cast<std::size_t>(j)] += av * widen(brow[j * b_cs]);
      }
      for (std::int64_t j = 0; j < N; ++j) c[r * N + j] = static_cast<T>(acc[static_cast<std::size_t>(j)]);
    }
  });
}

// c (batch..., M, N), contiguous = a (..., M, K) @ b (..., K, N), where the
// batch dims of a and b broadcast to `batch`; a and b have dtype T.
template <class T>
void product(const Tensor& a, const Tensor& b, const Shape& batch, T* c) {
  const auto na = static_cast<std::size_t>(a.ndim());
  const std::int64_t M = a.shape()[na - 2], K = a.shape()[na - 1], N = b.shape().back();
  const std::int64_t B = checked_numel(batch);
  if (B == 0 || M == 0 || N == 0) return;
  if (K == 0) {
    std::fill_n(c, B * M * N, T(0));
    return;
  }
  if constexpr (std::is_floating_point_v<T>) blas_product(a, b, batch, c, M, K, N, B);
  else integer_product(a, b, batch, c, M, K, N, B);
}

// The same product on a GPU, as launches (backend/cuda/launch.hpp): one cuBLAS
// GEMM per batch item on the GPU's stream (a shared right operand folds the
// batch into rows, as on the CPU). a and b have c's floating dtype and
// layouts cuBLAS reads (blas_layout); only their shapes and strides are read
// here, so the launches serve any operands laid out alike.
inline backend::cuda::CudaLaunch cuda_product_launch(const Tensor& a, const Tensor& b, const Shape& batch,
                                                     DType dtype) {
  const auto na = static_cast<std::size_t>(a.ndim());
  const std::int64_t rows = a.shape()[na - 2], K = a.shape()[na - 1], N = b.shape().back();
  const std::int64_t items = checked_numel(batch);
  backend::cuda::CudaLaunch launch{
      0, [plan = batched_product(a, b, batch, rows, K, N, items), batch, rows, K, N, items, dtype](
             backend::cuda::Gpu& gpu, std::span<const void* const> in, void* c, void*) {
        if (items == 0 || rows == 0 || N == 0) return;
        dispatch(dtype, [&](auto tag) {
          using T = typename decltype(tag)::type;
          if constexpr (std::is_floating_point_v<T>) {
            T* pc = static_cast<T*>(c);
            if (K == 0) {
              gpu.fill(reinterpret_cast<backend::cuda::CUdeviceptr>(pc), 0, 4,
                       static_cast<std::size_t>(items * rows * N) * sizeof(T) / 4);
              return;
            }
            const T* a0 = static_cast<const T*>(in[0]);
            const T* b0 = static_cast<const T*>(in[1]);
            for (std::int64_t bi = 0; bi < plan.B; ++bi)
              backend::cuda::gemm<T>(gpu, plan.la.trans, plan.lb.trans, plan.M, N, K, T(1),
                                     a0 + plan.a_offset(bi, batch), plan.la.ld, b0 + plan.b_offset(bi, batch),
                                     plan.lb.ld, T(0), pc + bi * plan.M * N, N);
          }
        });
      }};
  launch.reads_views = true;
  return launch;
}

// Refuses, at the call, a GPU product cuBLAS cannot take: integer dtypes,
// and views whose matrices are neither row- nor column-major.
inline void require_gpu_product(std::string_view op, DType dtype, std::initializer_list<const Tensor*> operands) {
  if (!is_floating(dtype))
    fail<DTypeError>(op, ": ", name(dtype), " products are not done on a GPU (float32 or float64 are)");
  for (const Tensor* t : operands)
    if (!blas_layout(*t).ok)
      fail<DeviceError>(op, ": an operand of shape ", to_string(t->shape()), " on ", t->device(),
                        " is a view whose matrices are neither row- nor column-major; make it contiguous first");
}

// A 1-d operand as a 1 x K row (as_row) or a K x 1 column, sharing storage.
inline Tensor as_matrix(const Tensor& v, bool as_row) {
  const std::int64_t k = v.shape()[0], s = v.strides()[0];
  return as_row ? v.view({1, k}, {k * s, s}, v.offset()) : v.view({k, 1}, {s, 1}, v.offset());
}

inline Tensor to_dtype(const Tensor& t, DType d) { return t.dtype() == d ? t : t.astype(d); }

// matmul of operands laid out as a and b on a GPU; nullopt where the eager op
// must prepare them first (a vector operand, dtypes to promote, a layout
// cuBLAS cannot read).
inline std::optional<backend::cuda::CudaLaunch> cuda_matmul_launch(const Tensor& a, const Tensor& b) {
  if (a.ndim() < 2 || b.ndim() < 2 || a.dtype() != b.dtype() || !is_floating(a.dtype()) || !blas_layout(a).ok ||
      !blas_layout(b).ok)
    return std::nullopt;
  const Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                       Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  return cuda_product_launch(a, b, batch, a.dtype());
}

// dot of operands laid out as a and b on a GPU, as one product of a's rows
// and b's matrix; nullopt where the eager op must prepare them first (a 0-d
// operand, dtypes to promote, a b of more than two dims to transpose).
inline std::optional<backend::cuda::CudaLaunch> cuda_dot_launch(const Tensor& a, const Tensor& b) {
  if (a.ndim() == 0 || b.ndim() == 0 || b.ndim() > 2 || a.dtype() != b.dtype() || !is_floating(a.dtype()) ||
      (a.ndim() > 2 && !a.is_contiguous()))
    return std::nullopt;
  const std::int64_t K = a.shape().back();
  const std::int64_t rows = checked_numel(Shape(a.shape().begin(), a.shape().end() - 1));
  const Tensor a2 = a.ndim() == 1 ? as_matrix(a, true) : a.ndim() == 2 ? a : a.view({rows, K}, {K, 1}, a.offset());
  const Tensor b2 = b.ndim() == 1 ? as_matrix(b, false) : b;
  if (!blas_layout(a2).ok || !blas_layout(b2).ok) return std::nullopt;
  return cuda_product_launch(a2, b2, Shape{}, a.dtype());
}

// Per output element, a contraction over the last axis of the first operand.
inline std::int64_t contraction(std::span<const Tensor> in, const Tensor& out) {
  return out.size() * (in[0].ndim() ? in[0].shape().back() : 1);
}

}  // namespace detail::linalg

// NumPy's matmul: the last two dims are matrices, the others batch dims that
// broadcast; a 1-d first operand is a row and a 1-d second operand a column,
// and that dim is dropped from the result. 0-d operands are rejected.
template <tensor_like A, tensor_like B>
Tensor matmul(A&& a_in, B&& b_in) {
  namespace la = detail::linalg;
  Tensor a = eval(a_in), b = eval(b_in);
  a.require("matmul");
  b.require("matmul");
  autograd::op_record rec("matmul", {a, b});
  if (auto r = detail::compute_in_float32({a, b}, [&](std::span<const Tensor> f) { return matmul(f[0], f[1]); })) return rec.output(*r);
  const Shape sa = a.shape(), sb = b.shape();
  if (sa.empty() || sb.empty())
    fail<ShapeError>("matmul: shapes ", to_string(sa), " and ", to_string(sb),
                     ": a 0-d operand has no matrix dimensions (use multiply)");
  require_same_device("matmul", a, b);
  const DType dtype = promote_types(a.dtype(), b.dtype());
  a = la::to_dtype(a, dtype);
  b = la::to_dtype(b, dtype);
  if (sa.size() == 1) a = la::as_matrix(a, true);
  if (sb.size() == 1) b = la::as_matrix(b, false);
  const auto na = static_cast<std::size_t>(a.ndim()), nb = static_cast<std::size_t>(b.ndim());
  if (a.shape()[na - 1] != b.shape()[nb - 2])
    fail<ShapeError>("matmul: shapes ", to_string(sa), " and ", to_string(sb), " are not aligned (",
                     a.shape()[na - 1], " != ", b.shape()[nb - 2], ")");
  Shape batch;
  try {
    batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                             Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  } catch (const ShapeError&) {
    fail<ShapeError>("matmul: the batch dimensions of shapes ", to_string(sa), " and ", to_string(sb),
                     " cannot be broadcast together");
  }
  Shape out_shape = batch;
  if (sa.size() > 1) out_shape.push_back(a.shape()[na - 2]);
  if (sb.size() > 1) out_shape.push_back(b.shape()[nb - 1]);
  Tensor out(out_shape, dtype, a.device());
  if (out.device().kind == DeviceKind::cuda) {
    la::require_gpu_product("matmul", dtype, {&a, &b});
    backend::cuda::push_cuda_launch("matmul", {a, b}, out, la::cuda_product_launch(a, b, batch, dtype));
    return rec.output(out);
  }
  const std::array operands{a, b};
  push_kernel("matmul", {a, b}, {out}, [a, b, batch, out] {
    dispatch(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      la::product<T>(a, b, batch, static_cast<T*>(out.raw_data()));
    });
  }, la::contraction(operands, out));
  return rec.output(out);
}

// numpy.dot: with a 0-d operand, an elementwise product; otherwise a sum over
// the last axis of a and the second-to-last axis of b (the only axis when b
// is 1-d). The result's shape is a.shape[:-1] + b.shape[:-2] + b.shape[-1:].
template <tensor_like A, tensor_like B>
Tensor dot(A&& a_in, B&& b_in) {
  namespace la = detail::linalg;
  Tensor a = eval(a_in), b = eval(b_in);
  a.require("dot");
  b.require("dot");
  autograd::op_record rec("dot", {a, b});
  if (auto r = detail::compute_in_float32({a, b}, [&](std::span<const Tensor> f) { return dot(f[0], f[1]); })) return rec.output(*r);
  if (a.ndim() == 0 || b.ndim() == 0) return rec.output(eval(a * b));
  require_same_device("dot", a, b);
  const Shape sa = a.shape(), sb = b.shape();
  const std::int64_t K = sa.back(), kb = sb.size() == 1 ? sb[0] : sb[sb.size() - 2];
  if (K != kb)
    fail<ShapeError>("dot: shapes ", to_string(sa), " and ", to_string(sb), " are not aligned (", K, " != ", kb, ")");
  const DType dtype = promote_types(a.dtype(), b.dtype());
  a = la::to_dtype(a, dtype);
  b = la::to_dtype(b, dtype);

  Shape out_shape(sa.begin(), sa.end() - 1);
  std::int64_t rest_of_b = 1;  // product of b's extents other than K
  if (sb.size() >= 2) {
    out_shape.insert(out_shape.end(), sb.begin(), sb.end() - 2);
    out_shape.push_back(sb.back());
    for (std::size_t d = 0; d < sb.size(); ++d)
      if (d != sb.size() - 2) rest_of_b *= sb[d];
  }
  // a as (P, K) rows; b as one (K, Q * N) matrix whose columns are b's
  // batch-major (q, n) pairs, so a single product yields the result's layout.
  Tensor a2 = sa.size() == 1 ? la::as_matrix(a, true)
              : sa.size() == 2 ? a
                               : reshape(a, {checked_numel(Shape(sa.begin(), sa.end() - 1)), K});
  Tensor b2;
  if (sb.size() == 1) {
    b2 = la::as_matrix(b, false);
  } else if (sb.size() == 2) {
    b2 = b;
  } else {
    std::vector<std::int64_t> k_first{static_cast<std::int64_t>(sb.size()) - 2};
    for (std::size_t d = 0; d < sb.size(); ++d)
      if (d != sb.size() - 2) k_first.push_back(static_cast<std::int64_t>(d));
    b2 = reshape(transpose(b, k_first), {K, rest_of_b});
  }
  Tensor out(out_shape, dtype, a.device());
  if (out.device().kind == DeviceKind::cuda) {
    la::require_gpu_product("dot", dtype, {&a2, &b2});
    backend::cuda::push_cuda_launch("dot", {a2, b2}, out, la::cuda_product_launch(a2, b2, Shape{}, dtype));
    return rec.output(out);
  }
  const std::array operands{a2, b2};
  push_kernel("dot", {a2, b2}, {out}, [a2, b2, out] {
    dispatch(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      la::product<T>(a2, b2, Shape{}, static_cast<T*>(out.raw_data()));
    });
  }, la::contraction(operands, out));
  return rec.output(out);
}

namespace detail::linalg {
// MXNet's dot is NumPy's matmul on operands of at most 2 dimensions, and its
// batch_dot is matmul on two 3-d operands with one batch size.
template <class W>
auto write_as_dot(const W& w) {
  const auto& a = w.input(0).meta.shape;
  const auto& b = w.input(1).meta.shape;
  if (a && b && a->size() == 3 && b->size() == 3 && (*a)[0] == (*b)[0]) return w.keep_all("batch_dot");
  for (const auto* s : {&a, &b})
    if (!*s || (*s)->size() > 2)
      w.reject("on operands of more than 2 dimensions, other than two 3-d ones of one batch size (batch_dot)");
  return w.keep_all("dot");
}
// MXNet's dot and batch_dot may transpose their operands; hybra reads neither flag.
template <class R>
void reject_transposes(const R& r) {
  if (r.flag("transpose_a", false) || r.flag("transpose_b", false))
    r.reject("transpose_a/transpose_b are not supported");
}
}  // namespace detail::linalg

namespace op {

struct matmul {
  static constexpr std::string_view name = "matmul";
  static constexpr int arity = 2;
  static constexpr bool product = true;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs&) { return hybra::matmul(in[0], in[1]); }
  static std::int64_t multiply_adds(std::span<const Tensor> in, const Tensor& out) {
    return hybra::detail::linalg::contraction(in, out);
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs&, backend::cuda::Gpu&) {
    return hybra::detail::linalg::cuda_matmul_launch(in[0], in[1]);
  }
  template <class G>
  static auto gradient(const G& g) {
    // 1-d operands as the row and column they stand for; batch dims broadcast (sum_to undoes it).
    const bool row = g.shape(0).size() == 1, col = g.shape(1).size() == 1;
    auto a = row ? g.reshape(g.in[0], Shape{1, g.shape(0)[0]}) : g.in[0];
    auto b = col ? g.reshape(g.in[1], Shape{g.shape(1)[0], 1}) : g.in[1];
    Shape out = g.out.shape();
    if (row) {
      // out[..., n] -> out[..., 1, n], as a push and a swap: GCC 12 (-O3)
      // cannot see that an insert before end() - 1 has an element to move,
      // and warns (-Wstringop-overflow) in every program that trains.
      out.push_back(1);
      if (!col) std::swap(out[out.size() - 1], out[out.size() - 2]);
    }
    if (col) out.push_back(1);
    auto dy = g.reshape(g.dy, out);
    auto r = g.grads();
    r.resize(2);
    if (g.wanted[0]) r[0] = g.reshape(g.sum_to(g.matmul(dy, g.swap_last(b)), a.shape()), g.shape(0));
    if (g.wanted[1]) r[1] = g.reshape(g.sum_to(g.matmul(g.swap_last(a), dy), b.shape()), g.shape(1));
    return r;
  }
  // Written as MXNet's dot or batch_dot where they agree; MXNet's batch_dot reads as matmul.
  static constexpr std::array<std::string_view, 1> mxnet{"batch_dot"};
  template <class W> static auto write(const W& w) { return hybra::detail::linalg::write_as_dot(w); }
  template <class R>
  static auto read(const R& r) {
    r.arity(2, 2);
    hybra::detail::linalg::reject_transposes(r);
    for (std::size_t k = 0; k < 2; ++k)
      if (r.inputs[k].has_shape() && r.inputs[k].shape().size() != 3) r.reject("batch_dot takes 3-d operands");
    return r.make("matmul");
  }
};

struct dot {
  static constexpr std::string_view name = "dot";
  static constexpr int arity = 2;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs&) { return hybra::dot(in[0], in[1]); }
  static std::int64_t multiply_adds(std::span<const Tensor> in, const Tensor& out) {
    return hybra::detail::linalg::contraction(in, out);
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs&, backend::cuda::Gpu&) {
    return hybra::detail::linalg::cuda_dot_launch(in[0], in[1]);
  }
  template <class G>
  static auto gradient(const G& g) {
    const Shape &sa = g.shape(0), &sb = g.shape(1);
    if (sa.empty() || sb.empty()) return g.grads(g.dy * g.in[1], g.dy * g.in[0]);
    // The forward's own layout: a as (P, K) rows, b as (K, rest) with K first.
    const std::int64_t K = sa.back(), P = checked_numel(sa) / K, rest = checked_numel(sb) / K;
    std::vector<std::int64_t> k_first{static_cast<std::int64_t>(sb.size()) - (sb.size() == 1 ? 1 : 2)};
    for (std::size_t d = 0; d < sb.size(); ++d)
      if (static_cast<std::int64_t>(d) != k_first[0]) k_first.push_back(static_cast<std::int64_t>(d));
    auto a2 = g.reshape(g.in[0], Shape{P, K});
    auto b2 = g.reshape(g.transpose(g.in[1], k_first), Shape{K, rest});
    auto dy2 = g.reshape(g.dy, Shape{P, rest});
    auto r = g.grads();
    r.resize(2);
    if (g.wanted[0]) r[0] = g.reshape(g.matmul(dy2, g.transpose(b2)), sa);
    if (g.wanted[1]) {
      Shape permuted;
      for (auto d : k_first) permuted.push_back(sb[static_cast<std::size_t>(d)]);
      std::vector<std::int64_t> back(k_first.size());
      for (std::size_t i = 0; i < k_first.size(); ++i)
        back[static_cast<std::size_t>(k_first[i])] = static_cast<std::int64_t>(i);
      r[1] = g.transpose(g.reshape(g.matmul(g.transpose(a2), dy2), permuted), back);
    }
    return r;
  }
  static constexpr std::array<std::string_view, 1> mxnet{"dot"};
  template <class W> static auto write(const W& w) { return hybra::detail::linalg::write_as_dot(w); }
  template <class R>
  static auto read(const R& r) {
    r.arity(2, 2);
    hybra::detail::linalg::reject_transposes(r);
    return r.make("dot");
  }
};

}  // namespace op

}  // namespace hybra
