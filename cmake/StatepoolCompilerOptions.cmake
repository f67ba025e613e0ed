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

if(STATEPOOL_SANITIZE)
  # Applied globally so that every object, test and helper executable agrees on the runtime.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=address,undefined)
endif()

function(statepool_target_defaults target)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${STATEPOOL_WARNING_FLAGS}>")
endfunction()
