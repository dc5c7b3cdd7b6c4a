#!/usr/bin/env bash
# fsdp-train end to end: the step line's exact shape, the loss falling on
# real text, --help, and each bad input refused with a message that names the
# value and a non-zero exit.
set -uo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"

# Real text: the license texts every Debian machine has.
cat /usr/share/common-licenses/* > "$work/text.txt" 2> /dev/null
[ -s "$work/text.txt" ] || head -c 200000 /usr/share/doc/*/copyright > "$work/text.txt" 2>/dev/null

small=(--preset tiny --arch llama --vocab 256 --dim 64 --layers 2 --heads 2 --seq 64 --batch 8 --threads 2)
line_re='^step [0-9]+ \| loss [0-9]+\.[0-9]{4} \| [0-9]+ tok/s \| mfu [0-9]+\.[0-9]% \| peak mem [0-9]+\.[0-9]{2} GB \| lr [0-9]\.[0-9]e[-+][0-9]+ \| grad norm [0-9]+\.[0-9]{3} \| elapsed [0-9hms]+ \| eta [0-9hms]+$'

# 1. Trains on text: 30 well-formed step lines and a clearly falling loss.
if "$bin" "${small[@]}" --steps 30 --lr 3e-3 --data "$work/text.txt" --sample-tokens 20 > "$work/train.out" 2> "$work/train.err"; then
  n=$(grep -cE "$line_re" "$work/train.out")
  [ "$n" -eq 30 ] && ok || bad "expected 30 step lines in the exact shape, got $n"
  first=$(grep -E '^step 0 ' "$work/train.out" | sed -E 's/.*loss ([0-9.]+).*/\1/')
  last5=$(grep -E "$line_re" "$work/train.out" | tail -5 | sed -E 's/.*loss ([0-9.]+).*/\1/' | awk '{s+=$1} END {print s/NR}')
  awk -v f="$first" -v l="$last5" 'BEGIN {exit !(l < f - 1.0)}' && ok || bad "loss did not fall: first $first, last-5 mean $last5"
  grep -q '^sample: ' "$work/train.out" && ok || bad "no sample printed"
  grep -q 'parameters' "$work/train.out" && ok || bad "no configuration table"
else
  bad "training on text failed: $(cat "$work/train.err")"
fi

# 2. Random tokens (the reference script's data) and the seed architecture.
"$bin" --preset tiny --dim 64 --layers 1 --heads 4 --seq 32 --batch 2 --steps 2 --threads 2 > "$work/rand.out" 2>&1 \
  && [ "$(grep -cE "$line_re" "$work/rand.out")" -eq 2 ] && ok || bad "random-token run: $(cat "$work/rand.out")"
# The run's table names the attention that runs (on CUDA: cuDNN SDPA, or our kernel and cuDNN's refusal).
grep -qE '^\| attention +\| our kernel \(CPU\)' "$work/rand.out" && ok \
  || bad "the run's table does not name the attention path: $(grep -E '^\| (attention|threads) ' "$work/rand.out")"

# 2b. --profile-steps writes a Chrome trace that parses and a key-averages table.
if "$bin" --preset tiny --dim 64 --layers 1 --heads 4 --seq 32 --batch 2 --steps 3 --threads 2 --profile-steps 1:2 \
  --profile-dir "$work/prof" > "$work/prof.out" 2>&1; then
  python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['traceEvents']; assert any(x.get('name')=='linear' for x in e)" \
    "$work/prof/trace_rank0.json" && ok || bad "the trace does not parse or has no linear op"
  grep -q "Self CPU time total" "$work/prof/table_rank0.txt" && grep -q "^overlap |" "$work/prof/table_rank0.txt" \
    && ok || bad "no key-averages table"
else
  bad "profiling run failed: $(tail -3 "$work/prof.out")"
fi

