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
    find_package(CUDAToolkit REQUIRED)
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
