// NCCL process groups. Each group owns a high-priority, non-blocking CUDA
// stream. A collective first makes that stream wait for the work already
// queued on the caller's stream (an event, never a device-wide sync), runs
// on it, and records a completion event; Work::wait() makes the caller's
// stream wait for that event, so the host never blocks. Each local rank uses
// the GPU of its local rank.
#include "src/distributed/nccl/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "src/distributed/split_sizes.h"
#include "src/distributed/transport.h"

#define NCCL_CHECK(expr)                                                                     \
  do {                                                                                       \
    ncclResult_t r_ = (expr);                                                                \
    if (r_ != ncclSuccess) FSDP_FAIL("[nccl] {} failed: {}", #expr, ncclGetErrorString(r_)); \
  } while (0)
#define CUDA_RT_CHECK(expr)                                                                  \
  do {                                                                                       \
    cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) FSDP_FAIL("[nccl] {} failed: {}", #expr, cudaGetErrorString(e_)); \
  } while (0)

namespace fsdp::dist {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
  }
  return ncclFloat32;
}

class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t done, int device, std::vector<Tensor> keep)
      : done_(done), device_(device), keep_(std::move(keep)) {}
  ~NcclWork() override {
    // Dropped without wait(): the tensors may go back to the compute stream's
    // pool, so the collective must be done with them first.
    if (!waited_) cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
  }
  void wait() override {
    CUDA_RT_CHECK(cudaSetDevice(device_));
    CUDA_RT_CHECK(cudaStreamWaitEvent(cudaStream_t(cuda_compute_stream(device_)), done_,
                                      0));  // the compute stream
    waited_ = true;
  }
  bool is_completed() const override { return cudaEventQuery(done_) == cudaSuccess; }

 private:
  cudaEvent_t done_;
  int device_;
  bool waited_ = false;
  std::vector<Tensor>
      keep_;  // inputs and outputs stay alive while the collective may still read them
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(ncclComm_t comm, int device) : comm_(comm), device_(device) {
    NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    NCCL_CHECK(ncclCommCount(comm_, &size_));
    CUDA_RT_CHECK(cudaSetDevice(device_));
    int least = 0, greatest = 0;
    CUDA_RT_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_RT_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  }
  ~NcclProcessGroup() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

  std::shared_ptr<Work> all_gather_into_tensor(const Tensor& out, const Tensor& in) override {
    check("all_gather_into_tensor", {out, in});
    FSDP_CHECK(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(),
               "[all_gather_into_tensor] output {} x {} does not hold {} ranks x {} of {}",
               dtype_name(out.dtype()), out.numel(), size_, in.numel(), dtype_name(in.dtype()));
    return launch({out, in}, [&] {
      NCCL_CHECK(ncclAllGather(in.raw_data(), out.raw_data(), size_t(in.numel()),
                               nccl_type(in.dtype()), comm_, stream_));
    });
  }
  std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& out, const Tensor& in,
                                              ReduceOp op) override {
    check("reduce_scatter_tensor", {out, in});
    FSDP_CHECK(in.numel() == out.numel() * size_ && out.dtype() == in.dtype(),
               "[reduce_scatter_tensor] input {} x {} does not hold {} ranks x {} of {}",
               dtype_name(in.dtype()), in.numel(), size_, out.numel(), dtype_name(out.dtype()));
    return launch({out, in}, [&] {
      NCCL_CHECK(ncclReduceScatter(in.raw_data(), out.raw_data(), size_t(out.numel()),
                                   nccl_type(in.dtype()), op == ReduceOp::SUM ? ncclSum : ncclAvg,
                                   comm_, stream_));
    });
  }
  std::shared_ptr<Work> all_reduce(const Tensor& t, ReduceOp op) override {
    check("all_reduce", {t});
    return launch({t}, [&] {
      NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()),
                               op == ReduceOp::SUM ? ncclSum : ncclAvg, comm_, stream_));
    });
  }
  std::shared_ptr<Work> broadcast(const Tensor& t, int root) override {
    check("broadcast", {t});
    FSDP_CHECK(root >= 0 && root < size_, "[broadcast] root {} is not a rank of this group of {}",
               root, size_);
    return launch({t}, [&] {
      NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()),
                               root, comm_, stream_));
    });
  }
  std::shared_ptr<Work> all_to_all_single(const Tensor& out, const Tensor& in) override {
    check("all_to_all_single", {out, in});
    FSDP_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0 && in.dtype() == out.dtype(),
               "[all_to_all_single] input {} and output {} must match and split into {} blocks",
               in.numel(), out.numel(), size_);
    return launch({out, in}, [&] {
      const size_t count = size_t(in.numel() / size_), bytes = count * dtype_size(in.dtype());
      NCCL_CHECK(ncclGroupStart());
      for (int peer = 0; peer < size_; ++peer) {
        NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw_data()) + bytes * size_t(peer), count,
                            nccl_type(in.dtype()), peer, comm_, stream_));
        NCCL_CHECK(ncclRecv(static_cast<char*>(out.raw_data()) + bytes * size_t(peer), count,
                            nccl_type(in.dtype()), peer, comm_, stream_));
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }
  // One grouped send and receive per peer with anything to move (NCCL has no alltoallv; this is
  // what PyTorch's ProcessGroupNCCL does). Compiled and linked on CPU-only machines, not yet run.
  std::shared_ptr<Work> all_to_all_v(const Tensor& out, const std::vector<int64_t>& out_splits,
                                     const Tensor& in,
                                     const std::vector<int64_t>& in_splits) override {
    const SplitLayout l = check_split_sizes("all_to_all_v", size_, out, out_splits, in, in_splits);
    check("all_to_all_v", {out, in});
    return launch({out, in}, [&] {
      const size_t elem = dtype_size(in.dtype());
      size_t in_off = 0, out_off = 0;
      NCCL_CHECK(ncclGroupStart());
      for (int peer = 0; peer < size_; ++peer) {
        const size_t sc = size_t(l.in_counts[size_t(peer)]),
                     rc = size_t(l.out_counts[size_t(peer)]);
        if (sc)
          NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw_data()) + in_off * elem, sc,
                              nccl_type(in.dtype()), peer, comm_, stream_));
        if (rc)
          NCCL_CHECK(ncclRecv(static_cast<char*>(out.raw_data()) + out_off * elem, rc,
                              nccl_type(in.dtype()), peer, comm_, stream_));
        in_off += sc;
        out_off += rc;
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }
  std::shared_ptr<Work> barrier() override {
    Tensor one = Tensor::zeros({1}, DType::f32, Device::cuda(device_));
    return all_reduce(one, ReduceOp::SUM);
  }
  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    ncclComm_t sub = nullptr;
    NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr));
    if (color < 0 || !sub) return nullptr;
    return std::make_shared<NcclProcessGroup>(sub, device_);
  }

 private:
  void check(const char* op, std::initializer_list<Tensor> ts) {
    for (const Tensor& t : ts) {
      FSDP_CHECK(t.defined() && t.device() == Device::cuda(device_),
                 "[{}] a tensor is on {} but this NCCL group runs on cuda:{}", op,
                 t.defined() ? t.device().str() : "nothing", device_);
      FSDP_CHECK(t.is_contiguous(), "[{}] NCCL needs contiguous tensors", op);
    }
  }
  template <class F>
  std::shared_ptr<Work> launch(std::vector<Tensor> keep, F&& f) {
    CUDA_RT_CHECK(cudaSetDevice(device_));
    cudaEvent_t ready, done;
    CUDA_RT_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDA_RT_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_RT_CHECK(
        cudaEventRecord(ready, cudaStream_t(cuda_compute_stream(device_))));  // queued so far
    CUDA_RT_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);
    f();
    CUDA_RT_CHECK(cudaEventRecord(done, stream_));
    return std::make_shared<NcclWork>(done, device_, std::move(keep));
  }

  ncclComm_t comm_;
  int device_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_world(const WorldInfo& info, ProcessGroup& host) {
  const int device = info.device.index;
  CUDA_RT_CHECK(cudaSetDevice(device));
  // NCCL allows one rank per GPU; two ranks on one GPU would fail or hang inside
  // ncclCommInitRank. Every rank shares (host, GPU UUID) over the host engine first, and all
  // refuse together, naming the ranks.
  if (info.size > 1) {
    cudaDeviceProp prop{};
    CUDA_RT_CHECK(cudaGetDeviceProperties(&prop, device));
    char host_name[256] = {};
    gethostname(host_name, sizeof(host_name) - 1);
    uint64_t id = std::hash<std::string>{}(std::string(host_name) + "/" +
                                           std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes)));
    Tensor mine = Tensor::full({1}, 0.0, DType::i64), all = Tensor::empty({info.size}, DType::i64);
    mine.data<int64_t>()[0] = int64_t(id & 0x7fffffffffffffffull);
    host.all_gather_into_tensor(all, mine)->wait();
    for (int r = 0; r < info.size; ++r)
      if (r != info.rank && all.data<int64_t>()[r] == mine.data<int64_t>()[0])
        FSDP_FAIL(
            "[nccl] ranks {} and {} are both on cuda:{} of {} ({}): NCCL allows one rank per GPU. "
            "Start at most as many ranks per node as it has GPUs, or share a GPU with "
            "--backend gloo or --backend mpi",
            std::min(r, info.rank), std::max(r, info.rank), device, host_name, prop.name);
  }
  ncclUniqueId id;
  if (info.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  if (info.size > 1) {
    Tensor bytes = Tensor::empty({int64_t((sizeof(id.internal) + 7) / 8)}, DType::i64);
    std::memcpy(bytes.raw_data(), id.internal, sizeof(id.internal));
    host.broadcast(bytes, 0)->wait();
    std::memcpy(id.internal, bytes.raw_data(), sizeof(id.internal));
  }
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, info.size, id, info.rank));
  return std::make_shared<NcclProcessGroup>(comm, device);
}

}  // namespace fsdp::dist
