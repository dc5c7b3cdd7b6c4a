// The CPU ProcessGroup: checks each call, then runs it on the group's
// communication thread through a Transport (MPI, Gloo, or local for a world of
// one). Also the local transport, which is what a collective means for one rank.
#include "fsdp/distributed/process_group.h"

#include <algorithm>
#include <atomic>
#include <compare>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/core/env.h"
#include "fsdp/core/trace.h"
#include "fsdp/distributed/init.h"
#include "src/core/dispatch.h"
#include "src/distributed/transport.h"
#include "src/distributed/cpu_group.h"
#include "src/distributed/split_sizes.h"

namespace fsdp::dist {

std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::SUM ? "sum" : "avg"; }

std::chrono::milliseconds collective_timeout() {
  return std::chrono::milliseconds(int64_t(env_double("FSDP_COLLECTIVE_TIMEOUT_S") * 1000.0));
}

namespace {

class CpuWork final : public Work {
 public:
  CpuWork(std::shared_ptr<Event> ev, std::string what, std::string group, int64_t seq)
      : ev_(std::move(ev)), what_(std::move(what)), group_(std::move(group)), seq_(seq) {}
  // A time-out is fatal to the group: its communication thread is stuck inside the engine, so
  // it is abandoned (never joined) and the error names the late ranks the board knows of.
  void wait() override {
    try {
      ev_->wait(collective_timeout(), what_);
    } catch (const Error& e) {
      // Timed out here, or failed in the engine (Gloo's own time-out): either way, say which
      // ranks the progress board shows behind.
      const bool timed_out = !ev_->query();
      const std::string late = watchdog::describe_late_ranks(group_, seq_, !timed_out);
      const std::string msg =
          late.empty() ? std::string(e.what()) : fmt::format("{}; {}", e.what(), late);
      if (timed_out) watchdog::abandon(msg);
      throw Error(msg);
    }
  }
  bool is_completed() const override { return ev_->query(); }

 private:
  std::shared_ptr<Event> ev_;
  std::string what_, group_;
  int64_t seq_;
};

std::atomic<int> g_groups{0};  // groups made in this process: the same order on every rank

// ---------------------------------------------------------------- local transport

class LocalTransport final : public Transport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }
  void all_gather(const void* in, void* out, size_t bytes) override {
    if (bytes) std::memmove(out, in, bytes);  // (empty tensors have no data pointer)
  }
  void all_reduce_sum(void*, size_t, DType) override {}
  void reduce_scatter_sum(const void* in, void* out, size_t count, DType dtype) override {
    if (count) std::memmove(out, in, count * dtype_size(dtype));
  }
  void broadcast(void*, size_t, int) override {}
  void all_to_all(const void* in, void* out, size_t bytes) override {
    if (bytes) std::memmove(out, in, bytes);
  }
  void all_to_all_v(const void* in, const std::vector<int64_t>& in_counts, void* out,
                    const std::vector<int64_t>&, size_t unit) override {
    if (in_counts[0]) std::memmove(out, in, size_t(in_counts[0]) * unit);
  }
  void barrier() override {}
  std::unique_ptr<Transport> split(int, int, const std::vector<int>&, int, int) override {
    return std::make_unique<LocalTransport>();
  }
};

bool is_narrow(DType t) { return t == DType::bf16 || t == DType::f16; }

// Waits for each part of a staged collective in order; the first error wins.
class StagedWork final : public Work {
 public:
  explicit StagedWork(std::vector<std::shared_ptr<Work>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    std::exception_ptr first;
    for (auto& w : parts_) {
      try {
        w->wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }
  bool is_completed() const override { return parts_.back()->is_completed(); }

 private:
  std::vector<std::shared_ptr<Work>> parts_;
};

void divide(const Tensor& t, double by) {
  dispatch_all(t.dtype(), [&](auto tv) {
    using T = decltype(tv);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      T* p = t.data<T>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = T(p[i] / by);
    }
  });
}

}  // namespace

std::unique_ptr<Transport> make_local_transport() { return std::make_unique<LocalTransport>(); }

