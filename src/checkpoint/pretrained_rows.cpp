// Pretrained's readers of weights (fsdp/checkpoint/pretrained.h): a parameter's rows [a, b) of
// dim 0, or its packed blocks for QLoRA, from whichever mapped files and tensors hold them (the
// packed in-projection from q, k and v; GGUF's q/k rows in Hugging Face's order), so a sharded rank
// touches only its own rows' bytes; and load_into, which fills a model's shards.
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/gguf.h"
#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/models/spec.h"
#include "fsdp/models/state_dict_adapter.h"
#include "src/core/json_fields.h"
#include "src/core/json_read.h"
#include "src/checkpoint/pretrained_impl.h"

namespace fsdp::checkpoint {

using json = nlohmann::json;
using models::is_in_proj;
using models::is_in_proj_bias;
using models::Naming;

namespace {

// Our parameter name -> the file's, in naming `to` as the family's adapter names it ("" for the
// packed in-projection and for a block parameter the naming does not have; a name outside the
// blocks that the adapter does not know stays as it is).
std::string file_name(const models::StateDictAdapter& names, const std::string& ours, Naming to) {
  const std::string n = names.rename(ours, Naming::ours, to);
  return !n.empty() || ours.starts_with("layers.") ? n : ours;
}

// Whether norm weights in the GGUF `f` are stored as 1 + w (its family's adapter says).
bool norms_plus_one(const GgufFile& f) {
  const models::ModelSpec* spec =
      models::spec_for_gguf_arch(f.get_string("general.architecture", ""));
  return spec && spec->adapter->gguf_norm_plus_one;
}

// Refuses a weight that holds NaN or Inf, naming the tensor (f32 values of it).
void check_finite(const std::string& path, const std::string& name, const Tensor& t) {
  const Tensor c = t.contiguous();
  const float* v = c.data<float>();
  const int64_t n = c.numel();
  for (int64_t i = 0; i < n; ++i)
    FSDP_CHECK(std::isfinite(v[i]),
               "[pretrained] {}: tensor '{}' holds {} (element {} of {}); refusing a model with "
               "non-finite weights",
               path, name, std::isnan(v[i]) ? "NaN" : "Inf", i, n);
}


// One stored tensor of the file: its shape in PyTorch's order, and its rows [a, b) of dim 0 in
// f32 (1-D tensors: elements). GGUF reads only those rows' blocks (q/k in Hugging Face's order);
// safetensors touches only those rows' bytes.
struct Stored {
  const PretrainedSource* src = nullptr;
  std::string name;
  Shape shape;
  // One expert of a stacked parameter: the whole tensor is one row of ours (shape [1, ...]).
  bool one_row = false;
  // The file's rows (GGUF's ne[1] * ne[2] * ...) in one row of ours: H for a stacked tensor of
  // experts ([E, H, dim], llama.cpp's ffn_gate_exps), else 1.
  int64_t file_rows_per_row() const {
    return shape.size() < 3 ? 1 : shape_numel(shape) / std::max<int64_t>(shape[0], 1) / shape.back();
  }
  Tensor rows(int64_t a, int64_t b) const {
    if (one_row) {
      Shape whole(shape.begin() + 1, shape.end());
      Tensor t = Stored{src, name, whole}.rows(0, whole[0]);
      return t.view(shape);
    }
    if (src->gguf) {
      if (shape.size() == 1) {
        Tensor t = src->gguf->read(name, RowOrder::hf).slice(a, b).contiguous();
        check_finite(src->path, name, t);
        // llama.cpp's converter stores (1 + w) norms as 1 + w; ours hold w.
        if (name.ends_with("norm.weight") && norms_plus_one(*src->gguf)) {
          float* v = t.data<float>();
          for (int64_t i = 0; i < t.numel(); ++i) v[i] -= 1.0f;
        }
        return t;
      }
      const int64_t inner = file_rows_per_row();
      Tensor t = src->gguf->read_rows(name, a * inner, b * inner, RowOrder::hf);
      Shape s = shape;
      s[0] = b - a;
      check_finite(src->path, name, t);
      return t.view(s);
    }
    Tensor t = src->find(name)->slice(a, b).to(DType::f32);
    check_finite(src->path, name, t);
    return t;
  }
};

std::optional<Stored> stored(const PretrainedSource& s, const std::string& name) {
  if (s.gguf) {
    if (!s.gguf->contains(name)) return std::nullopt;
    return Stored{&s, name, s.gguf->tensor(name).shape()};
  }
  const Tensor* t = s.find(name);
  if (!t) return std::nullopt;
  return Stored{&s, name, t->shape()};
}

// The tensors that hold our parameter `name`, each with the rows of the parameter it fills: one
// for most, q/k/v for the packed in-projection (and its bias).
std::vector<std::pair<Stored, int64_t>> parts_of(const PretrainedSource& s,
                                                 const nn::TransformerConfig& cfg,
                                                 const std::string& name) {
  auto missing = [&](const std::string& other) {
    FSDP_FAIL("[init-from] {}: no tensor named '{}'{}", s.path, name,
              other.empty() || other == name ? "" : fmt::format(" nor '{}'", other));
  };
  // A safetensors file may hold our own names; GGUF never does.
  if (!s.gguf)
    if (auto st = stored(s, name)) return {{*st, 0}};
  // The file's names are those the family's adapter gives (a family with only our own: none).
  const models::StateDictAdapter* names = models::spec_to_train(cfg).adapter;
  if (!names) missing("");
  const Naming naming = s.gguf ? Naming::gguf : Naming::hf;
  if (const auto experts = names->stacked_names(name, naming, cfg.moe.experts); !experts.empty()) {
    std::vector<std::pair<Stored, int64_t>> out;
    for (size_t e = 0; e < experts.size(); ++e) {
      auto st = stored(s, experts[e]);
      if (!st) missing(experts[e]);
      st->shape.insert(st->shape.begin(), 1);
      st->one_row = true;
      out.emplace_back(*st, int64_t(e));
    }
    return out;
  }
  if (is_in_proj(name) || is_in_proj_bias(name)) {
    const auto rows = in_proj_rows(cfg);
    const auto qkv = names->in_proj_names(name, naming);
    std::vector<std::pair<Stored, int64_t>> out;
    for (size_t i = 0; i < 3; ++i) {
      auto st = stored(s, qkv[i]);
      if (!st) missing(qkv[i]);
      out.emplace_back(*st, rows[i].first);
    }
    return out;
  }
  const std::string n = file_name(*names, name, naming);
  auto st = stored(s, n);
  if (!st) missing(n);
  return {{*st, 0}};
}

// The parameter's shape as the file holds it (q/k/v stacked), checked against `want`.
void check_shape(const PretrainedSource& s, const nn::TransformerConfig& cfg,
                 const std::string& name, const std::vector<std::pair<Stored, int64_t>>& parts,
                 const Shape& want) {
  const auto rows = in_proj_rows(cfg);
  for (size_t i = 0; i < parts.size(); ++i) {
    const Stored& st = parts[i].first;
    Shape need = want;
    if (st.one_row)
      need[0] = 1;
    else if (parts.size() == 3)
      need[0] = rows[i].second - rows[i].first;
    FSDP_CHECK(st.shape == need,
               "[init-from] {}: '{}' has shape {} but the model ({} heads, {} kv heads of {}, "
               "dim {}) needs {} for '{}'",
               s.path, st.name, shape_str(st.shape), cfg.heads, cfg.resolved_kv_heads(),
               cfg.resolved_head_dim(), cfg.dim, shape_str(need), name);
  }
}

// Before the model is built: the shape of every parameter outside the blocks and of block 0's,
// from a one-block model of the config (shapes only, no storage), against the file's tensors.
// With the layer count already held to the file's layers, a crafted width (intermediate_size
// 1e9) is refused by name here, not allocated.
}  // namespace

void pretrained_detail::check_one_layer_shapes(const Pretrained& p, const PretrainedSource& src) {
  if (!p.config) return;
  nn::TransformerConfig one = *p.config;
  one.layers = 1;
  // An MoE's dense layers past the first are not layers of the one-layer model.
  std::erase_if(one.moe.dense_layers, [](int64_t layer) { return layer >= 1; });
  const std::unique_ptr<nn::Transformer> shapes = models::spec_to_train(one).build(one);
  for (auto& [name, param] : shapes->named_parameters())
    check_shape(src, one, name, parts_of(src, one, name), param->shape);
}

namespace {

// Rows [a, b) of the parameter, read (dequantized, checked finite) a chunk of at most 4 M values
// at a time: the f32 copy of a rank's rows of a 262k-row embedding never exists whole beside its
// shard. Each chunk goes to `use(first row, chunk)`.
template <class Use>
void for_row_chunks(const std::vector<std::pair<Stored, int64_t>>& parts, int64_t a, int64_t b,
                    Use&& use) {
  for (const auto& [st, at] : parts) {
    const int64_t lo = std::max(a, at), hi = std::min(b, at + st.shape[0]);
    if (lo >= hi) continue;
    const int64_t row = st.shape.size() > 1 ? shape_numel(st.shape) / st.shape[0] : 1;
    const int64_t step = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(1, row));
    for (int64_t c = lo; c < hi; c += step) {
      const int64_t e = std::min(hi, c + step);
      use(c, st.rows(c - at, e - at));
    }
  }
}

// Rows [a, b) of the parameter into `dst` ([b - a, ...], any dtype or device).
void fill_rows(const std::vector<std::pair<Stored, int64_t>>& parts, int64_t a, int64_t b,
               const Tensor& dst) {
  for_row_chunks(parts, a, b, [&](int64_t first, const Tensor& rows) {
    dst.narrow(0, first - a, rows.shape()[0]).copy_(rows);
  });
}

}  // namespace

