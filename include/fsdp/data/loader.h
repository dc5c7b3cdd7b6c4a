// A rank's view of the training data: each batch is the next `global_rows` windows of a
// TokenSource (its layout, and the stream's shuffle when set), and this rank takes its own
// contiguous rows of it, so the data a batch holds never depends on the number of ranks. The
// position is the number of windows handed out so far over all ranks (a batch advances it by
// global_rows), which is what a checkpoint saves: set_position() resumes at the next unread
// window, whatever the batch size or world size that read the ones before.
//
// On a CUDA device, batches arrive there without a host sync: prefetch() makes the next batch
// and queues its copy from pinned memory on the compute stream (core/upload.h), so the host
// makes batch k+1 while the device runs batch k, and next() hands it out. A prefetched batch is
// not counted in position() until next() hands it out.
//
//   data::DataLoader loader(source, global_rows, rank, world, seq, device);
//   loader.set_position(windows_read);  // or, from a checkpoint, its state (a Stateful part)
//   data::Batch b = loader.next();  // [rows(), seq] inputs and targets, on the device
//   ... launch the step's forward and backward on b ...
//   loader.prefetch();              // the next batch on its way while the step runs
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/core/device.h"
#include "fsdp/core/stateful.h"
#include "fsdp/core/upload.h"
#include "fsdp/data/token_sources.h"

namespace fsdp::data {

class DataLoader : public Stateful {
 public:
  // Throws, naming the values, unless global_rows splits evenly over `world` ranks.
  DataLoader(std::shared_ptr<const TokenSource> source, int64_t global_rows, int rank, int world,
             int64_t seq, Device device = Device::cpu());
  Batch next();     // this rank's rows of the batch at position(), on the device, then advances
  void prefetch();  // stages the batch at position() for next() (nothing when one is staged)
  int64_t position() const { return position_; }  // windows handed out, all ranks
  void set_position(int64_t windows);             // drops a staged batch
  int64_t rows() const { return rows_; }          // per rank and batch
  bool masks_targets() const { return source_->masks_targets(); }
  // This rank's targets that are not kIgnoreIndex in the next `batches` batches from position()
  // (read on the host, before they are made; rows() x seq x batches when the source masks none).
  int64_t count_targets(int64_t batches) const;
  int64_t global_rows() const { return global_rows_; }
  // Its checkpoint state, {"windows": position(), "tokens": position() x seq}: a resume at any
  // batch size or world size goes on at the next unread window (load_state_dict sets it).
  std::string state_dict() const override;
  void load_state_dict(const std::string& state, const std::string& where) override;

 private:
  Batch make(int64_t position);
  std::shared_ptr<const TokenSource> source_;
  int64_t global_rows_, rows_, row_begin_, seq_, position_ = 0;
  Uploader uploader_;            // inputs, targets, doc_start of two batches in flight: six slots
  std::optional<Batch> staged_;  // the batch at position_, prefetched
};

}  // namespace fsdp::data
