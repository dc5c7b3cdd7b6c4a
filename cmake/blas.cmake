# The CPU GEMM's library (issue 55), chosen by measurement: FSDP_BLAS=auto|mkl|openblas|
# scipy-openblas|blis. Defines the target fsdp_blas (the libraries), FSDP_BLAS_INCLUDE_DIR and
# FSDP_BLAS_DEFINITION (FSDP_BLAS_<NAME>=1) for kernels/cpu/gemm.cpp, FSDP_BLAS_NAME (the one
# found) and FSDP_BLAS_LIBRARY_DIRS (the installed library's RPATH).
#
# auto tries, in order, what bench/gemm_libs.sh and bench/gemm_libs_step.sh measured fastest for
# the build machine's CPU vendor (bench/results/gemm-libs-cpu.md, gemm-libs-step-cpu.md). On AMD
# Zen 4 the libraries with AVX-512 kernels for it reach the same sgemm rate within the noise, and
# Debian's OpenBLAS (OpenMP, its threads wait passively) keeps its step time on a loaded machine,
# where BLIS's and scipy-openblas's spinning threads made 2-thread steps several times slower:
# openblas first. On Intel CPUs MKL first (issue 55: 293 against OpenBLAS's 201 GFLOP/s on an
# Emerald Rapids Xeon; install-deps.sh installs it there with FSDP_WITH_MKL=1). Debian's OpenBLAS, which
# install-deps.sh always installs, is in every order.
set(FSDP_BLAS auto CACHE STRING "CPU BLAS: auto, mkl, openblas, scipy-openblas or blis")
set_property(CACHE FSDP_BLAS PROPERTY STRINGS auto mkl openblas scipy-openblas blis)

set(_fsdp_triplet_inc /usr/include/x86_64-linux-gnu)
set(_fsdp_triplet_lib /usr/lib/x86_64-linux-gnu)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64")
  set(_fsdp_triplet_inc /usr/include/aarch64-linux-gnu)
  set(_fsdp_triplet_lib /usr/lib/aarch64-linux-gnu)
endif()

# The Python that install-deps.sh's pip installs into (MKL's and scipy-openblas's wheels).
find_program(FSDP_PYTHON3 python3)

# The headers and the definition go on kernels/cpu/gemm.cpp alone (CMakeLists.txt), the only
# file that includes them: the other objects do not change with the library (ccache keeps them).
function(_fsdp_blas_target name inc libs)
  add_library(fsdp_blas INTERFACE IMPORTED GLOBAL)
  string(TOUPPER "${name}" up)
  string(REPLACE "-" "_" up "${up}")
  set_target_properties(fsdp_blas PROPERTIES INTERFACE_LINK_LIBRARIES "${libs}")
  list(GET libs 0 first)
  get_filename_component(dir "${first}" DIRECTORY)
  set(FSDP_BLAS_NAME "${name}" PARENT_SCOPE)
  set(FSDP_BLAS_LIBRARY_DIRS "${dir}" PARENT_SCOPE)
  set(FSDP_BLAS_INCLUDE_DIR "${inc}" CACHE INTERNAL "")
  set(FSDP_BLAS_DEFINITION "FSDP_BLAS_${up}=1" CACHE INTERNAL "")
endfunction()

# Debian's OpenBLAS (the OpenMP build first) by its Debian paths (they also serve machines without
# pkg-config, like the bare GPU machine with Debian's packages unpacked); elsewhere (Fedora's
# lib64, Arch, conda) where pkg-config says, then the default search paths.
function(_fsdp_find_openblas)
  find_path(FSDP_OPENBLAS_INCLUDE_DIR cblas.h PATHS ${_fsdp_triplet_inc}/openblas-openmp
    ${_fsdp_triplet_inc}/openblas-pthread /usr/include/openblas NO_DEFAULT_PATH)
  find_library(FSDP_OPENBLAS_LIBRARY openblas PATHS ${_fsdp_triplet_lib}/openblas-openmp
    ${_fsdp_triplet_lib}/openblas-pthread ${_fsdp_triplet_lib} NO_DEFAULT_PATH)
  if(NOT FSDP_OPENBLAS_INCLUDE_DIR OR NOT FSDP_OPENBLAS_LIBRARY)
    find_package(PkgConfig QUIET)
    if(PKG_CONFIG_FOUND)
      pkg_check_modules(FSDP_OPENBLAS_PC QUIET openblas)
    endif()
    find_path(FSDP_OPENBLAS_INCLUDE_DIR cblas.h HINTS ${FSDP_OPENBLAS_PC_INCLUDE_DIRS}
      PATH_SUFFIXES openblas)
    find_library(FSDP_OPENBLAS_LIBRARY openblas HINTS ${FSDP_OPENBLAS_PC_LIBRARY_DIRS})
  endif()
  if(FSDP_OPENBLAS_INCLUDE_DIR AND FSDP_OPENBLAS_LIBRARY)
    _fsdp_blas_target(openblas "${FSDP_OPENBLAS_INCLUDE_DIR}" "${FSDP_OPENBLAS_LIBRARY}")
  endif()
  set(FSDP_BLAS_NAME "${FSDP_BLAS_NAME}" PARENT_SCOPE)
  set(FSDP_BLAS_LIBRARY_DIRS "${FSDP_BLAS_LIBRARY_DIRS}" PARENT_SCOPE)
endfunction()