# 2c. --log-every N: the step lines of steps 0, N, 2N, ... and of the last; 0: none.
"$bin" --preset tiny --dim 64 --layers 1 --heads 4 --seq 32 --batch 2 --steps 6 --threads 2 --log-every 4 \
  > "$work/every.out" 2>&1 && [ "$(grep -E "$line_re" "$work/every.out" | cut -d' ' -f2 | xargs)" = "0 4 5" ] \
  && ok || bad "--log-every 4 over 6 steps should print steps 0 4 5: $(grep '^step' "$work/every.out")"

# 2d. The BLAS library and its kernels (ops/blas.h). The table names the library the build chose
# (cmake/blas.cmake) and its kernels. With Debian's OpenBLAS: on a CPU newer than the library
# OpenBLAS runs generic kernels (Prescott); FSDP_BLAS_REEXEC=2 with OPENBLAS_CORETYPE=Prescott
# stands in for that CPU. fsdp-train re-executes itself with the best kernels this CPU runs
# (SkylakeX with AVX-512, Haswell with AVX2 and FMA, read here from /proc/cpuinfo), says so in its
# table, and trains as a run started with them does; FSDP_BLAS_REEXEC=0 keeps OpenBLAS's choice.
# The other libraries know this CPU: nothing re-executes, even with FSDP_BLAS_REEXEC=2.
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $cpu_flags == *" $f "* ]] || return 1; done; }
if has avx512f avx512bw avx512vl avx512dq avx512cd; then best=SkylakeX
elif has avx2 fma; then best=Haswell
else best=Prescott; fi
blas_run() {  # blas_run NAME ENV...: the table's blas rows in NAME.row/.lib, the losses in NAME.jsonl
  local name=$1
  shift
  env "$@" "$bin" "${small[@]}" --steps 2 --log-file "$work/$name.jsonl" > "$work/$name.out" 2>&1 \
    || bad "blas run $name ($*): $(tail -2 "$work/$name.out")"
  sed -nE 's/^\| blas kernels +\| (.*[^ ]) +\|$/\1/p' "$work/$name.out" > "$work/$name.row"
  sed -nE 's/^\| blas library +\| (.*[^ ]) +\|$/\1/p' "$work/$name.out" > "$work/$name.lib"
}
losses() { python3 -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1])]' "$1"; }
blas_run plain FSDP_BLAS_REEXEC=2
grep -qE '^(mkl|openblas|scipy-openblas|blis) [0-9]' "$work/plain.lib" && [ -s "$work/plain.row" ] && ok \
  || bad "the table's blas rows: library '$(cat "$work/plain.lib")', kernels '$(cat "$work/plain.row")'"
if grep -q '^openblas ' "$work/plain.lib"; then
  blas_run generic OPENBLAS_CORETYPE=Prescott FSDP_BLAS_REEXEC=2
  blas_run direct OPENBLAS_CORETYPE=$best
  blas_run kept OPENBLAS_CORETYPE=Prescott FSDP_BLAS_REEXEC=0
  if [ $best = Prescott ]; then want="Prescott (OPENBLAS_CORETYPE)"; else want="$best (OpenBLAS chose Prescott)"; fi
  [ "$(cat "$work/generic.row")" = "$want" ] && ok || bad "blas kernels: '$(cat "$work/generic.row")', expected '$want'"
  [ "$(cat "$work/kept.row")" = "Prescott (OPENBLAS_CORETYPE)" ] && ok \
    || bad "FSDP_BLAS_REEXEC=0 did not keep Prescott: '$(cat "$work/kept.row")'"
  [ -n "$(losses "$work/generic.jsonl")" ] && [ "$(losses "$work/generic.jsonl")" = "$(losses "$work/direct.jsonl")" ] && ok \
    || bad "the re-executed run's losses differ from a run started with $best's kernels"
else
  ! grep -q "chose" "$work/plain.row" && [ -n "$(losses "$work/plain.jsonl")" ] && ok \
    || bad "$(cat "$work/plain.lib") re-executed or did not train: kernels '$(cat "$work/plain.row")'"
fi

