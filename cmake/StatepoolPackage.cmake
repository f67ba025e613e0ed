# `cmake --install` for engines: the client library, the libraries it is built on, their
# headers and a CMake package, so that an engine's build does
#
#   find_package(statepool 0.1 REQUIRED)
#   target_link_libraries(engine PRIVATE statepool::client)
#
# statepool::client brings statepool::protocol (FlatBuffers), statepool::kernels (page
# format and codecs, to decode pages locally) and statepool::support. The package needs
# FlatBuffers, found again by the consumer; nothing else (no Boost, no prometheus-cpp).
# The daemon and the tools install their executables from their own folders.
include(CMakePackageConfigHelpers)

set(STATEPOOL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/statepool)

install(TARGETS statepool_client statepool_protocol statepool_kernels statepool_support
  EXPORT statepoolTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY
    ${PROJECT_SOURCE_DIR}/client/include/
    ${PROJECT_SOURCE_DIR}/protocol/include/
    ${PROJECT_SOURCE_DIR}/kernels/include/
    ${PROJECT_SOURCE_DIR}/support/include/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp")
# (protocol/CMakeLists.txt installs the generated statepool_generated.h beside them.)
install(EXPORT statepoolTargets
  NAMESPACE statepool::
  DESTINATION ${STATEPOOL_CMAKE_DIR})

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/statepoolConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/statepoolConfig.cmake
  INSTALL_DESTINATION ${STATEPOOL_CMAKE_DIR})
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/statepoolConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
    ${CMAKE_CURRENT_BINARY_DIR}/statepoolConfig.cmake
    ${CMAKE_CURRENT_BINARY_DIR}/statepoolConfigVersion.cmake
  DESTINATION ${STATEPOOL_CMAKE_DIR})
