// The language-model loss, and the head and the loss fused a chunk of rows at a time.
#include "fsdp/nn/loss.h"

#include <algorithm>
#include <cstddef>

#include "fsdp/core/device.h"
#include "fsdp/core/error.h"
#include "fsdp/core/meta.h"
#include "fsdp/ops/ops.h"

namespace fsdp::nn {

Tensor LMLoss::forward(const Tensor& logits, const Tensor& targets, double divisor) {
  FSDP_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                 logits.size(1) == targets.size(1),
             "[LMLoss] logits must be [B, T, V] and targets [B, T]; got {} and {}",
             shape_str(logits.shape()), shape_str(targets.shape()));
  shape_ = logits.shape();
  logits_ = logits.contiguous().view({shape_[0] * shape_[1], shape_[2]});
  targets_ = targets.contiguous().view({shape_[0] * shape_[1]});
  divisor_ = divisor;
  auto x = ops::cross_entropy_forward(logits_, targets_, /*read_loss=*/false, divisor);
  lse_ = x.lse;
  return x.loss_tensor;
}

Tensor LMLoss::backward(double scale) {
  FSDP_CHECK(logits_.defined(), "[LMLoss] backward() without forward(), or twice");
  Tensor d = ops::cross_entropy_backward_(logits_, targets_, lse_, scale, divisor_).view(shape_);
  logits_ = targets_ = lse_ = Tensor();
  return d;
}

int64_t ChunkedLMLoss::device_chunk_logits(Device device, int64_t rows, int64_t vocab) {
  const bool planned = device.is_meta() && meta::target().device.is_cuda();
  if (!(device.is_cuda() || planned) || rows < 2 || vocab < 1) return kChunkLogits;
  const int64_t half = (rows + 1) / 2 * vocab;  // two chunks: one would keep the logits
  // The memory plan (no GPU needed) plans the largest chunk a run takes: an upper bound.
  if (planned) return std::max(kChunkLogits, half);
  // A chunk's logits in the compute dtype, their f32 log-sum-exp work and dlogits written over
  // them: 8 bytes a logit at most, held to 1/32 of the device's total bytes. The total, not the
  // free bytes: the chunk count must be the same on every rank (the step gathers each chunk's
  // loss: ranks with different counts would gather different sizes) and in every run (the
  // head's gradient sums its chunks in order: a resume must chunk as the first run did), and
  // the free bytes differ between ranks and over time. Ranks on GPUs of different sizes would
  // still differ: fsdp-train runs one GPU type a job.
  const int64_t fit = cuda_memory_info(device.index).total / 32 / 8 / vocab * vocab;
  return std::max(kChunkLogits, std::min(half, fit));
}

int64_t ChunkedLMLoss::chunk_rows(int64_t rows, int64_t vocab, int64_t chunk_logits) {
  const int64_t logits = chunk_logits > 0 ? chunk_logits : kChunkLogits;
  return std::max<int64_t>(1, std::min<int64_t>(rows, logits / std::max<int64_t>(vocab, 1)));
}

Tensor ChunkedLMLoss::forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                              double divisor, int64_t chunk_logits) {
  FSDP_CHECK(x.dim() == 3 && targets.dim() == 2 && x.size(0) == targets.size(0) &&
                 x.size(1) == targets.size(1) && w.dim() == 2 && w.size(1) == x.size(2),
             "[ChunkedLMLoss] x must be [B, T, D], w [V, D] and targets [B, T]; got {}, {} and {}",
             shape_str(x.shape()), shape_str(w.shape()), shape_str(targets.shape()));
  shape_ = x.shape();
  const int64_t n = shape_[0] * shape_[1];
  const int64_t c = chunk_rows(
      n, w.size(0), chunk_logits > 0 ? chunk_logits : device_chunk_logits(x.device(), n, w.size(0)));
  chunk_ = c;
  x_ = x.contiguous().view({n, shape_[2]});
  w_ = w;
  targets_ = targets.contiguous().view({n});
  divisor_ = divisor > 0 ? divisor : double(n);  // LMLoss's 0: the mean over positions
  lse_.clear();
  if (c >= n) {  // one chunk: its logits are kept for the backward, as LMLoss keeps them
    logits_ = ops::linear_forward(x_, w_, Tensor());
    auto ce = ops::cross_entropy_forward(logits_, targets_, /*read_loss=*/false, divisor_);
    lse_.push_back(ce.lse);
    return ce.loss_tensor;
  }
  // Each chunk's share of the loss in its own f64 (copies on the device's stream: no host wait,
  // and no f64 arithmetic, which CUDA's elementwise kernels do not take).
  Tensor parts = Tensor::empty({(n + c - 1) / c}, DType::f64, x.device());
  for (int64_t r = 0, k = 0; r < n; r += c, ++k) {
    const int64_t e = std::min(n, r + c);
    const Tensor logits = ops::linear_forward(x_.slice(r, e), w_, Tensor());
    auto ce =
        ops::cross_entropy_forward(logits, targets_.slice(r, e), /*read_loss=*/false, divisor_);
    lse_.push_back(ce.lse);
    parts.narrow(0, k, 1).copy_(ce.loss_tensor.reshape({1}));
  }
  return parts;
}

Tensor ChunkedLMLoss::backward(double scale, const Tensor& dw) {
  FSDP_CHECK(x_.defined(), "[ChunkedLMLoss] backward() without forward(), or twice");
  const int64_t n = x_.size(0), c = chunk_;
  Tensor dx = Tensor::empty({n, x_.size(1)}, x_.dtype(), x_.device());
  for (int64_t r = 0, k = 0; r < n; r += c, ++k) {
    const int64_t e = std::min(n, r + c);
    const Tensor xc = x_.slice(r, e);
    const Tensor logits = c >= n ? logits_ : ops::linear_forward(xc, w_, Tensor());
    const Tensor dlogits = ops::cross_entropy_backward_(logits, targets_.slice(r, e),
                                                        lse_[size_t(k)], scale, divisor_);
    dx.slice(r, e).copy_(ops::linear_backward(dlogits, xc, w_, dw, Tensor()));
  }
  clear();
  return dx.view(shape_);
}

void ChunkedLMLoss::clear() {
  x_ = w_ = targets_ = logits_ = Tensor();
  lse_.clear();
}

}  // namespace fsdp::nn