# Debian's BLIS, the OpenMP build (libblis-openmp-dev): its own CBLAS header beside blis.h.
function(_fsdp_find_blis)
  find_path(FSDP_BLIS_INCLUDE_DIR blis.h PATHS ${_fsdp_triplet_inc}/blis-openmp NO_DEFAULT_PATH)
  find_library(FSDP_BLIS_LIBRARY blis PATHS ${_fsdp_triplet_lib}/blis-openmp NO_DEFAULT_PATH)
  if(FSDP_BLIS_INCLUDE_DIR AND FSDP_BLIS_LIBRARY AND EXISTS "${FSDP_BLIS_INCLUDE_DIR}/cblas.h")
    _fsdp_blas_target(blis "${FSDP_BLIS_INCLUDE_DIR}" "${FSDP_BLIS_LIBRARY}")
  endif()
  set(FSDP_BLAS_NAME "${FSDP_BLAS_NAME}" PARENT_SCOPE)
  set(FSDP_BLAS_LIBRARY_DIRS "${FSDP_BLAS_LIBRARY_DIRS}" PARENT_SCOPE)
endfunction()

# PyPI's scipy-openblas32: a current OpenBLAS (pthreads), every symbol prefixed scipy_.
function(_fsdp_find_scipy_openblas)
  if(FSDP_PYTHON3)
    execute_process(COMMAND ${FSDP_PYTHON3} -c
      "import scipy_openblas32 as s; print(s.get_include_dir() + ';' + s.get_lib_dir())"
      OUTPUT_VARIABLE dirs OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0)
      list(GET dirs 0 inc)
      list(GET dirs 1 lib)
      find_library(FSDP_SCIPY_OPENBLAS_LIBRARY scipy_openblas PATHS "${lib}" NO_DEFAULT_PATH)
      if(FSDP_SCIPY_OPENBLAS_LIBRARY AND EXISTS "${inc}/cblas.h")
        _fsdp_blas_target(scipy-openblas "${inc}" "${FSDP_SCIPY_OPENBLAS_LIBRARY}")
      endif()
    endif()
  endif()
  set(FSDP_BLAS_NAME "${FSDP_BLAS_NAME}" PARENT_SCOPE)
  set(FSDP_BLAS_LIBRARY_DIRS "${FSDP_BLAS_LIBRARY_DIRS}" PARENT_SCOPE)
endfunction()

# Intel's MKL (PyPI's mkl-devel, or oneAPI's): LP64, the GNU OpenMP threading layer (libgomp, the
# pool our own kernels run on: MKL's Intel OpenMP beside it would oversubscribe the cores).
function(_fsdp_find_mkl)
  set(roots "")
  if(FSDP_PYTHON3)
    execute_process(COMMAND ${FSDP_PYTHON3} -c "import sys; print(sys.prefix)"
      OUTPUT_VARIABLE prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    list(APPEND roots "${prefix}")
  endif()
  list(APPEND roots /usr/local /opt/intel/oneapi/mkl/latest)
  foreach(root IN LISTS roots)
    set(libs "")
    foreach(part mkl_gf_lp64 mkl_gnu_thread mkl_core)
      unset(FSDP_MKL_PART CACHE)
      find_library(FSDP_MKL_PART NAMES ${part} lib${part}.so.3 lib${part}.so.2 PATHS "${root}/lib"
        NO_DEFAULT_PATH)
      if(FSDP_MKL_PART)
        list(APPEND libs "${FSDP_MKL_PART}")
      endif()
      unset(FSDP_MKL_PART CACHE)
    endforeach()
    list(LENGTH libs n)
    if(n EQUAL 3 AND EXISTS "${root}/include/mkl_cblas.h")
      _fsdp_blas_target(mkl "${root}/include" "${libs}")
      break()
    endif()
  endforeach()
  set(FSDP_BLAS_NAME "${FSDP_BLAS_NAME}" PARENT_SCOPE)
  set(FSDP_BLAS_LIBRARY_DIRS "${FSDP_BLAS_LIBRARY_DIRS}" PARENT_SCOPE)
endfunction()

if(FSDP_BLAS STREQUAL "auto")
  set(_fsdp_vendor "")
  if(EXISTS /proc/cpuinfo)
    file(STRINGS /proc/cpuinfo _fsdp_vendor REGEX "^vendor_id" LIMIT_COUNT 1)
  endif()
  if(_fsdp_vendor MATCHES "GenuineIntel")
    set(_fsdp_order mkl openblas scipy-openblas blis)
  else()
    set(_fsdp_order openblas mkl scipy-openblas blis)
  endif()
elseif(FSDP_BLAS MATCHES "^(mkl|openblas|scipy-openblas|blis)$")
  set(_fsdp_order ${FSDP_BLAS})
else()
  message(FATAL_ERROR "FSDP_BLAS is '${FSDP_BLAS}'; expected auto, mkl, openblas, scipy-openblas or blis")
endif()
foreach(_fsdp_lib IN LISTS _fsdp_order)
  string(REPLACE "-" "_" _fsdp_fn "${_fsdp_lib}")
  cmake_language(CALL _fsdp_find_${_fsdp_fn})
  if(TARGET fsdp_blas)
    break()
  endif()
endforeach()
if(NOT TARGET fsdp_blas)
  message(FATAL_ERROR "FSDP_BLAS=${FSDP_BLAS}: none of ${_fsdp_order} found; scripts/install-deps.sh "
    "installs them (Debian's libopenblas-openmp-dev is the fallback)")
endif()
