// Element types and reduction operators of the typed collectives (harness.dist).
//
// MPI only moves bytes here: every reduction is done by the native layer itself, elementwise,
// in a fixed order given by the step program. float16 and bfloat16 are added (multiplied, ...) in
// float32 and rounded back to nearest even after each pairwise operation, as torch's CPU
// kernels and gloo do.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

namespace harness {

// Python takes both from harness._core (bindings.cpp exports them as DType and ReduceOp, with
// the names elem_type() and reduce_op_name() give: torch's dtype names, torch's ReduceOp names).
enum class DType : int { kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kI8, kBool };
enum class ReduceOp : int { kSum, kAvg, kProduct, kMin, kMax };
constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI64,
                                DType::kI32, DType::kU8,  DType::kI8,  DType::kBool};
constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};

// dst[i] = dst[i] (op) src[i] for n elements.
using ReduceFn = void (*)(void* dst, const void* src, int64_t n);
// buf[i] /= divisor for n elements (AVG's last step).
using DivideFn = void (*)(void* buf, int64_t n, int divisor);

struct ElemType {
  DType dtype = DType::kF32;
  MPI_Datatype mpi = MPI_FLOAT;  // what MPI moves: a type of the element's size
  int size = 4;                  // bytes per element
  const char* name = "float32";
};

ElemType elem_type(DType dtype);  // throws CommError for an unknown code
// The reduction kernel of `op` on `dtype`; throws CommError naming `what` (the operation) when
// the pair is not supported (AVG of an integer type; the sum-reduce of bool is logical or).
ReduceFn reduce_fn(DType dtype, ReduceOp op, const std::string& what);
DivideFn divide_fn(DType dtype, const std::string& what);
const char* reduce_op_name(ReduceOp op);

}  // namespace harness
