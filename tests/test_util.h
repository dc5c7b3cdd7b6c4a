// Shared by the tests: random tensors, finite-difference gradient checks in
// f64, relative-error helpers, what a call throws, and a temporary folder.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/tensor.h"
#include "fsdp/nn/init.h"
#include "fsdp/ops/ops.h"

namespace fsdp::test {

// What `f` throws: an fsdp::Error's message, a line saying so for another exception, or "" when
// it throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not an fsdp::Error: ") + e.what() + ">";
  }
  return "";
}

// A fresh folder under the system's temporary one (PREFIX_XXXXXX), removed with the object.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "fsdp_test") {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str(const std::string& sub = "ck") const { return (path / sub).string(); }
};

// Uniform values in [lo, hi), reproducible from `seed`.
inline Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64,
                            double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  nn::init_fill(nn::Init::uniform(lo, hi), seed, "test", 0, t);
  return t;
}

inline Tensor random_ids(const Shape& shape, int64_t vocab, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::i64);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int64_t>()[i] = int64_t(nn::counter_uniform(seed, uint64_t(i)) * double(vocab));
  return t;
}

inline double dot(const Tensor& a, const Tensor& b) {
  auto x = a.to_f64_vector(), y = b.to_f64_vector();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

// ||a - b|| / ||b||
inline double rel_error(const Tensor& a, const Tensor& b) {
  auto x = a.to_f64_vector(), y = b.to_f64_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// Compares `analytic` with central differences of `loss` with respect to the
// f64 tensor `x`, perturbing up to `max_checks` elements spread over x.
inline void expect_grad_matches(const std::string& what, const std::function<double()>& loss,
                                const Tensor& x, const Tensor& analytic, int64_t max_checks = 64,
                                double h = 1e-6, double tol = 1e-8) {
  ASSERT_EQ(x.dtype(), DType::f64) << what;
  ASSERT_EQ(x.shape(), analytic.shape()) << what;
  Tensor g = analytic.to(DType::f64).contiguous();
  const int64_t n = x.numel();
  const int64_t stride = std::max<int64_t>(1, n / max_checks);
  double* p = x.data<double>();
  ASSERT_TRUE(x.is_contiguous()) << what;
  int checked = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const double saved = p[i];
    p[i] = saved + h;
    const double lp = loss();
    p[i] = saved - h;
    const double lm = loss();
    p[i] = saved;
    const double numeric = (lp - lm) / (2 * h);
    const double a = g.data<double>()[i];
    EXPECT_NEAR(a, numeric, tol * std::max(1.0, std::abs(numeric))) << what << " element " << i;
    ++checked;
  }
  EXPECT_GT(checked, 0) << what;
}

// The backends' one contract (src/ops/backend.h): outputs in the storage dtype, saved
// statistics (rstd, lse) in the compute dtype: f64 for f64, f32 for f32, bf16 and f16.
inline void expect_backend_contract(Device device, DType dtype) {
  const DType stat = dtype == DType::f64 ? DType::f64 : DType::f32;
  const std::string where = device.str() + " " + std::string(dtype_name(dtype));
  Tensor x = random_tensor({6, 8}, 1, DType::f32).to(dtype).to(device);
  Tensor w = Tensor::full({8}, 1.0, dtype, device);
  auto n = ops::rmsnorm_forward(x, w, 1e-5);
  EXPECT_EQ(n.y.dtype(), dtype) << where;
  EXPECT_EQ(n.rstd.dtype(), stat) << where;
  EXPECT_EQ(n.rstd.device(), device) << where;
  Tensor qkv = random_tensor({1, 4, 3 * 16}, 2, DType::f32).to(dtype).to(device);
  auto a = ops::attention_forward(qkv, 2, true);
  EXPECT_EQ(a.out.dtype(), dtype) << where;
  EXPECT_EQ(a.lse.dtype(), stat) << where;
  EXPECT_EQ(a.lse.shape(), Shape({1, 2, 4})) << where;
  Tensor targets = Tensor::zeros({6}, DType::i64).to(device);
  auto xe = ops::cross_entropy_forward(x, targets);
  EXPECT_EQ(xe.lse.dtype(), stat) << where;
  EXPECT_EQ(xe.loss_tensor.dtype(), DType::f64) << where;
  EXPECT_EQ(ops::rmsnorm_backward(x, x, w, n.rstd, Tensor()).dtype(), dtype) << where;
}

}  // namespace fsdp::test