# 3. --help lists every flag of the table (include/fsdp/train/flags.def), and the run's own two.
def="$(dirname "$0")/../include/fsdp/train/flags.def"
if "$bin" --help > "$work/help.out" 2>&1; then
  flags=$(sed -nE 's/^FSDP_TRAIN_FLAG\([a-z]+, [^,]+(<[^>]*>)?, ([a-z0-9_]+),.*/--\2/p' "$def" | tr _ -)
  [ "$(echo "$flags" | wc -l)" -ge 50 ] && ok || bad "read only $(echo "$flags" | wc -l) flags from $def"
  for f in $flags; do
    grep -qE -- "^ +(-[a-z-]+,)?$f[ ,=]" "$work/help.out" && ok || bad "--help does not list $f"
  done
else
  bad "--help exited non-zero"
fi

# 4. Bad input: each must exit non-zero and name the bad value.
expect_fail() {
  local needle=$1
  shift
  if "$bin" "$@" > "$work/bad.out" 2>&1; then
    bad "expected failure for: $* (output: $(head -3 "$work/bad.out"))"
  elif ! grep -qF -- "$needle" "$work/bad.out"; then
    bad "message for '$*' lacks '$needle': $(cat "$work/bad.out")"
  else
    ok
  fi
}
mkdir -p "$work/a_directory"
printf '\x02\x00\x00\x00\x00\x00\x00\x00{}' > "$work/empty.safetensors"
FSDP_BLAS_REEXEC=3 expect_fail "FSDP_BLAS_REEXEC" --steps 1  # refused by name, not an abort
expect_fail "--bogus" --bogus 3
expect_fail "dim 250 is not divisible by heads 4" --preset tiny --dim 250 --heads 4 --steps 1
expect_fail "seq must be positive, got 0" --preset tiny --seq 0 --steps 1
expect_fail "batch must be positive, got -2" --preset tiny --batch -2 --steps 1
expect_fail "vocab must be positive, got 0" --preset tiny --vocab 0 --steps 1
expect_fail "unknown preset 'huge'" --preset huge
expect_fail "--arch must be seed or llama, got 'gpt'" --arch gpt
expect_fail "--backend must be nccl, mpi, gloo or local, got 'bogus'" --preset tiny --backend bogus --steps 1
expect_fail "backend nccl holds CUDA tensors but the device is cpu" --preset tiny --backend nccl --steps 1
expect_fail "--dtype bf16 is not a CPU training dtype" --preset tiny --dtype bf16 --steps 1
expect_fail "unknown dtype 'f8'" --preset tiny --dtype f8 --steps 1
expect_fail "--steps must be >= 0, got -1" --preset tiny --steps -1
expect_fail "data file '$work/missing.txt' does not exist" "${small[@]}" --data "$work/missing.txt" --steps 1
expect_fail "holds no .bin shards" "${small[@]}" --data "$work/a_directory" --steps 1
expect_fail "needs vocab >= 256, got 100" "${small[@]}" --vocab 100 --data "$work/text.txt" --steps 1
expect_fail "--lr" --lr notanumber
expect_fail "--shard must be full or none, got 'half'" --preset tiny --shard half --steps 1
expect_fail "--hsdp 2 does not divide the world size 1" --preset tiny --hsdp 2 --steps 1
expect_fail "--grad-accum must be >= 1, got 0" --preset tiny --grad-accum 0 --steps 1
expect_fail "--reshard-after-forward" --preset tiny --reshard-after-forward maybe --steps 1
expect_fail "--lr-decay must be none, cosine or linear, got 'step'" --preset tiny --lr-decay step --steps 1
expect_fail "--resume needs --ckpt-dir" --preset tiny --resume --steps 1
expect_fail "--overwrite needs --ckpt-dir" --preset tiny --overwrite --steps 1
expect_fail "--overwrite clears --ckpt-dir and --resume continues from it" --preset tiny --overwrite --resume \
  --ckpt-dir "$work/ow" --steps 1
expect_fail "--profile-steps '3' must be A:B" --preset tiny --profile-steps 3 --steps 1
expect_fail "no tensor named" --preset tiny --steps 1 --init-from "$work/empty.safetensors"
expect_fail "cannot open" --preset tiny --steps 1 --init-from "$work/missing.safetensors"


