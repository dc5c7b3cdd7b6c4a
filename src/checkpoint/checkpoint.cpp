// Sharded checkpoint save/load with resharding. What a folder must hold to be read, and the
// checks every reader makes before it reads a tensor byte: src/checkpoint/manifest.h. This file is
// the on-disk protocol only: which checkpoints are kept is checkpoint::Manager's (manager.cpp).
#include "fsdp/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stop_token>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/env.h"
#include "fsdp/core/file.h"
#include "fsdp/distributed/placement.h"
#include "src/checkpoint/manifest.h"
#include "src/checkpoint/save_parts.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using detail::shard_file;

std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }

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

namespace detail {

void begin_save(const std::string& dir, int64_t step,
                const std::shared_ptr<dist::ProcessGroup>& world, const Extras& extras) {
  try {  // checked on every rank before anything is written
    [[maybe_unused]] const json user = json::parse(extras.user_json);
  } catch (const json::exception& e) {
    FSDP_FAIL("[checkpoint] the trainer's extra JSON '{}' is not JSON: {}",
              extras.user_json.substr(0, 200), e.what());
  }
  for (const auto& [name, contents] : extras.files)
    FSDP_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "metadata.json" &&
                   name != detail::kCompleteFile && name.rfind("shard_", 0) != 0,
               "[checkpoint] extra file name '{}' must be a plain name other than "
               "metadata.json, complete.json and shard_*",
               name);
  // Rank 0 makes the folders; its error, if any, is agreed by every rank (a throw before the
  // barrier left the others waiting there until the collective time-out).
  std::string error;
  if (!world || world->rank() == 0) {
    try {
      const fs::path tmp = fs::path(dir) / (".tmp_" + step_name(step));
      std::error_code ec;
      fs::create_directories(dir, ec);
      FSDP_CHECK(!ec, "[checkpoint] cannot create '{}': {}", dir, ec.message());
      // An older checkpoint of the same step is replaced whole at the commit; a folder of that
      // name without the project's mark is the user's, and stays.
      const fs::path final_dir = fs::path(dir) / step_name(step);
      const fs::file_status st = fs::symlink_status(final_dir, ec);
      FSDP_CHECK(!fs::exists(st) ||
                     (fs::is_directory(st) && holds_project_mark(final_dir.string())),
                 "[checkpoint] {} exists and is not a checkpoint this project wrote (no {}): it "
                 "is left alone, and the checkpoint of step {} cannot be written there; move that "
                 "folder, or choose another --ckpt-dir",
                 final_dir.string(), detail::kCompleteFile, step);
      // A crashed earlier attempt, removed only when it carries the project's mark.
      const fs::file_status tmp_st = fs::symlink_status(tmp, ec);
      FSDP_CHECK(
          !fs::exists(tmp_st) || (fs::is_directory(tmp_st) && holds_project_mark(tmp.string())),
          "[checkpoint] {} exists and is not a folder this project is writing (no {}): it "
          "is left alone, and the checkpoint of step {} cannot be written there; move "
          "that folder, or choose another --ckpt-dir",
          tmp.string(), detail::kWritingFile, step);
      fs::remove_all(tmp, ec);
      fs::create_directories(tmp, ec);
      FSDP_CHECK(!ec, "[checkpoint] cannot create '{}': {}", tmp.string(), ec.message());
      write_file_atomic((tmp / detail::kWritingFile).string(),
                        "fsdp.cpp checkpoint being written\n", "[checkpoint]", /*durable=*/false);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  bool failed = !error.empty();
  if (world && world->size() > 1) {
    Tensor f = Tensor::full({1}, failed ? 1.0 : 0.0, DType::f32).to(world->device());
    world->all_reduce(f, dist::ReduceOp::SUM)->wait();
    failed = f.to(Device::cpu()).item() > 0;
  }
  if (!error.empty()) throw Error(error);
  FSDP_CHECK(!failed,
             "[checkpoint] rank 0 could not begin the checkpoint of step {} in {} (its error says "
             "why)",
             step, dir);
}

SaveSnapshot snapshot(const std::string& dir, int64_t step, FSDPModule& root,
                      const optim::Optimizer& opt, const std::string& config_json,
                      const std::shared_ptr<dist::ProcessGroup>& world, const Extras& extras,
                      const StageFn& stage) {
  SaveSnapshot s;
  s.dir = dir;
  s.tmp = (fs::path(dir) / (".tmp_" + step_name(step))).string();
  s.step = step;
  s.rank = world ? world->rank() : 0;
  s.world_size = world ? world->size() : 1;
  // fully_shard's mesh covers the world: a shard file per rank of its shard dim, written by the
  // first replica (HSDP). It covers part of it (the root sharded over mesh["dp"] beside a "tp"
  // dim, whose parameters carry their placements): a shard file per rank, each tensor's rows
  // written by the first rank that holds them (shard_chunks), an empty chunk by the others.
  const bool per_rank = root.mesh()->size() != int64_t(s.world_size);
  s.shard = per_rank ? s.rank : root.shard_rank();
  s.first_replica = per_rank || root.first_replica();
  s.run_id = extras.run_id;
  const auto infos = root.shard_infos();
  auto groups = root.param_groups(0);
  const int shards = per_rank ? s.world_size : root.shard_count();
  s.shards = shards;
  const auto all_chunks =
      detail::shard_chunks(infos, s.shard, shards, world, per_rank);  // collective
  if (s.first_replica) {
    // Each flat buffer is staged once; the parameters' rows are views of the staged copies.
    std::vector<Tensor> params;
    std::vector<std::vector<std::pair<std::string, Tensor>>> states;
    for (auto& g : groups) {  // a frozen group (no gradient) is not saved
      params.push_back(g.grads.defined() ? stage(g.params) : Tensor());
      states.emplace_back();
      if (g.grads.defined())
        for (const auto& [state, flat] : opt.state(g.params))
          states.back().emplace_back(state, stage(flat));
    }
    for (const auto& in : infos) {
      if (!groups[in.group].grads.defined()) continue;
      // The rows this shard file holds: none where another rank writes the same ones.
      const int64_t rows = all_chunks[size_t(&in - infos.data())][size_t(s.shard)].rows;
      s.tensors.emplace_back("param/" + in.name,
                             rows_view(params[size_t(in.group)], in.offset, rows, in.global_shape));
      for (const auto& [state, flat] : states[size_t(in.group)])
        s.tensors.emplace_back(state + "/" + in.name,
                               rows_view(flat, in.offset, rows, in.global_shape));
    }
  }
  if (s.rank == 0) {
    json& meta = s.meta;
    meta["format"] = detail::kFormat;
    meta["step"] = step;
    meta["run_id"] = extras.run_id;
    meta["world_size"] = s.world_size;
    meta["optimizer_step"] = opt.step_count();
    meta["data_position"] = extras.data_position >= 0 ? extras.data_position : step;
    meta["user"] = json::parse(extras.user_json);
    meta["shards"] = shards;
    meta["config"] = json::parse(config_json);
    json tensors = json::object();
    json frozen = json::array();
    for (const auto& in : infos) {
      if (!groups[in.group].grads.defined()) {
        frozen.push_back(in.name);
        continue;
      }
      json chunks = json::array();
      for (const detail::Chunk& c : all_chunks[size_t(&in - infos.data())])
        chunks.push_back({c.begin, c.rows});
      // How the tensor lay when saved (for readers and tools: loading reads only the chunks,
      // so a checkpoint loads into any layout): the mesh, its dims' placements, and which dim
      // was fully_shard's.
      json placements = json::array();
      for (const dist::Placement& pl : in.placements) placements.push_back(dist::placement_str(pl));
      tensors[in.name] = {{"shape", in.global_shape},
                          {"dtype", std::string(dtype_name(groups[in.group].params.dtype()))},
                          {"placement", "Shard(0)"},
                          {"mesh", {{"names", in.mesh->names()}, {"shape", in.mesh->shape()}}},
                          {"placements", placements},
                          {"fsdp_dim", in.fsdp_dim},
                          {"chunks", chunks}};
    }
    meta["tensors"] = tensors;
    if (!frozen.empty()) meta["frozen"] = frozen;
    s.extra_files = extras.files;
  }
  return s;
}

WriteResult write_snapshot(const SaveSnapshot& s, std::stop_token stop) {
  WriteResult r;
  try {
    if (s.first_replica) {
      if (const double slow_ms = env_double("FSDP_CKPT_SLOW_WRITE_MS"); slow_ms > 0) {
        // tests: a window to kill in, which a stop request (AsyncSaver's destructor) cuts short
        std::mutex mu;
        std::condition_variable_any cv;
        std::unique_lock lock(mu);
        cv.wait_for(lock, stop, std::chrono::milliseconds(int64_t(slow_ms)), [] { return false; });
        FSDP_CHECK(!stop.stop_requested(), "[checkpoint] the write of {} was abandoned", s.tmp);
      }
      if (const std::string hold = env_str("FSDP_CKPT_HOLD_WRITE"); !hold.empty()) {
        // tests: the write stays here until the test creates `hold` (or a stop request ends it)
        write_file_atomic(fmt::format("{}.held.{}", hold, s.rank), std::to_string(getpid()),
                          "[checkpoint]");  // the pid: a test kills this rank
        std::mutex mu;
        std::condition_variable_any cv;
        std::unique_lock lock(mu);
        while (!fs::exists(hold) && !stop.stop_requested())
          cv.wait_for(lock, stop, std::chrono::milliseconds(20), [] { return false; });
        FSDP_CHECK(!stop.stop_requested(), "[checkpoint] the write of {} was abandoned", s.tmp);
      }
      const fs::path file = fs::path(s.tmp) / shard_file(s.shard);
      // The shard's identity, checked against the metadata on load (a swapped or foreign shard).
      save_safetensors(file.string(), s.tensors,
                       {{"shard", std::to_string(s.shard)},
                        {"shards", std::to_string(s.shards)},
                        {"rank", std::to_string(s.rank)},
                        {"world_size", std::to_string(s.world_size)},
                        {"run_id", s.run_id},
                        {"step", std::to_string(s.step)}});
      r.shard_checksum = file_checksum(file.string());
    }
    for (const auto& [name, contents] : s.extra_files) {
      const fs::path fp = fs::path(s.tmp) / name;
      write_file_atomic(fp.string(), contents, "[checkpoint]");  // every write, fsync, close checked
      r.file_checksums.emplace_back(name, file_checksum(fp.string()));
    }
  } catch (...) {
    r.error = std::current_exception();
  }
  return r;
}

void commit_save(const SaveSnapshot& s, const WriteResult& mine,
                 const std::shared_ptr<dist::ProcessGroup>& world, bool background,
                 const OnCommit& on_commit) {
  // One all-gather: per rank [failed, shard (-1: none written), 16 hex digits of its checksum].
  constexpr int64_t k = 18;
  const int n = world ? world->size() : 1;
  Tensor my_t = Tensor::zeros({k}, DType::i32);
  my_t.data<int32_t>()[0] = mine.error ? 1 : 0;
  my_t.data<int32_t>()[1] = mine.shard_checksum.empty() ? -1 : s.shard;
  for (size_t i = 0; i < mine.shard_checksum.size() && i < 16; ++i)
    my_t.data<int32_t>()[2 + i] = mine.shard_checksum[i];
  Tensor all_t = my_t;
  if (world && n > 1) {
    const Device d = world->device();
    Tensor a = Tensor::empty({k * n}, DType::i32, d);
    world->all_gather_into_tensor(a, my_t.to(d))->wait();
    all_t = a.to(Device::cpu());
  }
  const int32_t* v = all_t.data<int32_t>();
  const char* how = background ? "background write" : "write";
  if (mine.error) {
    if (!background) std::rethrow_exception(mine.error);
    try {
      std::rethrow_exception(mine.error);
    } catch (const std::exception& e) {
      FSDP_FAIL("[checkpoint] the {} of step {} failed: {}; the checkpoint of step {} was not "
                "made (its files stay in {}) and the previous one stands",
                how, s.step, e.what(), s.step, s.tmp);
    }
  }
  std::string failed;
  for (int r = 0; r < n; ++r)
    if (v[k * r] != 0) failed += fmt::format("{}{}", failed.empty() ? "" : ", ", r);
  FSDP_CHECK(failed.empty(),
             "[checkpoint] the {} of step {} failed on rank(s) {} (their error names the file and "
             "the reason); the checkpoint of step {} was not made and the previous one stands",
             how, s.step, failed, s.step);
  if (s.rank == 0) {
    json meta = s.meta;
    json files = json::object();
    for (int r = 0; r < n; ++r) {
      const int shard = v[k * r + 1];
      if (shard < 0) continue;
      std::string c;
      for (int i = 0; i < 16; ++i) c.push_back(char(v[k * r + 2 + i]));
      files[shard_file(shard)] = {{"checksum", c}};
    }
    for (const auto& [name, checksum] : mine.file_checksums) files[name] = {{"checksum", checksum}};
    meta["files"] = files;
    const fs::path tmp(s.tmp), dir(s.dir), final_dir = dir / step_name(s.step);
    const std::string meta_bytes = meta.dump(1) + "\n";
    write_file_atomic((tmp / "metadata.json").string(), meta_bytes, "[checkpoint]");
    // The seal, written last: a folder without it (or whose metadata.json no longer matches it)
    // is incomplete.
    write_file_atomic((tmp / detail::kCompleteFile).string(),
                      detail::complete_record(meta_bytes, s.run_id, s.step), "[checkpoint]");
    std::error_code ec;
    fs::remove(tmp / detail::kWritingFile, ec);  // sealed: complete.json is its mark now
    fsync_path(tmp, true);
    // An older checkpoint of the same step is replaced whole: moved aside first (a crash while it
    // is deleted leaves .old_step_N, never a half-deleted step_N without its mark), then removed.
    const fs::path aside = dir / (".old_" + step_name(s.step));
    fs::remove_all(aside, ec);
    if (fs::exists(fs::symlink_status(final_dir, ec))) {
      fs::rename(final_dir, aside, ec);
      FSDP_CHECK(!ec, "[checkpoint] rename '{}' -> '{}' failed: {}", final_dir.string(),
                 aside.string(), ec.message());
    }
    fs::rename(tmp, final_dir, ec);
    FSDP_CHECK(!ec, "[checkpoint] rename '{}' -> '{}' failed: {}", tmp.string(), final_dir.string(),
               ec.message());
    fsync_path(dir, true);
    fs::remove_all(aside, ec);
    if (on_commit) on_commit(s.dir);  // the caller's policy (the Manager's retention)
  }
  barrier(world);
}

}  // namespace detail

void save(const std::string& dir, int64_t step, FSDPModule& root, const optim::Optimizer& opt,
          const std::string& config_json, const std::shared_ptr<dist::ProcessGroup>& world,
          const Extras& extras, const OnCommit& on_commit) {
  detail::begin_save(dir, step, world, extras);
  const detail::SaveSnapshot snap = detail::snapshot(dir, step, root, opt, config_json, world,
                                                     extras, [](const Tensor& t) { return t; });
  detail::commit_save(snap, detail::write_snapshot(snap), world, /*background=*/false, on_commit);
}

std::string new_run_id(const std::shared_ptr<dist::ProcessGroup>& world) {
  constexpr int64_t n = 24;  // "20261201-234512-9f3a61c2"
  Tensor id = Tensor::zeros({n}, DType::i32);
  if (!world || world->rank() == 0) {
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char when[32];
    std::strftime(when, sizeof when, "%Y%m%d-%H%M%S", &utc);
    const std::string s = fmt::format("{}-{:08x}", when, uint32_t(std::random_device{}()));
    for (size_t i = 0; i < s.size() && i < size_t(n); ++i) id.data<int32_t>()[i] = s[i];
  }
  if (world && world->size() > 1) {
    Tensor d = id.to(world->device());
    world->broadcast(d, 0)->wait();
    id = d.to(Device::cpu());
  }
  std::string s;
  for (int64_t i = 0; i < n && id.data<int32_t>()[i] != 0; ++i) s.push_back(char(id.data<int32_t>()[i]));
  return s;
}

bool is_step_folder_name(const std::string& name, bool tmp) {
  const std::string prefix = tmp ? ".tmp_step_" : "step_";
  if (name.size() != prefix.size() + 8 || name.rfind(prefix, 0) != 0) return false;
  return std::all_of(name.begin() + long(prefix.size()), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

std::string latest(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  std::vector<fs::path> steps;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && is_step_folder_name(e.path().filename().string()) &&
        incomplete_reason(e.path().string()).empty())
      steps.push_back(e.path());
  if (steps.empty()) return "";
  std::sort(steps.begin(), steps.end());
  return steps.back().string();
}

std::optional<std::string> read_extra_file(const std::string& path, const std::string& name) {
  const detail::Manifest m = detail::read_manifest(path);  // sealed, every field checked
  const auto it = m.checksums.find(name);
  if (it == m.checksums.end()) return std::nullopt;
  const fs::path fp = fs::path(path) / name;
  FSDP_CHECK(fs::exists(fp), "[checkpoint] {}: the metadata lists {} but the file is missing", path,
             name);
  const std::string got = file_checksum(fp.string());
  FSDP_CHECK(got == it->second,
             "[checkpoint] {}: {} has checksum {} but the metadata says {} (truncated or "
             "corrupted)",
             path, name, got, it->second);
  std::ifstream f(fp, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

namespace {
Loaded load_unchecked(const std::string& path, FSDPModule& root, optim::Optimizer& opt,
                      const std::string& config_json, const std::vector<std::string>& model_keys) {
  // Every field, the chunks' coverage and the shard files present, before a tensor byte is read.
  const detail::Manifest m = detail::read_manifest(path);
  const json& meta = m.meta;
  const json want = json::parse(config_json);
  for (const std::string& k : model_keys) {
    const json have = meta["config"].value(k, json());
    FSDP_CHECK(have == want.value(k, json()),
               "[checkpoint] {} was saved with {} {} but this run has {} {}", path, k, have.dump(),
               k, want.value(k, json()).dump());
  }
  auto infos = root.shard_infos();
  auto groups = root.param_groups(0);
  // Old shard files this rank reads, each checked once (checksum, header identity, shapes).
  std::map<int, std::unique_ptr<SafetensorsIndex>> open;
  auto shard_index = [&](int s) -> SafetensorsIndex& {
    auto& idx = open[s];
    if (!idx) idx = detail::open_shard(m, s);
    return *idx;
  };
  // Frozen parameters (a LoRA base) are not in checkpoints: the run built them as it did before
  // (its --init-from, checked by content, or its seed).
  std::erase_if(infos,
                [&](const FSDPModule::ShardInfo& in) { return !groups[in.group].grads.defined(); });
  for (const auto& in : infos) {
    const auto t = m.tensors.find(in.name);
    FSDP_CHECK(t != m.tensors.end(), "[checkpoint] {} has no tensor '{}'", path, in.name);
    FSDP_CHECK(t->second.shape == in.global_shape,
               "[checkpoint] {}: '{}' has shape {} but the model has {}", path, in.name,
               shape_str(t->second.shape), shape_str(in.global_shape));
  }
  for (const auto& in : infos) {
    const detail::TensorEntry& t = m.tensors.at(in.name);
    const int64_t row = in.global_shape[0] ? shape_numel(in.global_shape) / in.global_shape[0] : 0;
    const int64_t my_b = in.local_begin, my_e = in.local_begin + in.local_rows;
    for (int s = 0; s < m.shards; ++s) {
      const int64_t b = t.chunks[size_t(s)].begin, len = t.chunks[size_t(s)].rows;
      const int64_t lo = std::max(b, my_b), hi = std::min(b + len, my_e);
      if (lo >= hi) continue;
      SafetensorsIndex& idx = shard_index(s);
      std::vector<std::pair<std::string, Tensor>> dst = {{"param", groups[in.group].params}};
      for (auto& st : opt.state(groups[in.group].params)) dst.push_back(st);
      for (const auto& [prefix, flat] : dst) {
        Tensor src = idx.read(prefix + "/" + in.name);
        detail::check_finite(src, (fs::path(path) / detail::shard_file(s)).string(),
                             prefix + "/" + in.name);
        const int64_t at = in.offset + (lo - my_b) * row;
        flat.slice(at, at + (hi - lo) * row)
            .copy_(src.reshape({-1}).slice((lo - b) * row, (hi - b) * row));
      }
    }
  }
  opt.set_step_count(meta.value("optimizer_step", int64_t(0)));
  return {m.step, meta["config"].dump(), meta.value("data_position", m.step),
          meta.value("user", json::object()).dump(), m.run_id, m.sealed};
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
