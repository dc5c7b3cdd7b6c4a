// Modules and the MiniLLM: parameter names, world-size-free initialisation,
// and whole-model gradient checks in f64 for both architectures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/core/allocator.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/data/chat.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/loss.h"
#include "fsdp/nn/sample.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/ops.h"
#include "src/models/olmo2/olmo2.h"
#include "test_util.h"

namespace fsdp {
namespace {

nn::TransformerConfig small_config(nn::Arch arch) {
  nn::TransformerConfig c;
  c.arch = arch;
  c.vocab = 11;
  c.dim = 8;
  c.layers = 2;
  c.heads = 2;
  c.seq = 5;
  c.batch = 2;
  c.ffn_hidden = 12;
  return c;
}

TEST(Init, SliceEqualsSliceOfWhole) {
  for (auto init : {nn::Init::normal(0, 1), nn::Init::uniform(-0.3, 0.3)}) {
    Tensor whole = Tensor::empty({1000}, DType::f32);
    nn::init_fill(init, 7, "layers.3.ffn.0.weight", 0, whole);
    Tensor part = Tensor::empty({333}, DType::f32);
    nn::init_fill(init, 7, "layers.3.ffn.0.weight", 500, part);
    EXPECT_EQ(part.to_f64_vector(), whole.slice(500, 833).to_f64_vector());
    Tensor other = Tensor::empty({1000}, DType::f32);
    nn::init_fill(init, 7, "layers.3.ffn.2.weight", 0, other);  // another name, other values
    EXPECT_NE(other.to_f64_vector(), whole.to_f64_vector());
  }
}

TEST(Init, Distributions) {
  Tensor t = Tensor::empty({200000}, DType::f64);
  nn::init_fill(nn::Init::normal(0.5, 2.0), 1, "w", 0, t);
  double s = 0, ss = 0;
  for (double v : t.to_f64_vector()) s += v, ss += v * v;
  const double mean = s / 200000, var = ss / 200000 - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.02);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.02);
  nn::init_fill(nn::Init::uniform(-0.25, 0.75), 1, "w", 0, t);
  auto v = t.to_f64_vector();
  EXPECT_GE(*std::min_element(v.begin(), v.end()), -0.25);
  EXPECT_LT(*std::max_element(v.begin(), v.end()), 0.75);
}

TEST(MiniLLM, SeedParameterNamesArePyTorchStateDictKeys) {
  nn::TransformerConfig c = small_config(nn::Arch::seed);
  c.layers = 1;
  nn::Transformer m(c);
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "embed.weight", "layers.0.norm1.weight", "layers.0.attn.in_proj_weight",
                       "layers.0.attn.in_proj_bias", "layers.0.attn.out_proj.weight",
                       "layers.0.attn.out_proj.bias", "layers.0.norm2.weight",
                       "layers.0.ffn.0.weight", "layers.0.ffn.2.weight", "head.weight"}));
  EXPECT_EQ(m.parameter("layers.0.attn.in_proj_weight").shape, Shape({24, 8}));
}

TEST(MiniLLM, PresetsAndValidation) {
  auto seed = nn::TransformerConfig::preset("seed");
  EXPECT_EQ(seed.vocab, 32000);
  EXPECT_EQ(seed.dim, 2048);
  EXPECT_EQ(seed.layers, 12);
  EXPECT_EQ(seed.resolved_ffn_hidden(), 8192);
  auto tiny = nn::TransformerConfig::preset("tiny");
  EXPECT_EQ(tiny.dim, 256);
  tiny.arch = nn::Arch::decoder;
  EXPECT_EQ(tiny.resolved_ffn_hidden(), 768);
  EXPECT_THROW(nn::TransformerConfig::preset("huge"), Error);
  tiny.dim = 250;
  try {
    tiny.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dim 250 is not divisible by heads 4"), std::string::npos);
  }
}

TEST(MiniLLM, ConfigJsonRoundTripsAndNamesWhatIsWrong) {
  nn::TransformerConfig c = nn::TransformerConfig::preset("tiny");
  c.arch = nn::Arch::decoder;
  c.rope_theta = 500000.0;
  c.norm_eps = 1e-5;
  const nn::TransformerConfig r = nn::TransformerConfig::from_json(c.to_json());
  EXPECT_EQ(r.to_json(), c.to_json());
  EXPECT_EQ(r.arch, nn::Arch::decoder);
  EXPECT_EQ(r.ffn_hidden, c.resolved_ffn_hidden());
  EXPECT_EQ(r.rope_theta, 500000.0);
  EXPECT_EQ(r.norm_eps, std::optional<double>(1e-5));
  // Older files have no rope_theta, norm_eps or seq: the defaults.
  const auto old = nn::TransformerConfig::from_json(
      R"({"arch":"seed","vocab":64,"dim":32,"layers":1,"heads":2,"ffn_hidden":128})");
  EXPECT_EQ(old.rope_theta, 10000.0);
  EXPECT_FALSE(old.norm_eps.has_value());
  for (const char* bad :
       {R"({"arch":"seed","vocab":64})", R"({"arch":"seed","vocab":"x"})",
        R"({"arch":"gpt","vocab":64,"dim":32,"layers":1,"heads":2,"ffn_hidden":0})", "not json"}) {
    try {
      nn::TransformerConfig::from_json(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[model]"), std::string::npos) << e.what();
    }
  }
}

TEST(Sample, SeededTopKAndGreedy) {
  nn::TransformerConfig c = nn::TransformerConfig::preset("tiny");
  c.arch = nn::Arch::decoder, c.vocab = 300, c.dim = 32, c.layers = 1, c.heads = 2, c.seq = 16;
  nn::Transformer model(c);
  nn::materialize(model, DType::f32, 5);
  const std::vector<int32_t> ctx = {72, 105};
  auto a = nn::sample(model, ctx, {.tokens = 20, .temperature = 1.0, .max_id = 256, .seed = 3});
  auto b = nn::sample(model, ctx, {.tokens = 20, .temperature = 1.0, .max_id = 256, .seed = 3});
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);  // the counter-based draws: the same seed gives the same ids
  for (int32_t id : a) EXPECT_LT(id, 256);
  auto greedy = nn::sample(model, ctx, {.tokens = 20, .temperature = 0.0, .seed = 3});
  auto top1 = nn::sample(model, ctx, {.tokens = 20, .temperature = 2.0, .top_k = 1, .seed = 9});
  EXPECT_EQ(greedy, top1);
  // Greedy picks the argmax of the last position's logits.
  Tensor logits = model.forward(Tensor::from_vector(ctx, {1, 2})).to(DType::f64);
  const double* last = logits.data<double>() + c.vocab;
  EXPECT_EQ(greedy[0], int32_t(std::max_element(last, last + c.vocab) - last));
  EXPECT_THROW(nn::sample(model, {300}, {.tokens = 1}), Error);  // outside the vocab
  EXPECT_THROW(nn::sample(model, ctx, {.tokens = 1, .temperature = -1}), Error);
}

