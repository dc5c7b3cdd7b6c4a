// Module: a name-addressed tree of parameters with an explicit forward and
// backward (no autograd tape). forward_impl() saves what
// backward_impl() needs; backward_impl() returns the input gradient and ADDS
// into the gradients of the module's parameters. A container runs its
// children's backward in reverse order.
//
// What a forward saves belongs to that call, not to the module: forward_impl() pushes one record
// (save_for_backward) onto the module's stack of saved records and backward_impl() pops the latest
// (take_saved), as PyTorch's ctx.save_for_backward / ctx.saved_tensors. So a module may run N times
// in one forward (a block reused) and then backward N times, in reverse order, each backward
// getting its own call's tensors. Records are tagged with the batch context's microbatch: a
// backward pops the latest record of its own microbatch, so several microbatches may be in flight
// (a pipeline schedule's 1F1B: forward m0, forward m1, backward m0, ...), each LIFO within itself.
// An outermost forward (one called inside no other module's forward or backward: the root's, as a
// trainer calls it) starts its microbatch afresh: the records of that microbatch in its subtree,
// left by forwards whose backward never ran (evaluation, generation), are dropped there, so
// nothing accumulates. A module reused in one forward is therefore called from inside another's
// forward_impl (as a block from its model's).
//
// fully_shard on a module called several times in one forward all-gathers it before each call and
// before each backward, adds the backwards' gradients into one unsharded buffer and reduce-scatters
// them once, after the last backward (records still held in its subtree tell it more are to come),
// as FSDP2 does.
//
// Callers use forward() and backward(), which run the module's chain of hooks
// (add_hooks) around the implementation: this is where fully_shard plugs in its
// pre-forward unshard, post-forward reshard, pre-backward unshard and
// post-backward reduce-scatter, and replicate its gradient all-reduce, as plain
// calls, beside hooks of one's own. The backward hooks receive the gradient and
// may replace it: a pre-backward hook the output gradient dy (PyTorch's
// register_full_backward_pre_hook), a post-backward hook the input gradient dx
// (register_full_backward_hook's grad_input), as tensor parallel's all-reduce
// of an input gradient needs.
//
// Parameters are declared with a shape and an Init at construction and hold
// no memory until materialize() gives every parameter of a tree a view of
// one flat buffer (and every gradient a view of another), initialised by
// (seed, dotted name, element index). The optimizer then steps the flat
// buffers in one fused call; fully_shard will instead materialise shards.
#pragma once

#include <any>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "fsdp/core/tensor.h"
#include "fsdp/nn/init.h"

