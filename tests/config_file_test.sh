#!/usr/bin/env bash
# fsdp-train --config: a TOML file with an include gives the losses of the same run given as
# flags; --print-config's output, fed back, gives them again; an unknown key or section is refused
# with the nearest known one, an include cycle and a newer version by name; the fixed version-1
# file (tests/fixtures/config_v1.toml) still runs; --resume --ckpt-dir D with no other flag (or a
# longer --steps) continues bit-exactly from the flags the run was started with, and a flag that
# changes the model's shape is refused by name.
set -uo pipefail
bindir=$(cd "$1" && pwd)
source "$(dirname "$0")/testlib.sh"
use_tools "$bindir"
fixtures="$(cd "$(dirname "$0")" && pwd)/fixtures"
export OMP_WAIT_POLICY=PASSIVE
cd "$work" || exit 1
losses() { python3 -c "import json,sys; print([repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if l.strip()])" "$1"; }
expect_fail() {  # expect_fail NAME NEEDLE command...
  local name=$1 needle=$2
  shift 2
  timeout -s KILL 60 "$@" > bad.out 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then bad "$name: succeeded"
  elif ! grep -qF -- "$needle" bad.out; then bad "$name: rc $rc, no '$needle' in: $(tail -3 bad.out)"
  else ok; fi
}
F=(--preset tiny --arch llama --vocab 256 --dim 64 --layers 2 --heads 2 --seq 32 --batch 2 --threads 1
  --lr 2e-3 --warmup-steps 1 --grad-clip 1.0 --steps 4 --data /usr/share/common-licenses/GPL-3 --sample-tokens 0)
cat > base.toml << 'TOML'
version = 1
[model]
preset = "tiny"
arch = "llama"
vocab = 256
dim = 64
layers = 2
heads = 2
seq = 32
batch = 2
[run]
threads = 1
TOML
cat > run.toml << 'TOML'
include = "base.toml"   # read first; this file's keys override it
[optimizer]
lr = 2e-3
grad_clip = 1.0
[schedule]
steps = 4
warmup_steps = 1
[data]
data = "/usr/share/common-licenses/GPL-3"
[sample]
sample_tokens = 0
TOML
"$train" "${F[@]}" --log-file flags.jsonl > flags.out 2>&1 || bad "the run by flags: $(tail -2 flags.out)"
"$train" --config run.toml --log-file cfg.jsonl > cfg.out 2>&1 || bad "the run by --config: $(tail -2 cfg.out)"
[ -s flags.jsonl ] && [ "$(losses cfg.jsonl)" = "$(losses flags.jsonl)" ] && ok \
  || bad "--config's losses $(losses cfg.jsonl) are not the flags' $(losses flags.jsonl)"
"$train" --config run.toml --print-config > printed.toml 2> printed.err || bad "--print-config: $(cat printed.err)"
grep -q '^\[optimizer\]$' printed.toml && grep -q '^lr = 0.002$' printed.toml && grep -q '^version = 1$' printed.toml && ok \
  || bad "--print-config's TOML: $(head -5 printed.toml)"
"$train" --config printed.toml --log-file printed.jsonl > printed.out 2>&1 || bad "the printed config: $(tail -2 printed.out)"
[ "$(losses printed.jsonl)" = "$(losses flags.jsonl)" ] && ok || bad "the printed config's losses differ: $(losses printed.jsonl)"
"$train" --config run.toml --steps 2 --log-file over.jsonl > over.out 2>&1 && [ "$(wc -l < over.jsonl)" -eq 2 ] && ok \
  || bad "a flag on the command line does not override the file: $(tail -2 over.out)"

# Refusals, by name.
printf 'include = "base.toml"\n[optimizer]\nlrr = 1\n' > typo.toml
expect_fail "an unknown key" "typo.toml:3: [optimizer] has no key 'lrr' (did you mean lr?)" "$train" --config typo.toml
printf '[optimiser]\nlr = 1\n' > section.toml
expect_fail "an unknown section" "unknown section [optimiser] (did you mean optimizer?)" "$train" --config section.toml
printf '[model]\nlr = 1\n' > wrong_section.toml
expect_fail "a key in the wrong section" "[model] has no key 'lr' (it is in [optimizer])" "$train" --config wrong_section.toml
printf 'lr = 1\n' > top.toml
expect_fail "a key outside any section" "'lr' is outside any section" "$train" --config top.toml
printf '[optimizer]\nlr = "fast"\n' > value.toml
expect_fail "a value of the wrong kind" "value.toml:2: [optimizer] lr:" "$train" --config value.toml
printf 'include = "b.toml"\n' > a.toml; printf 'include = "a.toml"\n' > b.toml
expect_fail "an include cycle" "an include cycle: $work/a.toml -> $work/b.toml -> $work/a.toml" "$train" --config a.toml
printf 'version = 2\n' > v2.toml
expect_fail "a newer version" "this fsdp-train reads config version 1, got 2" "$train" --config v2.toml
printf '[model\n' > broken.toml
expect_fail "not TOML" "broken.toml:1:" "$train" --config broken.toml
expect_fail "a missing file" "cannot open 'missing.toml'" "$train" --config missing.toml

# The fixed version-1 file.
"$train" --config "$fixtures/config_v1.toml" --log-file v1.jsonl > v1.out 2>&1 && [ "$(wc -l < v1.jsonl)" -eq 2 ] && ok \
  || bad "the version-1 config no longer runs: $(tail -2 v1.out)"

# --resume --ckpt-dir D alone continues the run as it was started, bit-exactly.
"$train" "${F[@]}" --steps 6 --log-file straight.jsonl > straight.out 2>&1 || bad "6 straight steps: $(tail -2 straight.out)"
"$train" "${F[@]}" --ckpt-dir ck --ckpt-every 2 > first.out 2>&1 || bad "the first 4 steps: $(tail -2 first.out)"
"$train" --resume --ckpt-dir ck --steps 6 --log-file resumed.jsonl > resumed.out 2>&1 || bad "--resume --ckpt-dir ck --steps 6: $(tail -3 resumed.out)"
want=$(python3 -c "import json,sys; print([repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if l.strip()][4:])" straight.jsonl)
[ -s resumed.jsonl ] && [ "$(losses resumed.jsonl)" = "$want" ] && ok \
  || bad "the flag-less resume's losses $(losses resumed.jsonl) are not steps 4 and 5 of the straight run $want"
grep -q "resume: loaded .*step_00000004" resumed.out && ok || bad "the resume did not load step 4: $(grep resume resumed.out)"
expect_fail "a shape change with --resume" "was saved with dim 64 but this run has dim 128" \
  "$train" --resume --ckpt-dir ck --steps 8 --dim 128
summary
