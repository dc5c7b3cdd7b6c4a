// cuDNN's attention in a CUDA build without cuDNN (FSDP_CUDNN=OFF, or cuDNN or
// cudnn-frontend not found): every shape is refused, so ops falls back to our
// kernel in attention.cu.
#include <cstdint>
#include <string>

#include "fsdp/core/error.h"
#include "kernels/cuda/cuda_kernels.h"

namespace fsdp::kernels::cuda {

namespace {
constexpr const char* kWhy =
    "fsdp.cpp was built without cuDNN (FSDP_CUDNN=OFF, or cudnn.h, libcudnn or cudnn_frontend.h "
    "not found at configure time)";
}

int64_t cudnn_loaded_version() { return 0; }
int64_t cudnn_built_version() { return 0; }
std::string cudnn_versions() { return "no cuDNN in this build"; }

int64_t cudnn_attention_workspace(bool, DType, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                                  int64_t, int) {
  return -1;
}
std::string cudnn_attention_refusal(bool, DType, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                                    int64_t, int) {
  return kWhy;
}
void cudnn_attention_forward(const void*, void*, float*, DType, int64_t, int64_t, int64_t, int64_t,
                             int64_t, bool, int64_t, void*, int, Stream) {
  FSDP_FAIL("[attention] cuDNN: {}", kWhy);
}
void cudnn_attention_backward(const void*, const void*, const void*, const float*, void*, DType,
                              int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, void*,
                              int, Stream) {
  FSDP_FAIL("[attention_backward] cuDNN: {}", kWhy);
}

}  // namespace fsdp::kernels::cuda
