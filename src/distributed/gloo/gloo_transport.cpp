// The Gloo transport: TCP pairs between every two ranks of a group, met
// through our TCPStore (via a gloo::rendezvous::Store adapter with a key
// prefix per group). Gloo has no reduce-scatter in its options API, so a
// reduce-scatter is Gloo's all-reduce followed by keeping this rank's block:
// correct, at twice the bytes of a direct reduce-scatter (bench/ shows it).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/distributed/process_group.h"
#include "fsdp/distributed/store.h"
#include "src/distributed/transport.h"

namespace fsdp::dist {

namespace {

class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<TCPStore> store, std::string prefix)
      : store_(std::move(store)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, data);
  }
  std::vector<char> get(const std::string& key) override { return store_->get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_->timeout()); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (auto& k : keys) full.push_back(prefix_ + k);
    FSDP_CHECK(store_->wait(full, timeout),
               "[gloo] peers did not publish their addresses within {} s (keys {}...)",
               double(timeout.count()) / 1000.0, full.empty() ? "" : full[0]);
  }

 private:
  std::shared_ptr<TCPStore> store_;
  std::string prefix_;
};

template <class F>
void dispatch_sum(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      f(float{});
      return;
    case DType::f64:
      f(double{});
      return;
    case DType::i32:
      f(int32_t{});
      return;
    case DType::i64:
      f(int64_t{});
      return;
    default:
      FSDP_FAIL("[gloo] no reduction for {}", dtype_name(t));
  }
}

class GlooTransport final : public Transport {
 public:
  GlooTransport(std::shared_ptr<TCPStore> store, std::shared_ptr<gloo::transport::Device> dev,
              std::string prefix, int rank, int size)
      : store_(std::move(store)), dev_(std::move(dev)), prefix_(std::move(prefix)) {
    ctx_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx_->setTimeout(collective_timeout());
    StoreAdapter adapter(store_, prefix_ + "/");
    ctx_->connectFullMesh(adapter, dev_);
  }
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::string name() const override { return "gloo"; }

  void all_gather(const void* in, void* out, size_t bytes) override {
    if (bytes == 0) return;
    if (size() == 1) {
      std::memmove(out, in, bytes);
      return;
    }
    gloo::AllgatherOptions opts(ctx_);
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
    opts.setOutput(static_cast<uint8_t*>(out), bytes * size_t(size()));
    opts.setTag(tag_++);
    gloo::allgather(opts);
  }
  void all_reduce_sum(void* buf, size_t count, DType dtype) override {
    if (count == 0 || size() == 1) return;
    dispatch_sum(dtype, [&](auto tv) {
      using T = decltype(tv);
      gloo::AllreduceOptions opts(ctx_);
      opts.setOutput(static_cast<T*>(buf), count);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
      opts.setTag(tag_++);
      gloo::allreduce(opts);
    });
  }
  void reduce_scatter_sum(const void* in, void* out, size_t count, DType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    if (size() == 1) {  // the sum of one: a copy, with no staging (an expert group of one rank)
      if (bytes) std::memmove(out, in, bytes);
      return;
    }
    std::vector<char> tmp(static_cast<const char*>(in),
                          static_cast<const char*>(in) + bytes * size_t(size()));
    all_reduce_sum(tmp.data(), count * size_t(size()), dtype);
    std::memcpy(out, tmp.data() + bytes * size_t(rank()), bytes);
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    if (bytes == 0 || size() == 1) return;
    gloo::BroadcastOptions opts(ctx_);
    opts.setOutput(static_cast<uint8_t*>(buf), bytes);
    opts.setRoot(root);
    opts.setTag(tag_++);
    gloo::broadcast(opts);
  }
  void all_to_all(const void* in, void* out, size_t bytes) override {
    if (bytes == 0) return;
    if (size() == 1) {
      std::memmove(out, in, bytes);
      return;
    }
    gloo::AlltoallOptions opts(ctx_);
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes * size_t(size()));
    opts.setOutput(static_cast<uint8_t*>(out), bytes * size_t(size()));
    opts.setTag(tag_++);
    gloo::alltoall(opts);
  }
  void all_to_all_v(const void* in, const std::vector<int64_t>& in_counts, void* out,
                    const std::vector<int64_t>& out_counts, size_t unit_bytes) override {
    int64_t in_total = 0, out_total = 0;
    for (size_t j = 0; j < in_counts.size(); ++j) {
      in_total += in_counts[j];
      out_total += out_counts[j];
    }
    if (size() == 1) {
      if (in_total) std::memmove(out, in, size_t(in_total) * unit_bytes);
      return;
    }
    // Gloo counts in bytes here; a rank with nothing to send or receive (an empty tensor has no
    // data pointer) still takes part, through a placeholder byte that no count reaches.
    std::vector<int64_t> in_bytes, out_bytes;
    for (size_t j = 0; j < in_counts.size(); ++j) {
      in_bytes.push_back(in_counts[j] * int64_t(unit_bytes));
      out_bytes.push_back(out_counts[j] * int64_t(unit_bytes));
    }
    uint8_t placeholder[2] = {};
    gloo::AlltoallvOptions opts(ctx_);
    opts.setInput(in_total ? const_cast<uint8_t*>(static_cast<const uint8_t*>(in)) : placeholder,
                  std::move(in_bytes));
    opts.setOutput(out_total ? static_cast<uint8_t*>(out) : placeholder + 1, std::move(out_bytes));
    opts.setTag(tag_++);
    gloo::alltoallv(opts);
  }
  void barrier() override {
    if (size() == 1) return;
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(tag_++);
    gloo::barrier(opts);
  }
  std::unique_ptr<Transport> split(int color, int, const std::vector<int>& members, int index,
                                 int seq) override {
    if (color < 0) return nullptr;
    return std::make_unique<GlooTransport>(store_, dev_,
                                         fmt::format("{}/split{}/color{}", prefix_, seq, color),
                                         index, int(members.size()));
  }

 private:
  std::shared_ptr<TCPStore> store_;
  std::shared_ptr<gloo::transport::Device> dev_;
  std::string prefix_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  uint32_t tag_ = 0;
};

}  // namespace

std::unique_ptr<Transport> make_gloo_transport(std::shared_ptr<TCPStore> store, int rank, int size,
                                           const std::string& hostname) {
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  std::shared_ptr<gloo::transport::Device> dev;
  try {
    dev = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    FSDP_FAIL(
        "[gloo] cannot open a TCP device on '{}': {} (set FSDP_GLOO_HOSTNAME to an address of this "
        "host)",
        hostname, e.what());
  }
  try {
    return std::make_unique<GlooTransport>(std::move(store), std::move(dev), "gloo/world", rank,
                                         size);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    FSDP_FAIL("[gloo] connecting rank {} of {} failed: {}", rank, size, e.what());
  }
}

}  // namespace fsdp::dist
