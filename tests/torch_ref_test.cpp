// The seed MiniLLM against PyTorch on the same weights and the same tokens.
// The fixture comes from scripts/make_torch_fixture.py (float64 PyTorch): the
// loss and every gradient on one batch, and the losses of three AdamW steps.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/ops/ops.h"
#include "fsdp/optim/adamw.h"
#include "test_util.h"

namespace fsdp {
namespace {

struct Fixture {
  checkpoint::SafetensorsFile file;
  nn::TransformerConfig cfg;
  int64_t steps;
  double lr;
};

Fixture load_fixture() {
  Fixture f{
      checkpoint::load_safetensors(FSDP_FIXTURE_DIR "/seed_tiny_torch.safetensors"), {}, 0, 0};
  auto j = nlohmann::json::parse(f.file.metadata.at("config"));
  f.cfg.arch = nn::Arch::seed;
  f.cfg.vocab = j["vocab"];
  f.cfg.dim = j["dim"];
  f.cfg.layers = j["layers"];
  f.cfg.heads = j["heads"];
  f.cfg.seq = j["seq"];
  f.cfg.batch = j["batch"];
  f.steps = j["steps"];
  f.lr = j["lr"];
  return f;
}

// Builds the model in `dtype` with the fixture's weights.
std::pair<std::unique_ptr<nn::Transformer>, nn::FlatParameters> build(const Fixture& f,
                                                                      DType dtype) {
  auto m = std::make_unique<nn::Transformer>(f.cfg);
  auto flat = nn::materialize(*m, dtype, 0);
  for (auto& [name, p] : m->named_parameters()) {
    const Tensor& w = f.file.at(name);
    EXPECT_EQ(w.shape(), p->shape) << name;
    p->data.copy_(w);
  }
  return {std::move(m), flat};
}

double loss_and_backward(nn::Transformer& m, const nn::FlatParameters& flat, const Tensor& tokens,
                         const Tensor& targets) {
  const auto& c = m.config();
  flat.grads.zero_();
  Tensor logits = m.forward(tokens).view({c.batch * c.seq, c.vocab});
  auto x = ops::cross_entropy_forward(logits, targets.flatten());
  m.backward(ops::cross_entropy_backward(logits, targets.flatten(), x.lse)
                 .view({c.batch, c.seq, c.vocab}));
  return x.loss;
}

class TorchReference : public ::testing::TestWithParam<DType> {};

TEST_P(TorchReference, LossAndGradientsMatchPyTorch) {
  const DType dt = GetParam();
  Fixture f = load_fixture();
  auto [m, flat] = build(f, dt);
  const double ref_loss = f.file.at("ref.loss").item();
  const double loss = loss_and_backward(*m, flat, f.file.at("input.tokens").select(0),
                                        f.file.at("input.targets").select(0));
  const double loss_tol = dt == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_NEAR(loss, ref_loss, loss_tol * std::abs(ref_loss));
  const double grad_tol = dt == DType::f64 ? 1e-10 : 1e-4;
  int checked = 0;
  for (auto& [name, p] : m->named_parameters()) {
    EXPECT_LT(test::rel_error(p->grad, f.file.at("grad." + name)), grad_tol) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 2 + 8 * f.cfg.layers);
}

TEST_P(TorchReference, AdamWStepsMatchPyTorch) {
  const DType dt = GetParam();
  Fixture f = load_fixture();
  auto [m, flat] = build(f, dt);
  optim::AdamW opt({{flat.params, flat.grads, 0.01}}, {.lr = f.lr});
  auto ref = f.file.at("ref.adamw_losses").to_f64_vector();
  ASSERT_EQ(int64_t(ref.size()), f.steps);
  for (int64_t s = 0; s < f.steps; ++s) {
    const double loss = loss_and_backward(*m, flat, f.file.at("input.tokens").select(s),
                                          f.file.at("input.targets").select(s));
    opt.step();
    EXPECT_NEAR(loss, ref[size_t(s)], (dt == DType::f64 ? 1e-10 : 1e-5) * std::abs(ref[size_t(s)]))
        << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TorchReference, ::testing::Values(DType::f64, DType::f32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Safetensors, RoundTripAndBadFiles) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/rt.safetensors";
  Tensor a = test::random_tensor({3, 4}, 1, DType::f32);
  Tensor b = Tensor::from_vector<int64_t>({1, 2, 3}, {3});
  checkpoint::save_safetensors(path, {{"a", a}, {"b", b}}, {{"k", "v"}});
  auto f = checkpoint::load_safetensors(path);
  EXPECT_EQ(f.at("a").to_f64_vector(), a.to_f64_vector());
  EXPECT_EQ(f.at("b").dtype(), DType::i64);
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_THROW(f.at("c"), Error);
  // A truncated copy is refused with the file named.
  {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(dir + "/trunc.safetensors", std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size() - 10));
  }
  try {
    checkpoint::load_safetensors(dir + "/trunc.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trunc.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(checkpoint::load_safetensors(dir + "/missing.safetensors"), Error);
}

}  // namespace
}  // namespace fsdp
