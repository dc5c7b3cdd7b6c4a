// Builds a two-layer MiniLLM through the installed headers and takes AdamW
// steps, checking that the loss moved; then shards it with fully_shard (a
// world of one), saves a sharded checkpoint and loads it into a fresh model.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/distributed/device_mesh.h>
#include <fsdp/distributed/init.h>
#include <fsdp/fsdp/fully_shard.h>
#include <fsdp/nn/loss.h>
#include <fsdp/nn/transformer.h>
#include <fsdp/ops/ops.h>
#include <fsdp/optim/adamw.h>
#include <fsdp/optim/clip.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

// A sharded model, one step, a checkpoint, and a fresh model loaded from it: the same parameters.
bool sharded_round_trip(const fsdp::nn::TransformerConfig& c, const fsdp::Tensor& tokens) {
  using namespace fsdp;
  auto world = dist::init_process_group();
  auto mesh = dist::init_device_mesh({world->size()});
  const std::string dir = (std::filesystem::temp_directory_path() / "fsdp_consumer_ckpt").string();
  std::filesystem::remove_all(dir);
  auto build = [&](nn::Transformer& m) -> FSDPModule& {
    for (size_t i = 0; i < m.layers().size(); ++i) fully_shard(m.layers()[i], mesh, {.seed = 2});
    return fully_shard(m, mesh, {.seed = 2});
  };
  nn::Transformer a(c), b(c);
  FSDPModule& ra = build(a);
  FSDPModule& rb = build(b);
  optim::AdamW oa(ra.param_groups(0.01), {.lr = 1e-2}), ob(rb.param_groups(0.01), {.lr = 1e-2});
  nn::LMLoss loss;
  loss.forward(a.forward(tokens), tokens);
  a.backward(loss.backward());
  optim::clip_grad_norm(ra, 1.0);
  oa.step();
  checkpoint::save(dir, 1, ra, oa, c.to_json(), 1, world,
                   {.data_position = 7, .user_json = R"({"run": "consumer"})"});
  auto loaded = checkpoint::load(checkpoint::latest(dir), rb, ob, c.to_json(), {"arch", "dim"});
  bool same = loaded.step == 1 && loaded.data_position == 7 &&
              loaded.user_json.find("consumer") != std::string::npos;
  auto pa = ra.sharded_parameters(), pb = rb.sharded_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    same =
        same && pa[i].second.to_local().to_f64_vector() == pb[i].second.to_local().to_f64_vector();
  std::filesystem::remove_all(dir);
  dist::destroy_process_group();
  return same && !pa.empty();
}

}  // namespace

int main() {
  using namespace fsdp;
  nn::TransformerConfig c = nn::TransformerConfig::preset("tiny");
  c.arch = nn::Arch::decoder;
  c.vocab = 64, c.dim = 32, c.layers = 2, c.heads = 2, c.seq = 16, c.batch = 2;
  nn::Transformer model(c);
  auto flat = nn::materialize(model, DType::f32, 1);
  optim::AdamW opt({{flat.params, flat.grads, 0.0}}, {.lr = 1e-2});
  std::vector<int32_t> ids(size_t(c.batch * c.seq));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i % 7);
  Tensor tokens = Tensor::from_vector(ids, {c.batch, c.seq});
  Tensor targets = Tensor::from_vector(ids, {c.batch * c.seq});
  double first = 0, last = 0;
  for (int step = 0; step < 3; ++step) {
    flat.grads.zero_();
    Tensor logits = model.forward(tokens).view({c.batch * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(logits, targets);
    model.backward(
        ops::cross_entropy_backward(logits, targets, x.lse).view({c.batch, c.seq, c.vocab}));
    opt.step();
    (step == 0 ? first : last) = x.loss;
  }
  fmt::print("consumer: loss {:.4f} -> {:.4f}\n", first, last);
  const bool round_trip = sharded_round_trip(c, tokens);
  fmt::print("consumer: sharded checkpoint round trip {}\n", round_trip ? "ok" : "FAILED");
  return last < first && round_trip ? 0 : 1;
}