Tensor Pretrained::read_rows(const nn::TransformerConfig& cfg, const std::string& name,
                             int64_t begin, int64_t end) const {
  auto parts = parts_of(*source, cfg, name);
  Shape shape = parts[0].first.shape;
  shape[0] = parts.back().second + parts.back().first.shape[0];  // q/k/v's or experts' together
  FSDP_CHECK(0 <= begin && begin <= end && end <= shape[0],
             "[pretrained] {}: rows [{}, {}) of '{}' are outside its {} rows", path, begin, end,
             name, shape[0]);
  check_shape(*source, cfg, name, parts, shape);
  shape[0] = end - begin;
  Tensor out = Tensor::empty(shape, DType::f32);
  fill_rows(parts, begin, end, out);
  return out;
}

Tensor Pretrained::read(const nn::TransformerConfig& cfg, const std::string& name) const {
  auto parts = parts_of(*source, cfg, name);
  if (parts.size() == 1 && !source->gguf) {
    const Tensor* t = source->find(parts[0].first.name);
    if (t->dtype() == DType::f32) {  // in place, zero copy
      check_finite(path, parts[0].first.name, *t);
      return *t;
    }
  }
  const int64_t rows = parts.back().second + parts.back().first.shape[0];
  return read_rows(cfg, name, 0, rows);
}