// A sliding-window attention layer (Gemma 3's local layers), in f64: its KV-cached decode, a
// prefill of 4 positions then one at a time, gives the full forward's rows; the window (3 of 11
// positions) changes the output, and its gradient matches finite differences.
TEST(SlidingWindow, KvCacheEqualsTheFullForwardAndTheGradientIsRight) {
  const int64_t dim = 16, T = 11;
  auto layer = [&](int64_t window) {
    auto m = std::make_unique<nn::MultiheadAttention>(dim, 4,
                                                      nn::AttentionOptions{.bias = false,
                                                                           .causal = true,
                                                                           .rope_theta = 10000.0,
                                                                           .xavier_in_proj = false,
                                                                           .kv_heads = 2,
                                                                           .window = window});
    nn::materialize(*m, DType::f64, 21);
    return m;
  };
  auto attn = layer(3), wide = layer(0);
  Tensor x = test::random_tensor({1, T, dim}, 22).to(DType::f64);
  Tensor full = attn->forward(x).view({T, dim});
  EXPECT_GT(test::rel_error(wide->forward(x).view({T, dim}), full), 1e-3);  // the window matters
  attn->start_kv_cache(T);
  EXPECT_LT(test::rel_error(attn->forward(x.narrow(1, 0, 4).contiguous()).view({4, dim}),
                            full.slice(0, 4)),
            1e-12);
  for (int64_t t = 4; t < T; ++t)
    EXPECT_LT(test::rel_error(attn->forward(x.narrow(1, t, 1).contiguous()).view({1, dim}),
                              full.slice(t, t + 1)),
              1e-12)
        << "position " << t;
  attn->stop_kv_cache();
  Tensor dy = test::random_tensor({1, T, dim}, 23).to(DType::f64);
  auto loss = [&] {
    Tensor y = attn->forward(x);
    double acc = 0;
    const std::vector<double> yv = y.to_f64_vector(), dv = dy.to_f64_vector();
    for (size_t i = 0; i < yv.size(); ++i) acc += yv[i] * dv[i];
    return acc;
  };
  attn->zero_grad();
  attn->forward(x);
  attn->backward(dy);
  nn::Parameter& w = attn->parameter("in_proj_weight");
  test::expect_grad_matches("in_proj_weight", loss, w.data, w.grad.clone(), 8, 1e-6, 1e-8);
  EXPECT_THROW(nn::MultiheadAttention(dim, 4, {.causal = false, .window = 3}), Error);
}

// The KV cache against the full forward, in f64: a prefill of 3 positions, then one position at a
// time, gives every row of the full sequence's logits; a greedy sample with the cache equals one
// that recomputes the window, while the sequence fits (seq 16, 3 + 10 ids).
TEST(Sample, KvCacheEqualsTheFullForward) {
  nn::TransformerConfig c = small_config(nn::Arch::decoder);
  c.vocab = 50, c.dim = 16, c.heads = 4, c.seq = 16;
  nn::Transformer model(c);
  nn::materialize(model, DType::f64, 7);
  const std::vector<int32_t> ids = {3, 14, 15, 9, 2, 6, 5, 35};
  Tensor full = model.forward(Tensor::from_vector(ids, {1, 8})).view({8, c.vocab});
  model.start_kv_cache(c.seq);
  Tensor pre =
      model.forward(Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.begin() + 3), {1, 3}))
          .view({3, c.vocab});
  EXPECT_LT(test::rel_error(pre, full.slice(0, 3)), 1e-12);
  for (int64_t t = 3; t < 8; ++t) {
    Tensor row = model.forward(Tensor::from_vector(std::vector<int32_t>{ids[size_t(t)]}, {1, 1}))
                     .view({1, c.vocab});
    EXPECT_LT(test::rel_error(row, full.slice(t, t + 1)), 1e-12) << "position " << t;
  }
  EXPECT_EQ(model.kv_length(), 8);
  EXPECT_THROW(model.forward(Tensor::from_vector(std::vector<int32_t>(9, 1), {1, 9})), Error);
  model.stop_kv_cache();
  EXPECT_EQ(model.kv_length(), -1);
  const std::vector<int32_t> ctx = {1, 2, 3};
  auto with = nn::sample(model, ctx, {.tokens = 10, .temperature = 0.0});
  auto without = nn::sample(model, ctx, {.tokens = 10, .temperature = 0.0, .kv_cache = false});
  EXPECT_EQ(with, without);
  // Past the cache (3 + 30 ids > seq 16) the cache shifts and sampling goes on.
  EXPECT_EQ(nn::sample(model, ctx, {.tokens = 30, .temperature = 0.9, .seed = 2}).size(), 30u);
  nn::Transformer seed(small_config(nn::Arch::seed));
  EXPECT_THROW(seed.start_kv_cache(4), Error);  // bidirectional attention: no cache
}

TEST(Sample, TopPKeepsTheLikeliestAndStopsAtTheStopId) {
  nn::TransformerConfig c = small_config(nn::Arch::decoder);
  c.vocab = 40, c.dim = 16, c.heads = 4, c.seq = 32;
  nn::Transformer model(c);
  nn::materialize(model, DType::f64, 8);
  const std::vector<int32_t> ctx = {4, 5};
  // top_p tiny: only the likeliest id survives, so any temperature gives greedy's ids.
  EXPECT_EQ(nn::sample(model, ctx, {.tokens = 12, .temperature = 5.0, .top_p = 1e-9, .seed = 4}),
            nn::sample(model, ctx, {.tokens = 12, .temperature = 0.0}));
  auto greedy = nn::sample(model, ctx, {.tokens = 12, .temperature = 0.0});
  auto stopped = nn::sample(model, ctx, {.tokens = 12, .temperature = 0.0, .stop_id = greedy[2]});
  EXPECT_LE(stopped.size(), 3u);
  EXPECT_EQ(stopped.back(), greedy[2]);
  EXPECT_THROW(nn::sample(model, ctx, {.tokens = 1, .top_p = 0.0}), Error);
}

// The loss helper against the out-of-place ops: the same loss, and dlogits written over the
// logits equal to cross_entropy_backward's, in f64, f32 and bf16 storage.
TEST(LMLoss, InPlaceGradientEqualsTheOutOfPlaceOne) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    Tensor logits = test::random_tensor({3, 5, 11}, 8, DType::f32).to(dt);
    Tensor targets = test::random_ids({3, 5}, 11, 9).to(DType::i32);
    Tensor flat = logits.clone().view({15, 11});
    auto ref = ops::cross_entropy_forward(flat, targets.view({15}));
    Tensor dref = ops::cross_entropy_backward(flat, targets.view({15}), ref.lse, 0.5);
    nn::LMLoss loss;
    Tensor l = loss.forward(logits, targets);
    EXPECT_EQ(l.item(), ref.loss) << dtype_name(dt);
    Tensor d = loss.backward(0.5);
    EXPECT_EQ(d.shape(), logits.shape());
    EXPECT_TRUE(d.shares_storage_with(logits)) << "dlogits should be written over the logits";
    EXPECT_EQ(d.to_f64_vector(), dref.to_f64_vector()) << dtype_name(dt);
    EXPECT_THROW(loss.backward(), Error);  // once per forward
  }
}

TEST(MiniLLM, MaterializeIsOneFlatBuffer) {
  nn::Transformer m(small_config(nn::Arch::decoder));
  auto flat = nn::materialize(m, DType::f32, 3);
  EXPECT_EQ(flat.params.numel(), m.num_parameters());
  for (auto& [n, p] : m.named_parameters()) {
    EXPECT_TRUE(p->data.shares_storage_with(flat.params)) << n;
    EXPECT_TRUE(p->grad.shares_storage_with(flat.grads)) << n;
  }
  // norms start at one, as nn.RMSNorm does
  for (double v : m.parameter("layers.1.norm2.weight").data.to_f64_vector()) EXPECT_EQ(v, 1.0);
  // the same seed gives the same model
  nn::Transformer m2(small_config(nn::Arch::decoder));
  auto flat2 = nn::materialize(m2, DType::f32, 3);
  EXPECT_EQ(flat.params.to_f64_vector(), flat2.params.to_f64_vector());
}

