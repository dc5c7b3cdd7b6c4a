// Attention through cuDNN's fused SDPA (flash attention), built with
// cudnn-frontend's graph API: `sdpa` with stats for training and
// `sdpa_backward`, causal or not, bf16 or f16 with f32 softmax; a causal sliding window (query t
// keeps keys t - window + 1 .. t, as our kernel) is cuDNN's diagonal band, its left bound the
// window. Our packed
// layouts need no copies: q, k and v are strided views of qkv
// [B, T, H + 2 KV, hd] (q dims [B, H, T, hd], k and v [B, KV, T, hd], strides
// [T*W, hd, W, 1] with W = (H + 2 KV) hd; cuDNN takes grouped-query attention,
// H a multiple of KV, directly), and so are dq, dk and dv in dqkv; out and dout
// are [B, T, H, hd]. cuDNN's stats are the
// natural-log log-sum-exp of the scaled scores per (b, h, t), exactly the lse
// of our own kernel, so either backward can follow either forward.
//
// A graph is built once per (direction, shape, dtype, mask, device) and
// cached, like the GEMM plans; a shape cuDNN refuses is cached as refused and
// the caller falls back to attention.cu. The workspace comes from the caller
// (the caching allocator), so peak memory counts it.
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fsdp/core/env.h"
#include "fsdp/core/error.h"
#include "kernels/cuda/cuda_kernels.h"

#define CUDNN_CHECK(expr)                                                  \
  do {                                                                     \
    cudnnStatus_t st_ = (expr);                                            \
    if (st_ != CUDNN_STATUS_SUCCESS)                                       \
      FSDP_FAIL("[cudnn] {} failed: {}", #expr, cudnnGetErrorString(st_)); \
  } while (0)

namespace fsdp::kernels::cuda {

namespace fe = cudnn_frontend;

namespace {

// Tensor uids of the variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Key {
  bool backward;
  int64_t B, T, H, KV, hd;
  DType t;
  bool causal;
  int64_t window;  // > 0 (with causal): the diagonal band's left bound
  int device;
  bool operator<(const Key& o) const {
    return std::tie(backward, B, T, H, KV, hd, t, causal, window, device) <
           std::tie(o.backward, o.B, o.T, o.H, o.KV, o.hd, o.t, o.causal, o.window, o.device);
  }
};

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused this shape
  int64_t workspace = 0;
  std::string why;  // the refusal
};

std::mutex mu;

cudnnHandle_t handle(int device) {
  static std::mutex handles_mu;
  // Leaked on purpose, like the cuBLASLt handles: no exit-time destructor may touch cuDNN.
  static auto* all = new std::map<int, cudnnHandle_t>;
  std::lock_guard<std::mutex> lock(handles_mu);
  cudnnHandle_t& h = (*all)[device];
  if (!h) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    CUDNN_CHECK(cudnnCreate(&h));
    cudaSetDevice(prev);
  }
  return h;
}

fe::DataType_t fe_type(DType t) {
  return t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// Dims and strides of q (heads H) or k / v (heads KV) in the packed [B, T, H + 2 KV, hd] buffer,
// as [B, heads, T, hd].
std::vector<int64_t> packed_dims(const Key& k, bool is_q) {
  return {k.B, is_q ? k.H : k.KV, k.T, k.hd};
}
std::vector<int64_t> packed_strides(const Key& k) {
  const int64_t w = (k.H + 2 * k.KV) * k.hd;
  return {k.T * w, k.hd, w, 1};
}
std::shared_ptr<fe::graph::Tensor_attributes> packed(fe::graph::Graph& g, const Key& k,
                                                     const char* name, int64_t uid, bool is_q) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(packed_dims(k, is_q))
                      .set_stride(packed_strides(k)));
}

// [B, T, H, hd] as [B, H, T, hd].
std::vector<int64_t> bthd_strides(const Key& k) { return {k.T * k.H * k.hd, k.hd, k.H * k.hd, 1}; }