std::optional<PackedRows> Pretrained::packed_rows(const nn::TransformerConfig& cfg,
                                                  const std::string& name) const {
  if (!source->gguf) return std::nullopt;
  auto parts = parts_of(*source, cfg, name);
  // Matrices, and an MoE's stacked experts (each expert's rows: whole blocks, one after another).
  if (parts[0].first.shape.size() < 2) return std::nullopt;
  PackedRows out;
  int64_t rows = 0;
  for (const auto& [st, at] : parts) {
    const GgufTensorInfo& ti = source->gguf->tensor(st.name);
    FSDP_CHECK(at == rows, "[init-from] {}: '{}' fills rows from {}, after {} rows", path, st.name,
               at, rows);
    FSDP_CHECK(ggml_type_readable(ti.type),
               "[init-from] {}: tensor '{}' is {}; fsdp.cpp dequantizes {}", path, st.name,
               ggml_type_name(ti.type), ggml_readable_type_names());
    for (int64_t d : st.shape)  // a zero dimension would divide by zero below
      FSDP_CHECK(d > 0, "[init-from] {}: tensor '{}' has shape {}; expected every dimension > 0",
                 path, st.name, shape_str(st.shape));
    const int64_t inner = st.file_rows_per_row();
    out.runs.push_back({ti.rows() / inner, int64_t(ti.row_bytes()) * inner, ti.type});
    rows += ti.rows() / inner;
  }
  out.decode = [](uint32_t type, const uint8_t* src, float* dst, int64_t n) {
    dequantize_row(type, src, dst, n);
  };
  return out;
}

