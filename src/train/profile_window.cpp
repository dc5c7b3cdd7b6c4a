// ProfileWindow (profile_window.h): the profiler over fsdp-train's --profile-steps.
#include "src/train/profile_window.h"

#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

namespace fsdp::train {

ProfileWindow::ProfileWindow(StepRange steps, std::string dir, int rank, Device device)
    : steps_(steps), dir_(std::move(dir)), rank_(rank), device_(device) {}

void ProfileWindow::at_step(int64_t step) {
  if (steps_.empty()) return;
  if (step == steps_.begin) {
    std::vector<profiler::Activity> acts = {profiler::Activity::CPU};
    if (device_.is_cuda()) acts.push_back(profiler::Activity::CUDA);
    prof_ = std::make_unique<profiler::Profiler>(profiler::ProfilerOptions{.activities = acts,
                                                                           .record_shapes = true,
                                                                           .profile_memory = true,
                                                                           .schedule = std::nullopt,
                                                                           .rank = rank_});
    prof_->start();
  }
  if (step == steps_.end) finish();
}

void ProfileWindow::finish() {
  if (!prof_) return;
  prof_->stop();
  std::filesystem::create_directories(dir_);
  const std::string trace = fmt::format("{}/trace_rank{}.json", dir_, rank_);
  prof_->export_chrome_trace(trace);
  const std::string table =
      prof_->key_averages().table(device_.is_cuda() ? "device_time_total" : "cpu_time_total", 15) +
      prof_->overlap_summary() + "\n";
  std::ofstream(fmt::format("{}/table_rank{}.txt", dir_, rank_)) << table;
  if (rank_ == 0)
    fmt::print("profile: steps {}:{} -> {} (and the other ranks')\n{}", steps_.begin, steps_.end,
               trace, table);
  prof_.reset();
}

}  // namespace fsdp::train
