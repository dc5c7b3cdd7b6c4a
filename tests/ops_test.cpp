// Every op's forward against a direct reference and every backward against
// central finite differences in f64; bf16 storage against f32; bad inputs.
#include "fsdp/ops/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <tuple>

#include "kernels/cpu/vec_math.h"
#include "test_util.h"

namespace fsdp {
namespace {

using test::dot;
using test::expect_grad_matches;
using test::random_ids;
using test::random_tensor;
using test::rel_error;

TEST(VecMath, ExpF32IsAccurate) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.00137) {
    const double ref = std::exp(double(float(x)));
    worst = std::max(worst, std::abs(double(kernels::cpu::exp_f32(float(x))) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(kernels::cpu::exp_f32(-200.0f), 0.0f);
  EXPECT_EQ(kernels::cpu::exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(kernels::cpu::exp_f32(0.0f), 1.0f);
  EXPECT_GT(kernels::cpu::exp_f32(1000.0f), 1e38f);
}

TEST(Gemm, AllTransposesMatchNaive) {
  for (DType dt : {DType::f64, DType::f32})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t m = 5, n = 7, k = 3;
        Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 1, dt);
        Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 2, dt);
        Tensor c = random_tensor({m, n}, 3, dt);
        Tensor c0 = c.clone();
        ops::gemm(a, ta, b, tb, c, 0.5, 2.0);
        auto A = a.to_f64_vector(), B = b.to_f64_vector(), C0 = c0.to_f64_vector(),
             C = c.to_f64_vector();
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p)
              s += A[ta ? p * m + i : i * k + p] * B[tb ? j * k + p : p * n + j];
            EXPECT_NEAR(C[i * n + j], 0.5 * s + 2.0 * C0[i * n + j],
                        dt == DType::f64 ? 1e-12 : 1e-5);
          }
      }
}

TEST(Linear, ForwardAndGradients) {
  Tensor x = random_tensor({2, 3, 5}, 10), w = random_tensor({4, 5}, 11),
         b = random_tensor({4}, 12);
  Tensor r = random_tensor({2, 3, 4}, 13);
  Tensor y = ops::linear_forward(x, w, b);
  // y[0,0,j] = sum_k x[0,0,k] w[j,k] + b[j]
  for (int j = 0; j < 4; ++j) {
    double s = b.data<double>()[j];
    for (int k = 0; k < 5; ++k) s += x.data<double>()[k] * w.data<double>()[j * 5 + k];
    EXPECT_NEAR(y.data<double>()[j], s, 1e-12);
  }
  Tensor dw = Tensor::zeros(w.shape(), DType::f64), db = Tensor::zeros(b.shape(), DType::f64);
  Tensor dx = ops::linear_backward(r, x, w, dw, db);
  auto loss = [&] { return dot(ops::linear_forward(x, w, b), r); };
  expect_grad_matches("linear dx", loss, x, dx);
  expect_grad_matches("linear dw", loss, w, dw);
  expect_grad_matches("linear db", loss, b, db);
  // The backward adds into parameter gradients.
  ops::linear_backward(r, x, w, dw, db);
  Tensor dw1 = Tensor::zeros(w.shape(), DType::f64);
  ops::linear_backward(r, x, w, dw1, Tensor());
  auto v = dw.to_f64_vector(), v1 = dw1.to_f64_vector();
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], 2 * v1[i], 1e-12);
}

TEST(Embedding, ForwardAndGradient) {
  Tensor ids = random_ids({2, 6}, 5, 20);  // repeated ids exercise the scatter-add
  Tensor w = random_tensor({5, 4}, 21), r = random_tensor({2, 6, 4}, 22);
  Tensor y = ops::embedding_forward(ids, w);
  for (int i = 0; i < 12; ++i)
    for (int c = 0; c < 4; ++c)
      EXPECT_EQ(y.data<double>()[i * 4 + c], w.data<double>()[ids.data<int64_t>()[i] * 4 + c]);
  Tensor dw = Tensor::zeros(w.shape(), DType::f64);
  ops::embedding_backward(r, ids, dw);
  expect_grad_matches(
      "embedding dw", [&] { return dot(ops::embedding_forward(ids, w), r); }, w, dw);
}

