# Detect nvcc and enable CUDA when asked for and available. Sets STATEPOOL_HAVE_CUDA.
set(STATEPOOL_HAVE_CUDA OFF)
if(STATEPOOL_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # Debian 12's CMake 3.25 marks CUDA::nvToolsExt deprecated without checking that the
    # target exists, and CUDA 13 has no libnvToolsExt: with a required minimum of 3.25 the
    # find stops ("set_property could not find TARGET CUDA::nvToolsExt"). FindCUDAToolkit
    # marks it only for projects that require 3.25 or later, so the find runs with 3.24 as
    # the minimum it reads (the variable only: policies are unchanged).
    set(statepool_required_version "${CMAKE_MINIMUM_REQUIRED_VERSION}")
    set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_MINIMUM_REQUIRED_VERSION "${statepool_required_version}")
    # The kernels' targets: sm_80 and sm_90 everywhere (CI builds both); scripts/gpu-check
    # passes "native" to build for the card present only.
    set(STATEPOOL_CUDA_ARCHITECTURES "80;90" CACHE STRING
        "CUDA architectures of the kernels (e.g. 80;90, native)")
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "52")
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    # CMake 3.25 knows no C++20 flag for nvcc (added in 3.26); nvcc >= 12 accepts it.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION
       AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(STATEPOOL_HAVE_CUDA ON)
  else()
    message(STATUS "statepool: nvcc not found, building without CUDA kernels")
  endif()
endif()
