// Tensors (views, copies, casts), dtypes, devices and the allocator's counters.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/core/env.h"
#include "fsdp/core/meta.h"
#include "fsdp/core/tensor.h"

namespace fsdp {
namespace {

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(dtype_name(DType::f16), "f16");
  EXPECT_THROW(parse_dtype("f8"), Error);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3 * 2^-8 is halfway too: ties go up to the even 1 + 2^-6.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTrips) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.1f}) {
    float back = f16_to_f32(f32_to_f16(v));
    EXPECT_NEAR(back, v, std::abs(v) * 1e-3 + 1e-12) << v;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST(Device, Parse) {
  EXPECT_TRUE(parse_device("cpu").is_cpu());
  EXPECT_EQ(parse_device("cuda:3").index, 3);
  EXPECT_EQ(parse_device("cuda:1").str(), "cuda:1");
  EXPECT_THROW(parse_device("tpu"), Error);
  EXPECT_THROW(parse_device("cuda:x"), Error);
}

// The meta device (fsdp/core/meta.h): shapes without storage; its allocator models the CPU's
// caching rules and names each block's term; copies in do nothing, copies out read zeros.
TEST(Meta, TensorsHaveShapesAndTheAllocatorModelsTheCpusCache) {
  EXPECT_TRUE(parse_device("meta").is_meta());
  EXPECT_EQ(Device::meta().str(), "meta");
  meta::reset({.device = Device::cpu(), .cpu_cache_bytes = 4 << 20});
  {
    Tensor a = Tensor::empty({256, 1024}, DType::f32, Device::meta());  // 1 MiB
    EXPECT_TRUE(a.device().is_meta());
    EXPECT_EQ(a.nbytes(), size_t(1) << 20);
    a.fill_(3.0);                                         // nothing to fill
    a.copy_(Tensor::full({256, 1024}, 1.0, DType::f32));  // nothing to copy into
    const Tensor back = a.to(Device::cpu());              // reads zeros
    EXPECT_EQ(back.to_f64_vector()[17], 0.0);
    EXPECT_EQ(meta::stats().live, 1 << 20);
  }
  EXPECT_EQ(meta::stats().live, 0);
  {
    const meta::TermScope params(meta::Term::params);
    Tensor b = Tensor::empty({256, 1024}, DType::f32, Device::meta());  // the freed block, reused
    Tensor c = Tensor::empty({1000}, DType::f32, Device::meta());       // small: malloc'd, 64 B
    const meta::Stats st = meta::stats();
    EXPECT_EQ(st.peak, (1 << 20) + 4032);  // resident: one 1 MiB block and c's granules
    EXPECT_EQ(st.at_peak[size_t(meta::Term::params)], (1 << 20) + 4000);
    EXPECT_EQ(st.cache_at_peak, 32);  // the rounding
    EXPECT_THROW(meta::reset({}), Error) << "a reset while meta tensors live";
  }
  // Planning for CUDA: live bytes, no page model.
  meta::reset({.device = Device::cuda(0)});
  Tensor d = Tensor::empty({4}, DType::f32, Device::meta());
  EXPECT_EQ(meta::stats().peak, 16);
  EXPECT_EQ(meta::target().device, Device::cuda(0));
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  Tensor row = t.select(1);
  EXPECT_EQ(row.shape(), Shape({4}));
  EXPECT_EQ(row.data<float>()[0], 4.0f);
  row.fill_(-1.0);
  EXPECT_EQ(t.data<float>()[5], -1.0f);  // the view wrote through
  Tensor cols = t.narrow(1, 1, 2);       // [3, 2], not contiguous
  EXPECT_FALSE(cols.is_contiguous());
  Tensor c = cols.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_f64_vector(), (std::vector<double>{1, 2, -1, -1, 9, 10}));
  Tensor tr = t.transpose(0, 1).contiguous();
  EXPECT_EQ(tr.shape(), Shape({4, 3}));
  EXPECT_EQ(tr.to_f64_vector()[1], -1.0);  // t[1][0]
  EXPECT_EQ(t.view({2, -1}).shape(), Shape({2, 6}));
  EXPECT_EQ(t.slice(1, 3).shape(), Shape({2, 4}));
  EXPECT_THROW(cols.view({6}), Error);
  EXPECT_EQ(cols.reshape({6}).numel(), 6);
  EXPECT_THROW(t.view({5, 3}), Error);
  EXPECT_THROW(t.narrow(0, 2, 2), Error);
}

