// One table of op cases, in the spirit of ggml's test-backend-ops: each case is one op at one
// shape, with its dtypes, how to run its forward and backward through the public ops API, a
// direct f64 reference where one is written, and its FLOP and byte cost by the formulas the
// profiler records (src/ops/cost.h). ops_test (CPU) enumerates it: every case's forward against
// its reference, its backward against f64 central differences, its other dtypes against f64, its
// cost against the profiler's records, and every op of src/ops/backend.h covered by some case.
// cuda_test runs every case on CUDA against the CPU in f32 and bf16. fsdp-bench-kernels
// (bench/gpu_kernels.cpp) times perf_cases() at a model's shapes on CUDA, each forward and
// backward beside its floor from these costs; ops_test runs perf_cases() on the CPU at a small
// shape. A new op is one builder here (and its line in op_cases() and, for the bench,
// perf_cases()) plus its kernels. No GoogleTest here: the benchmark compiles this file in.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/tensor.h"
#include "src/ops/cost.h"

namespace fsdp::test {

// How the backward treats an input: no gradient; a gradient it returns (dx); or one it adds
// into a buffer the caller owns (a parameter's dw, the backward's `+=`).
enum class Grad { none, returned, accumulated };

// One input: a float tensor uniform in [lo, hi), or token ids in [0, vocab) when vocab > 0.
struct OpInput {
  Shape shape;
  double lo = -1, hi = 1;
  Grad grad = Grad::none;
  int64_t vocab = 0;
};

// What a forward leaves: the outputs (compared across backends) and what it saved for the
// backward (rstd, lse: not compared, the backend contract checks their dtypes).
struct OpRun {
  std::vector<Tensor> out, saved;
};

// What a backward is given. dout is the cotangent of out[0] (dout_scalar its value where out[0]
// is one number, read before the call so that a timed backward never reads the device); acc
// holds the accumulated gradients, one per Grad::accumulated input in order.
struct BackwardArgs {
  const std::vector<Tensor>& in;
  const OpRun& fwd;
  const Tensor& dout;
  double dout_scalar;
  const std::vector<Tensor>& acc;
};

struct OpCase {
  std::string op;    // the family: "attention"
  std::string what;  // this case: "attention [2, 5, 24] h2 causal"
  std::vector<std::string_view> covers;  // the ops of src/ops/backend.h it runs
  std::vector<DType> dtypes;             // float dtypes it runs in (ids stay integer)
  std::vector<OpInput> inputs;
  // in_place: an in-place op may write its inputs (the benchmark's repeated calls) instead of
  // a copy of them (the tests, which call it again on the same inputs).
  std::function<OpRun(const std::vector<Tensor>& in, bool in_place)> forward;
  // Returns the Grad::returned gradients, in input order. Empty: the op has no backward.
  std::function<std::vector<Tensor>(const BackwardArgs&)> backward;
  // out in f64 from f64 inputs, written out directly. Empty: checked otherwise (ops_test's
  // special tests, or against f64 only in other dtypes).
  std::function<std::vector<Tensor>(const std::vector<Tensor>& in)> reference;
  double ref_tol = 1e-12;  // ||out - reference|| / ||reference||
  int64_t fd_probes = 64;  // elements perturbed per gradient
  double tol_f32 = 1e-5, tol_half = 1e-2;  // against f64 (CPU) or against the CPU (CUDA)
  // The FLOPs and bytes of everything forward and backward run, by src/ops/cost.h.
  std::function<ops::cost::Cost(const std::vector<Tensor>& in, const OpRun& fwd)> forward_cost;
  std::function<ops::cost::Cost(const BackwardArgs&)> backward_cost;
};

// The correctness cases: small shapes that reach each kernel's seams (tiles, grids, groups).
std::vector<OpCase> op_cases();

// A model's shapes for the benchmark.
struct ModelShape {
  int64_t batch = 8, seq = 1024, dim = 2048, heads = 16, vocab = 32000;
  int64_t shard = int64_t(64) << 20;  // an FSDP flat shard's parameters (AdamW, copy_segments)
};
// The benchmark's cases at a model's shapes (bf16 activations; f32 optimizer state).
std::vector<OpCase> perf_cases(const ModelShape& m);

// The case's inputs on the CPU: floats drawn in f64 (reproducible from the case's name and the
// input's index), then cast to `dtype`; ids in `ids_dtype`.
std::vector<Tensor> make_inputs(const OpCase& c, DType dtype, DType ids_dtype = DType::i64);

// The cotangent of out[0]: uniform in [-1, 1), rounded through `through`, in out[0]'s dtype and
// device.
Tensor make_dout(const OpCase& c, const Tensor& out0, DType through = DType::f64);

// The accumulated gradients' buffers, each filled with `value`: f64 for f64 inputs, else f32
// (FSDP's reduce dtype), on the inputs' device.
std::vector<Tensor> make_acc(const OpCase& c, const std::vector<Tensor>& in, double value);

// Forward, then backward where there is one. grads: every input's gradient in input order
// (undefined for Grad::none), the accumulated ones starting at acc_init.
struct CaseResult {
  OpRun fwd;
  Tensor dout;
  std::vector<Tensor> grads;
};
// dout_through: the cotangent's values are rounded through this dtype first, so that a run in
// f32 sees the cotangent a bf16 run it is compared with does.
CaseResult run_case(const OpCase& c, const std::vector<Tensor>& in, double acc_init,
                    DType dout_through = DType::f64);

}  // namespace fsdp::test