# The step's host syncs, counted by core (item, to_f64_vector, host<->device copies; on CUDA each
# waits for the device): exactly one per step, the metrics' gather, with 2 microbatches, at 1 rank
# and at 2. The stop agreement rides on that gather, and batches need no read.
syncs_ok() {  # syncs_ok NAME JSONL
  python3 - "$2" << 'PY' && ok || bad "$1: host syncs per step are not all 1"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
syncs = [r.get("host_syncs") for r in rows]
print("host syncs per step:", syncs)
sys.exit(0 if len(rows) == 4 and all(s == 1 for s in syncs) else 1)
PY
}
"$bin" "${small[@]}" --steps 4 --grad-accum 2 --data "$work/text.txt" --sample-tokens 0 \
  --log-file "$work/syncs1.jsonl" > "$work/syncs1.out" 2>&1 && syncs_ok "np 1" "$work/syncs1.jsonl" \
  || bad "the sync-count run failed: $(tail -3 "$work/syncs1.out")"
if command -v mpirun > /dev/null; then
  mpi_run -np 2 "$bin" "${small[@]}" --threads 1 --steps 4 \
    --grad-accum 2 --data "$work/text.txt" --sample-tokens 0 --log-file "$work/syncs2.jsonl" \
    > "$work/syncs2.out" 2>&1 && syncs_ok "np 2" "$work/syncs2.jsonl" \
    || bad "the 2-rank sync-count run failed: $(tail -3 "$work/syncs2.out")"
fi


# Activation checkpointing: the same losses and grad norms as without, bit for bit, at 1 rank and
# at 2 (mpirun), with the peak memory lower; bad modes refused by name.
ac_run() {  # ac_run NAME MODE [LAUNCHER...]: the JSONL's losses and grad norms in NAME.ac
  local name=$1 mode=$2
  shift 2
  "$@" "$bin" "${small[@]}" --layers 4 --steps 3 --data "$work/text.txt" --sample-tokens 0 \
    --activation-checkpoint "$mode" --log-file "$work/$name.jsonl" > "$work/$name.out" 2>&1 \
    || bad "--activation-checkpoint $mode: $(tail -2 "$work/$name.out")"
  python3 -c 'import json,sys; [print(r["loss"], r["grad_norm"]) for r in map(json.loads, open(sys.argv[1]))]' \
    "$work/$name.jsonl" > "$work/$name.ac"
}
peak_mb() { sed -nE 's/^summary .*peak mem ([0-9.]+) MB.*/\1/p' "$1"; }
for launcher in single mpi; do
  l=()
  [ $launcher = mpi ] && { command -v mpirun > /dev/null || continue; l=("${mpirun_local[@]}" -np 2); }
  ac_run "ac_none_$launcher" none "${l[@]}"
  for mode in full every:2; do
    ac_run "ac_${mode/:/}_$launcher" "$mode" "${l[@]}"
    [ -s "$work/ac_none_$launcher.ac" ] && cmp -s "$work/ac_none_$launcher.ac" "$work/ac_${mode/:/}_$launcher.ac" && ok \
      || bad "--activation-checkpoint $mode ($launcher) changed the losses: $(paste "$work/ac_none_$launcher.ac" "$work/ac_${mode/:/}_$launcher.ac" | head -2)"
  done
  awk -v a="$(peak_mb "$work/ac_full_$launcher.out")" -v b="$(peak_mb "$work/ac_none_$launcher.out")" 'BEGIN {exit !(a < b)}' && ok \
    || bad "full checkpointing did not lower the peak ($launcher): $(peak_mb "$work/ac_full_$launcher.out") MB vs $(peak_mb "$work/ac_none_$launcher.out") MB"
done
expect_fail "--activation-checkpoint must be none, full or every:N (N >= 1), got 'every:0'" --preset tiny --activation-checkpoint every:0 --steps 1
expect_fail "--activation-checkpoint must be none, full or every:N (N >= 1), got 'some'" --preset tiny --activation-checkpoint some --steps 1

summary