TEST(RMSNorm, ForwardAndGradients) {
  Tensor x = random_tensor({3, 8}, 30), w = random_tensor({8}, 31, DType::f64, 0.5, 1.5),
         r = random_tensor({3, 8}, 32);
  const double eps = 1e-5;
  auto out = ops::rmsnorm_forward(x, w, eps);
  for (int row = 0; row < 3; ++row) {
    double ss = 0;
    for (int c = 0; c < 8; ++c) ss += x.data<double>()[row * 8 + c] * x.data<double>()[row * 8 + c];
    const double rs = 1.0 / std::sqrt(ss / 8 + eps);
    for (int c = 0; c < 8; ++c)
      EXPECT_NEAR(out.y.data<double>()[row * 8 + c],
                  x.data<double>()[row * 8 + c] * rs * w.data<double>()[c], 1e-12);
  }
  Tensor dw = Tensor::zeros(w.shape(), DType::f64);
  Tensor dx = ops::rmsnorm_backward(r, x, w, out.rstd, dw);
  auto loss = [&] { return dot(ops::rmsnorm_forward(x, w, eps).y, r); };
  expect_grad_matches("rmsnorm dx", loss, x, dx);
  expect_grad_matches("rmsnorm dw", loss, w, dw);
  EXPECT_DOUBLE_EQ(ops::default_rmsnorm_eps(DType::f32), 1.1920928955078125e-07);
  EXPECT_DOUBLE_EQ(ops::default_rmsnorm_eps(DType::f64), 2.220446049250313e-16);
}

TEST(Activation, SiluAndSwigluGradients) {
  Tensor x = random_tensor({4, 6}, 40, DType::f64, -3, 3), u = random_tensor({4, 6}, 41),
         r = random_tensor({4, 6}, 42);
  Tensor y = ops::silu_forward(x);
  for (int i = 0; i < 24; ++i) {
    const double v = x.data<double>()[i];
    EXPECT_NEAR(y.data<double>()[i], v / (1 + std::exp(-v)), 1e-14);
  }
  expect_grad_matches(
      "silu dx", [&] { return dot(ops::silu_forward(x), r); }, x, ops::silu_backward(r, x));
  auto [dg, du] = ops::swiglu_backward(r, x, u);
  auto loss = [&] { return dot(ops::swiglu_forward(x, u), r); };
  expect_grad_matches("swiglu dgate", loss, x, dg);
  expect_grad_matches("swiglu dup", loss, u, du);
}

// softmax(q k^T / sqrt(hd)) v for one (b, h), written out directly.
Tensor naive_attention(const Tensor& qkv, int64_t H, bool causal) {
  const int64_t B = qkv.size(0), T = qkv.size(1), d = qkv.size(2) / 3, hd = d / H;
  Tensor out = Tensor::zeros({B, T, d}, DType::f64);
  const double* p = qkv.data<double>();
  double* o = out.data<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(size_t(T), -INFINITY);
        double m = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if (causal && j > i) continue;
          double acc = 0;
          for (int64_t c = 0; c < hd; ++c)
            acc += p[(b * T + i) * 3 * d + h * hd + c] * p[(b * T + j) * 3 * d + d + h * hd + c];
          s[j] = acc / std::sqrt(double(hd));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < T; ++j) z += s[j] == -INFINITY ? 0 : std::exp(s[j] - m);
        for (int64_t j = 0; j < T; ++j) {
          if (s[j] == -INFINITY) continue;
          const double pj = std::exp(s[j] - m) / z;
          for (int64_t c = 0; c < hd; ++c)
            o[(b * T + i) * d + h * hd + c] += pj * p[(b * T + j) * 3 * d + 2 * d + h * hd + c];
        }
      }
  return out;
}

