// --pref-precompute-ref (TRL's precompute_ref_log_probs): before training, every pair's reference
// log-probs (chosen, rejected: sums over the reply's targets, f64) are computed once, by the
// reference the run would otherwise keep (the base with its adapters off under LoRA, the initial
// model for a full fine-tune, --pref-reference's model), and handed to the pair sources, whose
// batches carry them (data::Batch::reference_logps); the loss then runs no reference model and a
// full fine-tune builds no frozen copy. The pass runs before a resume loads the trained weights,
// so the policy itself is still the initial model; only --pref-reference builds a model for it,
// and frees it after.
//
// The pass is sharded as training is: each forward, each rank takes the next batch / 2 pairs (its
// rows of a global batch) and one all-reduce of the 2P values (each written by one rank, 0 on the
// others: the sum is exact) gives every rank all of them, whatever the world size.
//
// The cache file (--pref-ref-cache, else pref_ref_logps.json in --ckpt-dir, else none) is JSON:
// "format", "key" (what determines the values: the reference's identity by content, the model's
// shape and dtypes, seq, truncation, the tokenizer, and per set the data file by content, its pair
// count and its rows' token hash), "sets" (each set's 2P values, exact: JSON's shortest
// round-trip digits) and "checksum" (FNV-1a over the key's text and the values' bytes). Rank 0
// reads it and all ranks agree: a file of this key is used; one of another key (stale) is computed
// again and replaced, saying which field differs; a file that is not such a cache (not a regular
// file, larger than one of these pairs can be, no "format"), or is damaged (unparsable, wrong
// counts, its checksum, which is checked before its key, so that a damaged key is not taken for
// another run's), is refused by name and never overwritten. It is written
// through an AtomicFile (a temporary renamed over it).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/pretrained.h"
#include "fsdp/core/device.h"
#include "fsdp/core/dtype.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/core/tensor.h"
#include "fsdp/data/preference.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/module.h"
#include "fsdp/train/preference.h"
#include "src/train/trainer_impl.h"

namespace fsdp::train {

namespace {

constexpr const char* kFormat = "fsdp.cpp preference reference log-probs 1";
constexpr const char* kWhere = "[fsdp-train] --pref-precompute-ref";

struct RefSet {      // a source whose pairs need their reference log-probs
  std::string name;  // "train", "val"
  data::PreferenceSource* source;
  std::vector<double> logps;  // 2 a pair
};

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Over the key's text and each set's values in the sets' order (a file's: its "sets" object's
// names, sorted, which is the order a run writes them: "train", then "val").
std::string checksum(const nlohmann::json& key, const std::vector<std::vector<double>>& values) {
  const std::string text = key.dump();
  uint64_t h = fnv1a(text.data(), text.size(), 14695981039346656037ull);
  for (const std::vector<double>& v : values) h = fnv1a(v.data(), v.size() * sizeof(double), h);
  return fmt::format("{:016x}", h);
}
std::string checksum(const nlohmann::json& key, const std::vector<RefSet>& sets) {
  std::map<std::string, std::vector<double>> by_name;  // the sets by name, as a file's are read
  for (const RefSet& s : sets) by_name[s.name] = s.logps;
  std::vector<std::vector<double>> values;
  for (const auto& [name, v] : by_name) values.push_back(v);
  return checksum(key, values);
}

// What a rank-0 read of the cache found.
enum class Cached : int { compute = 0, valid = 1, refused = 2 };

// Reads `path` into sets' logps if it holds `key`'s values (valid); stale or absent: compute
// (*why says what differs); not a cache or damaged: refused (*why is the message).
Cached read_cache(const std::string& path, const nlohmann::json& key, std::vector<RefSet>& sets,
                  std::string* why) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
    return Cached::compute;
  }
  try {
    check_regular(path, kWhere);
  } catch (const Error& e) {
    *why = e.what();
    return Cached::refused;
  }
  // No more than such a file of these pairs can hold (a value is at most 24 characters and a
  // comma), or 256 MiB (some 5 M pairs: a cache of a larger data set than this run's is read, found
  // outdated and recomputed), so a large file named by mistake is refused, not read.
  uint64_t values = 0;
  for (const RefSet& s : sets) values += 2 * uint64_t(s.source->pairs());
  const uint64_t limit = std::max<uint64_t>(uint64_t(256) << 20, (uint64_t(1) << 20) + 32 * values);
  if (std::filesystem::file_size(path, ec) > limit) {
    *why = fmt::format(
        "{}: {} is {} bytes, more than a file of reference log-probs for {} values "
        "can be ({} bytes); it is not one, and is left as it is",
        kWhere, path, std::filesystem::file_size(path, ec), values, limit);
    return Cached::refused;
  }
  std::ifstream f(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  const auto refuse = [&](const std::string& what) {
    *why = fmt::format(
        "{}: {} {}; remove it (or give another --pref-ref-cache) to compute the "
        "reference log-probs again",
        kWhere, path, what);
    return Cached::refused;
  };
  if (j.is_discarded())
    return refuse(
        "is not JSON (a damaged file of reference log-probs, or another file), and is "
        "left as it is");
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
    return refuse(
        fmt::format("is not a file of reference log-probs (no \"format\": \"{}\"), and "
                    "is left as it is",
                    kFormat));
  if (!j.contains("key") || !j["key"].is_object()) return refuse("is damaged: no \"key\" object");
  if (!j.contains("sets") || !j["sets"].is_object())
    return refuse("is damaged: no \"sets\" object");
  // The file's own checksum first, over its own key and values: a damaged key is refused as
  // damaged, and only an intact file of another key is stale (computed again and replaced).
  std::map<std::string, std::vector<double>> held;
  for (const auto& [name, v] : j["sets"].items()) {
    if (!v.is_array()) return refuse(fmt::format("is damaged: \"sets\".\"{}\" is not an array", name));
    std::vector<double>& out = held[name];
    for (const nlohmann::json& x : v) {
      if (!x.is_number() || !std::isfinite(x.get<double>()))
        return refuse(fmt::format("is damaged: \"sets\".\"{}\" holds {}, not a finite number",
                                  name, x.dump()));
      out.push_back(x.get<double>());
    }
  }
  std::vector<std::vector<double>> file_values;
  for (const auto& [name, v] : held) file_values.push_back(v);
  if (!j.contains("checksum") || j["checksum"] != checksum(j["key"], file_values))
    return refuse("is damaged: its \"checksum\" does not match its key and values");
  if (j["key"] != key) {
    for (const auto& [field, value] : key.items())
      if (!j["key"].contains(field) || j["key"][field] != value) {
        *why =
            fmt::format("its \"{}\" was {}, this run's is {}", field,
                        j["key"].contains(field) ? j["key"][field].dump() : "absent", value.dump());
        return Cached::compute;
      }
    *why = "its key holds other fields";
    return Cached::compute;
  }
  for (RefSet& s : sets) {  // this key's file: its sets are this run's, whole
    const int64_t want = 2 * s.source->pairs();
    const auto it = held.find(s.name);
    if (it == held.end() || int64_t(it->second.size()) != want)
      return refuse(
          fmt::format("is damaged: \"sets\".\"{}\" is not an array of {} numbers (2 a "
                      "pair)",
                      s.name, want));
    s.logps = it->second;
  }
  return Cached::valid;
}

void write_cache(const std::string& path, const nlohmann::json& key,
                 const std::vector<RefSet>& sets) {
  nlohmann::json j{{"format", kFormat}, {"key", key}, {"sets", nlohmann::json::object()}};
  for (const RefSet& s : sets) j["sets"][s.name] = s.logps;
  j["checksum"] = checksum(key, sets);
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomic(path, j.dump() + "\n", kWhere);
}

}  // namespace

