#!/usr/bin/env bash
# No CUDA object calls exit(). nvcc compiles a host call to a __device__
# function (say, one made in a kernel launch's arguments, inside a generic
# lambda, where -Werror cross-execution-space-call does not see it) into a
# host stand-in that calls exit(1): the program then ends with status 1 and
# prints nothing, and only a GPU run shows it. The symbol table shows it on
# any machine. The library throws; nothing in it may exit.
#   cuda_objects_test.sh OBJECT...   (the library's object files)
set -uo pipefail
objs=()
for o in "$@"; do case "$o" in *.cu.o) objs+=("$o") ;; esac; done
[ ${#objs[@]} -gt 0 ] || { echo "cuda_objects_test: no .cu.o among the $# objects given" >&2; exit 1; }
bad=0
for o in "${objs[@]}"; do
  [ -f "$o" ] || { echo "cuda_objects_test: $o does not exist" >&2; exit 1; }
  calls=$(nm -u "$o" | awk '{print $NF}' | grep -xE 'exit|_exit|_Exit|quick_exit|abort' | tr '\n' ' ')
  if [ -n "$calls" ]; then
    echo "FAIL $(basename "$o") references: $calls(a host call to a __device__ function?)"
    objdump -dr --no-show-raw-insn -C "$o" 2>/dev/null | awk '/^[0-9a-f]+ <.*>:$/ {fn = $0} /R_X86_64_PLT32[ \t]+(exit|abort)/ {print "  in " fn}' | sort -u | head -10
    bad=1
  fi
done
[ $bad -eq 0 ] || exit 1
echo "cuda_objects_test: ${#objs[@]} CUDA objects, none calls exit or abort"
