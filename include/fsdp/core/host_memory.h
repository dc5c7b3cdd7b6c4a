// This host's and this process's memory as the operating system counts it: what the process may
// still take, its resident set now and its peak. The allocators' counters (core/allocator.h) say
// what tensors hold; these say what the process holds, runtime, libraries, thread stacks and
// allocator caches included, which is what the out-of-memory killer and /usr/bin/time see.
// Linux only: they read /proc and the cgroup files, and return 0 (or -1) where those are missing.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace fsdp {

// Bytes this process may still take, and where that figure comes from: the tightest memory
// limit of its cgroup and the cgroup's ancestors (v2 memory.max, or v1 memory.limit_in_bytes,
// less what the cgroup already uses), else /proc/meminfo's MemAvailable; -1 where neither says.
std::pair<int64_t, std::string> host_memory_available();

// Resident bytes now (VmRSS).
int64_t resident_bytes();

// The most resident bytes this process has held (VmHWM).
int64_t peak_resident_bytes();

}  // namespace fsdp