void Trainer::Impl::precompute_reference() {
  auto* pref = dynamic_cast<PreferenceLoss*>(parts.loss.get());
  if (!pref || !pref->precomputed()) return;
  std::vector<RefSet> sets;
  for (auto [name, s] : {std::pair{"train", src.get()}, std::pair{"val", val.get()}})
    if (auto* p = dynamic_cast<data::PreferenceSource*>(s)) sets.push_back({name, p, {}});
  FSDP_CHECK(!sets.empty(), "{}: the run has no preference pairs (--data FILE.jsonl)", kWhere);
  const std::string path =
      !o.preference.pref_ref_cache.empty() ? o.preference.pref_ref_cache
      : !o.checkpoint.ckpt_dir.empty()
          ? (std::filesystem::path(o.checkpoint.ckpt_dir) / "pref_ref_logps.json").string()
          : "";
  // What determines the values (rank 0 alone reads and writes the file).
  const std::string& other = o.preference.pref_reference;
  const auto make_key = [&] {
    const std::string& init = o.model.init_from;
    nn::TransformerConfig shape = cfg;
    shape.lora = {}, shape.batch = 0, shape.seq = 0;  // seq: its own field
    nlohmann::json key{
        {"reference", !other.empty()  ? "--pref-reference " + checkpoint::model_identity(other)
                      : !init.empty() ? "the initial model " + checkpoint::model_identity(init)
                                      : fmt::format("the initial model from seed {}", o.run.seed)},
        {"model", nlohmann::json::parse(shape.to_json())},
        {"dtype", dtype_name(dtype)},
        {"param_dtype", dtype_name(mp.param_dtype.value_or(dtype))},
        {"seq", cfg.seq},
        {"truncation", o.preference.pref_truncation},
        {"tokenizer", tokenizer ? tokenizer->hash() : ""}};
    for (const RefSet& s : sets) {
      const std::string& file =
          s.name == std::string("train") || o.data.val_data.empty() ? o.data.data : o.data.val_data;
      key[s.name] = nlohmann::json{{"data", data::data_identity(file).str()},
                                   {"pairs", s.source->pairs()},
                                   {"tokens", fmt::format("{:016x}", s.source->content_hash())}};
    }
    return key;
  };
  const auto all_sum = [this](std::vector<double> v) {  // exact where one rank holds each value
    Tensor t = Tensor::from_vector(v, {int64_t(v.size())}).to(device);
    pg->all_reduce(t, dist::ReduceOp::SUM)->wait();
    return t.to_f64_vector();
  };
  // Rank 0 reads; every rank learns what it found (and the values) from one all-reduce, a
  // refusal too (an error of rank 0's alone would leave the others waiting in it).
  std::string why;
  Cached found = Cached::compute;
  nlohmann::json key;
  if (main() && !path.empty()) {
    try {
      key = make_key();
      found = read_cache(path, key, sets, &why);
    } catch (const std::exception& e) {
      why = e.what(), found = Cached::refused;
    }
  }
  std::vector<double> shared{double(int(found))};
  for (const RefSet& s : sets) {
    const int64_t n = 2 * s.source->pairs();
    if (found == Cached::valid)
      shared.insert(shared.end(), s.logps.begin(), s.logps.end());
    else
      shared.resize(shared.size() + size_t(n), 0.0);
  }
  shared = all_sum(std::move(shared));
  found = Cached(int(shared[0]));
  if (found == Cached::refused) {
    FSDP_CHECK(!main(), "{}", why);
    FSDP_FAIL("{}: rank 0 refused the file {} (its message says why)", kWhere, path);
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t forwards = 0;
  if (found == Cached::valid) {
    size_t at = 1;
    for (RefSet& s : sets) {
      s.logps.assign(shared.begin() + std::ptrdiff_t(at),
                     shared.begin() + std::ptrdiff_t(at + 2 * size_t(s.source->pairs())));
      at += s.logps.size();
    }
  } else {
    // The reference: --pref-reference's model, built for the pass alone; else the policy, still
    // the initial model (a resume loads its weights after this), with its adapters off.
    if (!other.empty()) build_reference(pref);
    nn::Module& ref = reference ? static_cast<nn::Module&>(*reference) : *model;
    const nn::LoraDisabledScope base;
    const int64_t per_rank = cfg.batch / 2, global = per_rank * size;
    for (RefSet& s : sets) {
      const int64_t pairs = s.source->pairs();
      std::vector<double> mine(size_t(2 * pairs), 0.0);
      for (int64_t first = 0; first < pairs; first += global, ++forwards) {
        const int64_t begin = first + rank * per_rank;  // past the last pair: repeats, dropped
        data::Batch b = s.source->pair_rows(begin, per_rank, cfg.seq);
        b.inputs = b.inputs.to(device), b.targets = b.targets.to(device);
        const std::vector<double> logps = reference_row_logps(ref, b, true);
        for (int64_t r = 0; r < 2 * per_rank && begin + r / 2 < pairs; ++r)
          mine[size_t(2 * begin + r)] = logps[size_t(r)];
      }
      s.logps = all_sum(std::move(mine));
      for (size_t i = 0; i < s.logps.size(); ++i)  // every rank holds them all: all refuse alike
        FSDP_CHECK(std::isfinite(s.logps[i]),
                   "{}: the reference log-prob of {} pair {}'s {} row is {}: the reference "
                   "model's logits are not finite",
                   kWhere, s.name, i / 2, i % 2 ? "rejected" : "chosen", s.logps[i]);
    }
    if (reference) {  // training holds no reference model
      pref->set_reference_model(nullptr);
      reference.reset();
    }
    if (!path.empty()) {  // rank 0 writes; all ranks agree on whether it could
      std::string failed;
      if (main()) try {
          write_cache(path, key, sets);
        } catch (const std::exception& e) {
          failed = fmt::format("{}: cannot write {}: {}", kWhere, path, e.what());
        }
      if (all_sum({failed.empty() ? 0.0 : 1.0})[0] > 0) {
        FSDP_CHECK(failed.empty(), "{}", failed);
        FSDP_FAIL("{}: rank 0 could not write {} (its message says why)", kWhere, path);
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (RefSet& s : sets) s.source->set_reference(std::move(s.logps));
  if (!main()) return;
  std::string what;
  for (const RefSet& s : sets)
    what += fmt::format("{}{} {} pairs", what.empty() ? "" : ", ", s.source->pairs(), s.name);
  if (found == Cached::valid)
    fmt::print("reference log-probs: {}, read from {}\n", what, path);
  else
    fmt::print("reference log-probs: {}, computed in {:.2f} s ({} forwards a rank{}){}\n", what,
               seconds, forwards,
               why.empty() ? "" : fmt::format("; the file held other ones: {}", why),
               path.empty() ? ", not stored (no --pref-ref-cache or --ckpt-dir)"
                            : fmt::format(", written to {}", path));
  std::fflush(stdout);
}

}  // namespace fsdp::train