Plan build(const Key& k) {
  Plan p;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_type(k.t))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const float scale = 1.f / std::sqrt(float(k.hd));
  auto q = packed(*g, k, "q", kQ, true), kk = packed(*g, k, "k", kK, false),
       v = packed(*g, k, "v", kV, false);
  if (!k.backward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("sdpa")
                     .set_generate_stats(true)
                     .set_attn_scale(scale)
                     .set_causal_mask(k.causal);
    if (k.window > 0) attrs.set_diagonal_band_left_bound(int(k.window));
    auto [o, stats] = g->sdpa(q, kk, v, attrs);
    o->set_output(true).set_uid(kO).set_dim({k.B, k.H, k.T, k.hd}).set_stride(bthd_strides(k));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({k.B, k.H, k.T, 1})
        .set_stride({k.H * k.T, k.T, 1, 1});
  } else {
    auto o = g->tensor(fe::graph::Tensor_attributes()
                           .set_name("o")
                           .set_uid(kO)
                           .set_dim({k.B, k.H, k.T, k.hd})
                           .set_stride(bthd_strides(k)));
    auto dO = g->tensor(fe::graph::Tensor_attributes()
                            .set_name("dO")
                            .set_uid(kDO)
                            .set_dim({k.B, k.H, k.T, k.hd})
                            .set_stride(bthd_strides(k)));
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_data_type(fe::DataType_t::FLOAT)
                               .set_dim({k.B, k.H, k.T, 1})
                               .set_stride({k.H * k.T, k.T, 1, 1}));
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(scale)
                     .set_causal_mask(k.causal);
    if (k.window > 0) attrs.set_diagonal_band_left_bound(int(k.window));
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dO, stats, attrs);
    const std::vector<int64_t> strides = packed_strides(k);
    dq->set_output(true).set_uid(kDQ).set_dim(packed_dims(k, true)).set_stride(strides);
    dk->set_output(true).set_uid(kDK).set_dim(packed_dims(k, false)).set_stride(strides);
    dv->set_output(true).set_uid(kDV).set_dim(packed_dims(k, false)).set_stride(strides);
  }
  cudnnHandle_t h = handle(k.device);
  auto step = [&](fe::error_t e, const char* what) {
    if (e.is_good()) return true;
    p.why = std::string(what) + ": " + e.get_message();
    return false;
  };
  if (step(g->validate(), "validate") && step(g->build_operation_graph(h), "operation graph") &&
      step(g->create_execution_plans({fe::HeurMode_t::A}), "execution plans") &&
      step(g->check_support(), "support") && step(g->build_plans(), "build plans") &&
      step(g->get_workspace_size(p.workspace), "workspace size"))
    p.graph = g;
  return p;
}

// The cache is leaked on purpose. Its graphs own cuDNN execution-plan descriptors, and a static
// map would be destroyed at exit after cuDNN has unloaded the sub-libraries it loads lazily on
// first use: the destructor then segfaults after correct output (PyTorch leaks its cuDNN
// benchmark cache for the same reason, cuDNN 9.10 and later).
const Plan& plan(const Key& k) {
  static auto* cache = new std::map<Key, Plan>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(k);
  if (it == cache->end()) {
    Plan p;
    try {
      p = build(k);
    } catch (const std::exception& e) {  // some frontend paths throw instead of returning errors
      p = Plan{nullptr, 0, std::string("cudnn-frontend threw: ") + e.what()};
    }
    it = cache->emplace(k, std::move(p)).first;
  }
  return it->second;
}

void run(const Plan& p, int device, std::unordered_map<int64_t, void*>& pack, void* workspace,
         Stream s) {
  cudnnHandle_t h = handle(device);
  CUDNN_CHECK(cudnnSetStream(h, cudaStream_t(s)));
  auto e = p.graph->execute(h, pack, workspace);
  FSDP_CHECK(e.is_good(), "[cudnn] SDPA execute failed: {}", e.get_message());
}

}  // namespace

