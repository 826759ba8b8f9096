#include "dtype.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common.hpp"

namespace harness {

namespace {

// float16 and bfloat16 as stored (uint16_t), converted to float for arithmetic.
inline float f16_to_float(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
}
inline uint16_t float_to_f16(float f) {
  _Float16 v = static_cast<_Float16>(f);  // round to nearest even
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
}
inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {  // round to nearest even, NaN stays NaN (as c10::BFloat16)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (f != f) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Integer sums and products wrap around, as torch's do: computed on the unsigned type of the
// same width, since overflowing a signed type is undefined behaviour (floating point: plain).
template <class T, bool = std::is_integral_v<T>>
struct Wrapping {
  using type = T;
};
template <class T>
struct Wrapping<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using Wide = typename Wrapping<T>::type;

struct Add {
  template <class T>
  static T apply(T a, T b) { return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b)); }
};
struct Mul {
  template <class T>
  static T apply(T a, T b) { return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b)); }
};
// torch's min/max propagate NaN.
struct Min {
  template <class T>
  static T apply(T a, T b) {
    if (a != a) return a;
    if (b != b) return b;
    return b < a ? b : a;
  }
};
struct Max {
  template <class T>
  static T apply(T a, T b) {
    if (a != a) return a;
    if (b != b) return b;
    return b > a ? b : a;
  }
};
struct Or {  // bool "sum" and "max"
  template <class T>
  static T apply(T a, T b) { return static_cast<T>(a || b); }
};
struct And {  // bool "product" and "min"
  template <class T>
  static T apply(T a, T b) { return static_cast<T>(a && b); }
};

template <class T, class Op>
void reduce_plain(void* dst, const void* src, int64_t n) {
  T* __restrict d = static_cast<T*>(dst);
  const T* __restrict s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(d[i], s[i]);
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float), class Op>
void reduce_16(void* dst, const void* src, int64_t n) {
  uint16_t* __restrict d = static_cast<uint16_t*>(dst);
  const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = Store(Op::apply(Load(d[i]), Load(s[i])));
}

template <class T>
void divide_plain(void* buf, int64_t n, int divisor) {
  T* b = static_cast<T*>(buf);
  const T d = static_cast<T>(divisor);
  for (int64_t i = 0; i < n; ++i) b[i] /= d;
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void divide_16(void* buf, int64_t n, int divisor) {
  uint16_t* b = static_cast<uint16_t*>(buf);
  const float d = static_cast<float>(divisor);
  for (int64_t i = 0; i < n; ++i) b[i] = Store(Load(b[i]) / d);
}

template <class Op>
ReduceFn pick(DType dtype) {
  switch (dtype) {
    case DType::kF32: return reduce_plain<float, Op>;
    case DType::kF64: return reduce_plain<double, Op>;
    case DType::kF16: return reduce_16<f16_to_float, float_to_f16, Op>;
    case DType::kBF16: return reduce_16<bf16_to_float, float_to_bf16, Op>;
    case DType::kI64: return reduce_plain<int64_t, Op>;
    case DType::kI32: return reduce_plain<int32_t, Op>;
    case DType::kU8: return reduce_plain<uint8_t, Op>;
    case DType::kI8: return reduce_plain<int8_t, Op>;
    case DType::kBool: return nullptr;
  }
  return nullptr;
}

}  // namespace

ElemType elem_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return {dtype, MPI_FLOAT, 4, "float32"};
    case DType::kF64: return {dtype, MPI_DOUBLE, 8, "float64"};
    case DType::kF16: return {dtype, MPI_UINT16_T, 2, "float16"};
    case DType::kBF16: return {dtype, MPI_UINT16_T, 2, "bfloat16"};
    case DType::kI64: return {dtype, MPI_INT64_T, 8, "int64"};
    case DType::kI32: return {dtype, MPI_INT32_T, 4, "int32"};
    case DType::kU8: return {dtype, MPI_UINT8_T, 1, "uint8"};
    case DType::kI8: return {dtype, MPI_INT8_T, 1, "int8"};
    case DType::kBool: return {dtype, MPI_UINT8_T, 1, "bool"};
  }
  throw CommError("unknown element type code " + std::to_string(static_cast<int>(dtype)));
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kAvg: return "AVG";
    case ReduceOp::kProduct: return "PRODUCT";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kMax: return "MAX";
  }
  return "?";
}

ReduceFn reduce_fn(DType dtype, ReduceOp op, const std::string& what) {
  const ElemType et = elem_type(dtype);
  const bool is_float = dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 || dtype == DType::kBF16;
  if (dtype == DType::kBool) {
    if (op == ReduceOp::kSum || op == ReduceOp::kMax) return reduce_plain<uint8_t, Or>;
    if (op == ReduceOp::kProduct || op == ReduceOp::kMin) return reduce_plain<uint8_t, And>;
  }
  switch (op) {
    case ReduceOp::kSum: return pick<Add>(dtype);
    case ReduceOp::kAvg:
      if (is_float) return pick<Add>(dtype);
      break;
    case ReduceOp::kProduct: return pick<Mul>(dtype);
    case ReduceOp::kMin: return pick<Min>(dtype);
    case ReduceOp::kMax: return pick<Max>(dtype);
  }
  throw CommError(what + ": ReduceOp." + reduce_op_name(op) + " is not supported for " + et.name +
                  " tensors (AVG needs a floating-point type)");
}

DivideFn divide_fn(DType dtype, const std::string& what) {
  switch (dtype) {
    case DType::kF32: return divide_plain<float>;
    case DType::kF64: return divide_plain<double>;
    case DType::kF16: return divide_16<f16_to_float, float_to_f16>;
    case DType::kBF16: return divide_16<bf16_to_float, float_to_bf16>;
    default: break;
  }
  throw CommError(what + ": ReduceOp.AVG is not supported for " + std::string(elem_type(dtype).name) +
                  " tensors (AVG needs a floating-point type)");
}

}  // namespace harness
