// The CPU form of a CUDA stream: an ordered queue of tasks run by one worker
// thread. A process group's collectives run on its own CpuStream, so the
// compute threads go on while a collective is in flight, and collectives on
// one group run in the order they were issued. enqueue() returns an Event
// that completes when the task has run; wait() rethrows the task's error.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace fsdp {

class Event {
 public:
  // Blocks until the task ran. Rethrows its exception. Throws fsdp::Error
  // naming `what` if it has not finished within `timeout`.
  void wait(std::chrono::milliseconds timeout, const std::string& what);
  bool query() const;
  void set_done(std::exception_ptr error = nullptr);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class CpuStream {
 public:
  explicit CpuStream(std::string name);
  ~CpuStream();  // runs what is queued, then joins
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  std::shared_ptr<Event> enqueue(std::function<void()> task);
  const std::string& name() const { return name_; }
  // The worker's thread id, for tests and the profiler.
  std::thread::id thread_id() const { return thread_.get_id(); }
  // Seconds the worker has spent running tasks since it started.
  double busy_seconds() const { return double(busy_ns_.load()) * 1e-9; }

 private:
  void loop();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Event>>> queue_;
  bool stop_ = false;
  std::atomic<int64_t> busy_ns_{0};
  std::thread thread_;
};

}  // namespace fsdp
