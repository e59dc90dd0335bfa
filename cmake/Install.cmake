# install(): the public headers, the C ABI library, the static C++ layers with the headers they
# include, the `asynctp` command, and a CMake package config, so that
#   find_package(asynctp)  gives  asynctp::c (the C ABI)  and  asynctp::asynctp (C++).
# The C++ layers' headers still live under src/: they are installed under
# include/asynctp/internal/ (core/, runtime/, ...), which asynctp::asynctp puts on the include
# path next to include/, so that <asynctp/asynctp.h> and its "core/..." includes resolve.
#
# With SKBUILD (the Python wheel, scikit-build-core) only the component `python` exists: the C
# library at asynctp/lib/libasynctp_c.so relative to the wheel's root, and nothing else.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(SKBUILD)
  install(TARGETS asynctp_c LIBRARY DESTINATION asynctp/lib COMPONENT python)
  return()
endif()

set(ASYNCTP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/asynctp)
set(ASYNCTP_INSTALL_INTERNAL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/asynctp/internal)

# asynctp::asynctp: the C++ API (the ops layer and everything below it).
add_library(asynctp_cxx INTERFACE)
target_link_libraries(asynctp_cxx INTERFACE asynctp_ops)
set_target_properties(asynctp_cxx PROPERTIES EXPORT_NAME asynctp)

set(_asynctp_layers asynctp_core asynctp_runtime asynctp_device asynctp_symm asynctp_ops)
if(TARGET asynctp_kernels)
  list(APPEND _asynctp_layers asynctp_kernels)
endif()
foreach(_layer graph passes)
  if(TARGET asynctp_${_layer})
    list(APPEND _asynctp_layers asynctp_${_layer})
  endif()
endforeach()
foreach(_t IN LISTS _asynctp_layers)
  # The layers' include root is src/ in the build tree, internal/ once installed.
  set_property(TARGET ${_t} APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES
               $<INSTALL_INTERFACE:${ASYNCTP_INSTALL_INTERNAL_INCLUDEDIR}>
               $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endforeach()

install(TARGETS asynctp_c ${_asynctp_layers} asynctp_cxx asynctp_spdlog
        EXPORT asynctpTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS asynctp RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/asynctp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT development FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/ DESTINATION ${ASYNCTP_INSTALL_INTERNAL_INCLUDEDIR}
        COMPONENT development FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh"
        PATTERN "capi" EXCLUDE PATTERN "tools" EXCLUDE)

install(EXPORT asynctpTargets NAMESPACE asynctp:: DESTINATION ${ASYNCTP_INSTALL_CMAKEDIR}
        COMPONENT development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/asynctpConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/asynctpConfig.cmake
                              INSTALL_DESTINATION ${ASYNCTP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/asynctpConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/asynctpConfig.cmake
              ${PROJECT_BINARY_DIR}/asynctpConfigVersion.cmake
        DESTINATION ${ASYNCTP_INSTALL_CMAKEDIR} COMPONENT development)
