# Warning and sanitizer flags shared by every statepool target.
# Targets opt in with statepool_target_defaults(<target>).
#
# Warnings are errors when STATEPOOL_WERROR is ON: the project's own scripts and CI turn it
# on (scripts/build); a plain configure, as a packager runs it with their own compiler and
# flags, leaves it off, so a new compiler's new warning never breaks their build.
#
# The flags are set on each target directly (not through an interface library), so
# nothing about them reaches the installed CMake package.

set(STATEPOOL_WARNING_FLAGS
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
  -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough)
# GCC 12 at -O3 reports -Wrestrict inside libstdc++'s std::string operator+ when it inlines
# `"literal" + std::string(...)` (GCC bug 105651, fixed in GCC 13): a false positive in the
# standard library, not in our code, so that one warning is off for GCC 12.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  list(APPEND STATEPOOL_WARNING_FLAGS -Wno-restrict)
endif()
if(STATEPOOL_WERROR)
  list(APPEND STATEPOOL_WARNING_FLAGS -Werror)
endif()

# Applied globally so that every object, test and helper executable agrees on the runtime.
if(STATEPOOL_SANITIZE STREQUAL "thread")
  if(STATEPOOL_CUDA)
    message(STATUS "statepool: STATEPOOL_SANITIZE=thread builds no CUDA code (STATEPOOL_CUDA off)")
    set(STATEPOOL_CUDA OFF CACHE BOOL "Build the CUDA kernels when nvcc is found" FORCE)
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=thread)
  # ThreadSanitizer does not model std::atomic_thread_fence (GCC warns, -Wtsan). Asio
  # fences around each handler it runs; the scheduler's mutex orders posting and running
  # a handler already, which TSan sees, so Asio's null fenced block is used here.
  add_compile_definitions(BOOST_ASIO_DISABLE_FENCED_BLOCK)
  # The ifunc resolvers of target_clones (kernels/cpu/simd.hpp) run while the dynamic
  # loader relocates, before the TSan runtime is up, and crash once instrumented: the
  # TSan build runs the portable loops.
  add_compile_definitions(STATEPOOL_NO_SIMD_CLONES)
elseif(STATEPOOL_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=address,undefined)
endif()

function(statepool_target_defaults target)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${STATEPOOL_WARNING_FLAGS}>")
endfunction()
