// The CUDA part of the build: device tensors, casts and adds against the CPU.
// Skips with "no CUDA device" where no GPU is visible (or CUDA is not built).
#include <gtest/gtest.h>

#include "fsdp/core/allocator.h"
#include "fsdp/ops/ops.h"
#include "test_util.h"

namespace fsdp {
namespace {

#define REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

TEST(Cuda, CastRoundTripMatchesCpu) {
  REQUIRE_CUDA();
  Tensor x = test::random_tensor({1000}, 1, DType::f32, -4, 4);
  for (DType d : {DType::bf16, DType::f16, DType::f64}) {
    Tensor on_gpu = x.to(Device::cuda(0)).to(d);
    EXPECT_EQ(on_gpu.device(), Device::cuda(0));
    EXPECT_EQ(on_gpu.to(Device::cpu()).to_f64_vector(), x.to(d).to_f64_vector()) << dtype_name(d);
  }
}

TEST(Cuda, AddMatchesCpuAndPoisonIsOverwritten) {
  REQUIRE_CUDA();
  Tensor a = test::random_tensor({4097}, 2, DType::f32), b = test::random_tensor({4097}, 3, DType::f32);
  Tensor ga = a.to(Device::cuda(0)), gb = b.to(Device::cuda(0));
  Tensor out = ops::add(ga, gb);
  EXPECT_LT(test::rel_error(out.to(Device::cpu()), ops::add(a, b)), 1e-7);
  Tensor bf = ops::add(ga.to(DType::bf16), gb.to(DType::bf16));
  EXPECT_LT(test::rel_error(bf.to(Device::cpu()), ops::add(a, b)), 1e-2);
}

TEST(Cuda, AllocatorCounts) {
  REQUIRE_CUDA();
  const int64_t before = memory_stats(Device::cuda(0)).current;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::f32, Device::cuda(0));
    EXPECT_EQ(memory_stats(Device::cuda(0)).current - before, 4 << 20);
  }
  EXPECT_EQ(memory_stats(Device::cuda(0)).current, before);
}

TEST(Cuda, OpsWithoutAKernelSayWhich) {
  REQUIRE_CUDA();
  Tensor x = test::random_tensor({2, 8}, 4, DType::f32).to(Device::cuda(0));
  EXPECT_THROW(ops::silu_forward(x), Error);
}

}  // namespace
}  // namespace fsdp