void expect_whole_model_gradient(const nn::TransformerConfig& c,
                                 const nn::BlockFactory& blocks = nn::default_block) {
  nn::Transformer m(c, blocks);
  auto flat = nn::materialize(m, DType::f64, 11);
  // Random small biases and norm weights away from one, so that their gradients are tested away
  // from their init.
  for (auto& [n, p] : m.named_parameters()) {
    if (n.find("bias") != std::string::npos)
      nn::init_fill(nn::Init::uniform(-0.1, 0.1), 5, n, 0, p->data);
    if (n.find("norm") != std::string::npos)
      nn::init_fill(nn::Init::uniform(0.5, 1.5), 6, n, 0, p->data);
    if (n.ends_with("lora_B"))  // away from its zero init, so that lora_A's gradient is not 0
      nn::init_fill(nn::Init::uniform(-0.5, 0.5), 7, n, 0, p->data);
  }
  Tensor tokens = test::random_ids({c.batch, c.seq}, c.vocab, 12);
  Tensor targets = test::random_ids({c.batch * c.seq}, c.vocab, 13);
  auto loss = [&] {
    Tensor logits = m.forward(tokens).view({c.batch * c.seq, c.vocab});
    return ops::cross_entropy_forward(logits, targets).loss;
  };
  flat.grads.zero_();
  Tensor logits = m.forward(tokens).view({c.batch * c.seq, c.vocab});
  auto x = ops::cross_entropy_forward(logits, targets);
  m.backward(ops::cross_entropy_backward(logits, targets, x.lse).view({c.batch, c.seq, c.vocab}));
  Tensor grads = flat.grads.clone();
  int params = 0;
  for (auto& [n, p] : m.named_parameters()) {
    if (!p->requires_grad) {  // frozen (LoRA's base): no gradient view, and none was added
      EXPECT_FALSE(p->grad.defined()) << n;
      ++params;
      continue;
    }
    // grads of this parameter, as laid out in the flat buffer
    int64_t off = (static_cast<const char*>(p->grad.raw_data()) -
                   static_cast<const char*>(flat.grads.raw_data())) /
                  int64_t(sizeof(double));
    Tensor g = grads.slice(off, off + p->grad.numel()).view(p->shape);
    test::expect_grad_matches(n, loss, p->data, g, 8, 1e-6, 1e-8);
    ++params;
  }
  EXPECT_EQ(params, int(m.named_parameters().size()));
}

class WholeModelGradient : public ::testing::TestWithParam<nn::Arch> {};

TEST_P(WholeModelGradient, MatchesFiniteDifferencesInF64) {
  expect_whole_model_gradient(small_config(GetParam()));
}

// The llama family's options, end to end in f64: grouped-query attention (4 query heads over 2
// kv heads, and multi-query), a head dim stated on its own (6, not dim / heads = 2), q/k/v biases,
// and the head tied to the embedding, whose one gradient sums the head's dW and the
// embedding's scatter-add.
nn::TransformerConfig gqa_config(int64_t kv_heads, bool tied, bool bias) {
  nn::TransformerConfig c = small_config(nn::Arch::decoder);
  c.heads = 4;
  c.kv_heads = kv_heads;
  c.head_dim = 6;
  c.rope_theta = 100000.0;
  c.tie_embeddings = tied;
  c.qkv_bias = bias;
  return c;
}

TEST(WholeModelGradient, GroupedQueryTiedAndBiasedLlama) {
  for (int64_t kv : {2, 1})
    for (bool tied : {true, false}) {
      SCOPED_TRACE(fmt::format("kv_heads {} tied {}", kv, tied));
      expect_whole_model_gradient(gqa_config(kv, tied, kv == 2));
    }
}

// QK-norm (Qwen3): an RMSNorm over each head of q and of k before the rotary embedding, with
// grouped-query attention and a head dim of its own; every gradient, the norms' weights among
// them, matches finite differences in f64.
TEST(WholeModelGradient, QkNormLlama) {
  nn::TransformerConfig c = gqa_config(2, false, false);
  c.qk_norm = true;
  c.norm_eps = 1e-6;
  nn::Transformer m(c);
  int norms = 0;
  for (auto& [n, p] : m.named_parameters())
    if (n.find("attn.q_norm.weight") != std::string::npos ||
        n.find("attn.k_norm.weight") != std::string::npos) {
      EXPECT_EQ(p->shape, (std::vector<int64_t>{6})) << n;
      ++norms;
    }
  EXPECT_EQ(norms, 2 * int(c.layers));
  expect_whole_model_gradient(c);
}

// Gemma 3's block: (1 + w) norms everywhere (q/k norms too), norms on the attention's and the
// FFN's outputs, GeGLU, the embedding scaled by sqrt(dim), and local layers (a window of 3 keys,
// rope base 1e4) beside global ones (every second: full attention, base 1e5), tied: every
// gradient against f64 finite differences; the KV-cached decode equals the full forward.
nn::TransformerConfig gemma_config() {
  nn::TransformerConfig c = gqa_config(2, true, false);
  c.qk_norm = c.norm_plus_one = c.sandwich_norms = c.geglu = c.embed_scale = true;
  c.sliding_window = 3, c.global_every = 2, c.rope_local_theta = 1e4;
  c.norm_eps = 1e-6;
  return c;
}

TEST(WholeModelGradient, Gemma3Block) {
  const nn::TransformerConfig c = gemma_config();
  ASSERT_GT(c.seq, c.sliding_window);
  EXPECT_EQ(c.layer_window(0), 3);
  EXPECT_EQ(c.layer_window(1), 0);
  nn::Transformer m(c);
  EXPECT_EQ(c.num_parameters(), m.num_parameters());
  int sandwich = 0;
  for (auto& [n, p] : m.named_parameters())
    sandwich += n.find("post_attn_norm") != std::string::npos ||
                n.find("post_ffn_norm") != std::string::npos;
  EXPECT_EQ(sandwich, 2 * int(c.layers));
  expect_whole_model_gradient(c);
  EXPECT_EQ(nn::TransformerConfig::from_json(c.to_json()).to_json(), c.to_json());
  // FLOPs: the local layers' attention runs over their window of 3 keys, not the whole row.
  nn::TransformerConfig full = c;
  full.sliding_window = full.global_every = 0;
  const double attn_per_key = 12.0 * double(c.heads * c.resolved_head_dim());
  EXPECT_DOUBLE_EQ(full.flops_per_token() - c.flops_per_token(),
                   attn_per_key * double(c.seq - 3) * double(c.layers / 2));
}

TEST(Sample, Gemma3KvCacheEqualsTheFullForward) {
  nn::TransformerConfig c = gemma_config();
  c.vocab = 50, c.dim = 16, c.seq = 16;
  nn::Transformer model(c);
  nn::materialize(model, DType::f64, 9);
  for (auto& [n, p] : model.named_parameters())
    if (n.find("norm") != std::string::npos)
      nn::init_fill(nn::Init::uniform(-0.5, 0.5), 6, n, 0, p->data);
  const std::vector<int32_t> ids = {3, 14, 15, 9, 2, 6, 5, 35, 8, 9};
  Tensor full = model.forward(Tensor::from_vector(ids, {1, 10})).view({10, c.vocab});
  model.start_kv_cache(c.seq);
  Tensor pre =
      model.forward(Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.begin() + 2), {1, 2}))
          .view({2, c.vocab});
  EXPECT_LT(test::rel_error(pre, full.slice(0, 2)), 1e-12);
  for (int64_t t = 2; t < 10; ++t) {
    Tensor row = model.forward(Tensor::from_vector(std::vector<int32_t>{ids[size_t(t)]}, {1, 1}))
                     .view({1, c.vocab});
    EXPECT_LT(test::rel_error(row, full.slice(t, t + 1)), 1e-12) << "position " << t;
  }
  model.stop_kv_cache();
}

// Llama 3's rope scaling, with an original context of 32 so that at head dim 16 and theta 1e5
// frequency 0 is kept, 1 blended and the others divided: every gradient against f64 finite
// differences.
TEST(WholeModelGradient, Llama3RopeScaling) {
  nn::TransformerConfig c = gqa_config(2, true, false);
  c.head_dim = 16;
  c.rope_scaling = {
      .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_context = 32.0};
  expect_whole_model_gradient(c);
}

