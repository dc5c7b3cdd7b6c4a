// The module tree's forms (nn::Arch) by the names users give them: --arch and the config JSON's
// "arch". Each form is named after the family that is it (the seed's, llama's), and the names were
// the forms' own before nn named them by what they are; they stay the same in flags and in every
// config and checkpoint written since. Defined here, with the families, so that nn, train and
// checkpoint name no family.
#include <array>
#include <string>
#include <string_view>
#include <utility>

#include "fsdp/core/error.h"
#include "fsdp/nn/transformer.h"

namespace fsdp::nn {

namespace {
constexpr std::array<std::pair<Arch, std::string_view>, 2> kFormNames = {{
    {Arch::seed, "seed"},
    {Arch::decoder, "llama"},
}};
}  // namespace

Arch parse_arch(const std::string& s) {
  for (const auto& [arch, name] : kFormNames)
    if (s == name) return arch;
  FSDP_FAIL("[model] unknown arch '{}'; expected {} or {}", s, kFormNames[0].second,
            kFormNames[1].second);
}

std::string arch_name(Arch a) {
  for (const auto& [arch, name] : kFormNames)
    if (a == arch) return std::string(name);
  FSDP_FAIL("[model] arch {} has no name", int(a));
}

}  // namespace fsdp::nn
