// The memory plan's step replay (src/train/step_replay.h), fully_shard's half: the groups' shard
// layout, the persistent buffers, the token batches, and the all-gather and reduce-scatter
// buffers each hook makes and frees (src/fsdp/fsdp_param_group.cpp, fsdp_state.cpp).
#include <fmt/core.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/distributed/placement.h"
#include "fsdp/nn/module.h"
#include "src/train/step_replay.h"

namespace fsdp::train::replay {

StepReplay::StepReplay(const MemoryPlanOptions& o)
    : o_(o),
      c_(o.model),
      cpu_(o.device.is_cpu()),
      r_(cpu_, o.cpu_cache_bytes),
      R_(c_.batch * c_.seq),
      d_(c_.dim),
      F_(c_.resolved_ffn_hidden()),
      hd_(c_.resolved_head_dim()),
      nh_(c_.heads),
      kv_(c_.resolved_kv_heads()),
      V_(c_.vocab),
      L_(c_.layers) {
  q_ = nh_ * hd_;
  w_ = (nh_ + 2 * kv_) * hd_;
  const DType pd = o.fully_shard ? o.param_dtype.value_or(o.dtype) : o.dtype;
  const DType rd = o.fully_shard ? o.reduce_dtype.value_or(pd) : o.dtype;
  master_ = int64_t(dtype_size(o.dtype));
  act_ = int64_t(dtype_size(pd));
  red_ = int64_t(dtype_size(rd));
  // CPU ops compute in f32 (f64 for f64) and narrow back (src/ops/cpu_ops.cpp); CUDA's compute
  // in the storage dtype with f32 statistics.
  comp_ = cpu_ ? (pd == DType::f64 ? 8 : 4) : act_;
  stat_ = cpu_ ? comp_ : 4;
  narrow_ = comp_ != act_;
  gathered_ =
      o.fully_shard && !(o.shards == 1 && o.replicas == 1 && pd == o.dtype && rd == o.dtype);
  grad_ = gathered_ ? red_ : master_;
  // The frozen groups' own dtype (a bf16 LoRA base); at one rank in their compute dtype they are
  // their own parameters, as FSDPParamGroup's direct groups are.
  const DType fd = o.frozen_dtype.value_or(o.dtype);
  frozen_master_ = int64_t(dtype_size(fd));
  frozen_direct_ = !o.fully_shard || (o.shards == 1 && o.replicas == 1 && pd == fd);
  layout();
}

// FSDPParam::place: a group's shards are the padded row chunks of its parameters (aligned at
// one rank, where the shard is the parameter); its unsharded buffer aligns every parameter.
void StepReplay::layout() {
  nn::Transformer model(c_);  // shapes only: no tensor
  const int64_t n = o_.shards, align = nn::kFlatAlignElems;
  auto up = [&](int64_t x) { return (x + align - 1) / align * align; };
  auto place = [&](Group& g, const nn::Parameter& p, int64_t packed_bytes = 0) {
    const int64_t rows = p.shape[0], row = rows ? shape_numel(p.shape) / rows : 0;
    flat_ = up(flat_) + rows * row;  // nn::materialize's flat buffer, for --shard none
    if (g.packed) {                  // FSDPParam::place_packed
      g.G += packed_bytes;
      g.U = up(g.U) + rows * row;
      return;
    }
    if (n == 1) g.G = up(g.G);
    g.G += dist::chunk_size(rows, n) * row;
    g.U = up(g.U) + rows * row;
  };
  // The group a parameter joins (FSDPState's split): trainable, frozen, or frozen and packed.
  auto join = [&](Group& g, Group& f, Group& pk, const std::string& name, const nn::Parameter& p) {
    if (p.requires_grad) return place(g, p);
    if (o_.frozen_packed && o_.fully_shard)
      if (const auto packed = o_.frozen_packed(name))
        return place(pk, p, packed->padded_chunk_bytes(int(n)));
    place(f, p);
  };
  for (int64_t i = 0; i < L_; ++i) {
    Group g{.label = fmt::format("layers.{}", i), .master = master_, .direct = !gathered_},
        f{.label = g.label + " (frozen)", .master = frozen_master_, .direct = frozen_direct_},
        pk{.label = g.label + " (frozen, packed)", .master = 1, .packed = true};
    for (auto& [name, p] : model.layers()[size_t(i)].named_parameters())
      join(g, f, pk, fmt::format("layers.{}.{}", i, name), *p);
    groups_.push_back(g);
    frozen_.push_back(f);
    packed_.push_back(pk);
  }
  Group root{.label = "root", .master = master_, .direct = !gathered_},
      frozen_root{.label = "root (frozen)", .master = frozen_master_, .direct = frozen_direct_},
      packed_root{.label = "root (frozen, packed)", .master = 1, .packed = true};
  for (auto& [name, p] : model.named_parameters())
    if (name.rfind("layers.", 0) != 0) join(root, frozen_root, packed_root, name, *p);
  groups_.push_back(root);
  frozen_.push_back(frozen_root);
  packed_.push_back(packed_root);
}

H StepReplay::alloc_batch() {
  // inputs and targets, i32 [B, T] each, in one handle's worth of bytes per tensor
  const H in = r_.alloc(R_ * 4, kData), tg = r_.alloc(R_ * 4, kData);
  batches_[in] = tg;
  return in;
}

void StepReplay::free_batch(H in) {
  r_.free(batches_[in]);
  r_.free(in);
}

void StepReplay::issue(Group& g) {  // FSDPParamGroup::unshard_issue
  if (g.direct || g.U == 0 || g.state != Group::sharded) return;
  if (g.packed) {  // the bytes as they are; at one rank decoded from the shard itself
    if (o_.shards > 1) g.ag_out = r_.alloc(o_.shards * g.G, kParams);
    g.state = Group::issued;
    return;
  }
  if (act_ != g.master) g.ag_in = r_.alloc(g.G * act_, kParams);  // the copy-in
  g.ag_out = r_.alloc(o_.shards * g.G * act_, kParams);
  g.state = Group::issued;
}

void StepReplay::wait(Group& g) {  // unshard_wait: copy-out into the unsharded buffer
  if (g.direct || g.U == 0 || g.state == Group::unsharded) return;
  issue(g);
  g.params = r_.alloc(g.U * act_, kParams);
  r_.free(std::exchange(g.ag_out, -1));
  r_.free(std::exchange(g.ag_in, -1));
  g.state = Group::unsharded;
}

void StepReplay::reshard(Group& g) {
  if (g.direct || g.state != Group::unsharded) return;
  r_.free(std::exchange(g.params, -1));
  g.state = Group::sharded;
}

void StepReplay::prepare_grads(Group& g) {
  if (gathered_ && g.U > 0 && !g.grads_kept) g.grads = r_.alloc(g.U * red_, kGrads);
}

// reduce_grads: chunk-cat into the reduce-scatter's input, its output, and at most one
// reduce-scatter left in flight while the next block computes (FSDPCommContext).
void StepReplay::reduce_grads(Group& g) {
  if (!gathered_ || g.U == 0) return;
  if (!sync_) {
    g.grads_kept = true;
    return;
  }
  g.grads_kept = false;
  const H in = r_.alloc(o_.shards * g.G * red_, kGrads);
  r_.free(std::exchange(g.grads, -1));
  const H out = r_.alloc(g.G * red_, kGrads);
  rs_.push_back({in, out, g.G});
  while (rs_.size() > 1) complete_oldest();
}

void StepReplay::complete_oldest() {
  const Pending p = rs_.front();
  rs_.erase(rs_.begin());
  if (o_.replicas > 1) {  // all-reduced over the replicas, added at the end of the backward
    replica_.push_back(p);
    r_.free(p.in);
    return;
  }
  add_into_sharded(p);
}

void StepReplay::add_into_sharded(const Pending& p) {
  {
    Op op(*this);
    if (cpu_ && red_ != comp_) op.tmp.push_back(r_.alloc(p.G * comp_, kWork));
  }
  r_.free(p.out);
  r_.free(p.in);
}

void StepReplay::finish_backward() {
  while (!rs_.empty()) complete_oldest();
  for (const Pending& p : replica_) add_into_sharded({-1, p.out, p.G});
  replica_.clear();
}

// FSDPState's hooks around a block (or the root).
// FSDPState's groups in its order: the trainable one, then the frozen one, then the packed one.
void StepReplay::issue_all(int64_t i) {
  issue(groups_[size_t(i)]);
  issue(frozen_[size_t(i)]);
  issue(packed_[size_t(i)]);
}

void StepReplay::pre_forward(int64_t i) {
  issue_all(i);
  if (i + 1 < L_) issue_all(i + 1);  // the next block: prefetch
  wait(groups_[size_t(i)]);
  wait(frozen_[size_t(i)]);
  wait(packed_[size_t(i)]);
}

void StepReplay::post_forward(int64_t i) {
  if (!o_.reshard_after_forward) return;
  reshard(groups_[size_t(i)]);
  reshard(frozen_[size_t(i)]);
  reshard(packed_[size_t(i)]);
}

void StepReplay::pre_backward(int64_t i) {
  Group& g = groups_[size_t(i)];
  issue_all(i);
  if (i > 0) issue_all(i - 1);  // the block before it: prefetch
  wait(g);
  wait(frozen_[size_t(i)]);
  wait(packed_[size_t(i)]);
  prepare_grads(g);
}

void StepReplay::post_backward(int64_t i) {
  Group& g = groups_[size_t(i)];
  reduce_grads(g);
  reshard(g);
  reshard(frozen_[size_t(i)]);
  reshard(packed_[size_t(i)]);
}

}  // namespace fsdp::train::replay
