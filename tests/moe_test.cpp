// nn::MoE: its forward against a per-token, per-expert loop written here (transformers' form), its
// every gradient (input, router, each expert's weights) and the router loss's against float64
// central finite differences for both routers, with and without norm_topk_prob; the router loss
// over several layers as transformers' load_balancing_loss_func concatenates them; an expert with
// no tokens; two calls in flight; the meta device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/tensor.h"
#include "fsdp/nn/module.h"
#include "fsdp/nn/loss.h"
#include "fsdp/nn/moe.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/ops.h"
#include "test_util.h"

namespace fsdp {
namespace {

constexpr int64_t kDim = 6, kHidden = 5, kExperts = 4, kRows = 7;

nn::MoEOptions options(nn::RouterKind router, bool norm, int64_t k = 2) {
  return {.experts = kExperts, .top_k = k, .hidden = kHidden, .router = router,
          .norm_topk_prob = norm};
}

// Random weights, larger than the default init so that the router's choices are well apart.
void randomize(nn::Module& m, uint64_t seed) {
  for (auto& [name, p] : m.named_parameters())
    p->data.copy_(test::random_tensor(p->shape, seed++, DType::f64));
}

// The block as transformers' Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock computes it: for each
// token, softmax, the top k (ties to the lower index), the weights, each chosen expert's SwiGLU.
std::vector<double> reference(nn::MoE& m, const Tensor& x) {
  const nn::MoEOptions& o = m.options();
  const auto g = m.parameter("gate.weight").data.to_f64_vector();
  const auto wg = m.parameter("experts.gate_proj").data.to_f64_vector();
  const auto wu = m.parameter("experts.up_proj").data.to_f64_vector();
  const auto wd = m.parameter("experts.down_proj").data.to_f64_vector();
  const auto xv = x.to_f64_vector();
  const int64_t N = x.numel() / kDim, E = o.experts, H = o.hidden;
  std::vector<double> out(size_t(N * kDim), 0.0);
  for (int64_t t = 0; t < N; ++t) {
    const double* xt = &xv[size_t(t * kDim)];
    std::vector<double> l(static_cast<size_t>(E)), p(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t d = 0; d < kDim; ++d) l[size_t(e)] += g[size_t(e * kDim + d)] * xt[d];
    const double mx = *std::max_element(l.begin(), l.end());
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += p[size_t(e)] = std::exp(l[size_t(e)] - mx);
    for (double& v : p) v /= s;
    std::vector<int> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    double sum = 0;
    for (int64_t j = 0; j < o.top_k; ++j) sum += p[size_t(idx[size_t(j)])];
    for (int64_t j = 0; j < o.top_k; ++j) {
      const int e = idx[size_t(j)];
      double w = p[size_t(e)];
      if (o.norm_topk_prob || o.router == nn::RouterKind::topk_softmax) w /= sum;
      std::vector<double> a(static_cast<size_t>(H));
      for (int64_t h = 0; h < H; ++h) {
        double gh = 0, uh = 0;
        for (int64_t d = 0; d < kDim; ++d) {
          gh += wg[size_t((e * H + h) * kDim + d)] * xt[d];
          uh += wu[size_t((e * H + h) * kDim + d)] * xt[d];
        }
        a[size_t(h)] = gh / (1 + std::exp(-gh)) * uh;
      }
      for (int64_t d = 0; d < kDim; ++d) {
        double y = 0;
        for (int64_t h = 0; h < H; ++h) y += wd[size_t((e * kDim + d) * H + h)] * a[size_t(h)];
        out[size_t(t * kDim + d)] += w * y;
      }
    }
  }
  return out;
}

// sum(mask * moe(x)) + the router loss of this one call, and its gradients by backward.
struct Probe {
  nn::MoE& m;
  Tensor x, mask;
  nn::RouterLossOptions loss;
  double forward() {
    Tensor y = m.forward(x);
    nn::RouterTotals t;
    t.add(*m.last_call());
    return test::dot(y, mask) + nn::router_aux_loss(t, loss).value;
  }
  Tensor backward() {  // after forward(): its gradients
    nn::RouterTotals t;
    t.add(*m.last_call());
    m.set_router_grad(nn::router_aux_loss(t, loss).grad);
    return m.backward(mask);
  }
};

void expect_every_gradient(nn::MoE& m, const Tensor& x, const nn::RouterLossOptions& loss) {
  auto flat = nn::materialize(m, DType::f64, 3);
  randomize(m, 40);
  Probe probe{m, x, test::random_tensor(x.shape(), 9, DType::f64), loss};
  flat.grads.zero_();
  probe.forward();
  const Tensor dx = probe.backward().clone();
  EXPECT_EQ(m.saved_records(), 0u);
  auto f = [&] { return probe.forward(); };
  test::expect_grad_matches("x", f, x, dx, 64, 1e-6, 1e-7);
  for (auto& [name, p] : m.named_parameters())
    test::expect_grad_matches(name, f, p->data, p->grad.clone(), 200, 1e-6, 1e-7);
}

TEST(MoE, ForwardIsThePerTokenLoopOfTransformers) {
  for (auto [router, norm] : {std::pair{nn::RouterKind::softmax_topk, false},
                              {nn::RouterKind::softmax_topk, true},
                              {nn::RouterKind::topk_softmax, false}}) {
    nn::MoE m(kDim, options(router, norm));
    nn::materialize(m, DType::f64, 3);
    randomize(m, 40);
    Tensor x = test::random_tensor({1, kRows, kDim}, 8, DType::f64);
    const std::vector<double> want = reference(m, x);
    const std::vector<double> got = m.forward(x).to_f64_vector();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
  }
}

// A token's output depends on its own rows only: the first rows of a batch give, bit for bit, what
// they give as a batch of their own (so a token's result does not depend on the world size), in
// f64 and bf16.
TEST(MoE, ATokensOutputIsItsOwnBitForBit) {
  for (DType dt : {DType::f64, DType::bf16}) {
    nn::MoE m(kDim, options(nn::RouterKind::softmax_topk, true));
    auto flat = nn::materialize(m, dt, 3);
    randomize(m, 40);
    Tensor x = test::random_tensor({kRows, kDim}, 8, DType::f64).to(dt);
    const std::vector<double> all = m.forward(x).to_f64_vector();
    m.backward(Tensor::zeros({kRows, kDim}, dt));
    const int64_t few = 3;
    const std::vector<double> part = m.forward(x.slice(0, few).contiguous()).to_f64_vector();
    m.backward(Tensor::zeros({few, kDim}, dt));
    ASSERT_EQ(part.size(), size_t(few * kDim));
    EXPECT_EQ(part, std::vector<double>(all.begin(), all.begin() + few * kDim)) << dtype_name(dt);
  }
}

// In f32 (and bf16) the layer computes as in f64 up to the dtype's rounding; backward too.
TEST(MoE, LowerPrecisionsFollowF64) {
  std::vector<double> out[3], dx[3];
  int i = 0;
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    nn::MoE m(kDim, options(nn::RouterKind::softmax_topk, true));
    nn::materialize(m, dt, 3);
    randomize(m, 40);
    Tensor x = test::random_tensor({kRows, kDim}, 8, DType::f64).to(dt);
    Tensor y = m.forward(x);
    EXPECT_EQ(y.dtype(), dt);
    out[i] = y.to_f64_vector();
    dx[i++] = m.backward(test::random_tensor({kRows, kDim}, 9, DType::f64).to(dt)).to_f64_vector();
  }
  for (size_t j = 0; j < out[0].size(); ++j) {
    EXPECT_NEAR(out[1][j], out[0][j], 1e-5 * std::max(1.0, std::abs(out[0][j])));
    EXPECT_NEAR(out[2][j], out[0][j], 0.1 * std::max(1.0, std::abs(out[0][j])));
    EXPECT_NEAR(dx[1][j], dx[0][j], 1e-5 * std::max(1.0, std::abs(dx[0][j])));
  }
}

TEST(MoE, GradientsMatchFiniteDifferences) {
  struct Case {
    nn::RouterKind router;
    bool norm;
    double aux, z;
  };
  for (const Case& c : {Case{nn::RouterKind::softmax_topk, false, 0.3, 0},
                        Case{nn::RouterKind::softmax_topk, true, 0.3, 0.1},
                        Case{nn::RouterKind::topk_softmax, false, 0.3, 0.1},
                        Case{nn::RouterKind::softmax_topk, true, 0, 0}}) {
    SCOPED_TRACE(fmt::format("router {} norm {} aux {} z {}", int(c.router), c.norm, c.aux, c.z));
    nn::MoE m(kDim, options(c.router, c.norm));
    Tensor x = test::random_tensor({kRows, kDim}, 8, DType::f64);
    expect_every_gradient(m, x, {.experts = kExperts, .aux_coef = c.aux, .z_coef = c.z});
  }
}

// Qwen3-MoE's router with norm_topk_prob and Mixtral's are the same function (softmax over the
// k logits = the k probabilities over their sum): the same output and gradients.
TEST(MoE, MixtralsRouterIsQwensNormalized) {
  Tensor x = test::random_tensor({kRows, kDim}, 8, DType::f64);
  std::vector<double> out[2], grads[2];
  int i = 0;
  for (auto router : {nn::RouterKind::softmax_topk, nn::RouterKind::topk_softmax}) {
    nn::MoE m(kDim, options(router, router == nn::RouterKind::softmax_topk));
    auto flat = nn::materialize(m, DType::f64, 3);
    randomize(m, 40);
    flat.grads.zero_();
    Tensor y = m.forward(x);
    out[i] = y.to_f64_vector();
    m.backward(test::random_tensor(y.shape(), 9, DType::f64));
    grads[i++] = flat.grads.to_f64_vector();
  }
  for (size_t j = 0; j < out[0].size(); ++j) EXPECT_NEAR(out[0][j], out[1][j], 1e-13);
  for (size_t j = 0; j < grads[0].size(); ++j) EXPECT_NEAR(grads[0][j], grads[1][j], 1e-12);
}

// transformers' load_balancing_loss_func over two layers: their logits concatenated, so
// E * sum_e mean(onehot) mean(p) over all rows together, not the sum of each layer's.
TEST(MoE, RouterLossConcatenatesTheLayers) {
  nn::MoE a(kDim, options(nn::RouterKind::softmax_topk, true));
  nn::MoE b(kDim, options(nn::RouterKind::softmax_topk, true));
  nn::materialize(a, DType::f64, 3);
  nn::materialize(b, DType::f64, 4);
  randomize(a, 40);
  randomize(b, 80);
  Tensor xa = test::random_tensor({kRows, kDim}, 8, DType::f64);
  Tensor xb = test::random_tensor({kRows + 2, kDim}, 9, DType::f64);
  a.forward(xa);
  b.forward(xb);
  nn::RouterTotals t;
  t.add(*a.last_call());
  t.add(*b.last_call());
  EXPECT_EQ(nn::RouterTotals::from_vector(t.as_vector()).as_vector(), t.as_vector());
  // Written out from the logits, as transformers does.
  std::vector<std::vector<double>> probs;
  for (auto [m, x] : {std::pair<nn::MoE*, Tensor>{&a, xa}, {&b, xb}}) {
    const auto l = ops::linear_forward(x, m->parameter("gate.weight").data, Tensor()).to_f64_vector();
    for (size_t r = 0; r < l.size() / kExperts; ++r) {
      std::vector<double> p(kExperts);
      double s = 0;
      for (int e = 0; e < kExperts; ++e) s += p[size_t(e)] = std::exp(l[r * kExperts + size_t(e)]);
      for (double& v : p) v /= s;
      probs.push_back(p);
    }
  }
  const double T = double(probs.size());
  std::vector<double> tokens(kExperts, 0.0), mean_p(kExperts, 0.0);
  for (const auto& p : probs) {
    std::vector<int> idx(kExperts);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int i, int j) { return p[size_t(i)] > p[size_t(j)]; });
    for (int j = 0; j < 2; ++j) tokens[size_t(idx[size_t(j)])] += 1 / T;
    for (int e = 0; e < kExperts; ++e) mean_p[size_t(e)] += p[size_t(e)] / T;
  }
  double want = 0;
  for (int e = 0; e < kExperts; ++e) want += tokens[size_t(e)] * mean_p[size_t(e)];
  want *= kExperts;
  const double got = nn::router_aux_loss(t, {.experts = kExperts, .aux_coef = 1}).value;
  EXPECT_NEAR(got, want, 1e-14);
  nn::RouterTotals only_a;
  only_a.add(*a.last_call());
  nn::RouterTotals only_b;
  only_b.add(*b.last_call());
  const double per_layer = nn::router_aux_loss(only_a, {.experts = kExperts, .aux_coef = 1}).value +
                           nn::router_aux_loss(only_b, {.experts = kExperts, .aux_coef = 1}).value;
  EXPECT_GT(std::abs(per_layer - got), 1e-3);  // not the sum of each layer's
}