// ---------------------------------------------------------------- CpuProcessGroup

CpuProcessGroup::CpuProcessGroup(std::unique_ptr<Transport> transport, Device tensor_device)
    : transport_(std::move(transport)),
      device_(tensor_device),
      stream_(std::make_unique<CpuStream>(
          fmt::format("{} comm (rank {} of {})", transport_->name(), transport_->rank(), transport_->size()))),
      counter_(watchdog::register_group(fmt::format("group{}", g_groups++))),
      check_(env_str("FSDP_DIST_CHECK") != "0") {}

CpuProcessGroup::~CpuProcessGroup() {
  if (watchdog::abandoned()) {  // its thread may be stuck in the engine: end the job instead
    std::fprintf(stderr, "fsdp: error (rank %d): %s; ending the job\n", transport_->rank(),
                 watchdog::abandon_error().c_str());
    abort_process(1);
  }
  stream_.reset();  // drain the queue before the transport goes
}

int CpuProcessGroup::rank() const { return transport_->rank(); }
int CpuProcessGroup::size() const { return transport_->size(); }
std::string CpuProcessGroup::backend() const {
  return device_stand_in_ ? transport_->name() + "-device-check" : transport_->name();
}
std::thread::id CpuProcessGroup::comm_thread_id() const { return stream_->thread_id(); }

void CpuProcessGroup::set_label(const std::string& label) {
  const std::string name =
      fmt::format("{} {} (rank {} of {})", transport_->name(), label, transport_->rank(), transport_->size());
  stream_->enqueue([name] { trace::set_thread_name(name); });
  watchdog::relabel(*counter_, label);
}

std::shared_ptr<Work> CpuProcessGroup::submit(const std::string& what, double bytes,
                                              std::function<void()> fn) {
  const int64_t seq = ++counter_->issued;
  auto counter = counter_;
  const std::string desc = fmt::format("{} (collective #{} of {}, rank {})", what, seq,
                                       watchdog::label_of(*counter_), transport_->rank());
  auto task = [this, what, desc, bytes, counter, fn = std::move(fn)] {
    struct Done {  // counted however the collective ends
      watchdog::Counter& c;
      ~Done() { ++c.done; }
    } done{*counter};
    const std::string label = transport_->name() + ":" + what;
    trace::Scope prof(label.c_str(), trace::Kind::collective);
    if (prof.on()) {
      prof.set("", "", 0, bytes, "cpu");
      prof.set_detail(
          fmt::format("{} group of {} (rank {})", transport_->name(), transport_->size(), transport_->rank()));
    }
    try {
      fn();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(fmt::format("[{}] {} failed: {}", transport_->name(), desc, e.what()));
    }
  };
  return std::make_shared<CpuWork>(stream_->enqueue(std::move(task)), desc,
                                   watchdog::label_of(*counter_), seq);
}

void CpuProcessGroup::check_tensor(const char* op, const Tensor& t, const char* what) const {
  FSDP_CHECK(t.defined(), "[{}] {} is undefined", op, what);
  FSDP_CHECK(!device_stand_in_,
             "[{}] {} ({} on {}) was handed to the device half of the world "
             "(FSDP_DIST_DEVICE_CHECK=1 stands in for NCCL, which takes only CUDA tensors): route "
             "it through the world group, which sends host tensors to the host engine",
             op, what, shape_str(t.shape()), t.device().str());
  FSDP_CHECK(t.device().is_cpu() || t.device() == device_,
             "[{}] {} is on {} but this {} group holds tensors on {}{}", op, what, t.device().str(),
             transport_->name(), device_.str(),
             device_.is_cpu() ? " (NCCL, or --backend gloo|mpi with --device cuda, for CUDA)" : "");
}

bool CpuProcessGroup::on_device(std::initializer_list<const Tensor*> ts) const {
  bool any = false;
  for (const Tensor* t : ts) any = any || (t->defined() && t->device().is_cuda());
  return any;
}

