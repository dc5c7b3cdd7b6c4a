// The language-model loss: next-token cross-entropy of logits [B, T, V]
// against targets [B, T], summed over the targets that are not kIgnoreIndex and divided by the
// divisor (0: by B x T, the mean over positions). The loss stays on the logits' device (one f64), so
// a CUDA step needs no host sync for it; backward() writes dlogits over the
// logits, as llm.c does, so the largest activation of the model needs no
// second buffer.
//
//   nn::LMLoss loss;
//   Tensor l = loss.forward(model.forward(inputs), targets);  // f64 [1]
//   model.backward(loss.backward());  // dlogits [B, T, V], in the logits' place
//   ... l.item() when printing.
//
// Neither is a Module: an object holds one forward's state until its backward, so it is itself
// that call's context (use one object per forward in flight; nn::Transformer keeps its fused
// loss in its call's record).
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/core/tensor.h"

namespace fsdp::nn {

class LMLoss {
 public:
  // Saves the logits (which backward() overwrites) and the row log-sum-exps. A trainer that
  // masks targets passes its count of them per rank and microbatch (train_step does).
  Tensor forward(const Tensor& logits, const Tensor& targets, double divisor = 0);
  // dlogits for d(loss) = scale (1 / K to average over K accumulated micro-batches); once.
  Tensor backward(double scale = 1.0);

 private:
  Tensor logits_, targets_, lse_;
  Shape shape_;
  double divisor_ = 0;
};

// The head and the loss fused, a chunk of rows at a time (as Liger's and torchtitan's chunked
// cross-entropy): the loss of logits = x w^T against targets, the same sum and divisor as
// LMLoss, without the [N, V] logits ever existing. forward() takes each chunk's logits, its
// cross-entropy and row log-sum-exps, and keeps only those; backward() takes each chunk's logits
// again, writes dlogits over them, and from them dx (returned) and dw (added into the weight's
// gradient). The largest tensor is one chunk's [rows, V]: chunk_rows() holds it to
// kChunkLogits on the CPU, device_chunk_logits() on CUDA. The head's GEMM runs three times where the unfused loss runs it twice, so where
// every row fits in one chunk the logits are kept instead (the unfused loss's ops, bit for bit).
//
//   nn::ChunkedLMLoss loss;
//   Tensor l = loss.forward(x, head.weight().data, targets);  // x [B, T, D], targets [B, T]
//                                                             // f64 [chunks]: sum them
//   Tensor dx = loss.backward(1.0, head.weight().grad);      // dx [B, T, D]
class ChunkedLMLoss {
 public:
  static constexpr int64_t kChunkLogits = int64_t(1) << 25;  // 32 M logits: 128 MB in f32
  // Rows per chunk for a vocabulary: chunk_logits (0: kChunkLogits) / vocab, at least 1, at most
  // rows.
  static int64_t chunk_rows(int64_t rows, int64_t vocab, int64_t chunk_logits = 0);
  // The logits per chunk forward() takes when it is given 0: kChunkLogits on the CPU; on CUDA
  // half the rows' (two chunks) where a chunk's logits, at 8 bytes each, fit in 1/32 of the
  // device's total memory (not its free memory, which differs between ranks and runs: the chunk
  // count must not), else as many as fit, never under kChunkLogits (fewer, larger GEMMs
  // over the head). The meta device planning for CUDA takes two chunks, the most a run takes.
  static int64_t device_chunk_logits(Device device, int64_t rows, int64_t vocab);
  // The loss as f64 [chunks] on x's device, each chunk's share: their sum is the loss (one
  // element where every row fits in one chunk).
  Tensor forward(const Tensor& x, const Tensor& w, const Tensor& targets, double divisor = 0,
                 int64_t chunk_logits = 0);
  // dx for d(loss) = scale; adds dlogits^T x into dw when it is defined (a frozen head has none).
  Tensor backward(double scale, const Tensor& dw);
  bool pending() const { return x_.defined(); }  // a forward whose backward has not run
  void clear();                                  // drops what forward() kept (no backward)

 private:
  Tensor x_, w_, targets_, logits_;  // logits_: the one chunk's, when it is every row
  std::vector<Tensor> lse_;          // by chunk
  Shape shape_;
  double divisor_ = 0;
  int64_t chunk_ = 1;  // rows
};

}  // namespace fsdp::nn