// Expert 3 wins no token (its router row points away from every input): dropless still, its
// weights get an exact zero gradient, and the rest match finite differences.
TEST(MoE, AnExpertWithNoTokens) {
  nn::MoE m(kDim, options(nn::RouterKind::softmax_topk, true));
  auto flat = nn::materialize(m, DType::f64, 3);
  Tensor x = test::random_tensor({kRows, kDim}, 8, DType::f64);
  auto setup = [&] {
    randomize(m, 40);
    Tensor g = m.parameter("gate.weight").data;
    for (int64_t d = 0; d < kDim; ++d)  // logit 3 = -100 * sum(x): x's rows sum far from 0 below
      g.select(3).narrow(0, d, 1).fill_(-100.0);
    double* px = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) px[i] = std::abs(px[i]) + 0.1;
  };
  setup();
  flat.grads.zero_();
  Probe probe{m, x, test::random_tensor(x.shape(), 9, DType::f64),
              {.experts = kExperts, .aux_coef = 0.3, .z_coef = 0.1}};
  probe.forward();
  ASSERT_EQ(m.last_call()->pairs[3], 0.0);
  EXPECT_EQ(m.last_call()->pairs[0] + m.last_call()->pairs[1] + m.last_call()->pairs[2],
            double(2 * kRows));
  const Tensor dx = probe.backward().clone();
  for (const char* n : {"experts.gate_proj", "experts.up_proj", "experts.down_proj"})
    for (double v : m.parameter(n).grad.select(3).to_f64_vector()) EXPECT_EQ(v, 0.0) << n;
  auto f = [&] { return probe.forward(); };
  test::expect_grad_matches("x", f, x, dx, 64, 1e-6, 1e-7);
  for (auto& [name, p] : m.named_parameters())
    test::expect_grad_matches(name, f, p->data, p->grad.clone(), 200, 1e-6, 1e-7);
}

