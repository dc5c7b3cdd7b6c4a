// Builds a two-layer MiniLLM through the installed headers, takes one AdamW
// step and checks that the loss moved.
#include <fsdp/nn/minillm.h>
#include <fsdp/ops/ops.h>
#include <fsdp/optim/adamw.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

int main() {
  using namespace fsdp;
  nn::MiniLLMConfig c = nn::MiniLLMConfig::preset("tiny");
  c.arch = nn::Arch::llama;
  c.vocab = 64, c.dim = 32, c.layers = 2, c.heads = 2, c.seq = 16, c.batch = 2;
  nn::MiniLLM model(c);
  auto flat = nn::materialize(model, DType::f32, 1);
  optim::AdamW opt({{flat.params, flat.grads, 0.0}}, {.lr = 1e-2});
  std::vector<int32_t> ids(size_t(c.batch * c.seq));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i % 7);
  Tensor tokens = Tensor::from_vector(ids, {c.batch, c.seq});
  Tensor targets = Tensor::from_vector(ids, {c.batch * c.seq});
  double first = 0, last = 0;
  for (int step = 0; step < 3; ++step) {
    flat.grads.zero_();
    Tensor logits = model.forward(tokens).view({c.batch * c.seq, c.vocab});
    auto x = ops::cross_entropy_forward(logits, targets);
    model.backward(
        ops::cross_entropy_backward(logits, targets, x.lse).view({c.batch, c.seq, c.vocab}));
    opt.step();
    (step == 0 ? first : last) = x.loss;
  }
  fmt::print("consumer: loss {:.4f} -> {:.4f}\n", first, last);
  return last < first ? 0 : 1;
}