// LoRA: adapters on every projection (the packed in-projection's q, k and v each with its own
// pair), and on q and v alone (B's rows skip k's), and on the seed architecture's packed
// in-projection, out-projection and FFN: the adapters' gradients against f64 finite differences,
// and the base frozen (no gradient at all, so no weight-gradient GEMM ran for it). A fresh
// adapter (B zero) leaves the base model's logits exactly as they were.
TEST(WholeModelGradient, LoraAdapters) {
  for (const char* targets : {"q,k,v,o,gate,up,down", "q,v"}) {
    SCOPED_TRACE(targets);
    nn::TransformerConfig c = gqa_config(2, false, true);
    c.lora = {.rank = 2, .alpha = 3.0, .targets = nn::parse_lora_targets(targets)};
    nn::Transformer m(c);
    EXPECT_EQ(c.num_parameters(), m.num_parameters());
    int64_t adapters = 0;
    for (auto& [n, p] : m.named_parameters()) {
      EXPECT_EQ(p->requires_grad, nn::is_lora_parameter(n)) << n;
      if (p->requires_grad) adapters += shape_numel(p->shape);
    }
    EXPECT_EQ(adapters, c.lora_parameters());
    expect_whole_model_gradient(c);
  }
  nn::TransformerConfig seed = small_config(nn::Arch::seed);
  seed.lora = {.rank = 3, .alpha = 6.0, .targets = nn::parse_lora_targets("q,k,o,up,down")};
  expect_whole_model_gradient(seed);
  EXPECT_EQ(nn::TransformerConfig::from_json(seed.to_json()).to_json(), seed.to_json());
  seed.lora.targets = nn::parse_lora_targets("gate");
  EXPECT_THROW(seed.validate(), Error);  // seed's FFN has no gate
  EXPECT_THROW(nn::parse_lora_targets("q,qkv"), Error);

  nn::TransformerConfig plain = gqa_config(2, true, false), adapted = plain;
  adapted.lora = {.rank = 4, .alpha = 8.0, .targets = nn::parse_lora_targets("q,v,down")};
  nn::Transformer a(plain), b(adapted);
  nn::materialize(a, DType::f64, 4);
  nn::materialize(b, DType::f64, 4);  // every base parameter is initialised by its name alike
  Tensor tokens = test::random_ids({plain.batch, plain.seq}, plain.vocab, 2);
  EXPECT_EQ(a.forward(tokens).to_f64_vector(), b.forward(tokens).to_f64_vector());
}

// Packed rows (--pack) train on what the same samples train on unpacked, one per row: the loss
// over all targets and every parameter's gradient agree in f64 (to rounding: the sums run in
// another order, the rows' tokens being elsewhere), on grouped-query attention with rotary
// positions. The samples' lengths vary from 2 to 14 tokens; their masks are arbitrary. (The
// kernels' tiles and chunks across documents are ops_test's packed cases.)
TEST(PackedRows, EqualTheSamplesUnpacked) {
  nn::TransformerConfig c = gqa_config(2, false, true);
  std::vector<data::TokenizedSample> samples;
  uint64_t seed = 5;
  for (int64_t len : {5, 9, 2, 14, 3, 12, 7, 7, 4, 11}) {
    Tensor ids = test::random_ids({len}, c.vocab, ++seed);
    data::TokenizedSample smp;
    for (int64_t i = 0; i < len; ++i) {
      smp.ids.push_back(int32_t(ids.to_f64_vector()[size_t(i)]));
      smp.target.push_back(uint8_t(i > 0 && (i * 7 + len) % 3 != 0));
    }
    samples.push_back(smp);
  }
  data::SampleSource unpacked(samples, "ten samples", 0, 13);
  std::unique_ptr<data::PackedSource> packed =
      data::SampleSource(samples, "ten samples", 0, 20).packed();
  ASSERT_EQ(packed->split(), 0);
  ASSERT_GT(packed->rows(), 1);
  ASSERT_LT(packed->rows(), 10);
  nn::Transformer m(c);
  auto flat = nn::materialize(m, DType::f64, 11);
  auto loss_and_grads = [&](const data::Batch& b) {
    int64_t count = 0;
    for (double t : b.targets.to_f64_vector()) count += t != double(kIgnoreIndex);
    const int64_t B = b.inputs.size(0), T = b.inputs.size(1);
    flat.grads.zero_();
    const nn::BatchContextScope context(m, {.doc_start = b.doc_start});
    Tensor logits = m.forward(b.inputs).view({B * T, c.vocab});
    Tensor targets = b.targets.view({B * T});
    auto x = ops::cross_entropy_forward(logits, targets, true, double(count));
    m.backward(ops::cross_entropy_backward(logits, targets, x.lse, 1.0, double(count))
                   .view({B, T, c.vocab}));
    return std::make_pair(x.loss, flat.grads.clone());
  };
  const auto [loss_u, grads_u] = loss_and_grads(unpacked.windows(0, 10, 13));
  const auto [loss_p, grads_p] = loss_and_grads(packed->windows(0, packed->rows(), 20));
  EXPECT_NEAR(loss_p, loss_u, 1e-13 * std::abs(loss_u));
  EXPECT_LT(test::rel_error(grads_p, grads_u), 1e-12);
  // Activation checkpointing recomputes each block in the backward, and the recompute reads the
  // same documents from the batch context: the gradients are the same, bit for bit.
  for (size_t i = 0; i < m.layers().size(); ++i) m.layers()[i].set_activation_checkpoint(true);
  const auto [loss_ac, grads_ac] = loss_and_grads(packed->windows(0, packed->rows(), 20));
  for (size_t i = 0; i < m.layers().size(); ++i) m.layers()[i].set_activation_checkpoint(false);
  EXPECT_EQ(loss_ac, loss_p);
  EXPECT_EQ(grads_ac.to_f64_vector(), grads_p.to_f64_vector());
  // Without the documents the packed rows attend across samples: the check above would fail.
  data::Batch leak = packed->windows(0, packed->rows(), 20);
  leak.doc_start = Tensor();
  EXPECT_GT(std::abs(loss_and_grads(leak).first - loss_u), 1e-6);
}

// The fused loss (nn::ChunkedLMLoss through the batch context's targets) against the logits and
// LMLoss, in f64: the same loss and gradients, with the rows in several chunks (4 logits' worth of
// rows per chunk, the last one short), tied and untied, every target or a masked few, and a
// divisor; and the dx of the head's input is the unfused one, so every parameter's gradient is.
TEST(MiniLLM, FusedChunkedLossEqualsTheLogitsLoss) {
  for (bool tied : {false, true}) {
    nn::TransformerConfig c = gqa_config(2, tied, true);
    nn::Transformer m(c);
    auto flat = nn::materialize(m, DType::f64, 13);
    const int64_t B = 3, T = 7;
    Tensor inputs = test::random_ids({B, T}, c.vocab, 21);
    Tensor targets = test::random_ids({B, T}, c.vocab, 22);
    for (bool masked : {false, true}) {
      if (masked)
        for (int64_t i = 0; i < B * T; ++i)
          if (i % 3 != 1) targets.data<int64_t>()[i] = kIgnoreIndex;
      const double divisor = masked ? 5.0 : 0.0;
      flat.grads.zero_();
      double loss_u = 0;
      {
        nn::LMLoss loss;
        loss_u = loss.forward(m.forward(inputs), targets, divisor).item();
        m.backward(loss.backward(0.5));
      }
      const Tensor grads_u = flat.grads.clone();
      for (int64_t chunk : {int64_t(0), 4 * c.vocab}) {
        flat.grads.zero_();
        const nn::BatchContextScope context(m, {.doc_start = Tensor(),
                                                .targets = targets,
                                                .loss_divisor = divisor,
                                                .loss_scale = 0.5,
                                                .loss_chunk_logits = chunk,
                                                .no_backward = false});
        double loss_f = 0;  // the chunks' shares
        for (double part : m.forward(inputs).to_f64_vector()) loss_f += part;
        EXPECT_FALSE(m.backward(Tensor()).defined());
        EXPECT_NEAR(loss_f, loss_u, 1e-13 * std::abs(loss_u))
            << "tied " << tied << " chunk " << chunk;
        EXPECT_LT(test::rel_error(flat.grads, grads_u), 1e-12)
            << "tied " << tied << " masked " << masked << " chunk " << chunk;
      }
    }
  }
  EXPECT_EQ(nn::ChunkedLMLoss::chunk_rows(4096, 262144), 128);
  EXPECT_EQ(nn::ChunkedLMLoss::chunk_rows(4096, 4096), 4096);
  EXPECT_EQ(nn::ChunkedLMLoss::chunk_rows(10, 1 << 25), 1);
}

