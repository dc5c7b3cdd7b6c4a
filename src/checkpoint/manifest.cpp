// A checkpoint's manifest and seal, checked whole before any tensor byte is read (manifest.h).
#include "src/checkpoint/manifest.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <set>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include "fsdp/checkpoint/checkpoint.h"
#include "src/core/json_read.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// file_checksum's FNV-1a 64 over bytes already read: the seal covers exactly the bytes parsed.
std::string bytes_checksum(std::string_view b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : b) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

bool read_bytes(const fs::path& p, std::string* out) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return false;
  std::ifstream f(p, std::ios::binary);
  if (!f.good()) return false;
  *out = std::string((std::istreambuf_iterator<char>(f)), {});
  return true;
}

bool is_shard_name(const std::string& n) {
  return n.rfind("shard_", 0) == 0 && n.ends_with(".safetensors");
}

}  // namespace

std::string incomplete_reason(const std::string& path) {
  const fs::path dir(path);
  std::string bytes, record;
  if (!read_bytes(dir / "metadata.json", &bytes)) return "no metadata.json";
  if (!read_bytes(dir / detail::kCompleteFile, &record)) {
    const json meta = json::parse(bytes, nullptr, false);
    if (!meta.is_discarded() && meta.is_object() && meta.contains("format") &&
        meta["format"] == detail::kFormatUnsealed)
      return "";  // written before the seal: read with a note
    return "no complete.json (an unfinished checkpoint, or its record was removed)";
  }
  const json r = json::parse(record, nullptr, false);
  if (r.is_discarded() || !r.is_object() || !r.contains("metadata_checksum") ||
      !r["metadata_checksum"].is_string())
    return "complete.json is not a complete record (garbled): it must hold metadata.json's "
           "checksum as \"metadata_checksum\"";
  const std::string want = r["metadata_checksum"].get<std::string>(), got = bytes_checksum(bytes);
  if (got != want)
    return fmt::format(
        "metadata.json has checksum {} but complete.json records {} (metadata.json "
        "was changed after the checkpoint was written)",
        got, want);
  return "";
}

bool holds_project_mark(const std::string& path) {
  const fs::path dir(path);
  std::error_code ec;
  if (fs::is_regular_file(fs::symlink_status(dir / detail::kCompleteFile, ec)) ||
      fs::is_regular_file(fs::symlink_status(dir / detail::kWritingFile, ec)))
    return true;
  std::string bytes;
  if (!fs::is_regular_file(fs::symlink_status(dir / "metadata.json", ec)) ||
      !read_bytes(dir / "metadata.json", &bytes))
    return false;
  const json meta = json::parse(bytes, nullptr, false);
  return !meta.is_discarded() && meta.is_object() && meta.contains("format") &&
         (meta["format"] == detail::kFormat || meta["format"] == detail::kFormatUnsealed);
}