// B 2 x T 5, and T 300: longer than one tile of 128 query rows (the CPU kernel's scratch is
// 128 x T), so the tiles' seams, the causal key limit per tile and the dK/dV accumulation across
// tiles are checked too.
TEST(Attention, ForwardMatchesNaiveAndGradients) {
  struct Case {
    int64_t B, T;
    double tol;
    int64_t probes;
  };
  for (const Case& c : {Case{2, 5, 1e-13, 120}, Case{1, 300, 1e-12, 60}})
    for (bool causal : {false, true}) {
      const int64_t H = 2;
      Tensor qkv = random_tensor({c.B, c.T, 3 * 8}, 50 + c.T),
             r = random_tensor({c.B, c.T, 8}, 51 + c.T);
      auto a = ops::attention_forward(qkv, H, causal);
      EXPECT_LT(rel_error(a.out, naive_attention(qkv, H, causal)), c.tol)
          << "T " << c.T << " causal " << causal;
      Tensor dqkv = ops::attention_backward(r, qkv, a.out, a.lse, H, causal);
      expect_grad_matches(
          fmt::format("attention dqkv T={} causal={}", c.T, causal),
          [&] { return dot(ops::attention_forward(qkv, H, causal).out, r); }, qkv, dqkv, c.probes);
    }
}

TEST(Attention, CausalOutputIgnoresTheFuture) {
  Tensor qkv = random_tensor({1, 6, 3 * 4}, 52);
  Tensor out1 = ops::attention_forward(qkv, 1, true).out;
  Tensor qkv2 = qkv.clone();
  qkv2.narrow(1, 4, 2).fill_(7.0);  // change positions 4 and 5 only
  Tensor out2 = ops::attention_forward(qkv2, 1, true).out;
  EXPECT_EQ(rel_error(out2.narrow(1, 0, 4), out1.narrow(1, 0, 4)), 0.0);
}

// A decode step over a cache equals the causal attention's rows for those positions.
TEST(Attention, DecodeOverACacheEqualsCausalRows) {
  const int64_t T = 7, H = 2, d = 8, past = 4, n = T - past;
  Tensor qkv = random_tensor({1, T, 3 * d}, 55);
  Tensor full = ops::attention_forward(qkv, H, true).out.view({T, d});
  Tensor rows = qkv.view({T, 3 * d});
  Tensor q = rows.narrow(0, past, n).narrow(1, 0, d).contiguous();
  Tensor k = rows.narrow(1, d, d).contiguous(), v = rows.narrow(1, 2 * d, d).contiguous();
  EXPECT_LT(rel_error(ops::attention_decode(q, k, v, H, past), full.narrow(0, past, n)), 1e-13);
  Tensor out32 =
      ops::attention_decode(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), H, past);
  EXPECT_EQ(out32.dtype(), DType::f32);
  EXPECT_LT(rel_error(out32, full.narrow(0, past, n)), 1e-5);
  EXPECT_THROW(ops::attention_decode(q, k, v, H, past + 1), Error);  // k holds past + n rows
  EXPECT_THROW(ops::attention_decode(q, k, v, 3, past), Error);      // 8 is not divisible by 3
}

TEST(Attention, F32MatchesF64) {
  Tensor qkv = random_tensor({2, 16, 3 * 32}, 53), r = random_tensor({2, 16, 32}, 54);
  auto a64 = ops::attention_forward(qkv, 4, true);
  auto a32 = ops::attention_forward(qkv.to(DType::f32), 4, true);
  EXPECT_LT(rel_error(a32.out, a64.out), 1e-5);
  Tensor d64 = ops::attention_backward(r, qkv, a64.out, a64.lse, 4, true);
  Tensor d32 =
      ops::attention_backward(r.to(DType::f32), qkv.to(DType::f32), a32.out, a32.lse, 4, true);
  EXPECT_LT(rel_error(d32, d64), 1e-5);
}