// Parameter names and shapes of the llama options: the packed in-projection holds the rows of
// q_proj, k_proj and v_proj ([(heads + 2 kv_heads) head_dim, dim]); a tied model has one
// "embed.weight" and no "head.weight".
TEST(MiniLLM, GroupedQueryAndTiedParameters) {
  nn::TransformerConfig c = gqa_config(2, true, true);
  c.layers = 1;
  nn::Transformer m(c);
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "embed.weight", "layers.0.norm1.weight", "layers.0.attn.in_proj_weight",
                       "layers.0.attn.in_proj_bias", "layers.0.attn.out_proj.weight",
                       "layers.0.norm2.weight", "layers.0.ffn.w1.weight", "layers.0.ffn.w2.weight",
                       "layers.0.ffn.w3.weight", "norm.weight"}));
  EXPECT_EQ(m.parameter("layers.0.attn.in_proj_weight").shape, Shape({(4 + 2 * 2) * 6, 8}));
  EXPECT_EQ(m.parameter("layers.0.attn.in_proj_bias").shape, Shape({48}));
  EXPECT_EQ(m.parameter("layers.0.attn.out_proj.weight").shape, Shape({8, 24}));
  // SmolLM2-135M: 30 layers, dim 576, 9 heads over 3 kv heads, ffn 1536, vocab 49152, tied.
  nn::TransformerConfig smol;
  smol.arch = nn::Arch::decoder, smol.vocab = 49152, smol.dim = 576, smol.layers = 30;
  smol.heads = 9, smol.kv_heads = 3, smol.ffn_hidden = 1536, smol.rope_theta = 100000.0;
  smol.tie_embeddings = true, smol.seq = 2048;
  EXPECT_EQ(nn::Transformer(smol).num_parameters(), 134515008);  // Hugging Face's count
  // The tied head still does its matmul: 30 * (576 * (576 + 2 * 192) + 576 * 576 + 3 * 576 *
  // 1536) + 49152 * 576.
  EXPECT_EQ(smol.matmul_params(), 134479872);
  nn::TransformerConfig untied = smol;
  untied.tie_embeddings = false;
  EXPECT_EQ(nn::Transformer(untied).num_parameters(), 134515008 + 49152 * 576);
  EXPECT_EQ(untied.matmul_params(), smol.matmul_params());
}

// num_parameters() counts from the shape alone what a built model holds, for every option, and
// saturates on a crafted size instead of wrapping.
TEST(MiniLLM, ParameterCountFromTheShapeEqualsTheBuiltModel) {
  std::vector<nn::TransformerConfig> cfgs;
  nn::TransformerConfig c = nn::TransformerConfig::preset("tiny");
  c.vocab = 96, c.dim = 32, c.layers = 3, c.heads = 4, c.ffn_hidden = 40;
  cfgs.push_back(c);  // seed
  c.arch = nn::Arch::decoder;
  cfgs.push_back(c);
  c.kv_heads = 2, c.head_dim = 16, c.tie_embeddings = true, c.qkv_bias = true, c.ffn_hidden = 0;
  cfgs.push_back(c);
  c.kv_heads = 1, c.tie_embeddings = false, c.qkv_bias = false;
  cfgs.push_back(c);
  c.kv_heads = 2, c.qk_norm = true;
  cfgs.push_back(c);
  for (const nn::TransformerConfig& k : cfgs) {
    nn::Transformer m(k);
    EXPECT_EQ(k.num_parameters(), m.num_parameters()) << k.to_json();
  }
  c.layers = int64_t(1) << 40, c.dim = int64_t(1) << 20, c.heads = 1, c.head_dim = 0;
  EXPECT_EQ(c.num_parameters(), std::numeric_limits<int64_t>::max());
}

TEST(MiniLLM, LlamaOptionsRoundTripAndValidate) {
  nn::TransformerConfig c = gqa_config(2, true, true);
  const std::string j = c.to_json();
  const nn::TransformerConfig r = nn::TransformerConfig::from_json(j);
  EXPECT_EQ(r.to_json(), j);
  EXPECT_EQ(r.kv_heads, 2);
  EXPECT_EQ(r.head_dim, 6);
  EXPECT_TRUE(r.tie_embeddings);
  EXPECT_TRUE(r.qkv_bias);
  EXPECT_EQ(r.rope_theta, 100000.0);
  // Defaults are not written: a plain config reads and compares as before the options existed.
  const std::string plain = small_config(nn::Arch::decoder).to_json();
  for (const char* key : {"kv_heads", "head_dim", "tie_embeddings", "qkv_bias", "qk_norm"})
    EXPECT_EQ(plain.find(key), std::string::npos) << key;
  nn::TransformerConfig qk = c;
  qk.qk_norm = true;
  EXPECT_TRUE(nn::TransformerConfig::from_json(qk.to_json()).qk_norm);
  qk.rope_scaling = {
      .factor = 32.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_context = 8192.0};
  EXPECT_EQ(nn::TransformerConfig::from_json(qk.to_json()).rope_scaling, qk.rope_scaling);
  EXPECT_EQ(nn::TransformerConfig::from_json(qk.to_json()).to_json(), qk.to_json());
  const auto old = nn::TransformerConfig::from_json(
      R"({"arch":"llama","vocab":64,"dim":32,"layers":1,"heads":4,"ffn_hidden":128})");
  EXPECT_EQ(old.resolved_kv_heads(), 4);
  EXPECT_EQ(old.resolved_head_dim(), 8);
  EXPECT_FALSE(old.tie_embeddings);
  EXPECT_FALSE(old.qkv_bias);
  auto refused = [](nn::TransformerConfig bad, const std::string& says) {
    try {
      bad.validate();
      ADD_FAILURE() << "accepted " << bad.to_json();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  nn::TransformerConfig bad = c;
  bad.kv_heads = 3;
  refused(bad, "heads 4 is not divisible by kv_heads 3");
  bad = c, bad.head_dim = 5;
  refused(bad, "even head dim");
  bad = c, bad.kv_heads = -1;
  refused(bad, "kv_heads must be >= 0");
  bad = small_config(nn::Arch::seed), bad.tie_embeddings = true;
  refused(bad, "tie_embeddings is for arch llama");
  bad = small_config(nn::Arch::seed), bad.kv_heads = 1;
  refused(bad, "kv_heads 1 is for arch llama");
  bad = small_config(nn::Arch::seed), bad.qkv_bias = true;
  refused(bad, "qkv_bias is for arch llama");
  bad = small_config(nn::Arch::seed), bad.qk_norm = true;
  refused(bad, "qk_norm is for arch llama");
  bad = c, bad.rope_scaling = {.factor = 0.5};
  refused(bad, "rope scaling factor 0.5 must be at least 1");
  bad = c, bad.rope_scaling = {.factor = 8.0, .low_freq_factor = 4.0, .high_freq_factor = 1.0};
  refused(bad, "low below the high");
  // A head dim of its own frees dim from heads: dim 8 with 3 heads of 4.
  nn::TransformerConfig decoupled = small_config(nn::Arch::decoder);
  decoupled.heads = 3, decoupled.head_dim = 4;
  EXPECT_NO_THROW(decoupled.validate());
  EXPECT_NO_THROW(nn::TransformerConfig::from_json(decoupled.to_json()));
  EXPECT_THROW(nn::TransformerConfig::from_json(
                   R"({"arch":"llama","vocab":64,"dim":32,"layers":1,"heads":4,"ffn_hidden":128,)"
                   R"("tie_embeddings":1})"),
               Error);
}

// The KV cache with grouped-query attention (cache sized by the kv heads), a head dim of its own,
// q/k/v biases, a tied head and rope theta 1e5: prefill and one-at-a-time decode give the full
// forward's logits.
// The KV-cached decode of 8 ids (3 at once, then one at a time) against the full forward, in f64
// with biases and norm weights away from their init.
void expect_kv_cache_equals_full_forward(nn::Transformer& model, const std::string& what) {
  const nn::TransformerConfig& c = model.config();
  nn::materialize(model, DType::f64, 9);
  for (auto& [n, p] : model.named_parameters()) {
    if (n.find("bias") != std::string::npos)
      nn::init_fill(nn::Init::uniform(-0.5, 0.5), 5, n, 0, p->data);
    if (n.find("_norm") != std::string::npos)
      nn::init_fill(nn::Init::uniform(0.5, 1.5), 6, n, 0, p->data);
  }
  const std::vector<int32_t> ids = {3, 14, 15, 9, 2, 6, 5, 35};
  Tensor full = model.forward(Tensor::from_vector(ids, {1, 8})).view({8, c.vocab});
  model.start_kv_cache(c.seq);
  Tensor pre =
      model.forward(Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.begin() + 3), {1, 3}))
          .view({3, c.vocab});
  EXPECT_LT(test::rel_error(pre, full.slice(0, 3)), 1e-12) << what;
  for (int64_t t = 3; t < 8; ++t) {
    Tensor row = model.forward(Tensor::from_vector(std::vector<int32_t>{ids[size_t(t)]}, {1, 1}))
                     .view({1, c.vocab});
    EXPECT_LT(test::rel_error(row, full.slice(t, t + 1)), 1e-12) << what << " position " << t;
  }
  model.stop_kv_cache();
}

