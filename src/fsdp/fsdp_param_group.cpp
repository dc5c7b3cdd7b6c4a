#include "src/fsdp/fsdp_param_group.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "fsdp/core/env.h"
#include "fsdp/core/meta.h"
#include "fsdp/core/trace.h"
#include "fsdp/distributed/placement.h"
#include "fsdp/nn/init.h"
#include "src/fsdp/fsdp_state.h"

namespace fsdp {

FSDPParamGroup::FSDPParamGroup(std::vector<FSDPParam> params,
                               std::shared_ptr<dist::DeviceMesh> mesh, const FullyShardOptions& opt,
                               std::string label, bool frozen)
    : params_(std::move(params)),
      mesh_(std::move(mesh)),
      label_(std::move(label)),
      frozen_(frozen) {
  const int shard_dim = mesh_->ndim() - 1;
  shard_group_ = mesh_->group(shard_dim);
  if (mesh_->ndim() == 2) replicate_group_ = mesh_->group(0);
  n_ = shard_group_->size();
  rank_ = shard_group_->rank();

  const Device dev = mesh_->device();
  packed_ = !params_.empty() && params_.front().packed.has_value();
  if (packed_) {
    init_packed(opt);
    return;
  }
  bool has_values = false;
  for (auto& fp : params_) {
    nn::Parameter& p = *fp.param;
    FSDP_CHECK(!p.shape.empty(),
               "[fully_shard] parameter '{}' is 0-dim; fully_shard shards dim 0 and needs at "
               "least one dim",
               fp.name);
    if (p.data.defined()) {
      FSDP_CHECK(p.data.device() == dev,
                 "[fully_shard] parameter '{}' is on {} but the mesh is on {}", fp.name,
                 p.data.device().str(), dev.str());
      if (!has_values) master_ = p.data.dtype();
      has_values = true;
    }
  }
  if (!has_values) master_ = opt.init_dtype;
  FSDP_CHECK(is_floating(master_), "[fully_shard] parameters must be floating, got {}",
             dtype_name(master_));
  param_dtype_ = opt.mp_policy.param_dtype.value_or(master_);
  reduce_dtype_ = opt.mp_policy.reduce_dtype.value_or(param_dtype_);

  for (auto& fp : params_) fp.place(n_, rank_, g_, u_);
  sharded_ = Tensor::zeros({g_}, master_, dev);  // padding stays zero
  if (!frozen_) sharded_grad_ = Tensor::zeros({g_}, master_, dev);
  for (auto& fp : params_) {
    nn::Parameter& p = *fp.param;
    Tensor local = local_shard(fp);
    if (p.data.defined()) {
      if (fp.local_rows > 0)
        local.copy_(
            p.data.narrow(0, fp.local_begin, fp.local_rows).reshape({fp.local_rows * fp.row}));
    } else {
      nn::init_fill(p.init, opt.seed, fp.name, (fp.global_offset + fp.local_begin) * fp.row, local);
    }
    p.data = Tensor();  // nothing unsharded until the first unshard
    p.grad = Tensor();
  }
  // (A frozen group reduces nothing: its reduce dtype does not matter.)
  divide_ = frozen_ ? 0 : opt.gradient_divide_factor;
  direct_ = n_ == 1 && !replicate_group_ && param_dtype_ == master_ &&
            (frozen_ || reduce_dtype_ == master_) && divide_ == 0;
  one_rank_ = n_ == 1 && !replicate_group_ && !direct_ && divide_ == 0 &&
              env_double("FSDP_ONE_RANK_CAST") != 0;
  if (!params_.empty() && !direct_ && !one_rank_) {
    // The CPU form of FSDP2's all-gather and reduce-scatter streams: two more
    // communicators shared by every group on this mesh, each with its own
    // thread, so a reduce-scatter in flight never delays the next all-gather.
    ag_group_ = mesh_->stream_group(shard_dim, 0);
    rs_group_ = mesh_->stream_group(shard_dim, 1);
    ag_group_->set_label("all-gather");
    rs_group_->set_label("reduce-scatter");
  }
}

// A packed frozen group: its shards are the parameters' stored rows as bytes (an i32 buffer
// carries them: 4-byte elements, never computed on), filled by the caller; they decode into
// param_dtype (f32 unless the policy says otherwise) when unsharded.
void FSDPParamGroup::init_packed(const FullyShardOptions& opt) {
  const Device dev = mesh_->device();
  FSDP_CHECK(frozen_, "[fully_shard] {}: packed parameters must be frozen", label_);
  FSDP_CHECK(dev.is_cpu() || dev.is_meta(),  // meta: the memory plan's shapes
             "[fully_shard] {}: packed (quantized) frozen parameters are decoded on the CPU only, "
             "and the mesh is on {}",
             label_, dev.str());
  for (auto& fp : params_) {
    FSDP_CHECK(fp.packed && fp.packed->decode,
               "[fully_shard] {}: parameter '{}' is not packed but shares a group with packed ones",
               label_, fp.name);
    FSDP_CHECK(!fp.param->data.defined(),
               "[fully_shard] packed parameter '{}' already holds float values; a packed one is "
               "filled from its stored bytes",
               fp.name);
    FSDP_CHECK(!fp.param->shape.empty() && fp.packed->rows() == fp.param->shape[0],
               "[fully_shard] packed parameter '{}': its runs hold {} rows but it has shape {}",
               fp.name, fp.packed->rows(), shape_str(fp.param->shape));
  }
  master_ = DType::i32;
  // The compute dtype: the policy's, else the frozen parameters' own (FSDPState passes the frozen
  // dtype as init_dtype), as for an unpacked frozen group.
  param_dtype_ = opt.mp_policy.param_dtype.value_or(opt.init_dtype);
  reduce_dtype_ = param_dtype_;
  FSDP_CHECK(is_floating(param_dtype_),
             "[fully_shard] {}: packed parameters decode into a float dtype, not {}", label_,
             dtype_name(param_dtype_));
  int64_t bytes = 0;
  for (auto& fp : params_) fp.place_packed(n_, rank_, bytes, u_);
  g_ = bytes / 4;  // each shard is a multiple of 16 bytes
  sharded_ = Tensor::zeros({g_}, DType::i32, dev);
  for (auto& fp : params_) fp.param->data = fp.param->grad = Tensor();
  if (n_ > 1) {
    ag_group_ = mesh_->stream_group(mesh_->ndim() - 1, 0);
    ag_group_->set_label("all-gather");
  }
}

namespace {
// n f32 values into elements [at, at + n) of a CPU tensor of another float dtype.
void narrow_into(const float* src, const Tensor& dst, int64_t at, int64_t n) {
  switch (dst.dtype()) {
    // The destination's pointer once: data<T>() checks the dtype at each call.
    case DType::bf16: {
      bf16* d = dst.data<bf16>() + at;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::f16: {
      f16* d = dst.data<f16>() + at;
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::f64: {
      double* d = dst.data<double>() + at;
      for (int64_t i = 0; i < n; ++i) d[i] = double(src[i]);
      return;
    }
    default:
      FSDP_FAIL("[fully_shard] packed parameters decode into f32, f64, bf16 or f16, not {}",
                dtype_name(dst.dtype()));
  }
}
}  // namespace

// Every rank's rows of each packed parameter, from `blocks` (n rank-major blocks of g_ i32, or
// this rank's shard at one rank) into the unsharded buffer, decoded row run by row run.
void FSDPParamGroup::decode_packed(const Tensor& blocks) {
  const meta::TermScope term(meta::Term::params);
  unsharded_ = Tensor::empty({u_}, param_dtype_, sharded_.device());
  if (unsharded_.device().is_meta()) {  // no bytes to decode: the buffer and the views
    for (auto& fp : params_)
      fp.param->data = unsharded_.slice(fp.unsharded_offset, fp.unsharded_offset + fp.numel())
                           .view(fp.param->shape);
    return;
  }
  struct Piece {
    const uint8_t* src;
    const FSDPParam* fp;
    int64_t row, rows;  // of the parameter
    int64_t row_bytes;
    uint32_t format;
  };
  std::vector<Piece> pieces;
  const auto* base = static_cast<const uint8_t*>(blocks.raw_data());
  for (const auto& fp : params_) {
    for (int k = 0; k < n_; ++k) {
      auto [b, len] = dist::chunk_range(fp.dim0, n_, k);
      const uint8_t* src = base + int64_t(k) * g_ * 4 + fp.shard_offset;
      int64_t at = 0;
      for (const PackedRows::Run& r : fp.packed->runs) {
        const int64_t lo = std::max(b, at), hi = std::min(b + len, at + r.rows);
        if (lo < hi) {
          for (int64_t row = lo; row < hi; row += 64)  // pieces of work for the threads
            pieces.push_back({src + fp.packed->bytes(b, row), &fp, row,
                              std::min<int64_t>(64, hi - row), r.row_bytes, r.format});
        }
        at += r.rows;
      }
    }
  }
  const bool f32 = param_dtype_ == DType::f32;
  const auto n_pieces = int64_t(pieces.size());
  // A decoder's exception must not leave the parallel region (std::terminate): the first one is
  // kept and thrown after it.
  std::exception_ptr failed;
  std::mutex failed_mu;
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < n_pieces; ++i) {
    try {
      const Piece& p = pieces[size_t(i)];
      const int64_t elems = p.rows * p.fp->row, at = p.fp->unsharded_offset + p.row * p.fp->row;
      std::vector<float> tmp(f32 ? 0 : size_t(elems));
      float* dst = f32 ? unsharded_.data<float>() + at : tmp.data();
      for (int64_t r = 0; r < p.rows; ++r)
        p.fp->packed->decode(p.format, p.src + r * p.row_bytes, dst + r * p.fp->row, p.fp->row);
      if (!f32) narrow_into(tmp.data(), unsharded_, at, elems);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(failed_mu);
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  for (auto& fp : params_)
    fp.param->data = unsharded_.slice(fp.unsharded_offset, fp.unsharded_offset + fp.numel())
                         .view(fp.param->shape);
}

Tensor FSDPParamGroup::local_shard(const FSDPParam& fp) const {
  FSDP_CHECK(!packed_, "[fully_shard] parameter '{}' is kept packed: it has no float shard",
             fp.name);
  return sharded_.slice(fp.shard_offset, fp.shard_offset + fp.local_rows * fp.row);
}

std::vector<const dist::ProcessGroup*> FSDPParamGroup::comm_groups() const {
  return {ag_group_.get(), rs_group_.get(), replicate_group_.get()};
}

// Detects ranks whose parameters differ, at the first unshard, and names the parameter.
void FSDPParamGroup::check_shapes_once() {
  if (shapes_checked_ || n_ == 1) return;
  shapes_checked_ = true;
  const auto np = int64_t(params_.size());
  Tensor count = Tensor::full({1}, double(np), DType::i64);
  Tensor counts = Tensor::empty({n_}, DType::i64);
  shard_group_->all_gather_into_tensor(counts, count)->wait();
  for (int k = 0; k < n_; ++k)
    FSDP_CHECK(counts.data<int64_t>()[k] == np,
               "[fully_shard] {} holds {} parameters on rank {} but {} on rank {}", label_, np,
               rank_, counts.data<int64_t>()[k], k);
  // Rows, row length and, for a packed parameter, its padded shard bytes (ranks that hold other
  // quantizations of one model would gather blocks of other sizes).
  Tensor mine = Tensor::empty({np, 3}, DType::i64);
  for (size_t i = 0; i < params_.size(); ++i) {
    mine.data<int64_t>()[3 * i] = params_[i].dim0;
    mine.data<int64_t>()[3 * i + 1] = params_[i].row;
    mine.data<int64_t>()[3 * i + 2] = params_[i].padded_bytes;
  }
  Tensor all = Tensor::empty({n_ * np, 3}, DType::i64);
  shard_group_->all_gather_into_tensor(all, mine)->wait();
  for (int k = 0; k < n_; ++k)
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t* o = all.data<int64_t>() + 3 * (size_t(k) * params_.size() + i);
      FSDP_CHECK(o[0] == params_[i].dim0 && o[1] == params_[i].row,
                 "[fully_shard] parameter '{}' has shape {} on rank {} but {} rows x {} on rank {}",
                 params_[i].name, shape_str(params_[i].param->shape), rank_, o[0], o[1], k);
      FSDP_CHECK(o[2] == params_[i].padded_bytes,
                 "[fully_shard] packed parameter '{}' takes {} bytes a shard on rank {} but {} on "
                 "rank {}: the ranks hold it in other formats (other quantizations of the model?)",
                 params_[i].name, params_[i].padded_bytes, rank_, o[2], k);
    }
}

const char* sharded_state_name(ShardedState s) {
  switch (s) {
    case ShardedState::sharded:
      return "sharded";
    case ShardedState::unshard_issued:
      return "unshard issued";
    case ShardedState::unsharded:
      return "unsharded";
  }
  return "?";
}

void FSDPParamGroup::unshard_issue(FSDPCommContext& ctx) {
  // In flight or unsharded already (a prefetch reached it first), or one rank's direct views.
  if (params_.empty() || state_ != ShardedState::sharded || direct_ || one_rank_) return;
  if (packed_ && n_ == 1) return;  // decoded from the shard itself
  check_shapes_once();
  const meta::TermScope term(meta::Term::params);
  // Copy-in (no copy when the dtypes match; a packed group's bytes go as they are).
  const DType wire = packed_ ? master_ : param_dtype_;
  Tensor in = sharded_.to(wire);
  ag_out_ = Tensor::empty({int64_t(n_) * g_}, wire, sharded_.device());
  gathered_bytes_ += int64_t(ag_out_.nbytes());
  ag_work_ = ag_group_->all_gather_into_tensor(ag_out_, in);
  state_ = ShardedState::unshard_issued;
  ctx.log("ag_issue", label_);
}

// Issues the all-gather if nothing has (no prefetch reached this group), then waits for it.
void FSDPParamGroup::wait_for_all_gather(FSDPCommContext& ctx) {
  if (state_ == ShardedState::sharded) unshard_issue(ctx);
  FSDP_CHECK(state_ == ShardedState::unshard_issued && ag_work_,
             "[fully_shard] '{}': waiting for an all-gather in state '{}'", label_,
             sharded_state_name(state_));
  ctx.wait(ag_work_);
  ctx.log("ag_wait", label_);
}

void FSDPParamGroup::unshard_wait(FSDPCommContext& ctx) {
  if (params_.empty() || state_ == ShardedState::unsharded) return;
  trace::Scope prof(("FSDP::unshard " + label_).c_str(), trace::Kind::annotation);
  const meta::TermScope term(meta::Term::params);
  if (packed_) {
    if (n_ > 1) wait_for_all_gather(ctx);
    decode_packed(n_ > 1 ? ag_out_ : sharded_);
    ag_out_ = Tensor();
    ag_work_ = nullptr;
    state_ = ShardedState::unsharded;
    ctx.log("decode", label_);
    return;
  }
  if (direct_) {
    for (auto& fp : params_) fp.param->data = local_shard(fp).view(fp.param->shape);
    state_ = ShardedState::unsharded;
    return;
  }
  if (one_rank_) {  // one cast of the whole shard; the parameters are views of it
    unsharded_ = sharded_.to(param_dtype_);
    for (auto& fp : params_)
      fp.param->data =
          unsharded_.slice(fp.shard_offset, fp.shard_offset + fp.numel()).view(fp.param->shape);
    state_ = ShardedState::unsharded;
    ctx.log("cast", label_);
    return;
  }
  wait_for_all_gather(ctx);
  unsharded_ = Tensor::empty({u_}, param_dtype_, sharded_.device());
  std::vector<ops::Segment> copy_out;  // rank k's rows of each parameter, in one launch
  for (auto& fp : params_) {
    fp.segments(n_, g_, FSDPParam::Direction::blocks_to_unsharded, copy_out);
    fp.param->data = unsharded_.slice(fp.unsharded_offset, fp.unsharded_offset + fp.numel())
                         .view(fp.param->shape);
  }
  ops::copy_segments(unsharded_, ag_out_, copy_out);
  ag_out_ = Tensor();
  ag_work_ = nullptr;
  state_ = ShardedState::unsharded;
}

void FSDPParamGroup::reshard(FSDPCommContext& ctx) {
  if (params_.empty() || state_ == ShardedState::sharded) return;
  FSDP_CHECK(state_ == ShardedState::unsharded,
             "[fully_shard] '{}': reshard in state '{}' (its all-gather is still in flight)",
             label_, sharded_state_name(state_));
  trace::Scope prof(("FSDP::reshard " + label_).c_str(), trace::Kind::annotation);
  for (auto& fp : params_) fp.param->data = Tensor();
  unsharded_ = Tensor();  // back to the allocator
  state_ = ShardedState::sharded;
  ctx.log("reshard", label_);
}

void FSDPParamGroup::prepare_grads() {
  if (params_.empty() || frozen_) return;  // a frozen parameter's grad stays undefined
  const meta::TermScope term(meta::Term::grads);
  if (direct_) {
    settle_grad();  // the layers add into it
    for (auto& fp : params_)
      fp.param->grad =
          sharded_grad_.slice(fp.shard_offset, fp.shard_offset + fp.numel()).view(fp.param->shape);
    return;
  }
  if (one_rank_ && reduce_dtype_ == master_) {  // the shard's own gradients, as direct_'s
    settle_grad();
    for (auto& fp : params_)
      fp.param->grad =
          sharded_grad_.slice(fp.shard_offset, fp.shard_offset + fp.numel()).view(fp.param->shape);
    return;
  }
  if (one_rank_) {  // in the reduce dtype, laid out as the shard
    if (!grads_kept_) unsharded_grad_ = Tensor::zeros({g_}, reduce_dtype_, sharded_.device());
    for (auto& fp : params_)
      fp.param->grad = unsharded_grad_.slice(fp.shard_offset, fp.shard_offset + fp.numel())
                           .view(fp.param->shape);
    return;
  }
  if (!grads_kept_) unsharded_grad_ = Tensor::zeros({u_}, reduce_dtype_, sharded_.device());
  for (auto& fp : params_)
    fp.param->grad = unsharded_grad_.slice(fp.unsharded_offset, fp.unsharded_offset + fp.numel())
                         .view(fp.param->shape);
}

void FSDPParamGroup::keep_grads() {
  awaits_backward_ = true;
  for (auto& fp : params_) fp.param->grad = Tensor();
  if (!params_.empty() && !direct_ && !frozen_) grads_kept_ = true;
}

void FSDPParamGroup::reduce_grads(FSDPCommContext& ctx) {
  awaits_backward_ = false;
  if (params_.empty()) return;
  const meta::TermScope term(meta::Term::grads);
  for (auto& fp : params_) fp.param->grad = Tensor();
  if (direct_ || frozen_ || (one_rank_ && reduce_dtype_ == master_)) return;
  if (!requires_sync_) {  // accumulate over microbatches; reduce on the one that syncs
    grads_kept_ = true;
    return;
  }
  grads_kept_ = false;
  if (one_rank_) {  // the mean over one rank is the gradient itself
    add_into_sharded_grad(unsharded_grad_);
    unsharded_grad_ = Tensor();
    ctx.log("grad_add", label_);
    return;
  }
  trace::Scope prof(("FSDP::reduce_scatter " + label_).c_str(), trace::Kind::annotation);
  Tensor in = Tensor::empty({int64_t(n_) * g_}, reduce_dtype_, sharded_.device());
  std::vector<ops::Segment> chunk_cat;  // rank k's rows of each gradient into block k
  for (auto& fp : params_)
    fp.segments(n_, g_, FSDPParam::Direction::unsharded_to_blocks, chunk_cat);
  zero_outside(in, chunk_cat);  // only the padding is zeroed: the chunk-cat writes the rest
  ops::copy_segments(in, unsharded_grad_, chunk_cat);
  unsharded_grad_ = Tensor();
  // The step's first reduced gradient is written straight into the sharded gradients (zero_grad
  // left them to it); later ones (accumulation with a sync per microbatch, HSDP) are added.
  const bool write = grad_stale_ && !replicate_group_ && reduce_dtype_ == master_;
  if (write) grad_stale_ = false;
  Tensor out = write ? sharded_grad_ : Tensor::empty({g_}, reduce_dtype_, sharded_.device());
  ctx.log("rs_issue", label_);
  if (divide_ > 0) ops::scale_(in, 1.0 / divide_);  // then summed: the sum over divide_ ranks
  ctx.queue_reduce_scatter(
      this, {rs_group_->reduce_scatter_tensor(
                 out, in, divide_ > 0 ? dist::ReduceOp::SUM : dist::ReduceOp::AVG),
             out});
}

std::optional<PendingCollective> FSDPParamGroup::finish_reduce_scatter(const Tensor& out) {
  if (replicate_group_)
    return PendingCollective{replicate_group_->all_reduce(out, dist::ReduceOp::AVG), out};
  if (!out.shares_storage_with(sharded_grad_)) add_into_sharded_grad(out);  // else written there
  return std::nullopt;
}

// 0 + x is x bit for bit (but for -0, which no later use tells apart), so the first gradient
// after zero_grad is copied rather than added to zeros: one write instead of a zeroing write
// and a read-read-write add.
void FSDPParamGroup::add_into_sharded_grad(const Tensor& reduced) {
  if (grad_stale_) {
    sharded_grad_.copy_(reduced);
    grad_stale_ = false;
    return;
  }
  ops::add_(sharded_grad_, reduced);
}

void FSDPParamGroup::zero_grad() {
  awaits_backward_ = false;
  grad_stale_ = sharded_grad_.defined();  // zeroed or written by the step's first gradient
  grads_kept_ = false;
  unsharded_grad_ = Tensor();
}

void FSDPParamGroup::settle_grad() {
  if (!grad_stale_) return;
  sharded_grad_.zero_();
  grad_stale_ = false;
}

void FSDPParamGroup::zero_outside(const Tensor& buffer, std::vector<ops::Segment> segments) {
  std::sort(segments.begin(), segments.end(),
            [](const ops::Segment& a, const ops::Segment& b) { return a.dst_offset < b.dst_offset; });
  int64_t at = 0;
  for (const ops::Segment& g : segments) {
    if (g.dst_offset > at) buffer.slice(at, g.dst_offset).zero_();
    at = std::max(at, g.dst_offset + g.count);
  }
  if (at < buffer.numel()) buffer.slice(at, buffer.numel()).zero_();
}

}  // namespace fsdp