TEST(Rope, RotatesPairsAndBackwardIsTranspose) {
  const int64_t H = 2, hd = 4, d = H * hd;
  Tensor qkv = random_tensor({1, 3, 3 * d}, 60), r = random_tensor({1, 3, 3 * d}, 61);
  Tensor y = qkv.clone();
  ops::rope_(y, H, 10000.0, false);
  const double* x = qkv.data<double>();
  const double* o = y.data<double>();
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < hd / 2; ++i) {
          const int64_t base = t * 3 * d + part * d + h * hd;
          const double ang = double(t) * std::pow(10000.0, -2.0 * double(i) / double(hd));
          double e0 = x[base + i], e1 = x[base + i + hd / 2];
          if (part < 2) {  // q and k rotate, v does not
            const double c = std::cos(ang), s = std::sin(ang);
            std::tie(e0, e1) = std::pair(e0 * c - e1 * s, e1 * c + e0 * s);
          }
          EXPECT_NEAR(o[base + i], e0, 1e-14);
          EXPECT_NEAR(o[base + i + hd / 2], e1, 1e-14);
        }
  Tensor dr = r.clone();
  ops::rope_(dr, H, 10000.0, true);
  expect_grad_matches(
      "rope",
      [&] {
        Tensor z = qkv.clone();
        ops::rope_(z, H, 10000.0, false);
        return dot(z, r);
      },
      qkv, dr);
}

// Grouped-query attention: a packed qkv [B, T, (H + 2 KV) hd] with each kv head repeated for the
// H / KV query heads of its group (Hugging Face's repeat_kv) gives the multi-head qkv
// [B, T, 3 H hd] that the grouped one must equal.
Tensor repeat_kv(const Tensor& qkv, int64_t H, int64_t KV) {
  const int64_t B = qkv.size(0), T = qkv.size(1), hd = qkv.size(2) / (H + 2 * KV);
  Tensor out = Tensor::empty({B, T, 3 * H * hd}, DType::f64);
  const double* src = qkv.data<double>();
  double* dst = out.data<double>();
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t from = part == 0 ? h : H + (part - 1) * KV + h / (H / KV);
        for (int64_t c = 0; c < hd; ++c)
          dst[(bt * 3 + part) * H * hd + h * hd + c] = src[bt * (H + 2 * KV) * hd + from * hd + c];
      }
  return out;
}

// The transpose of repeat_kv: a multi-head gradient summed back onto the grouped layout (dK and
// dV of a kv head are the sums over its query heads).
Tensor sum_kv(const Tensor& dmha, int64_t H, int64_t KV) {
  const int64_t B = dmha.size(0), T = dmha.size(1), hd = dmha.size(2) / (3 * H);
  Tensor out = Tensor::zeros({B, T, (H + 2 * KV) * hd}, DType::f64);
  const double* src = dmha.data<double>();
  double* dst = out.data<double>();
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t to = part == 0 ? h : H + (part - 1) * KV + h / (H / KV);
        for (int64_t c = 0; c < hd; ++c)
          dst[bt * (H + 2 * KV) * hd + to * hd + c] += src[(bt * 3 + part) * H * hd + h * hd + c];
      }
  return out;
}

