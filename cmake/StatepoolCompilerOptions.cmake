# Warning and sanitizer flags shared by every statepool target.
# Targets opt in with statepool_target_defaults(<target>).

add_library(statepool_warnings INTERFACE)
target_compile_options(statepool_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
    -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough>)
if(STATEPOOL_WERROR)
  target_compile_options(statepool_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()

if(STATEPOOL_SANITIZE)
  # Applied globally so that every object, test and helper executable agrees on the runtime.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=address,undefined)
endif()

function(statepool_target_defaults target)
  target_link_libraries(${target} PRIVATE statepool_warnings)
endfunction()
