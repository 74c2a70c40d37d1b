# ctest script: install the project into a temporary prefix, move that prefix elsewhere (the
# package must be relocatable), then configure, build and run examples/link_lossfns against it;
# then the same against the build tree's package.
# Inputs: -DBUILD_DIR -DSOURCE_DIR -DWORK_DIR -DTORCH_PREFIX -DGENERATOR -DREADELF
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/staged)
file(RENAME ${WORK_DIR}/staged ${WORK_DIR}/moved)
# The installed library's RUNPATH names directories that exist (the Torch and CUDA libraries'),
# none of this build tree or of the install prefix.
file(GLOB installed_libs ${WORK_DIR}/moved/lib*/liblossfns.so)
list(GET installed_libs 0 installed_lib)
file(READ_ELF ${installed_lib} RUNPATH runpath RPATH rpath)
set(runpath "${runpath}${rpath}")  # a linker without new dtags writes DT_RPATH instead
if(runpath STREQUAL "")
  message(FATAL_ERROR "${installed_lib}: no RUNPATH or RPATH (it would not find Torch's libraries)")
endif()
string(REPLACE ":" ";" runpath_dirs "${runpath}")
foreach(dir IN LISTS runpath_dirs)
  if(NOT IS_DIRECTORY "${dir}")
    message(FATAL_ERROR "${installed_lib}: its RUNPATH names ${dir}, which does not exist (${runpath})")
  endif()
  string(FIND "${dir}" "${BUILD_DIR}" in_build)
  string(FIND "${dir}" "${WORK_DIR}" in_work)
  if(in_build EQUAL 0 OR in_work EQUAL 0)
    message(FATAL_ERROR "${installed_lib}: its RUNPATH names ${dir}, of the build or install tree (${runpath})")
  endif()
endforeach()
# With the CUDA kernels the library needs the CUDA runtime: the first RUNPATH directory holding one
# is the one libtorch_cuda loads its runtime from (Torch's own, a wheel's nvidia/*/lib) where Torch
# ships one, so an app does not need the toolkit where it runs (nor load a second runtime).
if(NOT READELF)
  set(READELF readelf)
endif()
execute_process(COMMAND ${READELF} -d ${installed_lib} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${installed_lib} failed (${rc})")
endif()
if(dynamic MATCHES "NEEDED[^\n]*\\[(libcudart\\.so\\.[0-9]+)\\]")
  set(cudart_soname "${CMAKE_MATCH_1}")
  set(torch_cudart_dir "")
  set(first_cudart_dir "")
  foreach(dir IN LISTS runpath_dirs)
    file(GLOB torch_cudart "${dir}/../../nvidia/*/lib/${cudart_soname}")
    if(EXISTS "${dir}/libtorch_cuda.so" AND torch_cudart AND torch_cudart_dir STREQUAL "")
      list(GET torch_cudart 0 torch_cudart)
      get_filename_component(torch_cudart_dir "${torch_cudart}" DIRECTORY)
      file(REAL_PATH "${torch_cudart_dir}" torch_cudart_dir)
    endif()
    file(GLOB cudart_here "${dir}/${cudart_soname}")
    if(cudart_here AND first_cudart_dir STREQUAL "")
      file(REAL_PATH "${dir}" first_cudart_dir)
    endif()
  endforeach()
  if(torch_cudart_dir AND NOT first_cudart_dir STREQUAL torch_cudart_dir)
    message(FATAL_ERROR "${installed_lib}: the first CUDA runtime on its RUNPATH is in "
                        "${first_cudart_dir}, not Torch's own in ${torch_cudart_dir} (${runpath})")
  endif()
  message("the CUDA runtime it finds first: ${first_cudart_dir} (Torch's: ${torch_cudart_dir}): ok")
endif()
# The environment form of CMAKE_PREFIX_PATH (':'-separated) survives execute_process's list splitting.
set(ENV{CMAKE_PREFIX_PATH} "${WORK_DIR}/moved:${TORCH_PREFIX}")
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/link_lossfns -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/link_lossfns)
# The app's RUNPATH names no directory that does not exist (Torch's MKL target lists some: the
# package keeps only the existing ones, as for the library).
file(READ_ELF ${WORK_DIR}/build/link_lossfns RUNPATH app_runpath RPATH app_rpath)
string(REPLACE ":" ";" app_dirs "${app_runpath}${app_rpath}")
foreach(dir IN LISTS app_dirs)
  if(NOT IS_DIRECTORY "${dir}")
    message(FATAL_ERROR "the app's RUNPATH names ${dir}, which does not exist (${app_runpath}${app_rpath})")
  endif()
endforeach()
# A consumer whose CMAKE_PREFIX_PATH finds another Torch minor version first is refused by the
# package, with both versions named (here a stand-in TorchConfig.cmake of version 2.10.0).
file(WRITE ${WORK_DIR}/torch210/share/cmake/Torch/TorchConfig.cmake "set(TORCH_FOUND TRUE)\n")
file(WRITE ${WORK_DIR}/torch210/share/cmake/Torch/TorchConfigVersion.cmake
     "set(PACKAGE_VERSION 2.10.0)\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n")
set(ENV{CMAKE_PREFIX_PATH} "${WORK_DIR}/moved:${WORK_DIR}/torch210:${TORCH_PREFIX}")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/link_lossfns
                        -B ${WORK_DIR}/build_torch210 -G ${GENERATOR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX REPLACE "[ \n]+" " " said "${out}${err}")  # CMake wraps its messages
if(rc EQUAL 0 OR NOT said MATCHES "lossfns was built against Torch 2\\.11, but CMAKE_PREFIX_PATH found Torch 2\\.10\\.0")
  message(FATAL_ERROR "a consumer finding Torch 2.10 first: expected the package to refuse it "
                      "naming both versions; got rc ${rc}:\n${out}\n${err}")
endif()
message("a consumer finding Torch 2.10 first is refused: ok")
# The build tree is a package too: the same app against it, without installing.
set(ENV{CMAKE_PREFIX_PATH} "${TORCH_PREFIX}")
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/link_lossfns -B ${WORK_DIR}/build_tree -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -Dlossfns_DIR=${BUILD_DIR}/lib)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build_tree)
run(${WORK_DIR}/build_tree/link_lossfns)