std::shared_ptr<Work> CpuProcessGroup::staged(
    const char* op, const std::vector<Tensor>& ins, const std::vector<Tensor>& outs,
    const std::function<std::shared_ptr<Work>(const std::vector<Tensor>& host)>& host_call) {
  // host[i] mirrors ins[i] and then outs[i - ins.size()]; an output that is also an input
  // (all_reduce, broadcast) is passed once, as an input, and copied back.
  std::vector<Tensor> host, devs;
  for (const Tensor& t : ins) devs.push_back(t.contiguous());
  for (const Tensor& t : outs) {
    bool also_in = false;
    for (const Tensor& i : ins) also_in = also_in || i.raw_data() == t.raw_data();
    if (!also_in) devs.push_back(t);
  }
  for (const Tensor& d : devs)
    host.push_back(d.device().is_cpu() ? d : Tensor::empty(d.shape(), d.dtype()));
  const size_t n_in = ins.size();
  auto copy_in = submit(std::string(op) + " (to host)", 0, [host, devs, n_in] {
    for (size_t i = 0; i < n_in; ++i)
      if (devs[i].device().is_cuda()) host[i].copy_(devs[i]);
  });
  auto work = host_call(host);
  auto copy_out = submit(std::string(op) + " (to device)", 0, [host, devs, outs] {
    for (const Tensor& o : outs)
      if (o.device().is_cuda())
        for (size_t i = 0; i < devs.size(); ++i)
          if (devs[i].raw_data() == o.raw_data()) o.copy_(host[i]);
  });
  return std::make_shared<StagedWork>(std::vector<std::shared_ptr<Work>>{copy_in, work, copy_out});
}

// Runs on the communication thread: every rank shares (kind, dtype, sizes)
// and all of them throw, naming the ranks, if they differ.
void CpuProcessGroup::check_signature(const char* op, DType dtype, int64_t a, int64_t b) {
  if (!check_ || size() == 1) return;
  const int64_t mine[4] = {int64_t(std::hash<std::string_view>{}(op)&0x7fffffff), int64_t(dtype), a,
                           b};
  std::vector<int64_t> all(size_t(4 * size()));
  transport_->all_gather(mine, all.data(), sizeof(mine));
  for (int r = 0; r < size(); ++r) {
    const int64_t* o = all.data() + 4 * r;
    if (o[0] != mine[0])
      FSDP_FAIL(
          "[{}] rank {} issued {} while rank {} issued a different collective: the ranks are out "
          "of order",
          op, rank(), op, r);
    if (o[1] != mine[1] || o[2] != mine[2] || o[3] != mine[3])
      FSDP_FAIL(
          "[{}] ranks disagree: rank {} has {} x {} (arg {}) but rank {} has {} x {} (arg {})", op,
          rank(), dtype_name(dtype), a, b, r, dtype_name(DType(o[1])), o[2], o[3]);
  }
}

std::shared_ptr<Work> CpuProcessGroup::all_gather_into_tensor(const Tensor& out, const Tensor& in) {
  const char* op = "all_gather_into_tensor";
  check_tensor(op, out, "output");
  check_tensor(op, in, "input");
  FSDP_CHECK(out.dtype() == in.dtype(), "[{}] output is {} but input is {}", op,
             dtype_name(out.dtype()), dtype_name(in.dtype()));
  FSDP_CHECK(out.numel() == in.numel() * size(),
             "[{}] output has {} elements; expected {} = {} ranks x {}", op, out.numel(),
             in.numel() * size(), size(), in.numel());
  FSDP_CHECK(out.is_contiguous(), "[{}] output must be contiguous", op);
  // (After the checks: a staged call runs this collective on host copies.)
  if (on_device({&out, &in}))
    return staged(op, {in}, {out}, [this](const std::vector<Tensor>& h) {
      return all_gather_into_tensor(h[1], h[0]);
    });
  Tensor src = in.contiguous();
  return submit(op, double(out.nbytes()), [=, this] {
    check_signature(op, in.dtype(), in.numel(), 0);
    transport_->all_gather(src.raw_data(), out.raw_data(), src.nbytes());
  });
}