// Two calls in flight (microbatches 0 and 1, each with its router gradient), backward in either
// order: each backward takes its own call's record and gradient; the sums equal one call each.
TEST(MoE, TwoCallsInFlight) {
  nn::MoE m(kDim, options(nn::RouterKind::softmax_topk, true));
  auto flat = nn::materialize(m, DType::f64, 3);
  randomize(m, 40);
  const nn::RouterLossOptions loss{.experts = kExperts, .aux_coef = 0.3, .z_coef = 0.1};
  const Tensor x[2] = {test::random_tensor({kRows, kDim}, 8, DType::f64),
                       test::random_tensor({kRows + 3, kDim}, 18, DType::f64)};
  const Tensor mask[2] = {test::random_tensor({kRows, kDim}, 9, DType::f64),
                          test::random_tensor({kRows + 3, kDim}, 19, DType::f64)};
  std::vector<double> single[2], dx_single[2];
  for (int i : {0, 1}) {
    flat.grads.zero_();
    Probe p{m, x[i], mask[i], loss};
    p.forward();
    dx_single[i] = p.backward().to_f64_vector();
    single[i] = flat.grads.to_f64_vector();
  }
  for (bool reverse : {false, true}) {
    flat.grads.zero_();
    for (int i : {0, 1}) {
      const nn::BatchContextScope mb(m, {.microbatch = i});
      Probe{m, x[i], mask[i], loss}.forward();
      nn::RouterTotals t;
      t.add(*m.last_call());
      m.set_router_grad(nn::router_aux_loss(t, loss).grad);
    }
    EXPECT_EQ(m.saved_records(), 2u);
    for (int n = 0; n < 2; ++n) {
      const int i = reverse ? 1 - n : n;
      const nn::BatchContextScope mb(m, {.microbatch = i});
      const std::vector<double> dx = m.backward(mask[i]).to_f64_vector();
      ASSERT_EQ(dx.size(), dx_single[i].size());
      for (size_t j = 0; j < dx.size(); ++j) EXPECT_NEAR(dx[j], dx_single[i][j], 1e-13);
    }
    EXPECT_EQ(m.saved_records(), 0u);
    const std::vector<double> g = flat.grads.to_f64_vector();
    for (size_t j = 0; j < g.size(); ++j) EXPECT_NEAR(g[j], single[0][j] + single[1][j], 1e-12);
  }
}

