#include "src/distributed/watchdog.h"

#include <fmt/core.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "fsdp/distributed/store.h"

namespace fsdp::dist::watchdog {

namespace {

struct Board {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::weak_ptr<Counter>> counters;
  std::shared_ptr<TCPStore> store;
  int rank = 0, size = 1;
  bool stop = false;
  std::thread thread;
};
Board& board() {
  static Board* b = new Board;  // lives for the process: its thread may outlive a clean exit
  return *b;
}
std::atomic<bool> g_abandoned{false};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string key(int rank) { return fmt::format("fsdp/progress/{}", rank); }

// "<ms> <label> <issued> <done>;<label> ..." (labels have no spaces or semicolons).
std::string snapshot(Board& b) {
  std::string s = std::to_string(now_ms());
  for (auto& w : b.counters)
    if (auto c = w.lock())
      s += fmt::format(" {} {} {};", c->label, c->issued.load(), c->done.load());
  return s;
}

}  // namespace

std::shared_ptr<Counter> register_group(const std::string& label) {
  auto c = std::make_shared<Counter>();
  c->label = label;
  for (char& ch : c->label)
    if (ch == ' ' || ch == ';') ch = '_';
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  b.counters.push_back(c);
  return c;
}

void relabel(Counter& c, const std::string& label) {
  std::lock_guard<std::mutex> lock(board().mu);
  c.label = c.label.substr(0, c.label.find('-')) + "-" + label;
  for (char& ch : c.label)
    if (ch == ' ' || ch == ';') ch = '_';
}

std::string label_of(const Counter& c) {
  std::lock_guard<std::mutex> lock(board().mu);
  return c.label;
}

void start_board(std::shared_ptr<TCPStore> store, int rank, int size) {
  stop_board();
  if (!store || size < 2) return;
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  b.store = std::move(store);
  b.rank = rank;
  b.size = size;
  b.stop = false;
  b.thread = std::thread([&b] {
    std::unique_lock<std::mutex> lock(b.mu);
    while (!b.stop) {
      const std::string post = snapshot(b);
      auto store = b.store;
      lock.unlock();
      try {
        store->set(key(b.rank), post);
      } catch (const std::exception&) {  // the board is advice: a failed post is not an error
      }
      lock.lock();
      b.cv.wait_for(lock, std::chrono::seconds(1), [&] { return b.stop; });
    }
  });
}

void stop_board() {
  Board& b = board();
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(b.mu);
    b.stop = true;
    t = std::move(b.thread);
  }
  b.cv.notify_all();
  if (!t.joinable()) return;
  if (abandoned())
    t.detach();  // it may be blocked on a store whose server is stopped
  else
    t.join();
  std::lock_guard<std::mutex> lock(b.mu);
  b.store.reset();
}

constexpr int64_t kStaleMs = 3000;  // a post older than this: the rank stopped posting

std::string describe_late_ranks(const std::string& raw_label, int64_t seq, bool peer_failed) {
  std::string label = raw_label;
  for (char& ch : label)
    if (ch == ' ' || ch == ';') ch = '_';
  std::shared_ptr<TCPStore> store;
  int size = 1, self = 0;
  {
    Board& b = board();
    std::lock_guard<std::mutex> lock(b.mu);
    store = b.store;
    size = b.size;
    self = b.rank;
  }
  if (!store) return "";
  // A peer that died mid-collective (its connection reset) posted its progress under a second
  // ago, and the live ranks may simply not have reached this collective yet: after a failure in
  // the engine the board is read once a dead rank's post has gone stale, and the ranks that
  // stopped posting are named before those merely behind.
  if (peer_failed) std::this_thread::sleep_for(std::chrono::milliseconds(kStaleMs + 500));
  // Read on a thread of its own, so a silent store (rank 0 stopped) cannot hold us past 5 s.
  auto reads = std::make_shared<std::promise<std::vector<std::string>>>();
  auto got = reads->get_future();
  std::thread([store, size, reads] {
    std::vector<std::string> posts{size_t(size), std::string()};
    try {
      for (int r = 0; r < size; ++r)
        if (store->check({key(r)})) posts[size_t(r)] = store->get_string(key(r));
      reads->set_value(std::move(posts));
    } catch (...) {
      reads->set_exception(std::current_exception());
    }
  }).detach();
  if (got.wait_for(std::chrono::seconds(5)) != std::future_status::ready)
    return "the progress board (served by rank 0) did not answer within 5 s: rank 0 itself may "
           "be stopped or hung";
  std::vector<std::string> posts;
  try {
    posts = got.get();
  } catch (const std::exception& e) {
    return fmt::format("the progress board could not be read: {}", e.what());
  }
  std::vector<std::string> stopped, behind;
  const int64_t now = now_ms();
  for (int r = 0; r < size; ++r) {
    if (r == self) continue;
    const std::string& p = posts[size_t(r)];
    if (p.empty()) {
      stopped.push_back(fmt::format("rank {} (never posted its progress)", r));
      continue;
    }
    std::istringstream in(p);
    int64_t t = 0;
    in >> t;
    int64_t issued = -1, done = -1;
    std::string entry;
    while (std::getline(in, entry, ';')) {
      std::istringstream e(entry);
      std::string l;
      int64_t i = 0, d = 0;
      if (e >> l >> i >> d && l == label) issued = i, done = d;
    }
    const double age = double(now - t) / 1000.0;
    if (age > kStaleMs / 1000.0)
      stopped.push_back(
          fmt::format("rank {} (no progress post for {:.0f} s: stopped, hung or dead{})", r, age,
                      done >= 0 ? fmt::format(", at {} #{}", label, done + 1) : ""));
    else if (issued >= 0 && issued < seq)
      behind.push_back(
          fmt::format("rank {} (has issued only {} {} collectives)", r, issued, label));
  }
  const std::vector<std::string>& late = stopped.empty() ? behind : stopped;
  if (late.empty()) return "every other rank is alive and has issued it (a slow collective?)";
  std::string s = "late: ";
  for (size_t i = 0; i < late.size(); ++i) s += (i ? "; " : "") + late[i];
  return s;
}

std::string& error_text() {
  static std::string* s = new std::string;
  return *s;
}

void abandon(const std::string& error) {
  if (!g_abandoned.exchange(true)) error_text() = error;
}
bool abandoned() { return g_abandoned.load(); }
const std::string& abandon_error() { return error_text(); }

}  // namespace fsdp::dist::watchdog