TEST(Sample, GroupedQueryKvCacheEqualsTheFullForward) {
  for (int64_t kv : {2, 1, 3, 4}) {  // 3: kv 2 with QK-norm (Qwen3); 4: with Llama 3's rope scaling
    nn::TransformerConfig c = gqa_config(kv == 1 ? 1 : 2, true, true);
    c.qk_norm = kv == 3;
    if (kv == 4) c.rope_scaling = {.factor = 8.0, .original_context = 16.0};
    c.vocab = 50, c.dim = 16, c.seq = 16;
    nn::Transformer model(c);
    expect_kv_cache_equals_full_forward(model, fmt::format("kv {}", kv));
  }
}

// A family's own blocks in the generic decoder (a BlockFactory): here nn::TransformerBlock with a
// QK-norm over the whole width of q and of k (AttentionOptions::qk_norm_whole, OLMo-2's): its
// weights are [heads hd] and [kv_heads hd]; every gradient matches f64 finite differences and the
// KV-cached decode (the cache found in the family's blocks) equals the full forward.
nn::BlockFactory whole_width_qk_norm_blocks() {
  return [](const nn::TransformerConfig& c, int64_t) -> std::unique_ptr<nn::Module> {
    const nn::AttentionOptions attn{.bias = false,
                                    .causal = true,
                                    .rope_theta = c.rope_theta,
                                    .xavier_in_proj = false,
                                    .kv_heads = c.kv_heads,
                                    .head_dim = c.head_dim,
                                    .qk_norm = true,
                                    .qk_norm_whole = true,
                                    .norm_eps = c.norm_eps};
    return std::make_unique<nn::TransformerBlock>(c.dim, c.heads, c.resolved_ffn_hidden(),
                                                  nn::FeedForward::Kind::swiglu, attn,
                                                  nn::NormOptions{.eps = c.norm_eps});
  };
}

TEST(WholeModelGradient, FamilyBlocksWithAWholeWidthQkNorm) {
  nn::TransformerConfig c = gqa_config(2, false, false);
  c.norm_eps = 1e-6;
  nn::Transformer m(c, whole_width_qk_norm_blocks());
  std::map<std::string, std::vector<int64_t>> norms;
  for (auto& [n, p] : m.named_parameters())
    if (n.find("_norm.weight") != std::string::npos) norms[n] = p->shape;
  EXPECT_EQ(norms["layers.1.attn.q_norm.weight"], (std::vector<int64_t>{4 * 6}));
  EXPECT_EQ(norms["layers.1.attn.k_norm.weight"], (std::vector<int64_t>{2 * 6}));
  EXPECT_EQ(norms.size(), 2 * size_t(c.layers));
  expect_whole_model_gradient(c, whole_width_qk_norm_blocks());
  c.vocab = 50, c.dim = 16, c.seq = 16;
  nn::Transformer cached(c, whole_width_qk_norm_blocks());
  expect_kv_cache_equals_full_forward(cached, "whole-width QK-norm");
}

// OLMo-2's block (src/models/olmo2/: norms after the attention and the FFN, QK-norm over the whole
// q and k width), as its family builds it, with grouped-query attention (4 query heads over 2 kv
// heads of 6 dims) and with and without its attention biases: every gradient against f64 finite
// differences, and the KV-cached decode equals the full forward.
TEST(WholeModelGradient, Olmo2Block) {
  for (const char* options : {R"({"attention_bias":false})", R"({"attention_bias":true})"}) {
    SCOPED_TRACE(options);
    nn::TransformerConfig c = gqa_config(2, false, false);
    c.norm_eps = 1e-6;
    c.family = "olmo2";
    c.family_options = options;
    nn::Transformer m(c, models::olmo2::make_block);
    int post_norms = 0;
    for (auto& [n, p] : m.named_parameters()) {
      post_norms += n.ends_with("post_attn_norm.weight") || n.ends_with("post_ffn_norm.weight");
      EXPECT_EQ(n.find("norm1"), std::string::npos) << n;  // no norm before a sublayer
    }
    EXPECT_EQ(post_norms, 2 * int(c.layers));
    expect_whole_model_gradient(c, models::olmo2::make_block);
    c.vocab = 50, c.dim = 16, c.seq = 16;
    nn::Transformer cached(c, models::olmo2::make_block);
    expect_kv_cache_equals_full_forward(cached, options);
  }
}

INSTANTIATE_TEST_SUITE_P(BothArchs, WholeModelGradient,
                         ::testing::Values(nn::Arch::seed, nn::Arch::decoder),
                         [](const auto& info) { return nn::arch_name(info.param); });

// Activation checkpointing without FSDP: full and every:2 give bit-identical gradients to the
// plain model in f64 (and so agree with finite differences, as the plain one does), the loss is
// unchanged, and a checkpointed forward keeps less memory until the backward: only each
// checkpointed block's input.
TEST(ActivationCheckpoint, SameGradientsLessMemoryHeldAfterTheForward) {
  nn::TransformerConfig c = small_config(nn::Arch::decoder);
  c.layers = 4;
  Tensor tokens = test::random_ids({c.batch, c.seq}, c.vocab, 12);
  Tensor targets = test::random_ids({c.batch * c.seq}, c.vocab, 13);
  auto run = [&](int64_t every, int64_t* held) {
    nn::Transformer m(c);
    auto flat = nn::materialize(m, DType::f64, 11);
    if (every > 0)
      for (size_t i = 0; i < m.layers().size(); i += size_t(every))
        m.layers()[i].set_activation_checkpoint(true);
    flat.grads.zero_();
    const int64_t before = memory_stats().current;
    Tensor logits = m.forward(tokens).view({c.batch * c.seq, c.vocab});
    *held = memory_stats().current - before;
    auto x = ops::cross_entropy_forward(logits, targets);
    m.backward(ops::cross_entropy_backward(logits, targets, x.lse).view({c.batch, c.seq, c.vocab}));
    std::vector<double> out = flat.grads.to_f64_vector();
    out.push_back(x.loss);
    return out;
  };
  int64_t held_plain = 0, held_full = 0, held_two = 0;
  const std::vector<double> plain = run(0, &held_plain);
  EXPECT_EQ(run(1, &held_full), plain);
  EXPECT_EQ(run(2, &held_two), plain);
  EXPECT_LT(held_full, held_two);
  EXPECT_LT(held_two, held_plain);
  // Each checkpointed block keeps one [B, T, dim] f64 input; the logits are kept either way.
  const int64_t block_input = c.batch * c.seq * c.dim * 8;
  const int64_t logits = c.batch * c.seq * c.vocab * 8;
  EXPECT_GE(held_full, logits + c.layers * block_input);
  EXPECT_LT(held_full, held_plain / 2)
      << "full checkpointing kept " << held_full << " of " << held_plain << " bytes";
}

