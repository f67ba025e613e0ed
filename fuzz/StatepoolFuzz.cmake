# STATEPOOL_FUZZ: what the option does to the whole build, included by the top-level
# CMakeLists.txt after cmake/StatepoolCompilerOptions.cmake (fuzz/CMakeLists.txt has the
# targets).
#
# The targets need clang with libFuzzer (Debian: clang, libclang-rt-dev). When the
# compiler is something else, or -fsanitize=fuzzer does not link, this says why and sets
# STATEPOOL_HAVE_FUZZ OFF: nothing of fuzz/ is built and the rest of the build is as usual.
# When it does link, every target of the build is instrumented for coverage
# (-fsanitize=fuzzer-no-link) and built with ASan + UBSan, so that the fuzzers see into the
# libraries they drive and every memory error or undefined behaviour there is a crash.
# Such a build is for the fuzzers only (scripts/fuzz uses build-fuzz/).
#
# UBSan's -fsanitize=function is left out: clang 14 cannot emit its prologue data for the
# split parts of a C++20 coroutine once coverage instrumentation is on ("error: Cannot
# represent a difference across sections" in every file with an asio awaitable). The
# flags are set here, after StatepoolCompilerOptions, so that this exclusion comes after
# any -fsanitize=undefined on the command line.
set(STATEPOOL_HAVE_FUZZ OFF)
if(STATEPOOL_FUZZ)
  if(STATEPOOL_CLIENT_ONLY)
    message(FATAL_ERROR "STATEPOOL_FUZZ needs the daemon's libraries; turn STATEPOOL_CLIENT_ONLY off")
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(WARNING "statepool: STATEPOOL_FUZZ needs clang with libFuzzer; the compiler is "
                    "${CMAKE_CXX_COMPILER_ID}: the fuzz targets are not built "
                    "(configure with -DCMAKE_CXX_COMPILER=clang++)")
  else()
    include(CheckCXXSourceCompiles)
    set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer")
    set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=fuzzer")
    check_cxx_source_compiles([[
      #include <cstddef>
      #include <cstdint>
      extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }
    ]] STATEPOOL_LIBFUZZER_LINKS)
    unset(CMAKE_REQUIRED_FLAGS)
    unset(CMAKE_REQUIRED_LINK_OPTIONS)
    if(NOT STATEPOOL_LIBFUZZER_LINKS)
      message(WARNING "statepool: STATEPOOL_FUZZ: clang cannot link -fsanitize=fuzzer "
                      "(Debian: apt-get install libclang-rt-dev); the fuzz targets are not built")
    else()
      set(STATEPOOL_HAVE_FUZZ ON)
      add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined>
                          $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize=function>
                          $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                          $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>)
      add_link_options(-fsanitize=address,undefined)
      set(STATEPOOL_SANITIZE ON)  # as it is now, for the summary the top level prints
    endif()
  endif()
endif()
