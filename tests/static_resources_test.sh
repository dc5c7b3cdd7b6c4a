#!/usr/bin/env bash
# No static-storage object owns a cuDNN, cuBLASLt, NCCL or CUDA resource. A
# function-local or namespace-scope static with a non-trivial destructor (a
# std::map of handles, a cache of plans) is destroyed at exit, after main: by
# then the CUDA runtime may be torn down (its own atexit handlers run in an
# order no one controls), and the destructor calls cublasLtDestroy,
# cudnnDestroy or cudaFree into a dead driver: a crash or a hang at exit, which
# only a GPU run shows. Such statics must be leaked heap objects
# (`static auto* x = new ...`). The compiler registers each such destructor
# with __cxa_atexit, and the symbol table shows that on any machine: every
# object of the library that references cudnn*, cublasLt*, nccl* or cuda*
# symbols must not reference __cxa_atexit. (A std::mutex or an array of
# pointers is trivially destructible and registers nothing; nvcc's own
# fat-binary registration uses atexit, not __cxa_atexit.) Two exceptions own
# no device resource and are not ours to change: std::ios_base::Init, which
# <iostream> places in every file that includes it, and the log file stream
# of cuDNN frontend's header-only cudnn_frontend::getLogger().
#   static_resources_test.sh OBJECT...   (the library's object files)
set -uo pipefail
[ $# -gt 0 ] || { echo "static_resources_test: no objects given" >&2; exit 1; }
bad=0
checked=0
for o in "$@"; do
  case "$o" in *.o) ;; *) continue ;; esac
  [ -f "$o" ] || { echo "static_resources_test: $o does not exist" >&2; exit 1; }
  undef=$(nm -u "$o" | awk '{print $NF}')
  device=$(grep -E '^(cudnn|cublasLt|nccl|cuda)[A-Za-z0-9_]+$' <<<"$undef" | head -3 | tr '\n' ' ')
  [ -n "$device" ] || continue
  checked=$((checked + 1))
  grep -qx '__cxa_atexit' <<<"$undef" || continue
  # Each call of __cxa_atexit, with the function it is in and the destructor it registers (among
  # the symbols loaded since the previous call), skipping the two exceptions above.
  sites=$(awk '
    function hex(h,   i, v) { v = 0; h = tolower(h); for (i = 1; i <= length(h); ++i) v = v * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1; return v }
    FNR == NR {  # nm: the local functions of .text by address, to name a ".text+0x..." destructor
      if ($2 == "t" || $2 == "T") { name = $0; sub(/^[^ ]+ [^ ]+ /, "", name); text[hex($1)] = name }
      next
    }
    /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<")); n = 0; next }
    /R_X86_64_/ {
      if ($0 ~ /__cxa_atexit/) {
        ctx = ""; dtor = ""
        for (i = (n > 16 ? n - 16 : 0); i < n; ++i) {
          if (recent[i % 16] ~ /^\.bss/) continue
          ctx = ctx " " recent[i % 16]
          if (recent[i % 16] ~ /::~/) dtor = recent[i % 16]
        }
        n = 0
        if (ctx !~ /ios_base::Init/ && !(fn ~ /^<cudnn_frontend::getLogger\(\)>/ && dtor ~ /basic_ofstream/))
          print "  in " substr(fn, 1, 200) "\n    destructor: " substr(dtor == "" ? ctx : dtor, 1, 300)
        next
      }
      sym = $0; sub(/^.*R_X86_64_[A-Z0-9_]+[ \t]+/, "", sym)
      if (sym ~ /^\.text\+0x[0-9a-f]+$/) {  # PC-relative: the target is 4 bytes past the addend
        a = hex(substr(sym, 9)) + ($0 ~ /R_X86_64_PC32/ ? 4 : 0)
        if (a in text) sym = text[a]
      }
      sub(/[-+]0x[0-9a-f]+$/, "", sym)
      recent[n % 16] = sym; ++n
    }' <(nm -C --defined-only "$o") <(objdump -dr --no-show-raw-insn -C "$o" 2>/dev/null))
  if [ -n "$sites" ]; then
    echo "FAIL $(basename "$o") references $device... and __cxa_atexit: a static object with a" \
      "destructor in a file that holds device resources; make it a leaked heap object" \
      "(static auto* x = new ...), or it is destroyed after the CUDA runtime at exit"
    echo "$sites" | head -20
    bad=1
  fi
done
[ $checked -gt 0 ] || { echo "static_resources_test: no object among the $# given references CUDA, cuBLASLt, cuDNN or NCCL" >&2; exit 1; }
[ $bad -eq 0 ] || exit 1
echo "static_resources_test: $checked objects reference CUDA, cuBLASLt, cuDNN or NCCL; none registers a static destructor"
