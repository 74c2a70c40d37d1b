# ctest script for a CPU-only build (LOSSFNS_CUDA=OFF): the library's needed libraries (readelf -d)
# name Torch's CPU half and no CUDA library, so that it loads beside a CPU-only Torch even when it
# was built against a CUDA one. Inputs: -DLIBRARY=<path of liblossfns.so> [-DREADELF=<readelf>]
if(NOT READELF)
  set(READELF readelf)
endif()
execute_process(COMMAND ${READELF} -d ${LIBRARY} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${LIBRARY} failed (${rc}): ${err}")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[([^]\n]+)\\]" lines "${out}")
set(needed "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE ".*\\[([^]]+)\\].*" "\\1" name "${line}")
  list(APPEND needed ${name})
endforeach()
if(NOT needed MATCHES "libtorch_cpu\\.so")
  message(FATAL_ERROR "${LIBRARY}: expected libtorch_cpu.so among its needed libraries, got: ${needed}")
endif()
set(cuda_needed "")
foreach(name IN LISTS needed)
  # libtorch_cuda, libc10_cuda, the CUDA runtime and libraries (libcudart, libcublas, libcufft,
  # libcurand, libcusparse, libcusolver, libcupti, libcudnn), NVIDIA's (libnvrtc, libnvJitLink,
  # libnvToolsExt, libnvshmem) and NCCL.
  if(name MATCHES "cuda|^libcu|^libnv|^libnccl")
    list(APPEND cuda_needed ${name})
  endif()
endforeach()
if(cuda_needed)
  message(FATAL_ERROR "${LIBRARY} was built without CUDA (LOSSFNS_CUDA=OFF) but needs ${cuda_needed}: "
                      "it would not load beside a CPU-only Torch (all needed: ${needed})")
endif()
message("${LIBRARY}: needs ${needed}; no CUDA library: ok")
