#pragma once
// embedding: the rows of a (rows, width) table that indices pick, Gluon's
// Embedding and PyTorch's embedding: indices of shape S give a result of
// shape S + (width,) in the table's dtype. Indices may have any dtype (MXNet's
// data are float32); a float must hold a whole number. An index that is not
// a row is an IndexError naming it and its place (MXNet clips it to a row,
// which hides a wrong input): on the CPU the engine op fails, on a GPU its
// kernel reports it and the first wait raises it (backend/cuda/bad_input.hpp);
// either way its row of the result is zeros. The gradient, embedding_backward,
// adds each row of dy into the table row its index picked: on the CPU in the
// indices' order, on a GPU by atomic adds, so a row picked more than once
// agrees with the CPU's to rounding. The whole op is this file: the eager op
// on tensors and symbols, the entries of its GPU kernels
// (kernels/embedding.cuh) and every facet of ops/op.hpp.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "half.hpp"
#include "../backend/cpu/threads.hpp"
#include "../backend/cuda/launch.hpp"
#include "../backend/cuda/ptx.hpp"
#include "../backend/cuda/source.hpp"
#include "../expr/evaluate.hpp"
#include "op.hpp"

namespace hybra {

namespace detail::embedding {

using i64 = std::int64_t;

// The table's row that `index` names, or -1 where it names none (the
// kernels' embedding_row).
template <class I>
i64 row_of(I index, i64 rows) {
  const double value = static_cast<double>(index);
  if (!(value >= 0 && value < static_cast<double>(rows))) return -1;
  const auto row = static_cast<i64>(index);
  return static_cast<I>(row) == index ? row : -1;
}

// The first index of count that names no row, as an IndexError.
template <class I>
void reject_bad_index(std::string_view op, const I* indices, i64 count, i64 rows) {
  for (i64 i = 0; i < count; ++i)
    if (row_of(indices[i], rows) < 0)
      fail<IndexError>(op, ": index ", static_cast<double>(indices[i]), " (element ", i,
                       " of the indices, flattened) is not one of the ", rows, " rows of its table");
}

// y's rows are the table's rows the indices pick (zeros for a bad index).
template <class I, class T>
void gather(const I* indices, const T* table, T* y, i64 count, i64 rows, i64 width) {
  backend::cpu::parallel_for(count, width, [&](i64 first, i64 last) {
    for (i64 i = first; i < last; ++i) {
      const i64 row = row_of(indices[i], rows);
      if (row < 0) std::fill_n(y + i * width, width, T(0));
      else std::memcpy(y + i * width, table + row * width, static_cast<std::size_t>(width) * sizeof(T));
    }
  });
  reject_bad_index("embedding", indices, count, rows);
}

// d_table = 0, then each row of dy added to the row its index picks, in the
// indices' order; threads split the columns, so the order is the same for any
// number of them.
template <class I, class T>
void scatter_add(const I* indices, const T* dy, T* d_table, i64 count, i64 rows, i64 width) {
  std::fill_n(d_table, rows * width, T(0));
  backend::cpu::parallel_for(width, count, [&](i64 first, i64 last) {
    for (i64 i = 0; i < count; ++i) {
      const i64 row = row_of(indices[i], rows);
      if (row < 0) continue;
      T* to = d_table + row * width;
      const T* from = dy + i * width;
      for (i64 c = first; c < last; ++c) to[c] += from[c];
    }
  });
  reject_bad_index("embedding_backward", indices, count, rows);
}

inline void require_table(std::string_view op, const Tensor& table) {
  if (table.ndim() != 2)
    fail<ShapeError>(op, ": the table must be 2-d (rows, width), not of shape ", to_string(table.shape()));
  if (!is_floating(table.dtype()))
    fail<DTypeError>(op, ": the table's dtype is ", name(table.dtype()), "; it must be a float dtype");
}

// The NVRTC program of both kernels for one index and one table dtype.
inline std::string program_name(DType index, DType table) {
  return hybra::detail::concat("hybra_embedding_", name(index), '_', name(table));
}
inline std::string entry(DType index, DType table, std::string_view kernel) {
  return hybra::detail::concat(program_name(index, table), '_', kernel);
}
inline std::string cuda_program(DType index, DType table) {
  const std::string I(backend::cuda::cuda_type(index)), T(backend::cuda::cuda_type(table));
  std::string source = "#include <hybra/core/half.hpp>\n#include <kernels/embedding.cuh>\n";
  for (const std::string_view kernel : {"gather", "scatter_add"}) {
    const bool gather = kernel == "gather";
    if (!gather && is_half(table)) continue;  // the gradient of a 16-bit table is summed in float32
    source += hybra::detail::concat(
        "\nextern \"C\" __global__ void __launch_bounds__(256) ", entry(index, table, kernel), "(const ", I,
        "* indices, const ", T, gather ? "* table, " : "* dy, ", T, gather ? "* y" : "* d_table",
        ", long long count, long long rows, long long width, hybra::kernels::bad_input_report* report, unsigned int "
        "op) {\n  hybra::kernels::embedding_",
        kernel, "(indices, ", gather ? "table, y" : "dy, d_table", ", count, rows, width, report, op);\n}\n");
  }
  return source;
}

// The gather (operands: indices, table) or the scatter-add (operands:
// indices, dy) of `count` indices into a table of `rows` rows of `width`
// elements of dtype `table`, on a GPU.
inline backend::cuda::CudaLaunch cuda_launch(bool gather, DType index, DType table, i64 count, i64 rows, i64 width,
                                             backend::cuda::Gpu& gpu) {
  const std::string& ptx = backend::cuda::program_ptx(program_name(index, table), gpu.arch(),
                                                      [index, table] { return cuda_program(index, table); });
  const std::string function = entry(index, table, gather ? "gather" : "scatter_add");
  const auto grid = backend::cuda::grid_over(count * width, gpu.info().multiprocessors);
  backend::cuda::BadInputReport* report = gpu.bad_input_report();
  const std::uint32_t code = backend::cuda::bad_input_code(gather ? "embedding" : "embedding_backward");
  const i64 table_bytes = rows * width * static_cast<i64>(size_of(table));
  return {0, [&ptx, function, grid, report, code, gather, count, rows, width, table_bytes](
                 backend::cuda::Gpu& gpu, std::span<const void* const> in, void* out, void*) {
            if (!gather && table_bytes)
              gpu.fill(reinterpret_cast<backend::cuda::CUdeviceptr>(out), 0, 1, static_cast<std::size_t>(table_bytes));
            if (count * width == 0) return;
            const void *indices = in[0], *values = in[1];
            long long n = count, r = rows, w = width;
            void* report_address = report;
            unsigned int op = code;
            void* args[] = {&indices, &values, &out, &n, &r, &w, &report_address, &op};
            gpu.launch_grid(gpu.function(ptx, function), grid.blocks, grid.threads, args,
                            gather ? "embedding" : "embedding_backward");
          }};
}

inline Tensor gather_rows(const Tensor& indices, const Tensor& table) {
  // The gather moves a table's elements as they are, a 16-bit float's too;
  // 16-bit indices are read as float32 (ops/half.hpp).
  if (is_half(indices.dtype())) return gather_rows(indices.astype(DType::float32), table);
  const Tensor idx = indices.contiguous(), t = table.contiguous();
  const i64 rows = t.shape()[0], width = t.shape()[1], count = idx.size();
  Shape shape = idx.shape();
  shape.push_back(width);
  Tensor out(shape, t.dtype(), t.device());
  if (out.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(
        "embedding", {idx, t}, out,
        cuda_launch(true, idx.dtype(), t.dtype(), count, rows, width, backend::cuda::gpu(out.device().id)));
    return out;
  }
  push_kernel("embedding", {idx, t}, {out}, [idx, t, out, count, rows, width] {
    dispatch(idx.dtype(), [&](auto index_tag) {
      dispatch_stored(t.dtype(), [&](auto table_tag) {
        using I = typename decltype(index_tag)::type;
        using T = typename decltype(table_tag)::type;
        gather(static_cast<const I*>(idx.raw_data()), static_cast<const T*>(t.raw_data()),
               static_cast<T*>(out.raw_data()), count, rows, width);
      });
    });
  });
  return out;
}

}  // namespace detail::embedding

// The rows of `table` (rows, width) that `indices` pick: shape
// indices.shape() + (width,). On symbols it adds a node; a tensor beside a
// symbol becomes a constant.
template <array_like I, array_like W>
auto embedding(I&& indices, W&& table) {
  if constexpr (symbol_like<I> || symbol_like<W>) {
    using S = decltype(to_symbol(std::forward<W>(table)));
    return op::make_node<S>("embedding", {}, {to_symbol(std::forward<I>(indices)), to_symbol(std::forward<W>(table))});
  } else {
    const Tensor idx = eval(indices), t = eval(table);
    idx.require("embedding");
    t.require("embedding");
    detail::embedding::require_table("embedding", t);
    require_same_device("embedding", idx, t);
    autograd::op_record rec("embedding", {idx, t});
    return rec.output(detail::embedding::gather_rows(idx, t));
  }
}

// embedding's gradient with respect to its table of `rows` rows: each row of
// dy (shape indices.shape() + (width,)) added into the row its index picks.
inline Tensor embedding_backward(const Tensor& indices, const Tensor& dy, std::int64_t rows) {
  namespace e = detail::embedding;
  indices.require("embedding_backward");
  dy.require("embedding_backward");
  if (auto r = detail::compute_in_float32({indices, dy}, [&](std::span<const Tensor> f) { return embedding_backward(f[0], f[1], rows); })) return *r;
  require_same_device("embedding_backward", indices, dy);
  Shape want = indices.shape();
  const std::int64_t width = dy.ndim() ? dy.shape().back() : 0;
  want.push_back(width);
  if (dy.shape() != want)
    fail<ShapeError>("embedding_backward: dy of shape ", to_string(dy.shape()), " for indices of shape ",
                     to_string(indices.shape()), " (it must be indices' shape plus the width)");
  if (rows < 0) fail<ValueError>("embedding_backward: rows must be at least 0, not ", rows);
  const Tensor idx = indices.contiguous(), g = dy.contiguous();
  Tensor out({rows, width}, g.dtype(), g.device());
  e::require_table("embedding_backward", out);
  if (out.device().kind == DeviceKind::cuda) {
    backend::cuda::push_cuda_launch(
        "embedding_backward", {idx, g}, out,
        e::cuda_launch(false, idx.dtype(), g.dtype(), idx.size(), rows, width, backend::cuda::gpu(out.device().id)));
    return out;
  }
  push_kernel("embedding_backward", {idx, g}, {out}, [idx, g, out, rows, width] {
    dispatch(idx.dtype(), [&](auto index_tag) {
      dispatch(g.dtype(), [&](auto table_tag) {
        using I = typename decltype(index_tag)::type;
        using T = typename decltype(table_tag)::type;
        e::scatter_add(static_cast<const I*>(idx.raw_data()), static_cast<const T*>(g.raw_data()),
                       static_cast<T*>(out.raw_data()), idx.size(), rows, width);
      });
    });
  });
  return out;
}

namespace op {

// (indices, table).
struct embedding {
  static constexpr std::string_view name = "embedding";
  static constexpr int arity = 2;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs&) { return hybra::embedding(in[0], in[1]); }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor&,
                                                              const op::Attrs&, backend::cuda::Gpu& gpu) {
    const Shape& t = in[1].shape();
    return hybra::detail::embedding::cuda_launch(true, in[0].dtype(), in[1].dtype(), in[0].size(), t[0], t[1], gpu);
  }
  // The indices get none; the table gets dy's rows added where they were read.
  template <class G>
  static auto gradient(const G& g) {
    auto r = g.grads();
    r.resize(2);
    if (g.wanted[1])
      r[1] = g.make("embedding_backward", {{"rows", op::attr_text(g.shape(1)[0])}}, {g.in[0], g.dy});
    return r;
  }
  // MXNet's Embedding; hybra has no sparse gradient, so it reads only a dense one.
  static constexpr std::array<std::string_view, 1> mxnet{"Embedding"};
  template <class W>
  static auto write(const W& w) {
    const auto& table = w.input(1).meta.shape;
    const auto& dtype = w.input(1).meta.dtype;
    return w.keep_all("Embedding", {{"input_dim", std::to_string(table ? (*table)[0] : 0)},
                                    {"output_dim", std::to_string(table ? (*table)[1] : 0)},
                                    {"dtype", std::string(dtype ? hybra::name(*dtype) : "float32")},
                                    {"sparse_grad", "False"}});
  }
  template <class R>
  static auto read(const R& r) {
    r.arity(2, 2);
    if (r.flag("sparse_grad", false)) r.reject("sparse_grad=True is not supported (hybra's gradients are dense)");
    const auto rows = r.integer("input_dim", 0), width = r.integer("output_dim", 0);
    if (r.inputs[1].has_shape() && r.inputs[1].shape() != Shape{rows, width})
      r.reject("attrs input_dim = " + std::to_string(rows) + " and output_dim = " + std::to_string(width) +
               " do not match weight of shape " + to_string(r.inputs[1].shape()));
    const auto& weight_dtype = r.inputs[1].node().meta.dtype;
    if (const auto dtype = r.attr("dtype"); dtype && weight_dtype && *dtype != hybra::name(*weight_dtype))
      r.reject("attr 'dtype' = '" + *dtype + "' does not match the weight's dtype " +
               std::string(hybra::name(*weight_dtype)));
    return r.make("embedding");
  }
};

// (indices, dy), with the table's row count.
struct embedding_backward {
  static constexpr std::string_view name = "embedding_backward";
  static constexpr int arity = 2;
  static constexpr bool gradient_only = true;
  static Tensor eval(std::span<const Tensor> in, const op::Attrs& a) {
    return hybra::embedding_backward(in[0], in[1], op::int_attr(a, "rows", name));
  }
  static std::optional<backend::cuda::CudaLaunch> cuda_launch(std::span<const Tensor> in, const Tensor& out,
                                                              const op::Attrs&, backend::cuda::Gpu& gpu) {
    return hybra::detail::embedding::cuda_launch(false, in[0].dtype(), in[1].dtype(), in[0].size(), out.shape()[0],
                                                 out.shape()[1], gpu);
  }
};

}  // namespace op

}  // namespace hybra