std::shared_ptr<Work> CpuProcessGroup::reduce_scatter_tensor(const Tensor& out, const Tensor& in,
                                                             ReduceOp rop) {
  const char* op = "reduce_scatter_tensor";
  check_tensor(op, out, "output");
  check_tensor(op, in, "input");
  FSDP_CHECK(out.dtype() == in.dtype(), "[{}] output is {} but input is {}", op,
             dtype_name(out.dtype()), dtype_name(in.dtype()));
  FSDP_CHECK(in.numel() == out.numel() * size(),
             "[{}] input has {} elements; expected {} = {} ranks x {}", op, in.numel(),
             out.numel() * size(), size(), out.numel());
  FSDP_CHECK(out.is_contiguous(), "[{}] output must be contiguous", op);
  FSDP_CHECK(rop == ReduceOp::SUM || is_floating(in.dtype()),
             "[{}] AVG needs a floating dtype, got {}", op, dtype_name(in.dtype()));
  // (After the checks: a staged call runs this collective on host copies.)
  if (on_device({&out, &in}))
    return staged(op, {in}, {out}, [this, rop](const std::vector<Tensor>& h) {
      return reduce_scatter_tensor(h[1], h[0], rop);
    });
  // Engines reduce f32/f64/i32/i64; narrow types are reduced in f32. (The input is read on
  // the communication thread, as the engines read theirs: a staged input is on the host only
  // once the copy ahead of this task has run.)
  const bool narrow = is_narrow(in.dtype());
  Tensor in_c = in.contiguous();
  return submit(op, double(in.nbytes()), [=, this] {
    check_signature(op, in.dtype(), out.numel(), int64_t(rop));
    Tensor src = narrow ? in_c.to(DType::f32) : in_c;
    Tensor dst = narrow ? Tensor::empty(out.shape(), DType::f32) : out;
    transport_->reduce_scatter_sum(src.raw_data(), dst.raw_data(), size_t(out.numel()), src.dtype());
    if (rop == ReduceOp::AVG) divide(dst, double(size()));
    if (narrow) out.copy_(dst);
  });
}

std::shared_ptr<Work> CpuProcessGroup::all_reduce(const Tensor& t, ReduceOp rop) {
  const char* op = "all_reduce";
  check_tensor(op, t, "tensor");
  FSDP_CHECK(t.is_contiguous(), "[{}] tensor must be contiguous", op);
  FSDP_CHECK(rop == ReduceOp::SUM || is_floating(t.dtype()),
             "[{}] AVG needs a floating dtype, got {}", op, dtype_name(t.dtype()));
  // (After the checks: a staged call runs this collective on host copies.)
  if (on_device({&t}))
    return staged(op, {t}, {t},
                  [this, rop](const std::vector<Tensor>& h) { return all_reduce(h[0], rop); });
  const bool narrow = is_narrow(t.dtype());
  return submit(op, double(t.nbytes()), [=, this] {
    check_signature(op, t.dtype(), t.numel(), int64_t(rop));
    Tensor buf = narrow ? t.to(DType::f32) : t;
    transport_->all_reduce_sum(buf.raw_data(), size_t(buf.numel()), buf.dtype());
    if (rop == ReduceOp::AVG) divide(buf, double(size()));
    if (narrow) t.copy_(buf);
  });
}

std::shared_ptr<Work> CpuProcessGroup::broadcast(const Tensor& t, int root) {
  const char* op = "broadcast";
  check_tensor(op, t, "tensor");
  FSDP_CHECK(t.is_contiguous(), "[{}] tensor must be contiguous", op);
  FSDP_CHECK(root >= 0 && root < size(), "[{}] root {} is not a rank of this group of {}", op, root,
             size());
  // (After the checks: a staged call runs this collective on host copies.)
  if (on_device({&t}))
    return staged(op, {t}, {t},
                  [this, root](const std::vector<Tensor>& h) { return broadcast(h[0], root); });
  return submit(op, double(t.nbytes()), [=, this] {
    check_signature(op, t.dtype(), t.numel(), root);
    transport_->broadcast(t.raw_data(), t.nbytes(), root);
  });
}