namespace detail {

std::string shard_file(int shard) { return fmt::format("shard_{:05d}.safetensors", shard); }

std::string complete_record(const std::string& metadata_bytes, const std::string& run_id,
                            int64_t step) {
  return json{{"format", kFormat},
              {"metadata_checksum", bytes_checksum(metadata_bytes)},
              {"run_id", run_id},
              {"step", step}}
             .dump(1) +
         "\n";
}

namespace {

int64_t integer(const json& j, const char* key, int64_t lo, int64_t hi, const std::string& where) {
  FSDP_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= lo &&
                 j[key].get<int64_t>() <= hi,
             "[checkpoint] {}: '{}' is {}; expected an integer in [{}, {}]", where, key,
             j.contains(key) ? json_read::brief(j[key]) : "missing", lo, hi);
  return j[key].get<int64_t>();
}

void check_fields(Manifest& m, const std::string& where) {
  const json& meta = m.meta;
  FSDP_CHECK(meta.is_object(), "[checkpoint] {}: not a JSON object", where);
  const std::string format = meta.value("format", "");
  FSDP_CHECK(format == kFormat || format == kFormatUnsealed,
             "[checkpoint] {}: unknown format '{}' (expected {})", where, format, kFormat);
  m.sealed = format == kFormat;
  m.step = integer(meta, "step", 0, INT64_MAX, where);
  m.shards = int(integer(meta, "shards", 1, 1 << 20, where));
  FSDP_CHECK(meta.contains("config") && meta["config"].is_object(),
             "[checkpoint] {}: 'config' is not an object", where);
  if (m.sealed) {
    FSDP_CHECK(meta.contains("run_id") && meta["run_id"].is_string(),
               "[checkpoint] {}: no 'run_id'", where);
    m.run_id = meta["run_id"].get<std::string>();
    m.world_size = int(integer(meta, "world_size", m.shards, 1 << 20, where));
  }
  const json files = meta.value("files", json::object());
  FSDP_CHECK(files.is_object(), "[checkpoint] {}: 'files' is not an object", where);
  for (const auto& [name, f] : files.items()) {
    FSDP_CHECK(f.is_object() && f.contains("checksum") && f["checksum"].is_string(),
               "[checkpoint] {}: files '{}' has no checksum", where, name);
    m.checksums[name] = f["checksum"].get<std::string>();
  }
  // Chunk coverage, exactly: one chunk per shard; by first row, each where the last ended.
  FSDP_CHECK(meta.contains("tensors") && meta["tensors"].is_object(),
             "[checkpoint] {}: 'tensors' is not an object", where);
  for (const auto& [name, t] : meta["tensors"].items()) {
    TensorEntry e;
    FSDP_CHECK(t.is_object() && t.contains("shape") && t["shape"].is_array() && !t["shape"].empty(),
               "[checkpoint] {}: tensor '{}' has no shape", where, name);
    for (const json& d : t["shape"]) {
      FSDP_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() <= (1LL << 40),
                 "[checkpoint] {}: tensor '{}' has shape {}; expected sizes of 0 or more", where,
                 name, t["shape"].dump());
      e.shape.push_back(d.get<int64_t>());
    }
    FSDP_CHECK(t.contains("dtype") && t["dtype"].is_string(),
               "[checkpoint] {}: tensor '{}' has no dtype", where, name);
    e.dtype = parse_dtype(t["dtype"].get<std::string>());
    FSDP_CHECK(t.value("placement", "Shard(0)") == "Shard(0)",
               "[checkpoint] {}: tensor '{}' has placement {}; expected Shard(0)", where, name,
               t["placement"].dump());
    // How the tensor lay when saved (written since placements; loading reads the chunks only).
    if (t.contains("placements"))
      FSDP_CHECK(
          t["placements"].is_array() && std::all_of(t["placements"].begin(), t["placements"].end(),
                                                    [](const json& x) { return x.is_string(); }),
          "[checkpoint] {}: tensor '{}' has placements {}; expected an array of strings", where,
          name, json_read::brief(t["placements"]));
    FSDP_CHECK(
        t.contains("chunks") && t["chunks"].is_array() && t["chunks"].size() == size_t(m.shards),
        "[checkpoint] {}: tensor '{}' has {} chunks but 'shards' is {}; expected one chunk "
        "per shard",
        where, name, t.contains("chunks") ? json_read::brief(t["chunks"]) : "no", m.shards);
    const int64_t dim = e.shape[0];
    for (int c = 0; c < m.shards; ++c) {
      const json& ch = t["chunks"][size_t(c)];
      FSDP_CHECK(
          ch.is_array() && ch.size() == 2 && ch[0].is_number_integer() && ch[1].is_number_integer(),
          "[checkpoint] {}: tensor '{}' chunk {} is {}; expected [first row, rows]", where, name, c,
          ch.dump());
      const int64_t b = ch[0].get<int64_t>(), len = ch[1].get<int64_t>();
      FSDP_CHECK(b >= 0 && len >= 0,
                 "[checkpoint] {}: tensor '{}' chunk {} is [{}, {}]: a negative {}", where, name, c,
                 b, len, b < 0 ? "first row" : "row count");
      e.chunks.push_back({b, len});
    }
    // By first row: a shard's rows need not follow the shard order (expert parallel's experts).
    // Empty chunks first, where they sit does not matter.
    std::vector<int> order(size_t(m.shards));
    for (int c = 0; c < m.shards; ++c) order[size_t(c)] = c;
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      const Chunk &a = e.chunks[size_t(x)], &b = e.chunks[size_t(y)];
      return (a.rows > 0) != (b.rows > 0) ? a.rows == 0 : a.begin < b.begin;
    });
    int64_t end = 0;
    for (int c : order) {
      const int64_t b = e.chunks[size_t(c)].begin, len = e.chunks[size_t(c)].rows;
      if (len == 0 && b <= dim) continue;
      FSDP_CHECK(b == end,
                 "[checkpoint] {}: tensor '{}' chunk {} is [{}, {}]: it starts at row {} but the "
                 "chunks before it end at row {} ({} rows {}..{})",
                 where, name, c, b, len, b, end,
                 b > end ? "a gap: no shard holds" : "an overlap:", std::min(b, end),
                 std::max(b, end) - 1);
      FSDP_CHECK(len <= dim - b,
                 "[checkpoint] {}: tensor '{}' chunk {} is [{}, {}]: it runs past the tensor's "
                 "{} rows (shape {})",
                 where, name, c, b, len, dim, shape_str(e.shape));
      end = b + len;
    }
    FSDP_CHECK(end == dim,
               "[checkpoint] {}: tensor '{}' chunks {} cover rows 0..{} but the tensor has {} rows "
               "(shape {})",
               where, name, json_read::brief(t["chunks"]), end, dim, shape_str(e.shape));
    m.tensors.emplace(name, std::move(e));
  }
  // The shard files present are exactly the ones 'shards' names, each with a checksum.
  std::set<std::string> present;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(m.dir, ec))
    if (is_shard_name(f.path().filename().string())) present.insert(f.path().filename().string());
  for (int s = 0; s < m.shards; ++s) {
    FSDP_CHECK(present.erase(shard_file(s)) == 1,
               "[checkpoint] {} is missing {} (the checkpoint was written by {} shards)", m.dir,
               shard_file(s), m.shards);
    FSDP_CHECK(m.checksums.count(shard_file(s)), "[checkpoint] {}: 'files' has no checksum for {}",
               where, shard_file(s));
  }
  FSDP_CHECK(present.empty(),
             "[checkpoint] {} holds {}, which is not one of the {} shard(s) metadata.json's "
             "'shards' names (shard files added, or 'shards' edited)",
             m.dir, present.empty() ? "" : *present.begin(), m.shards);
}

}  // namespace

