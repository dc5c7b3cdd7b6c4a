// The packed in-projection's parameter names ("layers.N.attn.in_proj_weight" and its bias), which
// every export (Hugging Face names, GGUF) splits into q, k and v.
#pragma once

#include <string>

namespace fsdp::checkpoint::detail {

inline bool is_in_proj(const std::string& n) {
  return n.find(".attn.in_proj_weight") != std::string::npos;
}
inline bool is_in_proj_bias(const std::string& n) {
  return n.find(".attn.in_proj_bias") != std::string::npos;
}

}  // namespace fsdp::checkpoint::detail