// A checkpointed module's backward without a forward before it is named.
TEST(ActivationCheckpoint, BackwardWithoutForwardIsNamed) {
  nn::TransformerConfig c = small_config(nn::Arch::decoder);
  nn::Transformer m(c);
  nn::materialize(m, DType::f64, 11);
  m.layers()[1].set_activation_checkpoint(true);
  try {
    m.layers()[1].backward(Tensor::zeros({c.batch, c.seq, c.dim}, DType::f64));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backward() of checkpointed 'layers.1'"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------- the chain of hooks

// A link that logs its calls ("A.pre_forward", ...) and may replace the gradients it receives.
class LogHooks : public nn::ModuleHooks {
 public:
  LogHooks(std::string name, std::vector<std::string>* log) : name_(std::move(name)), log_(log) {}
  Tensor pre_forward(nn::Module&, const Tensor& x) override { return note("pre_forward", x); }
  Tensor post_forward(nn::Module&, const Tensor& y) override { return note("post_forward", y); }
  Tensor pre_backward(nn::Module&, const Tensor& dy) override {
    note("pre_backward", dy);
    return replace_dy ? replace_dy(dy) : dy;
  }
  Tensor post_backward(nn::Module&, const Tensor& dx) override {
    note("post_backward", dx);
    return replace_dx ? replace_dx(dx) : dx;
  }
  std::function<Tensor(const Tensor&)> replace_dy, replace_dx;

 private:
  Tensor note(const char* what, const Tensor& t) {
    log_->push_back(name_ + "." + what);
    return t;
  }
  std::string name_;
  std::vector<std::string>* log_;
};

// Three linear layers in a row, f64.
struct ThreeLinears {
  nn::ModuleList m;
  nn::FlatParameters flat;
  ThreeLinears() {
    m.append(std::make_unique<nn::Linear>(5, 7, true));
    m.append(std::make_unique<nn::Linear>(7, 6, true));
    m.append(std::make_unique<nn::Linear>(6, 4, true));
    flat = nn::materialize(m, DType::f64, 21);
  }
};

// pre_forward and post_forward run in registration order, pre_backward and post_backward in
// reverse (module.h says why); a removed link no longer runs, removing it again (or after its
// module is gone) does nothing, and the others keep their order.
TEST(Hooks, TheChainRunsInTheDocumentedOrderAndARemovedLinkStops) {
  std::vector<std::string> log;
  nn::HookHandle a_handle, c_handle;
  {
    ThreeLinears net;
    nn::Module& mid = net.m[1];
    a_handle = mid.add_hooks(std::make_shared<LogHooks>("A", &log));
    nn::HookHandle b_handle = mid.add_hooks(std::make_shared<LogHooks>("B", &log));
    c_handle = mid.add_hooks(std::make_shared<LogHooks>("C", &log));
    EXPECT_EQ(mid.hooks().size(), 3u);
    Tensor x = test::random_tensor({3, 5}, 1);
    auto step = [&] {
      log.clear();
      Tensor y = net.m.forward(x);
      net.m.backward(Tensor::full(y.shape(), 1.0, DType::f64));
      return log;
    };
    EXPECT_EQ(step(),
              (std::vector<std::string>{"A.pre_forward", "B.pre_forward", "C.pre_forward",
                                        "A.post_forward", "B.post_forward", "C.post_forward",
                                        "C.pre_backward", "B.pre_backward", "A.pre_backward",
                                        "C.post_backward", "B.post_backward", "A.post_backward"}));
    b_handle.remove();
    b_handle.remove();  // again: nothing
    EXPECT_EQ(mid.hooks().size(), 2u);
    EXPECT_EQ(step(),
              (std::vector<std::string>{"A.pre_forward", "C.pre_forward", "A.post_forward",
                                        "C.post_forward", "C.pre_backward", "A.pre_backward",
                                        "C.post_backward", "A.post_backward"}));
    a_handle.remove();
    EXPECT_EQ(step(), (std::vector<std::string>{"C.pre_forward", "C.post_forward", "C.pre_backward",
                                                "C.post_backward"}));
  }
  c_handle.remove();  // the module is gone: nothing to remove, no crash
  EXPECT_EQ(test::error_of([] {
              nn::Linear l(2, 2, false);
              l.add_hooks(nullptr);
            }).find("[Module] add_hooks on 'Linear' (Linear) with no hooks"),
            0u);
}

// The backward hooks receive the gradients and may replace them. A pre-backward hook on the last
// layer multiplies dy by a mask m (PyTorch's full backward pre-hook): the loss is then
// sum(w * m * y). A post-backward hook on the middle layer multiplies its input gradient by 3
// (the full backward hook's grad_input): the first layer's gradients are 3 times the loss's. Every
// gradient against float64 finite differences of sum(w * m * y).
TEST(Hooks, ReplacedGradientsMatchFiniteDifferencesOfTheModifiedLoss) {
  ThreeLinears net;
  std::vector<std::string> log;
  Tensor x = test::random_tensor({3, 5}, 1);
  Tensor w = test::random_tensor({3, 4}, 2),
         mask = test::random_tensor({3, 4}, 3, DType::f64, 0, 2);
  auto times = [](const Tensor& t, const std::function<double(int64_t)>& f) {
    Tensor out = t.contiguous().clone();
    for (int64_t i = 0; i < out.numel(); ++i) out.data<double>()[i] *= f(i);
    return out;
  };
  auto last = std::make_shared<LogHooks>("last", &log),
       mid = std::make_shared<LogHooks>("mid", &log);
  Shape seen_dy, seen_dx;
  last->replace_dy = [&](const Tensor& dy) {
    seen_dy = dy.shape();
    return times(dy, [&](int64_t i) { return mask.data<double>()[i]; });
  };
  mid->replace_dx = [&](const Tensor& dx) {
    seen_dx = dx.shape();
    return times(dx, [](int64_t) { return 3.0; });
  };
  net.m[2].add_hooks(last);
  net.m[1].add_hooks(mid);
  auto modified_loss = [&] {  // sum(w * m * y), the model without hooks' backward
    Tensor y = net.m.forward(x);
    return test::dot(times(w, [&](int64_t i) { return mask.data<double>()[i]; }), y);
  };
  net.flat.grads.zero_();
  Tensor y = net.m.forward(x);
  Tensor dx = net.m.backward(w);
  EXPECT_EQ(seen_dy, Shape({3, 4}));
  EXPECT_EQ(seen_dx, Shape({3, 7}));
  EXPECT_EQ(dx.shape(), Shape({3, 5}));
  for (auto& [name, p] : net.m.named_parameters()) {
    const bool first = name.rfind("0.", 0) == 0;
    test::expect_grad_matches(name, modified_loss, p->data,
                              first ? times(p->grad, [](int64_t) { return 1.0 / 3; }) : p->grad);
  }
}

// A replacement that changes the gradient's shape (or drops it) is refused, naming the module and
// the link.
TEST(Hooks, AReplacementOfAnotherShapeIsNamed) {
  ThreeLinears net;
  std::vector<std::string> log;
  auto bad = std::make_shared<LogHooks>("bad", &log);
  bad->replace_dx = [](const Tensor& dx) { return dx.view({-1}); };
  net.m[1].add_hooks(std::make_shared<LogHooks>("ok", &log));
  net.m[1].add_hooks(bad);
  Tensor y = net.m.forward(test::random_tensor({3, 5}, 1));
  const std::string e =
      test::error_of([&] { net.m.backward(Tensor::full(y.shape(), 1.0, DType::f64)); });
  EXPECT_NE(e.find("the post-backward hook (link 2 of 2) of '1' (Linear) replaced the input "
                   "gradient, a f64 tensor of shape [3, 7] on cpu, with a f64 tensor of shape [21] "
                   "on cpu"),
            std::string::npos)
      << e;
  // Another dtype, same shape: refused too (the layer below would read the wrong element type).
  bad->replace_dx = [](const Tensor& dx) { return dx.to(DType::f32); };
  y = net.m.forward(test::random_tensor({3, 5}, 1));
  const std::string e2 =
      test::error_of([&] { net.m.backward(Tensor::full(y.shape(), 1.0, DType::f64)); });
  EXPECT_NE(e2.find("with a f32 tensor of shape [3, 7] on cpu"), std::string::npos) << e2;
}

// ---------------------------------------------------------------- a module called twice

// A test model that reuses its block: embedding, the same TransformerBlock applied `uses` times,
// final norm, head. Each call of the block (and of every layer inside it) keeps its own record,
// so the backward runs the block's backward `uses` times, in reverse, each on its own call's
// activations, and the block's gradients are the sum over its uses.
class ReusedBlock : public nn::Module {
 public:
  ReusedBlock(const nn::TransformerConfig& c, int uses) : Module("ReusedBlock"), uses_(uses) {
    embed_ = &register_module("embed", std::make_unique<nn::Embedding>(c.vocab, c.dim));
    const nn::AttentionOptions attn{.bias = false,
                                    .causal = true,
                                    .rope_theta = 10000.0,
                                    .xavier_in_proj = false,
                                    .qkv_bias = true,
                                    .qk_norm = true,
                                    .norm_eps = 1e-6};
    block_ = &register_module(
        "block", std::make_unique<nn::TransformerBlock>(c.dim, c.heads, c.ffn_hidden,
                                                        nn::FeedForward::Kind::swiglu, attn,
                                                        nn::NormOptions{.eps = 1e-6}));
    norm_ = &register_module("norm", std::make_unique<nn::RMSNorm>(c.dim, 1e-6));
    head_ = &register_module("head", std::make_unique<nn::Linear>(c.dim, c.vocab, false));
  }
  nn::Module& block() { return *block_; }

 protected:
  Tensor forward_impl(const Tensor& tokens) override {
    Tensor h = embed_->forward(tokens);
    for (int i = 0; i < uses_; ++i) h = block_->forward(h);
    return head_->forward(norm_->forward(h));
  }
  Tensor backward_impl(const Tensor& dlogits) override {
    Tensor d = norm_->backward(head_->backward(dlogits));
    for (int i = 0; i < uses_; ++i) d = block_->backward(d);
    return embed_->backward(d);
  }

 private:
  int uses_;
  nn::Embedding* embed_;
  nn::TransformerBlock* block_;
  nn::RMSNorm* norm_;
  nn::Linear* head_;
};

// Random small biases and norm weights away from one, as expect_whole_model_gradient's.
void perturb(nn::Module& m) {
  for (auto& [n, p] : m.named_parameters()) {
    if (n.find("bias") != std::string::npos)
      nn::init_fill(nn::Init::uniform(-0.1, 0.1), 5, n, 0, p->data);
    if (n.find("norm") != std::string::npos)
      nn::init_fill(nn::Init::uniform(0.5, 1.5), 6, n, 0, p->data);
  }
}

size_t records_held(nn::Module& m) {
  size_t n = 0;
  m.for_each_module([&](nn::Module& x) { n += x.saved_records(); });
  return n;
}

// The acceptance test of a per-call context: every parameter's gradient, the shared block's
// (the sum of both uses) among them, equals central finite differences in f64; nothing is left
// on any module's stack after the backward. Three uses, and the block checkpointed (its calls'
// inputs kept, recomputed in the backward), give the same: the checkpointed gradients bit for bit.
TEST(ReusedModule, ABlockCalledTwiceGetsTheGradientsOfFiniteDifferences) {
  const nn::TransformerConfig c = small_config(nn::Arch::decoder);
  Tensor tokens = test::random_ids({c.batch, c.seq}, c.vocab, 12);
  Tensor targets = test::random_ids({c.batch * c.seq}, c.vocab, 13);
  for (int uses : {2, 3}) {
    SCOPED_TRACE(fmt::format("{} uses", uses));
    ReusedBlock m(c, uses);
    auto flat = nn::materialize(m, DType::f64, 11);
    perturb(m);
    auto loss = [&] {
      Tensor logits = m.forward(tokens).view({c.batch * c.seq, c.vocab});
      return ops::cross_entropy_forward(logits, targets).loss;
    };
    auto gradients = [&] {
      flat.grads.zero_();
      Tensor logits = m.forward(tokens).view({c.batch * c.seq, c.vocab});
      auto x = ops::cross_entropy_forward(logits, targets);
      EXPECT_GT(records_held(m), 0u);
      m.backward(
          ops::cross_entropy_backward(logits, targets, x.lse).view({c.batch, c.seq, c.vocab}));
      EXPECT_EQ(records_held(m), 0u);
      return flat.grads.clone();
    };
    const Tensor grads = gradients();
    int block_params = 0;
    for (auto& [n, p] : m.named_parameters()) {
      const int64_t off = (static_cast<const char*>(p->grad.raw_data()) -
                           static_cast<const char*>(flat.grads.raw_data())) /
                          int64_t(sizeof(double));
      Tensor g = grads.slice(off, off + p->grad.numel()).view(p->shape);
      test::expect_grad_matches(n, loss, p->data, g, 8, 1e-6, 1e-8);
      block_params += n.starts_with("block.");
    }
    EXPECT_EQ(block_params, 10);  // norm1, qkv weight and bias, q/k norms, out_proj, norm2, 3 FFN
    m.block().set_activation_checkpoint(true);
    EXPECT_EQ(gradients().to_f64_vector(), grads.to_f64_vector());
  }
}

// Two microbatches in flight (a pipeline stage's 1F1B order: forward m0, forward m1, backward m0,
// backward m1), each forward and backward under its own BatchContext::microbatch: each backward
// takes its own forward's records, so the gradients equal those of the two run one after the
// other. A backward with no forward of its microbatch left is named.
TEST(ReusedModule, TwoMicrobatchesInFlightTakeTheirOwnRecords) {
  const nn::TransformerConfig c = small_config(nn::Arch::decoder);
  ReusedBlock m(c, 2);
  auto flat = nn::materialize(m, DType::f64, 11);
  perturb(m);
  const Tensor tokens[2] = {test::random_ids({c.batch, c.seq}, c.vocab, 12),
                            test::random_ids({c.batch, c.seq}, c.vocab, 14)};
  const Tensor targets[2] = {test::random_ids({c.batch * c.seq}, c.vocab, 13),
                             test::random_ids({c.batch * c.seq}, c.vocab, 15)};
  auto dlogits = [&](const Tensor& logits2, int k) {
    Tensor logits = logits2.view({c.batch * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(logits, targets[k]);
    return ops::cross_entropy_backward(logits, targets[k], x.lse).view({c.batch, c.seq, c.vocab});
  };
  flat.grads.zero_();
  for (int k : {0, 1}) m.backward(dlogits(m.forward(tokens[k]), k));
  const std::vector<double> sequential = flat.grads.to_f64_vector();

  flat.grads.zero_();
  Tensor d[2];
  for (int k : {0, 1}) {
    const nn::BatchContextScope mb(m, {.microbatch = k});
    d[k] = dlogits(m.forward(tokens[k]), k);
  }
  for (int k : {0, 1}) {
    const nn::BatchContextScope mb(m, {.microbatch = k});
    m.backward(d[k]);
  }
  EXPECT_EQ(flat.grads.to_f64_vector(), sequential);
  EXPECT_EQ(records_held(m), 0u);
  const std::string e = test::error_of([&] { m.backward(d[0]); });
  EXPECT_NE(e.find("backward() of 'head' (Linear) has no saved record of microbatch 0"),
            std::string::npos)
      << e;
}

// A forward with no backward to come (an evaluation, a preference reference) keeps no record, so
// its activations are not held until the next forward; its output is the training forward's.
TEST(ReusedModule, AForwardWithNoBackwardKeepsNoRecords) {
  const nn::TransformerConfig c = small_config(nn::Arch::decoder);
  ReusedBlock m(c, 2);
  nn::materialize(m, DType::f64, 11);
  const Tensor tokens = test::random_ids({c.batch, c.seq}, c.vocab, 12);
  const std::vector<double> kept = m.forward(tokens).to_f64_vector();
  EXPECT_GT(records_held(m), 0u);
  const nn::BatchContextScope eval(m, {.no_backward = true});
  EXPECT_EQ(m.forward(tokens).to_f64_vector(), kept);
  EXPECT_EQ(records_held(m), 0u);
}
}  // namespace
}  // namespace fsdp
