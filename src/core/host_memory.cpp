// The host's and the process's memory, read from /proc and the cgroup files
// (fsdp/core/host_memory.h).
#include "fsdp/core/host_memory.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>

namespace fsdp {

namespace {

// A "Name:   N kB" line of /proc/self/status, in bytes; 0 where there is none.
int64_t status_kb_line(const char* name) {
  std::ifstream f("/proc/self/status");
  const std::string key = std::string(name) + ":";
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return 0;
}

}  // namespace

std::pair<int64_t, std::string> host_memory_available() {
  auto read_num = [](const std::string& path) -> std::optional<int64_t> {
    std::ifstream f(path);
    std::string v;
    if (!(f >> v) || v == "max") return std::nullopt;
    int64_t n = 0;
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || n >= (int64_t(1) << 60)) return std::nullopt;  // unlimited
    return n;
  };
  int64_t best = -1;
  std::string from;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kb = 0;
    meminfo >> kb;
    if (key == "MemAvailable:") {
      best = kb * 1024;
      from = "MemAvailable";
      break;
    }
    meminfo.ignore(1 << 20, '\n');
  }
  std::ifstream cg("/proc/self/cgroup");
  for (std::string line; std::getline(cg, line);) {
    const auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string ctl = line.substr(c1 + 1, c2 - c1 - 1);
    std::string root, max_file, cur_file;
    if (ctl.empty() && std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers"))
      root = "/sys/fs/cgroup", max_file = "memory.max", cur_file = "memory.current";
    else if (ctl == "memory")
      root = "/sys/fs/cgroup/memory", max_file = "memory.limit_in_bytes",
      cur_file = "memory.usage_in_bytes";
    else
      continue;
    for (std::filesystem::path dir = line.substr(c2 + 1);; dir = dir.parent_path()) {
      const std::string at = root + dir.string();
      if (const auto max = read_num(at + "/" + max_file)) {
        const int64_t left = *max - read_num(at + "/" + cur_file).value_or(0);
        if (best < 0 || left < best) best = std::max<int64_t>(0, left), from = at + "/" + max_file;
      }
      if (dir == dir.parent_path() || dir.empty()) break;
    }
  }
  return {best, from};
}

int64_t resident_bytes() { return status_kb_line("VmRSS"); }

int64_t peak_resident_bytes() { return status_kb_line("VmHWM"); }

}  // namespace fsdp
