#!/usr/bin/env bash
# A stand-in for every program scripts/gpu_check.sh runs (cmake, nvidia-smi,
# python3, compute-sanitizer and the build's binaries), linked under each name
# by tests/gpu_check_test.sh: it prints a plausible line and sleeps; nothing
# computes. STANDIN_SLEEP: seconds each sleeps (default 2); STANDIN_HANG: a
# glob on "NAME ARGS" whose matches sleep for 1000 s (a hung command);
# STANDIN_NO_NCCL=1: cmake configures without NCCL, and says so as CMake does. STANDIN_NO_SMI=1:
# nvidia-smi is missing (the check then asks the CUDA driver, which this machine lacks).
# STANDIN_OPTABLE_FAILS=N: cuda_test's op table fails N tests (and passes 3). cuda_test answers
# each --gtest_filter of the check as gtest does, one test per group.
name=$(basename "$0")
call="$name $*"
sleep=${STANDIN_SLEEP:-2}
# STANDIN_CALLS: a file each call is appended to, with the library path it was given.
[ -n "${STANDIN_CALLS:-}" ] && echo "$call | LD_LIBRARY_PATH=${LD_LIBRARY_PATH-<unset>}" >> "$STANDIN_CALLS"
# shellcheck disable=SC2053 # STANDIN_HANG is a glob
[ -n "${STANDIN_HANG:-}" ] && [[ $call == $STANDIN_HANG ]] && exec sleep 1000
case $name in
  nvidia-smi)
    [ -n "${STANDIN_NO_SMI:-}" ] && { echo "nvidia-smi: command not found" >&2; exit 127; }
    if [ "${1:-}" = -L ]; then echo "GPU 0: Stand-in H200 (UUID: GPU-0)"; else echo "Stand-in H200, 143771 MiB, 0.0, 1980 MHz, 1980 MHz"; fi
    exit 0
    ;;
  cmake)
    if [ "${1:-}" != --build ] && [ -n "${STANDIN_NO_NCCL:-}" ]; then  # CMake's warning, as it wraps it
      printf 'CMake Warning at CMakeLists.txt:172 (message):\n  fsdp: a CUDA build without NCCL (nccl.h: NCCL_INCLUDE_DIR-NOTFOUND, libnccl:\n  NCCL_LIBRARY-NOTFOUND; searched /usr/local/cuda/include /usr/local/cuda/lib64\n  and the system): --backend nccl will refuse\n\n'
      echo "-- fsdp: CUDA=ON cuDNN=ON NCCL=OFF MPI=ON Gloo=ON"
    elif [ "${1:-}" != --build ]; then
      echo "-- fsdp: CUDA=ON cuDNN=ON NCCL=ON MPI=ON Gloo=ON"
    fi
    ;;
  python3)
    case ${1:-} in
      -) # the check's own log analysis: the real python3, the one after this folder on PATH
        here=$(cd "$(dirname "$0")" && pwd)
        PATH=$(echo "$PATH" | tr ':' '\n' | grep -vxF "$here" | paste -sd:)
        exec python3 "$@"
        ;;
      -c) exit 1 ;; # no nvidia.* packages here
    esac
    [[ $call == *torch_fsdp_ref* ]] && echo "torch-ref: arch stand-in | tok/s 1000 (steps 2..19) | peak 1.00 GB"
    [[ $call == *torch_attention* ]] && echo "torch-attention: causal=0 | fwd 0.100 ms | bwd 0.300 ms | stand-in"
    ;;
  cuda_test | ops_test)
    filter=""
    for a in "$@"; do [[ $a == --gtest_filter=* ]] && filter=${a#--gtest_filter=}; done
    fails=0
    test_ok() { printf '[ RUN      ] %s\n[       OK ] %s (0 ms)\n' "$1" "$1"; }
    case $filter in
      Build.*)
        echo "cudnn-versions: cuDNN 9.19.0 loaded, built against 9.19.0"
        test_ok Build.CudnnLoadedBesideTheHeadersItWasBuiltAgainst
        ran=1
        ;;
      OpTable/*)
        fails=${STANDIN_OPTABLE_FAILS:-0}
        ran=$((3 + fails))
        for i in 0 1 2; do test_ok "OpTable/OpTableOnCuda.MatchesTheCpu/$i"; done
        for ((i = 3; i < ran; i++)); do
          printf '[ RUN      ] OpTable/OpTableOnCuda.MatchesTheCpu/%s\ntests/cuda_test.cpp:300: Failure\nExpected: (rel_error) < (tol), actual: 0.5 vs 0.01\nstand-in case %s output 0\n[  FAILED  ] OpTable/OpTableOnCuda.MatchesTheCpu/%s, where GetParam() = %s (1 ms)\n' "$i" "$i" "$i" "$i"
        done
        ;;
      CudnnSdpa/*)
        d=${filter##*/}
        test_ok "CudnnSdpa/CudnnAttention.MatchesOurKernel/${d%%_*}_B2_T256_H4_KV4_hd64"
        ran=1
        ;;
      *) test_ok StandIn.Test && ran=1 ;;
    esac
    echo "[==========] $ran tests from 1 test suite ran. (0 ms total)"
    echo "[  PASSED  ] $((ran - fails)) tests."
    [ "$fails" = 0 ] || { sleep "$sleep"; exit 1; }
    ;;
  fsdp-train)
    echo "| attention              | cuDNN SDPA (cuDNN 9.19.0 loaded, built against 9.19.0) |"
    echo "step 5 | stand-in"
    echo "summary | step 1.0 ms | peak mem 1.0 MB"
    ;;
esac
exec sleep "$sleep"