namespace fsdp::nn {

// Where a parameter's tensor lies before fully_shard: a DTensor's spec (a mesh, one placement per
// mesh dim, the global shape), as a PyTorch parameter is a DTensor after tensor or expert parallel.
// nn only carries it, so it names no mesh: distributed defines it (dist::ParameterPlacement, made
// by dist::distribute_parameter) and fully_shard reads it, as nn::ExpertExchange is carried.
struct ParameterPlacement {
  virtual ~ParameterPlacement() = default;
  Shape global_shape;
  // For messages: "[Replicate(), Shard(0)] on DeviceMesh(dp=2, tp=2, mpi)".
  virtual std::string str() const = 0;
};

struct Parameter {
  std::string local_name;  // "weight"; the dotted path comes from the tree
  Shape shape;  // this rank's piece before fully_shard: the whole tensor unless `placement` is set
  Init init;
  Tensor data, grad;  // defined after materialize(); grad stays undefined when frozen
  // false: frozen (a LoRA base): no gradient buffer, no reduce-scatter, no optimizer state; a
  // layer's backward skips the weight gradient it would add into (grad undefined).
  bool requires_grad = true;
  // null: the parameter is whole. Set: `shape` is this rank's piece of a tensor of
  // placement->global_shape (a tensor-parallel weight's rows, an ep rank's experts); the
  // initialiser and checkpoints see global element indices and rows.
  std::shared_ptr<const ParameterPlacement> placement;
  const Shape& global_shape() const { return placement ? placement->global_shape : shape; }
};

class Module;

// What a forward needs from the batch besides its input: where each row's documents begin (packed
// rows; undefined: one document per row). It is set on the root for a batch's forward and backward
// (BatchContextScope) and every module of the tree reads the root's (Module::batch_context), so a
// module deep in the tree receives it without a change to any forward between.
struct BatchContext {
  Tensor doc_start;  // [B, T] i32 on the batch's device (fsdp/ops/ops.h's packed rows)
  // The fused loss (Module::fuses_loss): with targets set, the model's forward returns the loss
  // (LMLoss's sum over targets / loss_divisor, as f64 [k] whose sum it is: nn::ChunkedLMLoss's
  // chunks) in place of the logits, and its backward takes d(loss) = loss_scale and no gradient
  // tensor.
  Tensor targets;  // [B, T] i32, kIgnoreIndex where not a target
  double loss_divisor = 0, loss_scale = 1;
  int64_t loss_chunk_logits = 0;  // logits per chunk; 0: ChunkedLMLoss::device_chunk_logits
  // evaluation, a reference forward: no module keeps a saved record (save_for_backward does
  // nothing), and the fused loss keeps nothing for a backward
  bool no_backward = false;
  // Which microbatch in flight this forward or backward belongs to (Module's saved records): 0
  // unless a schedule keeps several forwards of one root in flight before their backwards (a
  // pipeline stage), each with its own key. fully_shard takes microbatch 0 only (its hooks keep
  // one step's state per module).
  int64_t microbatch = 0;
};

// Calls around a module's forward and backward, one link of the module's chain (Module::add_hooks).
// Each returns what it was given, or its replacement, which the next link receives:
//   pre_forward    the input x, in registration order, before forward_impl;
//   post_forward   the output y, in registration order, after it;
//   pre_backward   the output gradient dy, in reverse order, before backward_impl (and before an
//                  activation checkpoint's recompute);
//   post_backward  the input gradient dx that backward_impl returned, in reverse order.
// The backward runs the chain in reverse because that is the order autograd reaches the hooks in:
// the gradient passes the last forward transform first, so the backward hooks nest the forward
// ones (the first link's pre_forward is the outermost on the input, and its post_backward the
// last to see dx). A link installed before a user's (fully_shard's, replicate's) thus wraps it:
// a user's pre-backward sees dy before fully_shard's all-gathers, and its post-backward sees dx
// before fully_shard's reduce-scatter is issued (fully_shard's hooks pass gradients unchanged).
// A gradient is undefined where there is none (dy of a fused loss's root, dx of token ids); a
// hook returns it as it came. A replacement keeps the shape, the dtype and the device of what it
// replaces (Module::backward refuses another, naming the module and the link).
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual Tensor pre_forward(Module&, const Tensor& x) { return x; }
  virtual Tensor post_forward(Module&, const Tensor& y) { return y; }
  virtual Tensor pre_backward(Module&, const Tensor& dy) { return dy; }
  virtual Tensor post_backward(Module&, const Tensor& dx) { return dx; }
  // Hooks that own the gradients of their module's subtree (fully_shard's, in sharded
  // buffers): Module::zero_grad() asks them to clear them, and refuses below them.
  virtual bool owns_gradients() const { return false; }
  virtual void zero_grad_hook() {}
};

// A module's chain of hooks, in registration order, with the id each link's handle names. Shared
// with the handles (weakly), so a handle outliving its module removes nothing.
struct HookChain {
  std::vector<std::pair<uint64_t, std::shared_ptr<ModuleHooks>>> links;
  uint64_t next_id = 0;
};

// What Module::add_hooks returns: remove() takes that link out of the chain (PyTorch's
// RemovableHandle). Removing twice, or after the module is gone, does nothing. A link removed
// while its module's forward() or backward() is running still gets that call's remaining hooks
// (the chain of a call is fixed when it begins), so pre and post calls stay paired.
class HookHandle {
 public:
  HookHandle() = default;
  HookHandle(std::weak_ptr<HookChain> chain, uint64_t id) : chain_(std::move(chain)), id_(id) {}
  void remove();

