// nn::MoEConfig in the model's config JSON (TransformerConfig::to_json / from_json): the "moe"
// object, written only for a model with experts. Private to src/nn/.
#pragma once

#include <nlohmann/json.hpp>

#include "fsdp/nn/moe.h"

namespace fsdp::nn {

nlohmann::json moe_to_json(const MoEConfig& moe);
// Refuses, naming the field, a missing or mistyped key.
MoEConfig moe_from_json(const nlohmann::json& j);

}  // namespace fsdp::nn
