// CpuStream: one worker thread draining an ordered task queue.
#include "fsdp/core/stream.h"

#include <algorithm>
#include <compare>

#include "fsdp/core/error.h"
#include "fsdp/core/interrupt.h"
#include "fsdp/core/trace.h"

namespace fsdp {

void Event::wait(std::chrono::milliseconds timeout, const std::string& what) {
  std::unique_lock<std::mutex> lock(mu_);
  // In slices, so that a stop signal (SIGTERM, SIGINT) ends a wait that is stuck on a peer.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done_ && std::chrono::steady_clock::now() < deadline) {
    cv_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() +
                                                std::chrono::milliseconds(100)));
    if (!done_) {
      lock.unlock();
      throw_if_interrupted(what);
      lock.lock();
    }
  }
  if (!done_)
    FSDP_FAIL(
        "[Work] {} did not complete within {} s; a peer rank may have died or stopped making "
        "progress",
        what, double(timeout.count()) / 1000.0);
  if (error_) std::rethrow_exception(error_);
}

bool Event::query() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Event::set_done(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = error;
  }
  cv_.notify_all();
}

CpuStream::CpuStream(std::string name) : name_(std::move(name)), thread_([this] { loop(); }) {}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<Event> CpuStream::enqueue(std::function<void()> task) {
  auto ev = std::make_shared<Event>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    FSDP_CHECK(!stop_, "[CpuStream] {} is shut down", name_);
    queue_.emplace_back(std::move(task), ev);
  }
  cv_.notify_one();
  return ev;
}

void CpuStream::loop() {
  trace::set_thread_name(name_);
  for (;;) {
    std::pair<std::function<void()>, std::shared_ptr<Event>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    // The task (and the tensors it captured) is destroyed before the event
    // completes, so a waiter sees its memory already returned.
    std::exception_ptr error;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      item.first();
    } catch (...) {
      error = std::current_exception();
    }
    item.first = nullptr;
    busy_ns_ +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    item.second->set_done(error);
  }
}

}  // namespace fsdp