// 4 query heads over 2 kv heads and over 1 (multi-query), head dim 6: the forward equals
// multi-head attention over the repeated kv heads, the backward equals its gradient summed over
// each group, and both match central differences; T 130 crosses the CPU kernel's 128-row tile.
TEST(Attention, GroupedQueryEqualsRepeatedKvAndGradients) {
  const int64_t H = 4, hd = 6;
  for (int64_t KV : {2, 1})
    for (int64_t T : {5, 130})
      for (bool causal : {false, true}) {
        const std::string what = fmt::format("kv {} T {} causal {}", KV, T, causal);
        Tensor qkv = random_tensor({2, T, (H + 2 * KV) * hd}, 80 + T + KV),
               r = random_tensor({2, T, H * hd}, 81 + T);
        auto a = ops::attention_forward(qkv, H, causal, KV);
        Tensor mha = repeat_kv(qkv, H, KV);
        auto m = ops::attention_forward(mha, H, causal);
        EXPECT_LT(rel_error(a.out, m.out), 1e-13) << what;
        EXPECT_LT(rel_error(a.lse, m.lse), 1e-13) << what;
        Tensor dqkv = ops::attention_backward(r, qkv, a.out, a.lse, H, causal, KV);
        EXPECT_EQ(dqkv.shape(), qkv.shape());
        EXPECT_LT(rel_error(dqkv, sum_kv(ops::attention_backward(r, mha, m.out, m.lse, H, causal),
                                         H, KV)),
                  1e-12)
            << what;
        expect_grad_matches(
            "gqa attention dqkv " + what,
            [&] { return dot(ops::attention_forward(qkv, H, causal, KV).out, r); }, qkv, dqkv,
            T > 100 ? 40 : 120);
      }
  // Heads must be a multiple of the kv heads, and the width (H + 2 KV) hd.
  EXPECT_THROW(ops::attention_forward(random_tensor({1, 2, 7 * 4}, 3), 3, false, 2), Error);
  EXPECT_THROW(ops::attention_forward(random_tensor({1, 2, 9 * 4}, 3), 4, false, 2), Error);
}

// Rotary on a grouped qkv rotates its H query heads and KV key heads as the multi-head rotary
// does each head, leaves the values alone, and its backward is the transpose.
TEST(Rope, GroupedQueryRotatesQueryAndKeyHeads) {
  const int64_t H = 4, KV = 2, hd = 6;
  Tensor qkv = random_tensor({2, 5, (H + 2 * KV) * hd}, 82),
         r = random_tensor({2, 5, (H + 2 * KV) * hd}, 83);
  Tensor y = qkv.clone();
  ops::rope_(y, H, 100000.0, false, 3, KV);
  Tensor m = repeat_kv(qkv, H, KV);
  ops::rope_(m, H, 100000.0, false, 3);
  EXPECT_LT(rel_error(repeat_kv(y, H, KV), m), 1e-14);
  Tensor dr = r.clone();
  ops::rope_(dr, H, 100000.0, true, 3, KV);
  expect_grad_matches(
      "gqa rope",
      [&] {
        Tensor z = qkv.clone();
        ops::rope_(z, H, 100000.0, false, 3, KV);
        return dot(z, r);
      },
      qkv, dr);
}

// A decode step over a cache of kv heads equals the grouped causal attention's rows.
TEST(Attention, GroupedQueryDecodeEqualsCausalRows) {
  const int64_t T = 7, H = 4, hd = 6, past = 4, n = T - past;
  for (int64_t KV : {2, 1}) {
    const int64_t w = (H + 2 * KV) * hd;
    Tensor qkv = random_tensor({1, T, w}, 84 + KV);
    Tensor full = ops::attention_forward(qkv, H, true, KV).out.view({T, H * hd});
    Tensor rows = qkv.view({T, w});
    Tensor q = rows.narrow(0, past, n).narrow(1, 0, H * hd).contiguous();
    Tensor k = rows.narrow(1, H * hd, KV * hd).contiguous(),
           v = rows.narrow(1, (H + KV) * hd, KV * hd).contiguous();
    EXPECT_LT(rel_error(ops::attention_decode(q, k, v, H, past), full.narrow(0, past, n)), 1e-13)
        << "kv " << KV;
  }
  // k and v of 5 columns are no whole number of head-dim-6 kv heads.
  Tensor q = random_tensor({1, 24}, 1), k = random_tensor({1, 5}, 2);
  EXPECT_THROW(ops::attention_decode(q, k, k, 4, 0), Error);
}

TEST(CrossEntropy, ValueAndGradient) {
  Tensor logits = random_tensor({6, 7}, 70, DType::f64, -2, 2);
  Tensor targets = random_ids({6}, 7, 71);
  auto out = ops::cross_entropy_forward(logits, targets);
  double expect = 0;
  for (int r = 0; r < 6; ++r) {
    double z = 0;
    for (int j = 0; j < 7; ++j) z += std::exp(logits.data<double>()[r * 7 + j]);
    expect += std::log(z) - logits.data<double>()[r * 7 + targets.data<int64_t>()[r]];
  }
  EXPECT_NEAR(out.loss, expect / 6, 1e-13);
  Tensor d = ops::cross_entropy_backward(logits, targets, out.lse, 1.0);
  expect_grad_matches(
      "cross_entropy dlogits", [&] { return ops::cross_entropy_forward(logits, targets).loss; },
      logits, d);
}

