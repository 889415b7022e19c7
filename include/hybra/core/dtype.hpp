#pragma once
// The element types and their promotion rules. Five compute: the rules are
// written once, over their C++ types (promote_t), and the run-time DType
// version is derived from them, so fused kernels and shape/dtype inference
// cannot disagree. Two are storage, the 16-bit floats (core/half.hpp): a
// tensor holds them, and ops compute them in float32 (ops/half.hpp), so no
// kernel is instantiated for them: `dispatch` refuses them, and the code that
// only moves or converts elements takes them through `dispatch_stored`.
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "error.hpp"
#include "half.hpp"

namespace hybra {

enum class DType : std::uint8_t { float32, float64, int32, int64, uint8, float16, bfloat16 };

template <class T>
inline constexpr bool is_dtype_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint8_t> || std::is_same_v<T, float16_t> ||
    std::is_same_v<T, bfloat16_t>;

template <class T>
struct dtype_of {
  static_assert(is_dtype_v<T>,
                "hybra: this C++ type is not a hybra dtype; use float, double, std::int32_t, "
                "std::int64_t, std::uint8_t, hybra::float16_t or hybra::bfloat16_t_t");
};
template <> struct dtype_of<float> { static constexpr DType value = DType::float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::float64; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::int32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::int64; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::uint8; };
template <> struct dtype_of<float16_t> { static constexpr DType value = DType::float16; };
template <> struct dtype_of<bfloat16_t> { static constexpr DType value = DType::bfloat16; };
template <class T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

constexpr std::string_view name(DType d) {
  switch (d) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint8: return "uint8";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
  }
  return "invalid";
}

// The dtype a name() spells; anything else is a DTypeError naming `what`.
inline DType parse_dtype(std::string_view text, std::string_view what) {
  for (DType d : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8, DType::float16,
                  DType::bfloat16})
    if (name(d) == text) return d;
  fail<DTypeError>(what, ": unknown dtype '", text, "' (float32, float64, int32, int64, uint8, float16 or bfloat16)");
}

constexpr std::size_t size_of(DType d) {
  switch (d) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::int32: return 4;
    case DType::int64: return 8;
    case DType::uint8: return 1;
    case DType::float16:
    case DType::bfloat16: return 2;
  }
  return 0;
}

template <class T> struct type_tag { using type = T; };

inline bool is_half(DType d) { return d == DType::float16 || d == DType::bfloat16; }

// Calls f(type_tag<T>{}) with the C++ type of d, a dtype that computes. A
// 16-bit float here is an op that forgot to compute it in float32
// (ops/half.hpp): an error, never a kernel on 2-byte values.
template <class F>
decltype(auto) dispatch(DType d, F&& f) {
  switch (d) {
    case DType::float32: return f(type_tag<float>{});
    case DType::float64: return f(type_tag<double>{});
    case DType::int32: return f(type_tag<std::int32_t>{});
    case DType::int64: return f(type_tag<std::int64_t>{});
    case DType::uint8: return f(type_tag<std::uint8_t>{});
    case DType::float16:
    case DType::bfloat16:
      fail<DTypeError>("no kernel computes in ", name(d), ": ops compute it in float32 (an op of hybra's missed "
                       "the conversion; please report it)");
  }
  fail<DTypeError>("invalid dtype code ", static_cast<int>(d));
}

// Calls f(type_tag<T>{}) with the C++ type of any dtype: for code that moves,
// fills, prints or converts elements (static_cast works between every pair).
template <class F>
decltype(auto) dispatch_stored(DType d, F&& f) {
  if (d == DType::float16) return f(type_tag<float16_t>{});
  if (d == DType::bfloat16) return f(type_tag<bfloat16_t>{});
  return dispatch(d, std::forward<F>(f));
}

// Promotion of two operands. A "weak" operand is a C++ scalar: it never
// widens a tensor's dtype, except that a floating scalar turns an integer
// tensor into float32 (PyTorch's rule). Two tensors promote as follows:
// same -> same; integers widen (uint8 < int32 < int64); integer with a float
// gives that float; float32 with float64 gives float64.
namespace detail {
template <class A, class B>
struct promote_strong {
  using type = std::conditional_t<
      std::is_floating_point_v<A> != std::is_floating_point_v<B>,
      std::conditional_t<std::is_floating_point_v<A>, A, B>,
      std::conditional_t<(sizeof(A) >= sizeof(B)), A, B>>;
};
template <class T, class S>
using promote_weak_t = std::conditional_t<std::is_integral_v<T> && std::is_floating_point_v<S>, float, T>;
}  // namespace detail

template <class A, bool WeakA, class B, bool WeakB>
struct promote {
  using type = typename detail::promote_strong<A, B>::type;
};
template <class A, class B>
struct promote<A, false, B, true> { using type = detail::promote_weak_t<A, B>; };
template <class A, class B>
struct promote<A, true, B, false> { using type = detail::promote_weak_t<B, A>; };
template <class A, class B>
struct promote<A, true, B, true> { using type = std::common_type_t<A, B>; };
template <class A, bool WeakA, class B, bool WeakB>
using promote_t = typename promote<A, WeakA, B, WeakB>::type;

// The floating type an integer operand is computed in by exp, log, /, ...
template <class T>
using floating_t = std::conditional_t<std::is_floating_point_v<T>, T, float>;

// A 16-bit float promotes as float32 does, but keeps its own dtype where
// float32 would be the result (with integers, weak scalars and itself);
// float16 with bfloat16 is float32, which holds both.
inline DType promote_types(DType a, bool weak_a, DType b, bool weak_b);

inline DType promote_types(DType a, DType b) { return promote_types(a, false, b, false); }

// The same rule for operands that may be weak (C++ scalars), at run time.
inline DType promote_types(DType a, bool weak_a, DType b, bool weak_b) {
  if (is_half(a) || is_half(b)) {
    if (a == b) return a;
    const DType pa = is_half(a) ? DType::float32 : a, pb = is_half(b) ? DType::float32 : b;
    const DType p = promote_types(pa, weak_a, pb, weak_b);
    if (p != DType::float32 || (is_half(a) && is_half(b))) return p;
    // float32 stands for the half: unless a strong float32 tensor took part.
    const bool float32_tensor = (a == DType::float32 && !weak_a) || (b == DType::float32 && !weak_b);
    return float32_tensor ? DType::float32 : is_half(a) && !weak_a ? a : is_half(b) && !weak_b ? b : p;
  }
  return dispatch(a, [&](auto ta) {
    return dispatch(b, [&](auto tb) {
      using A = typename decltype(ta)::type;
      using B = typename decltype(tb)::type;
      if (weak_a && weak_b) return dtype_of_v<promote_t<A, true, B, true>>;
      if (weak_a) return dtype_of_v<promote_t<A, true, B, false>>;
      if (weak_b) return dtype_of_v<promote_t<A, false, B, true>>;
      return dtype_of_v<promote_t<A, false, B, false>>;
    });
  });
}

inline bool is_floating(DType d) { return d == DType::float32 || d == DType::float64 || is_half(d); }

// The dtype an op computes a dtype in: float32 for the 16-bit floats.
inline DType compute_dtype(DType d) { return is_half(d) ? DType::float32 : d; }

}  // namespace hybra
