// A rank's view of the training data.
#include "fsdp/data/loader.h"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/core/meta.h"
#include "fsdp/core/tensor.h"
#include "fsdp/ops/ops.h"

namespace fsdp::data {

DataLoader::DataLoader(std::shared_ptr<const TokenSource> source, int64_t global_rows, int rank,
                       int world, int64_t seq, Device device)
    : source_(std::move(source)), global_rows_(global_rows), seq_(seq), uploader_(device, 6) {
  FSDP_CHECK(source_, "[DataLoader] no token source");
  FSDP_CHECK(world > 0 && rank >= 0 && rank < world, "[DataLoader] rank {} is not in [0, {})", rank,
             world);
  FSDP_CHECK(global_rows > 0 && global_rows % world == 0,
             "[DataLoader] a global batch of {} rows does not split evenly over {} ranks",
             global_rows, world);
  FSDP_CHECK(seq > 0, "[DataLoader] seq must be > 0, got {}", seq);
  rows_ = global_rows / world;
  row_begin_ = int64_t(rank) * rows_;
}

Batch DataLoader::make(int64_t position) {
  Batch b = source_->windows(position + row_begin_, rows_, seq_);
  // Packed rows: checked here, on the host, since the attention kernels trust a device copy.
  const meta::TermScope data(meta::Term::data);  // the batch on the device
  if (b.doc_start.defined()) ops::check_doc_start(b.doc_start, rows_, seq_);
  return {uploader_.upload(b.inputs), uploader_.upload(b.targets),
          b.doc_start.defined() ? uploader_.upload(b.doc_start) : Tensor(),
          std::move(b.reference_logps)};
}

Batch DataLoader::next() {
  Batch b = staged_ ? std::move(*staged_) : make(position_);
  staged_.reset();
  position_ += global_rows_;
  return b;
}

void DataLoader::prefetch() {
  if (!staged_) staged_ = make(position_);
}

int64_t DataLoader::count_targets(int64_t batches) const {
  if (!source_->masks_targets()) return rows_ * seq_ * batches;
  int64_t n = 0;
  for (int64_t k = 0; k < batches; ++k) {
    const Batch b = source_->windows(position_ + k * global_rows_ + row_begin_, rows_, seq_);
    const Tensor t = b.targets.contiguous();
    const int32_t* p = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) n += p[i] != int32_t(kIgnoreIndex);
  }
  return n;
}

std::string DataLoader::state_dict() const {
  return nlohmann::json{{"windows", position_}, {"tokens", position_ * seq_}}.dump();
}

void DataLoader::load_state_dict(const std::string& state, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(state, nullptr, false);
  const nlohmann::json* w = j.is_object() && j.contains("windows") ? &j["windows"] : nullptr;
  FSDP_CHECK(w && w->is_number_integer() && w->get<int64_t>() >= 0,
             "[DataLoader] {}: {} is not a data loader's state: expected {{\"windows\": a count of "
             "windows read >= 0, ...}}",
             where, state.substr(0, 200));
  set_position(w->get<int64_t>());
}

void DataLoader::set_position(int64_t windows) {
  FSDP_CHECK(windows >= 0, "[DataLoader] the position (windows read) must be >= 0, got {}",
             windows);
  position_ = windows;
  staged_.reset();
}

}  // namespace fsdp::data
