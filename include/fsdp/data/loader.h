// A rank's view of the training data: batch p is the global batch of
// `global_rows` rows at step p of a TokenSource (its layout, and the stream's
// shuffle when set), and this rank takes its own contiguous rows of it, so the
// data a batch holds never depends on the number of ranks. The position (the
// batches taken so far) is what a checkpoint saves; set_position() resumes.
//
//   data::DataLoader loader(source, global_rows, rank, world, seq);
//   loader.set_position(loaded.data_position);
//   data::Batch b = loader.next();  // [rows(), seq] inputs and targets
#pragma once

#include <cstdint>
#include <memory>

#include "fsdp/data/text_dataset.h"

namespace fsdp::data {

class DataLoader {
 public:
  // Throws, naming the values, unless global_rows splits evenly over `world` ranks.
  DataLoader(std::shared_ptr<const TokenSource> source, int64_t global_rows, int rank, int world,
             int64_t seq);
  Batch next();  // this rank's rows of batch position(), then advances
  int64_t position() const { return position_; }
  void set_position(int64_t position);
  int64_t rows() const { return rows_; }  // per rank and batch

 private:
  std::shared_ptr<const TokenSource> source_;
  int64_t global_rows_, rows_, row_begin_, seq_, position_ = 0;
};

}  // namespace fsdp::data