int64_t cudnn_loaded_version() { return int64_t(cudnnGetVersion()); }
int64_t cudnn_built_version() { return int64_t(CUDNN_VERSION); }

std::string cudnn_versions() {
  const auto words = [](int64_t v) {
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
           std::to_string(v % 100);
  };
  return "cuDNN " + words(cudnn_loaded_version()) + " loaded, built against " +
         words(cudnn_built_version());
}

bool cudnn_attention_enabled() {
  static const bool on = env_double("FSDP_CUDNN_ATTENTION") != 0;
  return on;
}

int64_t cudnn_attention_workspace(bool backward, DType t, int64_t B, int64_t T, int64_t H,
                                  int64_t KV, int64_t hd, bool causal, int64_t window, int device) {
  if (!cudnn_attention_enabled() || (t != DType::bf16 && t != DType::f16) || B * T * H == 0 ||
      window > std::numeric_limits<int>::max())
    return -1;
  const Plan& p = plan({backward, B, T, H, KV, hd, t, causal, window, device});
  return p.graph ? p.workspace : -1;
}

std::string cudnn_attention_refusal(bool backward, DType t, int64_t B, int64_t T, int64_t H,
                                    int64_t KV, int64_t hd, bool causal, int64_t window,
                                    int device) {
  if (!cudnn_attention_enabled()) return "FSDP_CUDNN_ATTENTION=0";
  if (t != DType::bf16 && t != DType::f16) return "cuDNN SDPA takes bf16 or f16";
  if (window > std::numeric_limits<int>::max()) return "a window past cuDNN's int bound";
  return plan({backward, B, T, H, KV, hd, t, causal, window, device}).why;
}

void cudnn_attention_forward(const void* qkv, void* out, float* lse, DType t, int64_t B, int64_t T,
                             int64_t H, int64_t KV, int64_t hd, bool causal, int64_t window,
                             void* workspace, int device, Stream s) {
  const Plan& p = plan({false, B, T, H, KV, hd, t, causal, window, device});
  FSDP_CHECK(p.graph, "[attention] cuDNN refused B {} T {} H {} KV {} hd {}: {}", B, T, H, KV, hd,
             p.why);
  const size_t kpos = size_t(H * hd) * dtype_size(t), vpos = size_t((H + KV) * hd) * dtype_size(t);
  char* base = static_cast<char*>(const_cast<void*>(qkv));
  std::unordered_map<int64_t, void*> pack{
      {kQ, base}, {kK, base + kpos}, {kV, base + vpos}, {kO, out}, {kStats, lse}};
  run(p, device, pack, workspace, s);
}

void cudnn_attention_backward(const void* dout, const void* qkv, const void* out, const float* lse,
                              void* dqkv, DType t, int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t hd, bool causal, int64_t window, void* workspace, int device,
                              Stream s) {
  const Plan& p = plan({true, B, T, H, KV, hd, t, causal, window, device});
  FSDP_CHECK(p.graph, "[attention_backward] cuDNN refused B {} T {} H {} KV {} hd {}: {}", B, T, H,
             KV, hd, p.why);
  const size_t kpos = size_t(H * hd) * dtype_size(t), vpos = size_t((H + KV) * hd) * dtype_size(t);
  char* base = static_cast<char*>(const_cast<void*>(qkv));
  char* dbase = static_cast<char*>(dqkv);
  std::unordered_map<int64_t, void*> pack{{kQ, base},
                                          {kK, base + kpos},
                                          {kV, base + vpos},
                                          {kO, const_cast<void*>(out)},
                                          {kDO, const_cast<void*>(dout)},
                                          {kStats, const_cast<float*>(lse)},
                                          {kDQ, dbase},
                                          {kDK, dbase + kpos},
                                          {kDV, dbase + vpos}};
  run(p, device, pack, workspace, s);
}

}  // namespace fsdp::kernels::cuda
