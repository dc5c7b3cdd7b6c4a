// Module tree traversal, the chain of hooks around forward and backward, and materialisation
// into flat buffers.
#include "fsdp/nn/module.h"

#include <algorithm>
#include <any>
#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>

#include "fsdp/core/meta.h"

namespace fsdp::nn {

namespace {
// A module by its dotted path, or its type at the root.
std::string where_of(const Module& m) {
  std::string p = m.path();
  return p.empty() ? std::string(m.type_name()) : p;
}
}  // namespace

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters(
    const std::string& prefix) {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (auto& p : params_) out.emplace_back(prefix + p->local_name, p.get());
  for (auto& [name, child] : children_) {
    auto sub = child->named_parameters(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_children() {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [name, child] : children_) out.emplace_back(name, child.get());
  return out;
}

std::vector<std::pair<std::string, Parameter*>> Module::direct_parameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  for (auto& p : params_) out.emplace_back(p->local_name, p.get());
  return out;
}

Parameter& Module::parameter(const std::string& dotted_name) {
  for (auto& [name, p] : named_parameters())
    if (name == dotted_name) return *p;
  FSDP_FAIL("[Module] {} has no parameter named '{}'", type_name_, dotted_name);
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += shape_numel(p->shape);
  return n;
}

namespace {
// The link of `m`'s chain that owns its subtree's gradients (fully_shard's), or nullptr.
ModuleHooks* gradient_owner(const std::shared_ptr<HookChain>& chain) {
  if (chain)
    for (auto& [id, h] : chain->links)
      if (h->owns_gradients()) return h.get();
  return nullptr;
}

// A backward hook's replacement keeps what it replaces: defined or not, its shape, its dtype and
// its device.
void check_replacement(const Module& m, const char* hook, const char* what, size_t link,
                       size_t links, const Tensor& before, const Tensor& after) {
  if (before.defined() == after.defined() &&
      (!before.defined() || (before.shape() == after.shape() && before.dtype() == after.dtype() &&
                             before.device() == after.device())))
    return;
  auto desc = [](const Tensor& t) {
    return t.defined() ? fmt::format("a {} tensor of shape {} on {}", dtype_name(t.dtype()),
                                     shape_str(t.shape()), t.device().str())
                       : std::string("no tensor");
  };
  FSDP_FAIL(
      "[Module] the {} hook (link {} of {}) of '{}' ({}) replaced the {} gradient, {}, with {}: "
      "a replacement keeps the shape, the dtype and the device (return the gradient as it came "
      "to keep it)",
      hook, link + 1, links, where_of(m), m.type_name(), what, desc(before), desc(after));
}
}  // namespace

void Module::zero_grad() {
  const bool owns = gradient_owner(hooks_) != nullptr;
  for (const Module* a = parent_; a && !owns; a = a->parent_)
    FSDP_CHECK(!gradient_owner(a->hooks_),
               "[Module] zero_grad() on '{}', inside '{}', whose hooks own its gradients "
               "(fully_shard): call zero_grad() on '{}' or its root (FSDPModule::zero_grad)",
               path(), a->path(), a->path());
  zero_grad_below();
}

void Module::zero_grad_below() {
  if (ModuleHooks* owner = gradient_owner(hooks_)) {  // a sharded subtree, all of it
    owner->zero_grad_hook();
    return;
  }
  for (auto& [name, p] : direct_parameters())
    if (p->grad.defined()) p->grad.zero_();
  for (auto& [name, child] : children_) child->zero_grad_below();
}

namespace {
// A checkpointed call's record: its input, as forward_impl saw it (after the hooks' dtype cast).
struct CheckpointInput {
  Tensor x;
};

// Module::forward and backward calls in progress on this thread: a forward at depth 0 is an
// outermost one (the root's, typically), which starts its microbatch afresh.
thread_local int call_depth = 0;
struct CallDepth {
  CallDepth() { ++call_depth; }
  ~CallDepth() { --call_depth; }
  CallDepth(const CallDepth&) = delete;
  CallDepth& operator=(const CallDepth&) = delete;
};
}  // namespace

void Module::push_saved(std::any saved) {
  // A forward with no backward to come (an evaluation, a preference loss's reference) keeps no
  // record: its activations are freed as it goes, not held until the next outermost forward.
  if (batch_context().no_backward) return;
  saved_.push_back({batch_context().microbatch, std::move(saved)});
}

std::any Module::pop_saved(const std::type_info& type) {
  const int64_t mb = batch_context().microbatch;
  auto it = std::find_if(saved_.rbegin(), saved_.rend(),
                         [&](const SavedRecord& r) { return r.microbatch == mb; });
  FSDP_CHECK(it != saved_.rend(),
             "[Module] backward() of {}'{}' ({}) has no saved record of microbatch {}: no "
             "forward() before it, or more backward() calls than forward() calls (an outermost "
             "forward drops its microbatch's records left from before: give each outermost "
             "forward in flight its own BatchContext::microbatch)",
             checkpoint_ ? "checkpointed " : "", where_of(*this), type_name_, mb);
  FSDP_CHECK(it->state.type() == type,
             "[Module] backward() of '{}' ({}): the latest record of microbatch {} holds {}, not "
             "the {} it takes (its forward_impl saves another type than its backward_impl takes)",
             where_of(*this), type_name_, mb, it->state.type().name(), type.name());
  std::any out = std::move(it->state);
  saved_.erase(std::next(it).base());
  return out;
}

void Module::drop_saved(int64_t microbatch) {
  for_each_module([&](Module& m) {
    std::erase_if(m.saved_, [&](const SavedRecord& r) { return r.microbatch == microbatch; });
  });
}

std::vector<size_t> Module::saved_sizes() {
  std::vector<size_t> sizes;
  for_each_module([&](Module& m) { sizes.push_back(m.saved_.size()); });
  return sizes;
}

void Module::truncate_saved(const std::vector<size_t>& keep) {
  size_t i = 0;
  for_each_module([&](Module& m) {
    const size_t k = keep.at(i++);
    if (m.saved_.size() > k) m.saved_.erase(m.saved_.begin() + std::ptrdiff_t(k), m.saved_.end());
    m.release_saved();
  });
}

Tensor Module::forward(const Tensor& x) {
  std::optional<meta::At> at;  // on the meta device: where the memory plan's peak falls
  if (x.defined() && x.device().is_meta()) at.emplace("forward of " + where_of(*this));
  if (call_depth == 0) drop_saved(batch_context().microbatch);  // backwards that never ran
  const CallDepth depth;
  const std::vector<std::shared_ptr<ModuleHooks>> chain = hooks();  // fixed for this call
  Tensor in = x;
  for (const auto& h : chain) in = h->pre_forward(*this, in);
  std::vector<size_t> keep;  // checkpointed: what the subtree held before this call
  if (checkpoint_) keep = saved_sizes();
  Tensor y = forward_impl(in);
  if (checkpoint_) {  // only the input stays, as this call's record
    truncate_saved(keep);
    push_saved(CheckpointInput{in});
  }
  for (const auto& h : chain) y = h->post_forward(*this, y);
  return y;
}

Tensor Module::backward(const Tensor& dy) {
  const meta::TermScope work(meta::Term::work);  // activation gradients and op temporaries
  std::optional<meta::At> at;
  // (No dy: the fused loss's root, whose device it cannot tell; named on every device.)
  if (!dy.defined() || dy.device().is_meta()) at.emplace("backward of " + where_of(*this));
  const CallDepth depth;  // a recompute's forwards are inside this call
  const std::vector<std::shared_ptr<ModuleHooks>> chain = hooks();  // fixed for this call
  Tensor g = dy;
  for (size_t i = chain.size(); i-- > 0;) {  // reverse order: ModuleHooks says why
    Tensor r = chain[i]->pre_backward(*this, g);
    check_replacement(*this, "pre-backward", "output", i, chain.size(), g, r);
    g = std::move(r);
  }
  if (checkpoint_) {  // the recompute pushes the records backward_impl takes
    std::any in = pop_saved(typeid(CheckpointInput));
    (void)forward_impl(std::any_cast<CheckpointInput&>(in).x);
  }
  Tensor dx = backward_impl(g);
  for (size_t i = chain.size(); i-- > 0;) {
    Tensor r = chain[i]->post_backward(*this, dx);
    check_replacement(*this, "post-backward", "input", i, chain.size(), dx, r);
    dx = std::move(r);
  }
  return dx;
}

HookHandle Module::add_hooks(std::shared_ptr<ModuleHooks> hooks) {
  FSDP_CHECK(hooks, "[Module] add_hooks on '{}' ({}) with no hooks", where_of(*this), type_name_);
  if (!hooks_) hooks_ = std::make_shared<HookChain>();
  const uint64_t id = hooks_->next_id++;
  hooks_->links.emplace_back(id, std::move(hooks));
  return HookHandle(hooks_, id);
}

std::vector<std::shared_ptr<ModuleHooks>> Module::hooks() const {
  std::vector<std::shared_ptr<ModuleHooks>> out;
  if (hooks_)
    for (auto& [id, h] : hooks_->links) out.push_back(h);
  return out;
}

void HookHandle::remove() {
  const std::shared_ptr<HookChain> chain = chain_.lock();
  if (!chain) return;
  std::erase_if(chain->links, [&](const auto& link) { return link.first == id_; });
  chain_.reset();
}

std::string Module::path() const {
  if (!parent_) return "";
  std::string up = parent_->path();
  return up.empty() ? name_in_parent_ : up + "." + name_in_parent_;
}

std::string Module::describe() const {
  return parent_ ? type_name_ + " '" + path() + "'" : type_name_;
}

const Module* Module::root() const { return parent_ ? parent_->root() : this; }

void Module::for_each_module(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (auto& [name, child] : children_) child->for_each_module(fn);
}

Parameter& Module::register_parameter(std::string local_name, Shape shape, Init init) {
  params_.push_back(std::make_unique<Parameter>(
      Parameter{std::move(local_name), std::move(shape), init, {}, {}, true, nullptr}));
  return *params_.back();
}

FlatParameters materialize(Module& root, DType dtype, uint64_t seed, Device device, int64_t align) {
  FSDP_CHECK(align >= 1, "[materialize] align must be at least 1, got {}", align);
  auto named = root.named_parameters();
  auto start = [&](int64_t off) { return (off + align - 1) / align * align; };
  int64_t total = 0;
  for (auto& [name, p] : named) total = start(total) + shape_numel(p->shape);
  // Padding (align > 1) is zero in both buffers and stays so under the optimizer.
  FlatParameters flat{
      align > 1 ? Tensor::zeros({total}, dtype, device) : Tensor::empty({total}, dtype, device),
      Tensor::zeros({total}, dtype, device)};
  int64_t off = 0;
  for (auto& [name, p] : named) {
    const int64_t n = shape_numel(p->shape);
    off = start(off);
    p->data = flat.params.slice(off, off + n).view(p->shape);
    // A frozen parameter gets no gradient view: its stretch of `grads` stays zero.
    p->grad = p->requires_grad ? flat.grads.slice(off, off + n).view(p->shape) : Tensor();
    init_fill(p->init, seed, name, 0, p->data);
    off += n;
  }
  return flat;
}

Tensor ModuleList::forward_impl(const Tensor& x) {
  Tensor h = x;
  for (Module* m : modules_) h = m->forward(h);
  return h;
}

Tensor ModuleList::backward_impl(const Tensor& dy) {
  Tensor g = dy;
  for (auto it = modules_.rbegin(); it != modules_.rend(); ++it) g = (*it)->backward(g);
  return g;
}

BatchContextScope::BatchContextScope(Module& root, BatchContext context) : root_(root) {
  FSDP_CHECK(root.parent() == nullptr,
             "[BatchContextScope] {} is inside a tree; set the batch context on the top module",
             root.path());
  root_.set_batch_context(std::move(context));
}

}  // namespace fsdp::nn
