// The memory plan's step replay (src/train/step_replay.h), the model's half: the ops' outputs,
// widened copies and kernel scratch (src/ops/cpu_ops.cpp, kernels/cpu), what each block saves for
// its backward and when it frees it (nn/layers.cpp), activation recompute, the loss, and one
// microbatch's forward and backward with the root's hooks around them (nn/minillm.cpp).
#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fsdp/nn/loss.h"
#include "src/train/step_replay.h"

namespace fsdp::train::replay {

H StepReplay::linear(int64_t in, int64_t out, Term t) {
  Op op(*this);
  op.in(R_ * in);
  op.in(out * in);
  return op.out(R_ * out, t);
}

// linear_backward: dx, and dW added into the gradient buffer (none for a frozen LoRA base).
H StepReplay::linear_backward(int64_t in, int64_t out, Term t) {
  Op op(*this);
  op.in(R_ * out);
  op.in(R_ * in);
  op.in(out * in);
  if (!c_.lora.enabled()) op.grad(out * in);
  return op.out(R_ * in, t);
}

std::pair<H, H> StepReplay::rmsnorm() {
  Op op(*this);
  op.in(R_ * d_);
  const H y = op.out(R_ * d_, kActivations);
  return {y, op.stat(R_, kActivations)};
}

H StepReplay::rmsnorm_backward() {
  Op op(*this);
  op.in(R_ * d_);
  op.in(R_ * d_);
  op.in(R_);
  op.grad(d_);
  return op.out(R_ * d_, kWork);
}

// add, silu, swiglu and their backwards
H StepReplay::elementwise(int64_t inputs, int64_t elems, Term t) {
  Op op(*this);
  for (int64_t i = 0; i < inputs; ++i) op.in(elems);
  return op.out(elems, t);
}

void StepReplay::add_inplace(int64_t elems) {  // add_: an Accum of a and a widened b
  Op op(*this);
  op.in(elems);
  op.in(elems);
}

void StepReplay::rope(int64_t width) {  // in place; the kernel's cos and sin tables
  if (c_.arch != nn::Arch::llama) return;
  Op op(*this);
  op.in(R_ * width);
  r_.scratch(2 * c_.seq * (hd_ / 2) * comp_);
}

// MultiheadAttention::qk_norm_forward: q's heads, then k's, gathered out of the packed qkv (each
// RMSNorm keeps its gathered input and its rstd), normalized, and scattered back.
void StepReplay::qk_norm(Saved& s) {
  auto part = [&](H& kept, H& rstd, int64_t heads) {
    kept = r_.alloc(R_ * heads * hd_ * act_, kActivations);
    Op op(*this);
    op.in(R_ * heads * hd_);
    r_.free(op.out(R_ * heads * hd_, kWork));
    rstd = op.stat(R_ * heads, kActivations);
  };
  part(s.qn, s.qr, nh_);
  part(s.kn, s.kr, kv_);
}

// MultiheadAttention::qk_norm_backward: each part's gradient gathered, through its RMSNorm's
// backward, scattered back; the norms' saved input and rstd freed.
void StepReplay::qk_norm_backward(Saved& s) {
  auto part = [&](H& kept, H& rstd, int64_t heads) {
    const int64_t n = R_ * heads * hd_;
    const H g = r_.alloc(n * act_, kWork);
    {
      Op op(*this);
      op.in(n);
      op.in(n);
      op.in(R_ * heads);
      op.grad(hd_);
      r_.free(op.out(n, kWork));
    }
    r_.free(g);
    r_.free(std::exchange(kept, -1));
    r_.free(std::exchange(rstd, -1));
  };
  part(s.qn, s.qr, nh_);
  part(s.kn, s.kr, kv_);
}

// kernels/cpu/attention.cpp: kRows x T scores per thread (and as much again and a row in the
// backward), outside the allocator.
int64_t StepReplay::attention_scratch(bool backward) const {
  if (!cpu_) return 0;
  const int64_t rows = std::min<int64_t>(128, c_.seq);
  return int64_t(std::max(1, o_.threads)) * (backward ? 2 * rows * c_.seq + rows : rows * c_.seq) *
         comp_;
}

// TransformerBlock::forward_impl: returns the block's output; `s` gets what it saves.
H StepReplay::block_forward(H x, Saved& s, const std::string& where) {
  s.x = x;
  r_.at(where + ".attn");
  std::tie(s.y1, s.rstd1) = rmsnorm();
  s.qkv = linear(d_, w_);
  if (c_.qk_norm) qk_norm(s);
  rope(w_);
  {
    Op op(*this);
    op.in(R_ * w_);
    s.attn = op.out(R_ * q_, kActivations);
    s.lse = op.stat(c_.batch * nh_ * c_.seq, kActivations);
    r_.scratch(attention_scratch(false));
  }
  const bool sw = c_.sandwich_norms;  // the outputs' norms keep them (and their rstd)
  const H o = linear(q_, d_, sw ? kActivations : kWork);
  H yo = -1;
  if (sw) {
    std::tie(yo, s.rpa) = rmsnorm();
    s.pa = o;
  }
  s.h = elementwise(2, R_ * d_, kActivations);
  r_.free(sw ? yo : o);
  r_.at(where + ".ffn");
  std::tie(s.y2, s.rstd2) = rmsnorm();
  if (c_.arch == nn::Arch::llama) {
    s.f1 = linear(d_, F_);
    s.f2 = linear(d_, F_);
    s.f3 = elementwise(2, R_ * F_, kActivations);
  } else {
    s.f1 = linear(d_, F_);
    s.f2 = elementwise(1, R_ * F_, kActivations);
  }
  const H f = linear(F_, d_, sw ? kActivations : kWork);
  H yf = -1;
  if (sw) {
    std::tie(yf, s.rpf) = rmsnorm();
    s.pf = f;
  }
  const H out = elementwise(2, R_ * d_, kActivations);
  r_.free(sw ? yf : f);
  return out;
}

// Module::release_saved over the block, all but its input.
void StepReplay::release(Saved& s) {
  for (H* h : {&s.y1, &s.rstd1, &s.qkv, &s.attn, &s.lse, &s.h, &s.rstd2, &s.y2, &s.f1, &s.f2, &s.f3,
               &s.qn, &s.qr, &s.kn, &s.kr, &s.pa, &s.rpa, &s.pf, &s.rpf})
    r_.free(std::exchange(*h, -1));
}

// TransformerBlock::backward_impl(dy): returns dx; frees what the block saved, its input too.
H StepReplay::block_backward(Saved& s, const std::string& where) {
  r_.at(where + ".ffn");
  // Sandwich norms: the output norm's backward first; its gradient lives through the branch.
  auto post_norm_backward = [&](H& kept, H& rstd) {
    if (!c_.sandwich_norms) return H(-1);
    const H d = rmsnorm_backward();
    r_.free(std::exchange(kept, -1));
    r_.free(std::exchange(rstd, -1));
    return d;
  };
  const H df = post_norm_backward(s.pf, s.rpf);
  H dxf;
  if (c_.arch == nn::Arch::llama) {
    const H dh = linear_backward(F_, d_);
    r_.free(std::exchange(s.f3, -1));
    H dg, du;
    {
      Op op(*this);
      for (int k = 0; k < 3; ++k) op.in(R_ * F_);
      dg = op.out(R_ * F_, kWork);
      du = op.out(R_ * F_, kWork);
    }
    r_.free(std::exchange(s.f1, -1));
    r_.free(std::exchange(s.f2, -1));
    dxf = linear_backward(d_, F_);
    const H t = linear_backward(d_, F_);
    r_.free(std::exchange(s.y2, -1));
    add_inplace(R_ * d_);
    r_.free(t);
    r_.free(du);
    r_.free(dg);
    r_.free(dh);
  } else {
    const H dh = linear_backward(F_, d_);
    r_.free(std::exchange(s.f2, -1));
    const H ds = elementwise(2, R_ * F_, kWork);
    dxf = linear_backward(d_, F_);
    r_.free(std::exchange(s.y2, -1));
    r_.free(ds);
    r_.free(std::exchange(s.f1, -1));
    r_.free(dh);
  }
  const H dh2 = rmsnorm_backward();
  r_.free(std::exchange(s.h, -1));
  r_.free(std::exchange(s.rstd2, -1));
  r_.free(dxf);
  r_.free(df);
  add_inplace(R_ * d_);
  r_.at(where + ".attn");
  const H da = post_norm_backward(s.pa, s.rpa);
  const H dattn = linear_backward(q_, d_);
  H dqkv;
  {
    Op op(*this);
    op.in(R_ * q_);
    op.in(R_ * w_);
    op.in(R_ * q_);
    op.in(c_.batch * nh_ * c_.seq);
    dqkv = op.out(R_ * w_, kWork);
    r_.scratch(attention_scratch(true));
  }
  rope(w_);
  if (c_.qk_norm) qk_norm_backward(s);
  const H dxa = linear_backward(d_, w_);
  for (H* h : {&s.y1, &s.qkv, &s.attn, &s.lse}) r_.free(std::exchange(*h, -1));
  r_.free(dqkv);
  r_.free(dattn);
  const H dx = rmsnorm_backward();
  r_.free(std::exchange(s.x, -1));
  r_.free(std::exchange(s.rstd1, -1));
  r_.free(dxa);
  r_.free(da);
  add_inplace(R_ * d_);
  r_.free(dh2);
  return dx;
}

bool StepReplay::checkpointed(int64_t i) const {
  return o_.checkpoint_every > 0 && i % o_.checkpoint_every == 0;
}

// One microbatch: the Transformer's forward, LMLoss, its backward (nn/transformer.cpp,
// nn/loss.cpp), with the root's hooks around them.
void StepReplay::microbatch() {
  Group& rg = root();
  // Root pre-forward: its all-gather, the first block's prefetched, then its wait.
  Group& rf = frozen_.back();
  Group& rp = packed_.back();
  r_.at("forward of the embedding");
  issue(rg);
  issue(rf);
  issue(rp);
  issue_all(0);
  wait(rg);
  wait(rf);
  wait(rp);
  H x;
  {
    Op op(*this);
    op.in(V_ * d_);
    x = op.out(R_ * d_, kActivations);
  }
  std::vector<Saved> saved(static_cast<size_t>(L_));
  for (int64_t i = 0; i < L_; ++i) {
    const std::string where = fmt::format("forward of layers.{}", i);
    r_.at(where);
    pre_forward(i);
    x = block_forward(x, saved[size_t(i)], where);
    if (checkpointed(i)) release(saved[size_t(i)]);
    post_forward(i);
  }
  r_.at("forward of the head");
  H xn = x, rstd_n = -1;  // the head's input
  if (c_.arch == nn::Arch::llama) std::tie(xn, rstd_n) = rmsnorm();
  // The fused loss (nn::ChunkedLMLoss): one chunk's logits at a time and every row's lse, kept
  // for the backward. Else the logits, then LMLoss: the cross-entropy's lse; its backward
  // overwrites the logits with dlogits (widened copies where the logits are narrower than the
  // compute dtype).
  // Fused with one chunk of every row: the logits kept until the head's backward, which frees
  // them (LMLoss's dlogits live through the whole backward).
  const int64_t C = nn::ChunkedLMLoss::chunk_rows(R_, V_);
  const bool fused = o_.fused_loss && C < R_, one_chunk = o_.fused_loss && !fused;
  H logits = -1, lse = -1;
  if (fused) {
    r_.at("forward of the head and the loss (chunked)");
    lse = r_.alloc(R_ * stat_, kLogits);
    chunk_logits(C, /*backward=*/false);
  } else {
    logits = linear(d_, V_, kLogits);
    r_.at("loss");
    {
      Op op(*this);
      op.in(R_ * V_);
      lse = op.stat(R_, kLogits);
    }
    {
      Op op(*this);
      op.in(R_ * V_);
    }
    if (!one_chunk) r_.free(lse);
  }
  // Root pre-backward: nothing to gather (the root stays unsharded), the last block prefetched,
  // the root's gradient buffer.
  r_.at("backward of the head");
  issue_all(L_ - 1);
  prepare_grads(rg);
  H top = -1;   // the head's dx (the head, or tied: the embedding's weight)
  if (fused) {  // each chunk's logits again, dlogits over them, dx's rows and dW from them
    {
      Op op(*this);
      top = op.out(R_ * d_, kWork);
    }
    chunk_logits(C, /*backward=*/true);
    r_.free(lse);
  } else {
    top = linear_backward(d_, V_);
    if (one_chunk) {
      r_.free(logits);
      r_.free(lse);
      logits = -1;
    }
  }
  r_.free(xn);
  if (c_.arch == nn::Arch::llama) {
    const H dn = rmsnorm_backward();
    r_.free(x);
    r_.free(rstd_n);
    r_.free(top);
    top = dn;
  }
  H g = top;
  for (int64_t i = L_ - 1; i >= 0; --i) {
    const std::string where = fmt::format("backward of layers.{}", i);
    r_.at(where);
    pre_backward(i);
    Saved& s = saved[size_t(i)];
    if (checkpointed(i)) r_.free(block_forward(s.x, s, where + " (recompute)"));
    const H dx = block_backward(s, where);
    post_backward(i);
    if (g != top) r_.free(g);
    g = dx;
  }
  r_.at("backward of the embedding");
  if (!c_.lora.enabled()) {  // a frozen embedding adds no gradient
    Op op(*this);
    op.in(R_ * d_);
    op.grad(V_ * d_);
  }
  r_.free(g);
  r_.free(top);
  r_.at("end of the backward");
  reduce_grads(rg);
  reshard(rg);
  reshard(rf);
  reshard(rp);
  finish_backward();
  if (logits >= 0) r_.free(logits);
}

// One chunk of nn::ChunkedLMLoss: its logits (in the compute dtype, narrowed where the
// activations are narrower), the cross-entropy over them, and in the backward dlogits written
// over them, then the chunk's dx and its dW added into the head's gradient.
void StepReplay::chunk_logits(int64_t rows, bool backward) {
  Op op(*this);
  op.in(rows * d_);
  op.in(V_ * d_);
  const H logits = op.out(rows * V_, kLogits);
  {
    Op ce(*this);
    ce.in(rows * V_);
  }
  if (backward) {
    Op lb(*this);
    lb.in(rows * V_);
    lb.in(rows * d_);
    lb.in(V_ * d_);
    if (!c_.lora.enabled()) lb.grad(V_ * d_);
    r_.free(lb.out(rows * d_, kWork));
  }
  r_.free(logits);
}

}  // namespace fsdp::train::replay