Manifest read_manifest(const std::string& path) {
  const fs::path dir(path), mp = dir / "metadata.json";
  const std::string why = incomplete_reason(path);
  FSDP_CHECK(why.empty(), "[checkpoint] {}: {}; not a complete checkpoint, so not read", path, why);
  Manifest m;
  m.dir = path;
  std::string bytes;
  read_bytes(mp, &bytes);
  m.meta = json_read::parse(bytes, mp.string(), "[checkpoint]");
  try {
    check_fields(m, mp.string());
  } catch (const json::exception& e) {  // valid JSON of the wrong shape: name the file
    FSDP_FAIL("[checkpoint] {} does not hold a checkpoint's fields: {}", mp.string(), e.what());
  }
  return m;
}

std::unique_ptr<SafetensorsIndex> open_shard(const Manifest& m, int s) {
  const std::string file = (fs::path(m.dir) / shard_file(s)).string();
  FSDP_CHECK(fs::exists(file),
             "[checkpoint] {} is missing {} (the checkpoint was written by {} "
             "shards)",
             m.dir, shard_file(s), m.shards);
  const auto it = m.checksums.find(shard_file(s));
  const std::string expect = it == m.checksums.end() ? "" : it->second;
  const std::string got = file_checksum(file);
  FSDP_CHECK(got == expect,
             "[checkpoint] {}: checksum {} does not match the metadata's {} (truncated or "
             "corrupted)",
             file, got, expect);
  auto idx = std::make_unique<SafetensorsIndex>(file);
  const auto& h = idx->metadata();
  auto field = [&](const char* k) -> std::string {
    const auto i = h.find(k);
    return i == h.end() ? "" : i->second;
  };
  // Identity: a shard of another position, checkpoint or run is refused by name.
  const std::string holds = field("shard");
  if (holds != std::to_string(s)) {
    const bool number =
        !holds.empty() && holds.size() < 7 &&
        std::all_of(holds.begin(), holds.end(), [](char c) { return c >= '0' && c <= '9'; });
    FSDP_FAIL(
        "[checkpoint] {} holds shard {} (written by rank {}{}), not shard {}: the shard "
        "files were swapped or renamed{}",
        file, holds.empty() ? "?" : holds, field("rank").empty() ? "?" : field("rank"),
        field("run_id").empty() ? "" : fmt::format(" of run '{}'", field("run_id")), s,
        number ? fmt::format(" (shard {}'s file is {})", holds, shard_file(std::stoi(holds))) : "");
  }
  if (m.sealed) {
    const std::pair<const char*, std::string> want[] = {
        {"shards", std::to_string(m.shards)},
        {"world_size", std::to_string(m.world_size)},
        {"run_id", m.run_id},
        {"step", std::to_string(m.step)}};
    for (const auto& [k, v] : want)
      FSDP_CHECK(field(k) == v,
                 "[checkpoint] {} (written by rank {}) says {} '{}' but {}/metadata.json says '{}' "
                 "(a shard of another checkpoint or run)",
                 file, field("rank"), k, field(k), m.dir, v);
  } else {
    FSDP_CHECK(field("run_id").empty(),
               "[checkpoint] {} names run '{}' but {}/metadata.json is of format 1, which names "
               "none: its complete.json was removed or its format edited",
               file, field("run_id"), m.dir);
  }
  // Every tensor's shape against its chunk, before any of its bytes is read.
  for (const auto& [name, e] : m.tensors) {
    Shape want = e.shape;
    want[0] = e.chunks[size_t(s)].rows;
    FSDP_CHECK(idx->contains("param/" + name), "[checkpoint] {} has no 'param/{}'", file, name);
    for (const std::string& key : idx->names()) {
      if (key.substr(key.find('/') + 1) != name) continue;
      const auto [dtype, shape, offset] = idx->locate(key);
      FSDP_CHECK(shape == want,
                 "[checkpoint] {}: '{}' has shape {} but chunk {} of metadata.json says {}", file,
                 key, shape_str(shape), s, shape_str(want));
      FSDP_CHECK(key != "param/" + name || dtype == e.dtype,
                 "[checkpoint] {}: '{}' is {} but metadata.json says {}", file, key,
                 dtype_name(dtype), dtype_name(e.dtype));
    }
  }
  return idx;
}