void Pretrained::load_into(nn::Transformer& model, FSDPModule* root) const {
  const nn::TransformerConfig& cfg = model.config();
  // A LoRA run's adapters are not the model's: they keep their initial values (B zero).
  if (!root) {
    for (auto& [name, p] : model.named_parameters()) {
      if (nn::is_lora_parameter(name)) continue;
      auto parts = parts_of(*source, cfg, name);
      check_shape(*source, cfg, name, parts, p->shape);
      FSDP_CHECK(p->data.defined(), "[pretrained] load_into: '{}' has no storage", name);
      fill_rows(parts, 0, p->shape[0], p->data);
    }
    return;
  }
  // Each rank's rows of each Shard(0) parameter (torch.chunk's split of dim 0), written into the
  // shard buffers that the optimizer steps.
  auto groups = root->param_groups(0);
  for (const auto& in : root->shard_infos()) {
    if (nn::is_lora_parameter(in.name)) continue;
    auto parts = parts_of(*source, cfg, in.name);
    check_shape(*source, cfg, in.name, parts, in.global_shape);
    if (in.local_rows == 0) continue;
    const int64_t row = shape_numel(in.global_shape) / in.global_shape[0];
    Shape local = in.global_shape;
    local[0] = in.local_rows;
    if (in.packed) {  // the stored rows' bytes, as they are
      const int64_t a = in.local_begin, b = a + in.local_rows;
      auto* dst = static_cast<uint8_t*>(groups[in.group].params.raw_data()) + in.offset;
      int64_t wrote = 0;
      for (const auto& [st, at] : parts) {
        const int64_t lo = std::max(a, at), hi = std::min(b, at + st.shape[0]);
        if (lo >= hi) continue;
        const int64_t inner = st.file_rows_per_row();
        source->gguf->read_row_bytes(st.name, (lo - at) * inner, (hi - at) * inner, RowOrder::hf,
                                     dst + wrote);
        wrote += (hi - lo) * inner * int64_t(source->gguf->tensor(st.name).row_bytes());
      }
      FSDP_CHECK(wrote == in.packed_bytes,
                 "[init-from] {}: '{}' took {} bytes of this rank's rows where its shard holds {}",
                 path, in.name, wrote, in.packed_bytes);
      for_row_chunks(parts, a, b, [](int64_t, const Tensor&) {});  // the values are finite
      continue;
    }
    Tensor dst =
        groups[in.group].params.slice(in.offset, in.offset + in.local_rows * row).view(local);
    fill_rows(parts, in.local_begin, in.local_begin + in.local_rows, dst);
  }
}

void Pretrained::release_file_pages() const {
  if (!source) return;
  if (source->gguf) source->gguf->release_pages();
  // A Hugging Face folder's mapped tensors: their clean pages would otherwise stay resident for
  // the whole run (the file's size beside the memory plan's peak; bench/moe_ep.sh's model at np 1:
  // 197 MiB of a 207 MB model.safetensors). They read back from the file if touched again.
  for (const SafetensorsFile& f : source->files)
    for (const auto& [name, t] : f.tensors)
      release_mapped_pages(static_cast<const uint8_t*>(t.raw_data()),
                           uint64_t(t.numel()) * uint64_t(dtype_size(t.dtype())));
}

}  // namespace fsdp::checkpoint