// The memory plan runs the layer on the meta device: shapes and allocations, no values.
TEST(MoE, RunsOnTheMetaDevice) {
  nn::MoE m(kDim, options(nn::RouterKind::softmax_topk, true));
  nn::materialize(m, DType::f32, 3, Device::meta());
  Tensor x = Tensor::empty({2, kRows, kDim}, DType::f32, Device::meta());
  Tensor y = m.forward(x);
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_TRUE(y.device().is_meta());
  Tensor dx = m.backward(Tensor::empty(x.shape(), DType::f32, Device::meta()));
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(m.saved_records(), 0u);
}

TEST(MoE, RefusesBadOptionsByName) {
  EXPECT_THROW(nn::MoE(kDim, options(nn::RouterKind::softmax_topk, false, 5)), Error);
  EXPECT_THROW(nn::MoE(kDim, options(nn::RouterKind::topk_softmax, true)), Error);
  nn::MoE m(kDim, options(nn::RouterKind::softmax_topk, false));
  nn::materialize(m, DType::f64, 3);
  try {
    m.forward(Tensor::zeros({3, kDim + 1}, DType::f64));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no last dim 6"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- in the Transformer

// A Qwen3-MoE-shaped model: layer 0 dense (mlp_only_layers), layers 1 and 2 MoE, GQA, QK-norm.
nn::TransformerConfig moe_model() {
  nn::TransformerConfig c;
  c.arch = nn::Arch::decoder;
  c.vocab = 13, c.dim = kDim, c.layers = 3, c.heads = 2, c.kv_heads = 1, c.head_dim = 4;
  c.seq = 5, c.batch = 2, c.ffn_hidden = 7, c.qk_norm = true, c.norm_eps = 1e-6;
  c.moe = {.experts = kExperts, .top_k = 2, .hidden = kHidden, .norm_topk_prob = true,
           .dense_layers = {0}, .aux_coef = 0.05, .z_coef = 0.01};
  return c;
}

// The fused loss of a batch: its chunks' sum, the router loss among them.
double fused_loss(nn::Transformer& m, const Tensor& tokens, const Tensor& targets,
                  double scale = 1, bool backward = false) {
  const nn::BatchContextScope ctx(m, {.targets = targets, .loss_scale = scale});
  double sum = 0;
  for (double part : m.forward(tokens).to_f64_vector()) sum += part;
  if (backward) m.backward(Tensor());
  return sum;
}

TEST(MoEModel, ConfigCountsAndNames) {
  const nn::TransformerConfig c = moe_model();
  nn::Transformer m(c);
  EXPECT_EQ(c.num_parameters(), m.num_parameters());
  EXPECT_EQ(m.moe_layers().size(), 2u);
  EXPECT_EQ(c.active_parameters(), c.num_parameters() - 2 * 3 * (kExperts - 2) * kHidden * kDim);
  EXPECT_EQ(m.parameter("layers.1.ffn.experts.gate_proj").shape,
            (Shape{kExperts, kHidden, kDim}));
  EXPECT_EQ(m.parameter("layers.1.ffn.gate.weight").shape, (Shape{kExperts, kDim}));
  EXPECT_EQ(m.parameter("layers.0.ffn.w1.weight").shape, (Shape{7, kDim}));
  nn::MoEConfig steps = c.moe;  // the closed-form count of sparse layers against the loop
  steps.sparse_step = 2, steps.dense_layers = {1, 3, 3, 4};
  for (int64_t layers : {1, 2, 7, 8}) {
    int64_t loop = 0;
    for (int64_t i = 0; i < layers; ++i) loop += steps.sparse(i);
    EXPECT_EQ(steps.sparse_layers(layers), loop) << layers;
  }
  EXPECT_EQ(nn::TransformerConfig::from_json(c.to_json()).moe, c.moe);
  EXPECT_EQ(nn::TransformerConfig::from_json(c.to_json()).to_json(), c.to_json());
  nn::TransformerConfig bad = c;
  bad.moe.dense_layers = {3};
  EXPECT_THROW(bad.validate(), Error);
  bad = c;
  bad.moe.top_k = 5;
  EXPECT_THROW(bad.validate(), Error);
  std::string j = c.to_json();
  j.replace(j.find("\"top_k\":2"), 9, "\"top_k\":\"2\"");
  try {
    nn::TransformerConfig::from_json(j);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe.top_k"), std::string::npos) << e.what();
  }
}

// Every parameter's gradient of the fused loss with the router loss (aux and z) in it, against
// float64 finite differences; the loss is the cross-entropy plus the router term.
TEST(MoEModel, WholeModelGradientWithTheRouterLoss) {
  const nn::TransformerConfig c = moe_model();
  nn::Transformer m(c);
  auto flat = nn::materialize(m, DType::f64, 11);
  for (auto& [n, p] : m.named_parameters())
    if (n.find("ffn.gate.weight") != std::string::npos)  // routers apart from ties
      p->data.copy_(test::random_tensor(p->shape, 5, DType::f64));
  Tensor tokens = test::random_ids({c.batch, c.seq}, c.vocab, 12);
  Tensor targets = test::random_ids({c.batch, c.seq}, c.vocab, 13);
  flat.grads.zero_();
  const double loss = fused_loss(m, tokens, targets, 1, true);
  EXPECT_GT(m.router_loss(), 0.05 * 0.99);  // aux >= 1 (E sum f P), times its coefficient
  {
    nn::LMLoss ce;
    const double plain = ce.forward(m.forward(tokens), targets, 0).item();
    EXPECT_NEAR(loss, plain + m.router_loss(), 1e-12);
  }
  const Tensor grads = flat.grads.clone();
  auto f = [&] { return fused_loss(m, tokens, targets); };
  for (auto& [n, p] : m.named_parameters()) {
    const int64_t off = (static_cast<const char*>(p->grad.raw_data()) -
                         static_cast<const char*>(flat.grads.raw_data())) /
                        int64_t(sizeof(double));
    test::expect_grad_matches(n, f, p->data, grads.slice(off, off + p->grad.numel()).view(p->shape),
                              12, 1e-6, 1e-8);
  }
}

// Two ranks' halves of a batch with the router statistics summed over them (set_router_reduce)
// give the whole batch's loss and, averaged as the data-parallel backward averages, its gradients:
// the router loss is the global batch's at any world size.
TEST(MoEModel, GlobalRouterStatisticsMakeTwoRanksOne) {
  const nn::TransformerConfig c = moe_model();
  nn::Transformer m(c);
  auto flat = nn::materialize(m, DType::f64, 11);
  for (auto& [n, p] : m.named_parameters())
    if (n.find("ffn.gate.weight") != std::string::npos)
      p->data.copy_(test::random_tensor(p->shape, 5, DType::f64));
  Tensor tokens = test::random_ids({c.batch, c.seq}, c.vocab, 12);
  Tensor targets = test::random_ids({c.batch, c.seq}, c.vocab, 13);
  flat.grads.zero_();
  const double whole = fused_loss(m, tokens, targets, 1, true);
  const std::vector<double> want = flat.grads.to_f64_vector();
  // Each rank's statistics, for the other's reduce.
  std::vector<double> stats[2];
  for (int r : {0, 1}) {
    fused_loss(m, tokens.slice(r, r + 1), targets.slice(r, r + 1));
    nn::RouterTotals t;
    for (nn::MoE* l : m.moe_layers()) t.add(*l->last_call());
    stats[r] = t.as_vector();
  }
  flat.grads.zero_();
  double mean = 0;
  for (int r : {0, 1}) {
    m.set_router_reduce(
        [&](std::vector<double>& v) {
          for (size_t i = 0; i < v.size(); ++i) v[i] += stats[1 - r][i];
        },
        2);
    mean += fused_loss(m, tokens.slice(r, r + 1), targets.slice(r, r + 1), 0.5, true) / 2;
  }
  EXPECT_NEAR(mean, whole, 1e-13);
  const std::vector<double> got = flat.grads.to_f64_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
}

// Activation checkpointing recomputes the MoE blocks in the backward: the router's gradient (set
// for the microbatch, not the call) still reaches them; the gradients are bit for bit the same.
TEST(MoEModel, ActivationCheckpointingKeepsTheRouterGradient) {
  const nn::TransformerConfig c = moe_model();
  std::vector<double> grads[2];
  for (bool checkpoint : {false, true}) {
    nn::Transformer m(c);
    auto flat = nn::materialize(m, DType::f64, 11);
    for (nn::Module& block : m.layers()) block.set_activation_checkpoint(checkpoint);
    flat.grads.zero_();
    fused_loss(m, test::random_ids({c.batch, c.seq}, c.vocab, 12),
               test::random_ids({c.batch, c.seq}, c.vocab, 13), 1, true);
    grads[checkpoint] = flat.grads.to_f64_vector();
  }
  EXPECT_EQ(grads[0], grads[1]);
}

// Without the fused loss the logits' loss cannot carry the router's: a backward is refused.
TEST(MoEModel, LogitsBackwardRefusedWithARouterLoss) {
  nn::Transformer m(moe_model());
  nn::materialize(m, DType::f64, 11);
  Tensor logits = m.forward(test::random_ids({2, 5}, 13, 12));
  try {
    m.backward(logits);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused loss only"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdp
