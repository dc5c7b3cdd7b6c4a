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
#   moe_bench_setup NAME SEQ COUNT   what both benches do before their runs: the checks (the
#       reference stack, GNU time), fsdp-train built (unless FSDP_BIN or FSDP_BENCH_NO_BUILD is
#       set: the build is done), one thread per rank, and log (a temporary folder, removed at exit)
#       holding the model (log/model, its line in log/make.txt) and COUNT tokens (log/data.bin);
#       sets bin, log, load0 (the load average now) and maxrss (the prefix that runs a rank under
#       GNU time, which prints its ru_maxrss with the rank the launcher gave it)
# shellcheck shell=bash disable=SC2154,SC2034 # py is the caller's, and so are what the functions set

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

moe_bench_setup() {
  moe_model_check "$1"
  [ -x /usr/bin/time ] || { echo "$1: needs GNU time (apt-get install time)" >&2; exit 1; }
  bin=${FSDP_BIN:-${FSDP_BUILD_DIR:-build}/examples}
  [ -n "${FSDP_BIN:-}${FSDP_BENCH_NO_BUILD:-}" ] || scripts/build.sh fsdp-train > /dev/null
  log=$(mktemp -d)
  trap 'rm -rf "$log"' EXIT
  export OMP_NUM_THREADS=1 FSDP_CACHE_DIR=${FSDP_CACHE_DIR:-$log/cache}
  moe_model_make "$log/model" "$2" "$log/make.txt"
  moe_model_tokens "$log/data.bin" "$3"
  load0=$(cut -d" " -f1-3 /proc/loadavg)
  # shellcheck disable=SC2016 # $RANK and $@ are the rank's shell's
  maxrss=(sh -c 'exec /usr/bin/time -f "rank $RANK maxrss_kb %M" "$@"' sh)
}