void check_finite(const Tensor& t, const std::string& file, const std::string& name) {
  const Tensor c = t.contiguous();
  const int64_t n = c.numel();
  auto refuse = [&](int64_t i, double v) {
    FSDP_FAIL(
        "[checkpoint] {}: tensor '{}' holds {} (element {} of {}); refusing a checkpoint "
        "whose weights are not finite (the run that wrote it diverged, or the file was "
        "changed)",
        file, name, std::isnan(v) ? "NaN" : "Inf", i, n);
  };
  if (c.dtype() == DType::f64) {
    const double* v = c.data<double>();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(v[i])) refuse(i, v[i]);
    return;
  }
  const Tensor f = c.to(DType::f32);
  const float* v = f.data<float>();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) refuse(i, double(v[i]));
}

std::vector<std::vector<Chunk>> shard_chunks(const std::vector<FSDPModule::ShardInfo>& infos,
                                             int shard, int shards,
                                             const std::shared_ptr<dist::ProcessGroup>& world,
                                             bool dedupe) {
  std::vector<double> all;
  for (const auto& in : infos)
    all.insert(all.end(), {double(shard), double(in.local_begin), double(in.local_rows)});
  int ranks = 1;
  if (world && world->size() > 1 && !all.empty()) {
    ranks = world->size();
    Tensor out = Tensor::empty({int64_t(ranks) * int64_t(all.size())}, DType::f64);
    world->all_gather_into_tensor(out, Tensor::from_vector(all, {int64_t(all.size())}))->wait();
    all = out.to_f64_vector();
  }
  std::vector<std::vector<Chunk>> chunks(infos.size(),
                                         std::vector<Chunk>(size_t(shards), Chunk{-1, -1}));
  for (size_t r = 0; r < size_t(ranks); ++r)
    for (size_t i = 0; i < infos.size(); ++i) {
      const double* v = &all[(r * infos.size() + i) * 3];
      FSDP_CHECK(v[0] >= 0 && v[0] < shards, "[checkpoint] rank {} names shard {} of {}", r, v[0],
                 shards);
      chunks[i][size_t(v[0])] = {int64_t(v[1]), int64_t(v[2])};  // replicas (HSDP) agree
    }
  for (size_t i = 0; i < infos.size(); ++i)
    for (int s = 0; s < shards; ++s)
      FSDP_CHECK(chunks[i][size_t(s)].rows >= 0, "[checkpoint] '{}': no rank holds shard {} of {}",
                 infos[i].name, s, shards);
  if (dedupe)
    for (size_t i = 0; i < infos.size(); ++i)
      for (size_t s = 0; s < size_t(shards); ++s) {
        Chunk& c = chunks[i][s];
        for (size_t e = 0; e < s && c.rows > 0; ++e) {
          const Chunk& o = chunks[i][e];
          if (o.rows == 0) continue;
          if (o.begin == c.begin && o.rows == c.rows) {
            c.rows = 0;  // shard e saves these rows
            break;
          }
          FSDP_CHECK(o.begin + o.rows <= c.begin || c.begin + c.rows <= o.begin,
                     "[checkpoint] '{}': shard {} holds rows {}..{} and shard {} rows {}..{}: "
                     "they overlap without being the same rows",
                     infos[i].name, e, o.begin, o.begin + o.rows - 1, s, c.begin,
                     c.begin + c.rows - 1);
        }
      }
  return chunks;
}

}  // namespace detail
}  // namespace fsdp::checkpoint
