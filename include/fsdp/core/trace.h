// The recording half of the profiler, low in the layers so that every op,
// collective and allocation can record itself with no code at the call
// site. When nothing is recording, a Scope costs one relaxed atomic load and
// a branch. The profiler layer (fsdp/profiler) turns these records into a
// Chrome trace, a key-averages table and roofline verdicts. In a CUDA build
// each recorded scope is also an NVTX range, for Nsight Systems and Compute.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::trace {

enum class Kind : uint8_t { op, annotation, collective, kernel, counter };

struct Record {
  Kind kind = Kind::op;
  std::string name;
  uint32_t tid = 0;  // small per-thread id (see thread_names())
  int64_t begin_ns = 0, end_ns = 0;
  std::string shapes;  // "[8, 256], [1024, 256]" when shapes are recorded
  std::string dtype;
  double flops = 0, bytes = 0;
  std::string device;  // "cpu", "cuda:0"
  std::string detail;  // collective group, counter device
  int64_t value = 0;   // counter value (bytes allocated)
  int64_t flow = 0;    // links an op to its device kernel (0: none)
};

namespace detail {
extern std::atomic<bool> active;
extern std::atomic<bool> shapes;
extern std::atomic<bool> memory;
}  // namespace detail

inline bool active() { return detail::active.load(std::memory_order_relaxed); }
inline bool recording_shapes() { return detail::shapes.load(std::memory_order_relaxed); }
inline bool recording_memory() { return detail::memory.load(std::memory_order_relaxed); }

void start(bool record_shapes, bool profile_memory);
void stop();
std::vector<Record> take();  // every record so far, in no particular order
void add(Record r);
int64_t now_ns();
uint32_t thread_id();  // this thread's small id
void set_thread_name(const std::string& name);
std::vector<std::string> thread_names();  // index = small id

// Hook for device timing: called at the start and the end of an op on a
// CUDA tensor while recording (installed by the CUDA build).
using DeviceHook = std::function<int64_t(bool begin, int64_t token, int device)>;
void set_device_hook(DeviceHook hook);
int64_t device_hook(bool begin, int64_t token, int device);

// Times the enclosing block as one record.
class Scope {
 public:
  explicit Scope(const char* name, Kind kind = Kind::op) {
    if (active()) begin(name, kind);
  }
  ~Scope() {
    if (on_) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  bool on() const { return on_; }
  // Details, only worth computing when on().
  void set(std::string shapes, std::string dtype, double flops, double bytes, std::string device);
  void set_detail(std::string d) { rec_->detail = std::move(d); }

 private:
  void begin(const char* name, Kind kind);
  void end();
  bool on_ = false;
  int device_ = -1;
  int64_t token_ = 0;
  std::optional<Record> rec_;  // built only when recording: off costs a load and a branch
};

}  // namespace fsdp::trace
