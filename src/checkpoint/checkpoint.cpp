// Sharded checkpoint save/load with resharding.
#include "fsdp/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/file.h"
#include "fsdp/core/env.h"
#include "fsdp/dist/placement.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string shard_file(int shard) { return fmt::format("shard_{:05d}.safetensors", shard); }

void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void barrier(const std::shared_ptr<dist::ProcessGroup>& world) {
  if (world && world->size() > 1) world->barrier()->wait();
}

// Rows [begin, begin + len) of a shard buffer `flat` at `offset` with row width `row`, shaped like
// the parameter.
Tensor rows_view(const Tensor& flat, int64_t offset, int64_t rows, const Shape& global) {
  const int64_t row = global[0] ? shape_numel(global) / global[0] : 0;
  Shape s = global;
  s[0] = rows;
  return flat.slice(offset, offset + rows * row).view(s);
}

}  // namespace

void save(const std::string& dir, int64_t step, FSDPModule& root, const optim::Optimizer& opt,
          const std::string& config_json, int keep,
          const std::shared_ptr<dist::ProcessGroup>& world, const Extras& extras) {
  const int rank = world ? world->rank() : 0;
  json user;  // checked on every rank before anything is written
  try {
    user = json::parse(extras.user_json);
  } catch (const json::exception& e) {
    FSDP_FAIL("[checkpoint] the trainer's extra JSON '{}' is not JSON: {}",
              extras.user_json.substr(0, 200), e.what());
  }
  const fs::path final_dir = fs::path(dir) / step_name(step);
  const fs::path tmp = fs::path(dir) / (".tmp_" + step_name(step));
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    FSDP_CHECK(!ec, "[checkpoint] cannot create '{}': {}", dir, ec.message());
    fs::remove_all(tmp, ec);  // a crashed earlier attempt
    fs::create_directories(tmp, ec);
    FSDP_CHECK(!ec, "[checkpoint] cannot create '{}': {}", tmp.string(), ec.message());
  }
  barrier(world);

  auto infos = root.shard_infos();
  auto groups = root.param_groups(0);
  const int shard = root.shard_rank(), shards = root.shard_count();
  std::string checksum;
  if (root.first_replica()) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    const double slow_ms = env_double("FSDP_CKPT_SLOW_WRITE_MS");
    for (const auto& in : infos) {
      tensors.emplace_back("param/" + in.name, rows_view(groups[in.group].params, in.offset,
                                                         in.local_rows, in.global_shape));
      for (const auto& [state, flat] : opt.state(groups[in.group].params))
        tensors.emplace_back(state + "/" + in.name,
                             rows_view(flat, in.offset, in.local_rows, in.global_shape));
    }
    if (slow_ms > 0)
      std::this_thread::sleep_for(
          std::chrono::milliseconds(int64_t(slow_ms)));  // tests: a window to kill in
    const fs::path file = tmp / shard_file(shard);
    save_safetensors(file.string(), tensors, {{"shard", std::to_string(shard)}});
    checksum = file_checksum(file.string());
  }
  // Rank 0 gathers each shard's checksum (16 hex digits) and writes the metadata.
  std::vector<char> mine(16, '0');
  std::copy(checksum.begin(), checksum.end(), mine.begin());
  const int n = world ? world->size() : 1;
  Tensor my_t = Tensor::empty({16}, DType::i32);
  for (int i = 0; i < 16; ++i) my_t.data<int32_t>()[i] = mine[size_t(i)];
  Tensor all_t = Tensor::empty({16 * int64_t(n)}, DType::i32);
  Tensor shard_t = Tensor::full({1}, double(root.first_replica() ? shard : -1), DType::i32);
  Tensor shards_t = Tensor::empty({n}, DType::i32);
  if (world && n > 1) {
    const Device d = world->device();
    Tensor a = all_t.to(d), s = shards_t.to(d);
    world->all_gather_into_tensor(a, my_t.to(d))->wait();
    world->all_gather_into_tensor(s, shard_t.to(d))->wait();
    all_t = a.to(Device::cpu());
    shards_t = s.to(Device::cpu());
  } else {
    all_t = my_t;
    shards_t = shard_t;
  }
  if (rank == 0) {
    json meta;
    meta["format"] = "fsdp.cpp-checkpoint/1";
    meta["step"] = step;
    meta["optimizer_step"] = opt.step_count();
    meta["data_position"] = extras.data_position >= 0 ? extras.data_position : step;
    meta["user"] = user;
    meta["shards"] = shards;
    meta["config"] = json::parse(config_json);
    json files = json::object();
    for (int r = 0; r < n; ++r) {
      const int s = shards_t.data<int32_t>()[r];
      if (s < 0) continue;
      std::string c;
      for (int i = 0; i < 16; ++i) c.push_back(char(all_t.data<int32_t>()[16 * r + i]));
      files[shard_file(s)] = {{"checksum", c}};
    }
    for (const auto& [name, contents] : extras.files) {
      FSDP_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "metadata.json" &&
                     name.rfind("shard_", 0) != 0,
                 "[checkpoint] extra file name '{}' must be a plain name other than "
                 "metadata.json and shard_*",
                 name);
      const fs::path fp = tmp / name;
      write_file_atomic(fp.string(), contents, "[checkpoint]");  // every write, fsync, close checked
      files[name] = {{"checksum", file_checksum(fp.string())}};
    }
    meta["files"] = files;
    json tensors = json::object();
    for (const auto& in : infos) {
      json chunks = json::array();
      for (int s = 0; s < shards; ++s) {
        auto [b, len] = dist::chunk_range(in.global_shape[0], shards, s);
        chunks.push_back({b, len});
      }
      tensors[in.name] = {{"shape", in.global_shape},
                          {"dtype", std::string(dtype_name(groups[in.group].params.dtype()))},
                          {"placement", "Shard(0)"},
                          {"chunks", chunks}};
    }
    meta["tensors"] = tensors;
    const fs::path mp = tmp / "metadata.json";
    write_file_atomic(mp.string(), meta.dump(1) + "\n", "[checkpoint]");
    fsync_path(tmp, true);
    std::error_code ec;
    fs::remove_all(final_dir, ec);  // an older checkpoint of the same step is replaced whole
    fs::rename(tmp, final_dir, ec);
    FSDP_CHECK(!ec, "[checkpoint] rename '{}' -> '{}' failed: {}", tmp.string(), final_dir.string(),
               ec.message());
    fsync_path(dir, true);
    if (keep > 0) {
      std::vector<fs::path> steps;
      for (auto& e : fs::directory_iterator(dir))
        if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0)
          steps.push_back(e.path());
      std::sort(steps.begin(), steps.end());
      for (size_t i = 0; i + size_t(keep) < steps.size(); ++i) fs::remove_all(steps[i], ec);
    }
  }
  barrier(world);
}