TEST(Elementwise, AddAndSumSquares) {
  Tensor a = random_tensor({3, 4}, 80), b = random_tensor({3, 4}, 81);
  Tensor c = ops::add(a, b);
  for (int i = 0; i < 12; ++i)
    EXPECT_DOUBLE_EQ(c.data<double>()[i], a.data<double>()[i] + b.data<double>()[i]);
  ops::add_(a, b);
  EXPECT_EQ(rel_error(a, c), 0.0);
  double ss = 0;
  for (double v : c.to_f64_vector()) ss += v * v;
  EXPECT_NEAR(ops::sum_squares(c), ss, 1e-12);
}

TEST(AdamW, MatchesTorchFormulaOverSteps) {
  const int64_t n = 10;
  Tensor p = random_tensor({n}, 90), m = Tensor::zeros({n}, DType::f64),
         v = Tensor::zeros({n}, DType::f64);
  std::vector<double> P = p.to_f64_vector(), M(n, 0.0), V(n, 0.0);
  ops::AdamWHyper h{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  for (int64_t step = 1; step <= 3; ++step) {
    Tensor g = random_tensor({n}, 100 + uint64_t(step));
    ops::adamw_(p, g, m, v, h, step);
    auto G = g.to_f64_vector();
    for (int64_t i = 0; i < n; ++i) {  // torch.optim.AdamW, single-tensor path
      P[i] *= 1 - h.lr * h.weight_decay;
      M[i] = 0.9 * M[i] + 0.1 * G[i];
      V[i] = 0.999 * V[i] + 0.001 * G[i] * G[i];
      const double mhat = M[i] / (1 - std::pow(0.9, double(step)));
      const double vhat = V[i] / (1 - std::pow(0.999, double(step)));
      P[i] -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
    }
  }
  auto got = p.to_f64_vector();
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], P[i], 1e-12);
}

TEST(Bf16, StorageComputesInF32) {
  Tensor x = random_tensor({8, 64}, 110, DType::f32), w = random_tensor({32, 64}, 111, DType::f32);
  Tensor ref = ops::linear_forward(x, w, Tensor());
  Tensor y = ops::linear_forward(x.to(DType::bf16), w.to(DType::bf16), Tensor());
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_LT(rel_error(y, ref), 1e-2);
  auto n = ops::rmsnorm_forward(x.to(DType::bf16), Tensor::full({64}, 1.0, DType::bf16), 1e-6);
  EXPECT_LT(rel_error(n.y, ops::rmsnorm_forward(x, Tensor::full({64}, 1.0, DType::f32), 1e-6).y),
            1e-2);
}

TEST(Backend, SavedStatisticsInTheComputeDtype) {
  for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16})
    test::expect_backend_contract(Device::cpu(), d);
}

TEST(BadInput, MessagesNameTheValue) {
  Tensor w = random_tensor({5, 4}, 120);
  Tensor ids = Tensor::from_vector<int64_t>({1, 5}, {2});
  try {
    ops::embedding_forward(ids, w);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 5 at position 1 is outside [0, 5)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ops::linear_forward(random_tensor({2, 3}, 1), random_tensor({4, 5}, 2), Tensor()),
               Error);
  try {
    ops::attention_forward(random_tensor({1, 2, 3 * 6}, 3), 4, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dim 6 is not divisible by heads 4"), std::string::npos)
        << e.what();
  }
  Tensor targets = Tensor::from_vector<int32_t>({0, 9}, {2});
  EXPECT_THROW(ops::cross_entropy_forward(random_tensor({2, 9}, 4), targets), Error);
}

}  // namespace
}  // namespace fsdp