 private:
  std::weak_ptr<HookChain> chain_;
  uint64_t id_ = 0;
};

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module's forward and backward with its hooks around them.
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);

  const std::string& type_name() const { return type_name_; }
  // Whether forward computes the loss itself when the batch context has targets (BatchContext):
  // nn::Transformer's head and cross-entropy a chunk of rows at a time, never the whole logits.
  virtual bool fuses_loss() const { return false; }
  // Dotted path from the top of the tree ("layers.3"); "" for the top.
  std::string path() const;
  // For messages: "TransformerBlock 'layers.3'", or the type alone for the top ("Transformer").
  std::string describe() const;
  // The context of the batch in flight: the root's (empty when none is set).
  const BatchContext& batch_context() const { return root()->context_; }
  void set_batch_context(BatchContext context) { context_ = std::move(context); }
  const Module* root() const;
  Module* parent() const { return parent_; }
  // Appends a link to the module's chain of hooks (ModuleHooks gives the order they run in).
  // fully_shard and replicate install theirs this way, and refuse each other and themselves twice.
  HookHandle add_hooks(std::shared_ptr<ModuleHooks> hooks);
  // The chain, in registration order.
  std::vector<std::shared_ptr<ModuleHooks>> hooks() const;
  // The first link of type H in the chain (fsdp_state: fully_shard's), or nullptr.
  template <class H>
  H* find_hooks() const {
    if (hooks_)
      for (auto& [id, h] : hooks_->links)
        if (auto* found = dynamic_cast<H*>(h.get())) return found;
    return nullptr;
  }
  // Pre-order walk of this module and every descendant.
  void for_each_module(const std::function<void(Module&)>& fn);
  // Every parameter of the subtree with its dotted name ("layers.0.attn.in_proj_weight"),
  // in registration order, depth first: the order of PyTorch's state_dict.
  std::vector<std::pair<std::string, Parameter*>> named_parameters(const std::string& prefix = "");
  std::vector<std::pair<std::string, Module*>> named_children();
  // The parameters registered on this module itself, by local name.
  std::vector<std::pair<std::string, Parameter*>> direct_parameters();
  Parameter& parameter(const std::string& dotted_name);  // throws when absent
  int64_t num_parameters();
  // Clears the gradients of the subtree. A sharded module (fully_shard) clears its sharded
  // gradients, as FSDPModule::zero_grad() does; a module inside a sharded one refuses, since
  // its gradients live in the sharded module's buffers.
  void zero_grad();

  // Activation checkpointing (PyTorch's checkpoint_wrapper, llm.c's recompute): forward() keeps
  // only this module's input (as the pre-forward hooks left it, as a record of this call) and
  // drops the records its subtree pushed during the call; backward() runs forward_impl again on
  // that input, after every pre-backward hook (so under fully_shard the recompute uses the
  // parameters its hook all-gathered: one all-gather per block in the backward, not two), then the
  // backward. The recompute calls forward_impl, never this module's forward hooks. The gradients
  // are bit-identical to those without it.
  void set_activation_checkpoint(bool on) { checkpoint_ = on; }
  bool activation_checkpoint() const { return checkpoint_; }
  // A module of one's own that keeps saved tensors in fields of its own rather than in records
  // drops them here (called on the subtree of a checkpointed module after its forward); the
  // library's layers keep records, which the checkpoint drops itself. Such a module runs once
  // per step.
  virtual void release_saved() {}
  // Records on this module's stack, every microbatch's (tests: none are left after a backward).
  size_t saved_records() const { return saved_.size(); }

 protected:
  virtual Tensor forward_impl(const Tensor& x) = 0;
  virtual Tensor backward_impl(const Tensor& dy) = 0;

  // This call's record of what backward_impl needs (any copyable type: a struct of Tensors),
  // pushed from forward_impl; take_saved<S>() in backward_impl pops the latest record of the
  // current microbatch, refusing by name when there is none or it is not an S.
  template <class S>
  void save_for_backward(S saved) {
    push_saved(std::any(std::move(saved)));
  }
  template <class S>
  S take_saved() {
    std::any a = pop_saved(typeid(S));
    return std::move(*std::any_cast<S>(&a));
  }

  Parameter& register_parameter(std::string local_name, Shape shape, Init init);
  template <class M>
  M& register_module(std::string local_name, std::unique_ptr<M> m) {
    M& ref = *m;
    ref.parent_ = this;
    ref.name_in_parent_ = local_name;
    children_.emplace_back(std::move(local_name), std::move(m));
    return ref;
  }

 private:
  void zero_grad_below();
  void push_saved(std::any saved);
  std::any pop_saved(const std::type_info& type);
  // Drops this microbatch's records in the subtree (an outermost forward), or those above the
  // sizes `keep` holds in for_each_module order (a checkpointed forward's subtree).
  void drop_saved(int64_t microbatch);
  std::vector<size_t> saved_sizes();
  void truncate_saved(const std::vector<size_t>& keep);

  std::string type_name_;
  Module* parent_ = nullptr;
  std::string name_in_parent_;
  std::shared_ptr<HookChain> hooks_;  // created by the first add_hooks
  bool checkpoint_ = false;
  // What forward_impl calls saved (and a checkpointed call's input), oldest first, each with
  // its microbatch.
  struct SavedRecord {
    int64_t microbatch;
    std::any state;
  };
  std::vector<SavedRecord> saved_;
  BatchContext context_;  // read on the root only
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

