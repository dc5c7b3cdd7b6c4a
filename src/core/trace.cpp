// Trace records: one global buffer under a mutex (only touched while
// recording), small thread ids, and the optional device-timing hook.
#include "fsdp/core/trace.h"

#include <chrono>
#include <mutex>
#include <utility>

#include "src/core/gpu.h"

namespace fsdp::trace {

namespace detail {
std::atomic<bool> active{false};
std::atomic<bool> shapes{false};
std::atomic<bool> memory{false};
}  // namespace detail

namespace {
std::mutex mu;
std::vector<Record> records;
std::vector<std::string> names;
DeviceHook hook;
std::atomic<int64_t> next_token{1};
}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint32_t thread_id() {
  thread_local uint32_t id = [] {
    std::lock_guard<std::mutex> lock(mu);
    names.push_back(names.empty() ? "main" : "thread " + std::to_string(names.size()));
    return uint32_t(names.size() - 1);
  }();
  return id;
}

void set_thread_name(const std::string& name) {
  const uint32_t id = thread_id();
  std::lock_guard<std::mutex> lock(mu);
  names[id] = name;
}

std::vector<std::string> thread_names() {
  std::lock_guard<std::mutex> lock(mu);
  return names;
}

void start(bool record_shapes, bool profile_memory) {
  set_thread_name("main");  // the thread that starts profiling computes
  detail::shapes = record_shapes;
  detail::memory = profile_memory;
  detail::active = true;
}

void stop() { detail::active = false; }

std::vector<Record> take() {
  std::lock_guard<std::mutex> lock(mu);
  return std::exchange(records, {});
}

void add(Record r) {
  std::lock_guard<std::mutex> lock(mu);
  records.push_back(std::move(r));
}

void set_device_hook(DeviceHook h) {
  std::lock_guard<std::mutex> lock(mu);
  hook = std::move(h);
}

int64_t device_hook(bool begin, int64_t token, int device) {
  return hook ? hook(begin, token, device) : 0;
}

void Scope::begin(const char* name, Kind kind) {
  on_ = true;
  rec_.emplace();
  rec_->kind = kind;
  rec_->name = name;
  rec_->tid = thread_id();
  rec_->begin_ns = now_ns();
  gpu::range_push(name);  // so that Nsight Systems and Nsight Compute show our names
}

void Scope::set(std::string shapes, std::string dtype, double flops, double bytes,
                std::string device) {
  if (recording_shapes()) rec_->shapes = std::move(shapes);
  rec_->dtype = std::move(dtype);
  rec_->flops = flops;
  rec_->bytes = bytes;
  if (device.rfind("cuda:", 0) == 0 && hook) {
    device_ = std::stoi(device.substr(5));
    token_ = next_token++;
    rec_->flow = token_;
    device_hook(true, token_, device_);
  }
  rec_->device = std::move(device);
}

void Scope::end() {
  gpu::range_pop();
  if (device_ >= 0) device_hook(false, token_, device_);
  rec_->end_ns = now_ns();
  add(std::move(*rec_));
}

}  // namespace fsdp::trace