std::string latest(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  std::vector<fs::path> steps;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0 &&
        fs::exists(e.path() / "metadata.json"))
      steps.push_back(e.path());
  if (steps.empty()) return "";
  std::sort(steps.begin(), steps.end());
  return steps.back().string();
}

namespace {
std::optional<std::string> read_extra_file_unchecked(const std::string& path,
                                                     const std::string& name) {
  const fs::path dir(path);
  const fs::path mp = dir / "metadata.json";
  std::ifstream mf(mp);
  FSDP_CHECK(mf.good(), "[checkpoint] {} has no metadata.json (not a checkpoint)", path);
  json meta;
  try {
    mf >> meta;
  } catch (const json::exception& e) {
    FSDP_FAIL("[checkpoint] {}: metadata.json is not valid JSON: {}", path, e.what());
  }
  const json files = meta.value("files", json::object());
  if (!files.contains(name)) return std::nullopt;
  const fs::path fp = dir / name;
  FSDP_CHECK(fs::exists(fp), "[checkpoint] {}: the metadata lists {} but the file is missing", path,
             name);
  const std::string want = files[name].value("checksum", "");
  const std::string got = file_checksum(fp.string());
  FSDP_CHECK(got == want,
             "[checkpoint] {}: {} has checksum {} but the metadata says {} (truncated or "
             "corrupted)",
             path, name, got, want);
  std::ifstream f(fp, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}
}  // namespace

std::optional<std::string> read_extra_file(const std::string& path, const std::string& name) {
  try {
    return read_extra_file_unchecked(path, name);
  } catch (const json::exception& e) {  // valid JSON of the wrong shape: name the file
    FSDP_FAIL("[checkpoint] {}/metadata.json does not hold a checkpoint's fields: {}", path,
              e.what());
  }
}

namespace {
Loaded load_unchecked(const std::string& path, FSDPModule& root, optim::Optimizer& opt,
                      const std::string& config_json, const std::vector<std::string>& model_keys) {
  const fs::path dir(path);
  const fs::path mp = dir / "metadata.json";
  FSDP_CHECK(fs::exists(mp),
             "[checkpoint] {} has no metadata.json (not a checkpoint, or an unfinished one)", path);
  json meta;
  try {
    std::ifstream f(mp);
    f >> meta;
  } catch (const json::exception& e) {
    FSDP_FAIL("[checkpoint] {}: metadata.json is not valid JSON: {}", path, e.what());
  }
  FSDP_CHECK(meta.value("format", "") == "fsdp.cpp-checkpoint/1",
             "[checkpoint] {}: unknown format '{}'", mp.string(), meta.value("format", ""));
  const json want = json::parse(config_json);
  for (const std::string& k : model_keys) {
    const json have = meta["config"].value(k, json());
    FSDP_CHECK(have == want.value(k, json()),
               "[checkpoint] {} was saved with {} {} but this run has {} {}", path, k, have.dump(),
               k, want.value(k, json()).dump());
  }
  const int old_shards = meta["shards"].get<int>();
  for (int s = 0; s < old_shards; ++s) {
    const fs::path file = dir / shard_file(s);
    FSDP_CHECK(fs::exists(file),
               "[checkpoint] {} is missing {} (the checkpoint was written by {} shards)", path,
               shard_file(s), old_shards);
  }

  auto infos = root.shard_infos();
  auto groups = root.param_groups(0);
  std::map<int, std::unique_ptr<SafetensorsIndex>>
      open;  // old shard files this rank reads, checked once
  auto shard_index = [&](int s) -> SafetensorsIndex& {
    auto& idx = open[s];
    if (!idx) {
      const fs::path file = dir / shard_file(s);
      const std::string expect =
          meta["files"].value(shard_file(s), json::object()).value("checksum", "");
      const std::string got = file_checksum(file.string());
      FSDP_CHECK(
          got == expect,
          "[checkpoint] {}: checksum {} does not match the metadata's {} (truncated or corrupted)",
          file.string(), got, expect);
      idx = std::make_unique<SafetensorsIndex>(file.string());
    }
    return *idx;
  };
  for (const auto& in : infos) {
    FSDP_CHECK(meta["tensors"].contains(in.name), "[checkpoint] {} has no tensor '{}'", path,
               in.name);
    const json& t = meta["tensors"][in.name];
    FSDP_CHECK(t["shape"].get<Shape>() == in.global_shape,
               "[checkpoint] {}: '{}' has shape {} but the model has {}", path, in.name,
               shape_str(t["shape"].get<Shape>()), shape_str(in.global_shape));
    const int64_t row = in.global_shape[0] ? shape_numel(in.global_shape) / in.global_shape[0] : 0;
    const int64_t my_b = in.local_begin, my_e = in.local_begin + in.local_rows;
    for (int s = 0; s < old_shards; ++s) {
      const int64_t b = t["chunks"][s][0].get<int64_t>(), len = t["chunks"][s][1].get<int64_t>();
      const int64_t lo = std::max(b, my_b), hi = std::min(b + len, my_e);
      if (lo >= hi) continue;
      SafetensorsIndex& idx = shard_index(s);
      std::vector<std::pair<std::string, Tensor>> dst = {{"param", groups[in.group].params}};
      for (auto& st : opt.state(groups[in.group].params)) dst.push_back(st);
      for (const auto& [prefix, flat] : dst) {
        Tensor src = idx.read(prefix + "/" + in.name);
        const int64_t at = in.offset + (lo - my_b) * row;
        flat.slice(at, at + (hi - lo) * row)
            .copy_(src.reshape({-1}).slice((lo - b) * row, (hi - b) * row));
      }
    }
  }
  opt.set_step_count(meta.value("optimizer_step", int64_t(0)));
  const int64_t step = meta["step"].get<int64_t>();
  return {step, meta["config"].dump(), meta.value("data_position", step),
          meta.value("user", json::object()).dump()};
}
}  // namespace

Loaded load(const std::string& path, FSDPModule& root, optim::Optimizer& opt,
            const std::string& config_json, const std::vector<std::string>& model_keys) {
  try {
    return load_unchecked(path, root, opt, config_json, model_keys);
  } catch (const json::exception& e) {  // valid JSON of the wrong shape: name the file
    FSDP_FAIL("[checkpoint] {}/metadata.json does not hold a checkpoint's fields: {}", path,
              e.what());
  }
}

}  // namespace fsdp::checkpoint