std::shared_ptr<Work> CpuProcessGroup::all_to_all_single(const Tensor& out, const Tensor& in) {
  const char* op = "all_to_all_single";
  check_tensor(op, out, "output");
  check_tensor(op, in, "input");
  FSDP_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel(),
             "[{}] output ({} x {}) and input ({} x {}) must match", op, dtype_name(out.dtype()),
             out.numel(), dtype_name(in.dtype()), in.numel());
  FSDP_CHECK(in.numel() % size() == 0, "[{}] {} elements do not split into {} equal blocks", op,
             in.numel(), size());
  FSDP_CHECK(out.is_contiguous(), "[{}] output must be contiguous", op);
  // (After the checks: a staged call runs this collective on host copies.)
  if (on_device({&out, &in}))
    return staged(op, {in}, {out},
                  [this](const std::vector<Tensor>& h) { return all_to_all_single(h[1], h[0]); });
  Tensor src = in.contiguous();
  return submit(op, double(in.nbytes()), [=, this] {
    check_signature(op, in.dtype(), in.numel(), 0);
    transport_->all_to_all(src.raw_data(), out.raw_data(), src.nbytes() / size_t(size()));
  });
}

std::shared_ptr<Work> CpuProcessGroup::all_to_all_v(const Tensor& out,
                                                    const std::vector<int64_t>& out_splits,
                                                    const Tensor& in,
                                                    const std::vector<int64_t>& in_splits) {
  const char* op = "all_to_all_v";
  check_tensor(op, out, "output");
  check_tensor(op, in, "input");
  const SplitLayout l = check_split_sizes(op, size(), out, out_splits, in, in_splits);
  FSDP_CHECK(out.is_contiguous(), "[{}] output must be contiguous", op);
  // (After the checks: a staged call runs this collective on host copies.)
  if (on_device({&out, &in}))
    return staged(op, {in}, {out}, [=, this](const std::vector<Tensor>& h) {
      return all_to_all_v(h[1], out_splits, h[0], in_splits);
    });
  Tensor src = in.contiguous();
  return submit(op, double(in.nbytes()), [=, this] {
    check_signature(op, in.dtype(), l.row_numel, 0);
    if (check_ && size() > 1) {  // every rank's splits, so that all refuse a mismatch together
      std::vector<int64_t> mine(in_splits), all(size_t(2 * size() * size()));
      mine.insert(mine.end(), out_splits.begin(), out_splits.end());
      transport_->all_gather(mine.data(), all.data(), mine.size() * sizeof(int64_t));
      check_split_agreement(op, size(), all);
    }
    transport_->all_to_all_v(src.raw_data(), l.in_counts, out.raw_data(), l.out_counts,
                             dtype_size(in.dtype()));
  });
}

std::shared_ptr<Work> CpuProcessGroup::barrier() {
  return submit("barrier", 0, [this] {
    check_signature("barrier", DType::i32, 0, 0);
    transport_->barrier();
  });
}

std::shared_ptr<ProcessGroup> CpuProcessGroup::split(int color, int key) {
  std::unique_ptr<Transport> sub;
  const int seq = split_seq_++;
  auto work = submit("split", 0, [&, this] {
    const int64_t mine[2] = {color, key};
    std::vector<int64_t> all(size_t(2 * size()));
    transport_->all_gather(mine, all.data(), sizeof(mine));
    std::vector<std::pair<int64_t, int>> order;  // (key, rank) of my color
    for (int r = 0; r < size(); ++r)
      if (all[2 * r] == color) order.emplace_back(all[2 * r + 1], r);
    std::sort(order.begin(), order.end());
    std::vector<int> members;
    int index = -1;
    for (auto& [k, r] : order) {
      if (r == rank()) index = int(members.size());
      members.push_back(r);
    }
    sub = transport_->split(color, key, members, index, seq);
  });
  work->wait();
  if (color < 0 || !sub) return nullptr;
  auto g = std::make_shared<CpuProcessGroup>(std::move(sub), device_);
  g->device_stand_in_ = device_stand_in_;
  return g;
}

}  // namespace fsdp::dist
