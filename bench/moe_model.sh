# The bench-sized mixture of experts that bench/moe_fsdp2.sh and bench/moe_ep.sh train, sourced by
# both so that they train the same model: transformers' own random Qwen3MoeForCausalLM (seeded,
# written by bench/moe_fsdp2_ref.py --make with save_pretrained) and one llm.c shard of random
# tokens below its vocabulary. Full size: vocab 8192, dim 512, 4 layers (layer 0 dense, ffn 1536;
# layers 1-3 MoE: 16 experts of hidden 512, top 2, norm_topk_prob), 8 heads / 4 KV heads of dim
# 64, QK-norm, untied, aux coef 0.02 (EXPERTS and MOE_HIDDEN change the experts); tiny: vocab 256,
# dim 64, 3 layers, 8 experts of hidden 32. The caller sets py (the reference stack's python).
#   moe_model_args full|tiny     sets model_args and vocab
#   moe_model_check NAME         exits unless $py imports torch (with gloo) and Qwen3-MoE
#   moe_model_make DIR SEQ LOG   writes DIR (config.json, model.safetensors); its line in LOG
#   moe_model_tokens FILE COUNT  writes COUNT random token ids below $vocab to FILE
# shellcheck shell=bash disable=SC2154 # py is the caller's

moe_model_args() {
  if [ "$1" = tiny ]; then
    model_args=(--vocab 256 --dim 64 --inter 96 --layers 3 --heads 4 --kv-heads 2 --head-dim 16
      --experts 8 --top-k 2 --moe-inter 32 --dense-layers 0 --aux-coef 0.02)
  else
    model_args=(--vocab 8192 --dim 512 --inter 1536 --layers 4 --heads 8 --kv-heads 4 --head-dim 64
      --experts "${EXPERTS:-16}" --top-k 2 --moe-inter "${MOE_HIDDEN:-512}" --dense-layers 0 --aux-coef 0.02)
  fi
  vocab=${model_args[1]}
}

moe_model_check() {
  "$py" -c "from transformers import Qwen3MoeForCausalLM; import torch.distributed as d; assert d.is_gloo_available()" 2> /dev/null \
    || { echo "$1: $py cannot import torch (with gloo) and transformers' Qwen3MoeForCausalLM; run bench/setup_torch_ref.sh" >&2; exit 1; }
}

moe_model_make() {
  "$py" bench/moe_fsdp2_ref.py --make "$1" "${model_args[@]}" --max-seq "$2" > "$3" 2>&1 \
    || { cat "$3"; exit 1; }
}

moe_model_tokens() {
  "$py" bench/moe_fsdp2_ref.py --tokens "$1" --vocab "$vocab" --count "$2" > /dev/null
}
