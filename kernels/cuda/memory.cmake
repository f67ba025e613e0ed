# Device memory for the CUDA backend (driver.cpp, vmm.cpp): the driver API reached through
# the runtime (cudaGetDriverEntryPointByVersion), so nothing links libcuda and a CUDA build
# still starts on a machine without the NVIDIA driver. Do not add CUDA::cuda_driver here.
# cuda.h and cudaTypedefs.h come with CUDA::cudart's include directories.
target_sources(statepool_kernels_cuda PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/driver.cpp
  ${CMAKE_CURRENT_LIST_DIR}/vmm.cpp)
# PUBLIC, not PRIVATE: vmm.hpp holds its descriptor in a support::UniqueFd, so users of
# the header need statepool::support's include path too.
target_link_libraries(statepool_kernels_cuda PUBLIC statepool::support)
