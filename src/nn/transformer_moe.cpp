// nn::Transformer's mixture of experts: MoEConfig (which blocks are sparse, its checks, its JSON
// form in the model's config), its parameter counts, and the router loss added to the fused loss.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/nn/moe.h"
#include "src/core/json_read.h"
#include "src/nn/transformer_moe.h"

namespace fsdp::nn {

const char* router_kind_name(RouterKind kind) {
  return kind == RouterKind::softmax_topk ? "softmax_topk" : "topk_softmax";
}

bool MoEConfig::sparse(int64_t layer) const {
  return enabled() && sparse_step > 0 && (layer + 1) % sparse_step == 0 &&
         std::find(dense_layers.begin(), dense_layers.end(), layer) == dense_layers.end();
}

int64_t MoEConfig::sparse_layers(int64_t layers) const {
  if (!enabled() || sparse_step <= 0 || layers <= 0) return 0;
  // Closed form (a config of 2^40 layers is counted, then refused, without a loop over them).
  int64_t n = layers / sparse_step;
  std::vector<int64_t> dense = dense_layers;
  std::sort(dense.begin(), dense.end());
  dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
  for (int64_t l : dense) n -= (l >= 0 && l < layers && (l + 1) % sparse_step == 0) ? 1 : 0;
  return n;
}

void MoEConfig::validate(int64_t layers) const {
  if (!enabled()) {
    FSDP_CHECK(experts == 0, "[model] moe.experts must be >= 0, got {}", experts);
    return;
  }
  FSDP_CHECK(experts <= (int64_t(1) << 20) && hidden > 0 && hidden <= (int64_t(1) << 40),
             "[model] moe.experts {} must be in [1, 2^20] and moe.hidden {} in [1, 2^40]",
             experts, hidden);
  FSDP_CHECK(top_k >= 1 && top_k <= experts, "[model] moe.top_k {} must be in [1, experts {}]",
             top_k, experts);
  FSDP_CHECK(sparse_step >= 1, "[model] moe.sparse_step must be >= 1, got {}", sparse_step);
  for (int64_t l : dense_layers)
    FSDP_CHECK(l >= 0 && l < layers, "[model] moe.dense_layers holds {}, not a layer of [0, {})",
               l, layers);
  FSDP_CHECK(router == RouterKind::softmax_topk || !norm_topk_prob,
             "[model] moe.norm_topk_prob is for router softmax_topk; topk_softmax (Mixtral's) "
             "is normalized already");
  FSDP_CHECK(std::isfinite(aux_coef) && aux_coef >= 0 && std::isfinite(z_coef) && z_coef >= 0,
             "[model] moe.aux_coef {} and moe.z_coef {} must be finite and >= 0", aux_coef,
             z_coef);
}

nlohmann::json moe_to_json(const MoEConfig& m) {
  return {{"experts", m.experts},         {"top_k", m.top_k},
          {"hidden", m.hidden},           {"router", router_kind_name(m.router)},
          {"norm_topk_prob", m.norm_topk_prob}, {"sparse_step", m.sparse_step},
          {"dense_layers", m.dense_layers},     {"aux_coef", m.aux_coef},
          {"z_coef", m.z_coef}};
}

MoEConfig moe_from_json(const nlohmann::json& j) {
  FSDP_CHECK(j.is_object(), "[model] config field 'moe' must be an object, got {}",
             json_read::brief(j));
  auto need = [&](const char* key) -> const nlohmann::json& {
    FSDP_CHECK(j.contains(key), "[model] config field 'moe' has no '{}'", key);
    return j[key];
  };
  auto integer = [&](const char* key) {
    const nlohmann::json& v = need(key);
    FSDP_CHECK(v.is_number_integer(), "[model] config field 'moe.{}' must be an integer, got {}",
               key, json_read::brief(v));
    return v.get<int64_t>();
  };
  auto number = [&](const char* key) {
    const nlohmann::json& v = need(key);
    FSDP_CHECK(v.is_number(), "[model] config field 'moe.{}' must be a number, got {}", key,
               json_read::brief(v));
    return v.get<double>();
  };
  MoEConfig m;
  m.experts = integer("experts");
  m.top_k = integer("top_k");
  m.hidden = integer("hidden");
  const nlohmann::json& router = need("router");
  FSDP_CHECK(router == "softmax_topk" || router == "topk_softmax",
             "[model] config field 'moe.router' must be softmax_topk or topk_softmax, got {}",
             json_read::brief(router));
  m.router = router == "softmax_topk" ? RouterKind::softmax_topk : RouterKind::topk_softmax;
  const nlohmann::json& norm = need("norm_topk_prob");
  FSDP_CHECK(norm.is_boolean(), "[model] config field 'moe.norm_topk_prob' must be true or false");
  m.norm_topk_prob = norm.get<bool>();
  m.sparse_step = integer("sparse_step");
  const nlohmann::json& dense = need("dense_layers");
  FSDP_CHECK(dense.is_array() && std::all_of(dense.begin(), dense.end(),
                                             [](const auto& v) { return v.is_number_integer(); }),
             "[model] config field 'moe.dense_layers' must be an array of integers, got {}",
             json_read::brief(dense));
  m.dense_layers = dense.get<std::vector<int64_t>>();
  m.aux_coef = number("aux_coef");
  m.z_coef = number("z_coef");
  return m;
}


void Transformer::set_router_reduce(std::function<void(std::vector<double>&)> reduce,
                                    int64_t world) {
  FSDP_CHECK(world >= 1, "[model] set_router_reduce: world size {} must be >= 1", world);
  reduce_ = std::move(reduce);
  world_ = reduce_ ? world : 1;
}

Tensor Transformer::with_router_loss(const Tensor& loss) {
  RouterTotals totals;
  for (MoE* m : moe_) totals.add(*m->last_call());
  if (reduce_ && !loss.device().is_meta()) {
    std::vector<double> v = totals.as_vector();
    reduce_(v);
    totals = RouterTotals::from_vector(v);
  }
  const BatchContext& ctx = batch_context();
  const RouterLoss r = router_aux_loss(totals, {.experts = cfg_.moe.experts,
                                                .aux_coef = cfg_.moe.aux_coef,
                                                .z_coef = cfg_.moe.z_coef,
                                                .grad_scale = ctx.loss_scale * double(world_)});
  for (MoE* m : moe_) m->set_router_grad(r.grad);
  router_loss_ = r.value;
  // One more chunk: the loss is the sum of the returned f64 values.
  Tensor out = Tensor::empty({loss.numel() + 1}, DType::f64, loss.device());
  out.slice(0, loss.numel()).copy_(loss);
  out.slice(loss.numel(), loss.numel() + 1).fill_(r.value);
  return out;
}

}  // namespace fsdp::nn