TEST(Tensor, CastsBetweenAllDtypes) {
  Tensor t = Tensor::from_vector<double>({1.5, -2.0, 3.25, 1000.0}, {4});
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    auto back = t.to(d).to(DType::f64).to_f64_vector();
    if (d == DType::i32 || d == DType::i64) {
      EXPECT_EQ(back, (std::vector<double>{1.0, -2.0, 3.0, 1000.0})) << dtype_name(d);
    } else {
      EXPECT_EQ(back, t.to_f64_vector()) << dtype_name(d);  // all exactly representable
    }
  }
  Tensor strided = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);
  EXPECT_EQ(strided.to(DType::bf16).to_f64_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
}

TEST(Allocator, CountsCurrentAndPeak) {
  Allocator& a = allocator_for(Device::cpu());
  a.reset_peak();
  const int64_t before = a.stats().current;
  {
    Tensor t = Tensor::empty({1024, 256}, DType::f32);  // 1 MiB
    EXPECT_EQ(a.stats().current - before, 1 << 20);
    Tensor view = t.slice(0, 10);
    EXPECT_EQ(a.stats().current - before, 1 << 20);  // views allocate nothing
  }
  EXPECT_EQ(a.stats().current, before);
  EXPECT_GE(a.stats().peak - before, 1 << 20);
  a.reset_peak();
  EXPECT_EQ(a.stats().peak, a.stats().current);
}

// The CPU allocator's cache, and the meta allocator's model of it (the memory plan): a request
// takes a cached block up to a quarter larger; a block no allocation took during a whole step is
// released at the step's end. Both run the same script and hold the same bytes beyond the live
// requests after each move.
TEST(Allocator, CacheTakesCloseSizesAndReleasesWhatAStepDidNotTake) {
  meta::reset({.device = Device::cpu(), .cpu_cache_bytes = int64_t(1) << 30});
  const auto script = [](Device d) {
    Allocator& a = allocator_for(d);
    a.empty_cache();
    const auto cached = [&] { return a.stats().reserved - a.stats().current; };
    const auto bytes = [&](int64_t n) { return Tensor::empty({n / 4}, DType::f32, d); };
    std::vector<int64_t> seen;
    const void* first = nullptr;
    {
      const Tensor t = bytes(1 << 20);
      first = t.raw_data();
    }
    seen.push_back(cached());  // 1 MiB cached
    {
      const Tensor t = bytes(900 << 10);  // within a quarter: takes the 1 MiB block
      if (d.is_cpu()) EXPECT_EQ(t.raw_data(), first);
      seen.push_back(cached());  // reserved beyond the request: the block's last 124 KiB
    }
    seen.push_back(cached());  // the 1 MiB block again, not a 900 KiB one
    { const Tensor t = bytes(512 << 10); }  // more than a quarter smaller: a fresh block
    seen.push_back(cached());               // 1.5 MiB
    a.end_step();                           // both were cached during this step: kept
    seen.push_back(cached());
    { const Tensor t = bytes(1 << 20); }  // taken and cached again
    a.end_step();                         // the 512 KiB block sat out a whole step: released
    seen.push_back(cached());
    a.end_step();  // and the 1 MiB block now
    seen.push_back(cached());
    return seen;
  };
  const std::vector<int64_t> want = {1 << 20, 124 << 10, 1 << 20, 3 << 19, 3 << 19, 1 << 20, 0};
  EXPECT_EQ(script(Device::cpu()), want);
  EXPECT_EQ(script(Device::meta()), want);
}

TEST(Device, CudaTensorsAreRefusedWithoutCuda) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
#ifdef FSDP_WITH_CUDA
  EXPECT_THROW(Tensor::empty({4}, DType::f32, Device::cuda(0)), Error);  // built, but no device
#else
  try {
    Tensor::empty({4}, DType::f32, Device::cuda(0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA in this build"), std::string::npos) << e.what();
  }
#endif
}

TEST(Env, KnobsAreDeclared) {
  EXPECT_FALSE(env_knobs().empty());
  EXPECT_THROW(env_str("FSDP_NOT_A_KNOB"), Error);
}

TEST(Error, MessageNamesWhereItFailed) {
  try {
    FSDP_CHECK(1 + 1 == 3, "[test] value {} is wrong", 42);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("[test] value 42 is wrong", 0), 0u) << m;
    EXPECT_NE(m.find("core_test.cpp"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace fsdp