// Sets a root's batch context for a scope (a batch's forward and backward), then clears it, so
// a later forward (generation, evaluation of unpacked rows) never sees a stale one.
class BatchContextScope {
 public:
  // Throws unless `root` is the top of its tree (the modules read the top's context).
  BatchContextScope(Module& root, BatchContext context);
  ~BatchContextScope() { root_.set_batch_context({}); }
  BatchContextScope(const BatchContextScope&) = delete;
  BatchContextScope& operator=(const BatchContextScope&) = delete;

 private:
  Module& root_;
};

// The flat buffers behind a materialised tree.
struct FlatParameters {
  Tensor params, grads;  // 1-D, parameters laid out in named_parameters() order
};
// With align > 1, each parameter starts at a multiple of `align` elements, zero padding between
// them: kFlatAlignElems gives every parameter and gradient a 16-byte-aligned start in any dtype
// (cuBLASLt's vectorised kernels and its bias epilogue need that on CUDA).
inline constexpr int64_t kFlatAlignElems = 16;
FlatParameters materialize(Module& root, DType dtype, uint64_t seed, Device device = Device::cpu(),
                           int64_t align = 1);

// Runs its children in order; backward in reverse. Children are named "0", "1", ...
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <class M>
  M& append(std::unique_ptr<M> m) {
    modules_.push_back(m.get());
    return register_module(std::to_string(modules_.size() - 1), std::move(m));
  }
  size_t size() const { return modules_.size(); }
  Module& operator[](size_t i) const { return *modules_[i]; }
  // for (nn::Module& block : model.layers()): the children in order.
  class Iterator {
   public:
    using value_type = Module;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    explicit Iterator(std::vector<Module*>::const_iterator it) : it_(it) {}
    Module& operator*() const { return **it_; }
    Iterator& operator++() {
      ++it_;
      return *this;
    }
    Iterator operator++(int) { return Iterator(it_++); }
    bool operator==(const Iterator&) const = default;

   private:
    std::vector<Module*>::const_iterator it_;
  };
  Iterator begin() const { return Iterator(modules_.begin()); }
  Iterator end() const { return Iterator(modules_.end()); }

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  std::vector<Module*> modules_;
};

}  // namespace fsdp::nn
