"""A small mixture-of-experts Hugging Face folder written by hand (random f32 weights, no torch),
for the tests that train one with fsdp-train: 4 experts, top 2, GQA. A Qwen3-MoE (the default) has
QK-norm and its second layer dense (mlp_only_layers [1]); a Mixtral (family "mixtral": the top k of
the router's logits, then softmax over them) has both layers sparse and no QK-norm. Every folder of
a family holds the same weights."""
import json
import os
import random
import struct
import sys

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")  # for fsdp-train's runs


class Checks:
    """check(cond, what) counts a check and prints what failed; finish() says the counts and exits."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL: {what}")

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)


D, HEADS, KV, HD, FF, MOE_FF, E, V, L = 32, 2, 1, 16, 64, 16, 4, 256, 2


def model_folder(work, name, router_logits, family="qwen3_moe"):
    assert family in ("qwen3_moe", "mixtral"), family
    qwen = family == "qwen3_moe"
    rng = random.Random(5)

    def tensor(*shape, scale=0.08, ones=False):
        n = 1
        for s in shape:
            n *= s
        vals = [1.0] * n if ones else [rng.gauss(0, scale) for _ in range(n)]
        return shape, struct.pack(f"<{n}f", *vals)

    tensors = {"model.embed_tokens.weight": tensor(V, D), "lm_head.weight": tensor(V, D),
               "model.norm.weight": tensor(D, ones=True)}
    for layer in range(L):
        p = f"model.layers.{layer}."
        tensors.update({p + "input_layernorm.weight": tensor(D, ones=True),
                        p + "post_attention_layernorm.weight": tensor(D, ones=True),
                        p + "self_attn.q_proj.weight": tensor(HEADS * HD, D),
                        p + "self_attn.k_proj.weight": tensor(KV * HD, D),
                        p + "self_attn.v_proj.weight": tensor(KV * HD, D),
                        p + "self_attn.o_proj.weight": tensor(D, HEADS * HD)})
        if qwen:
            tensors.update({p + "self_attn.q_norm.weight": tensor(HD, ones=True),
                            p + "self_attn.k_norm.weight": tensor(HD, ones=True)})
        if layer == 0 or not qwen:  # sparse
            moe, (gate, up, down) = ("mlp", ("gate_proj", "up_proj", "down_proj")) if qwen else \
                ("block_sparse_moe", ("w1", "w3", "w2"))
            tensors[f"{p}{moe}.gate.weight"] = tensor(E, D)
            for e in range(E):
                q = f"{p}{moe}.experts.{e}."
                tensors.update({f"{q}{gate}.weight": tensor(MOE_FF, D), f"{q}{up}.weight": tensor(MOE_FF, D),
                                f"{q}{down}.weight": tensor(D, MOE_FF)})
        else:  # mlp_only_layers
            tensors.update({p + "mlp.gate_proj.weight": tensor(FF, D), p + "mlp.up_proj.weight": tensor(FF, D),
                            p + "mlp.down_proj.weight": tensor(D, FF)})
    header, blobs, at = {}, [], 0
    for key, (shape, raw) in tensors.items():
        header[key] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header).encode()
    folder = os.path.join(work, name)
    os.makedirs(folder)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    config = {"vocab_size": V, "hidden_size": D, "num_hidden_layers": L, "num_attention_heads": HEADS,
              "num_key_value_heads": KV, "head_dim": HD, "num_experts_per_tok": 2, "max_position_embeddings": 128,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "attention_bias": False, "router_aux_loss_coef": 0.01, "output_router_logits": router_logits,
              "torch_dtype": "float32"}
    if qwen:
        config.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "intermediate_size": FF,
                       "moe_intermediate_size": MOE_FF, "num_experts": E, "norm_topk_prob": True,
                       "decoder_sparse_step": 1, "mlp_only_layers": [1]})
    else:  # intermediate_size is each expert's width
        config.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                       "intermediate_size": MOE_FF, "num_local_experts": E, "sliding_window": None})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder
