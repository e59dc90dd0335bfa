# install(): the public headers (include/asynctp/*.h, and nothing of src/), the C ABI library,
# the static C++ layers, the `asynctp` command, and a CMake package config, so that
#   find_package(asynctp)  gives  asynctp::c (the C ABI)  and  asynctp::asynctp (C++).
# asynctp::asynctp's include path is the installed include/ alone: the public headers include
# only each other and standard headers (tests/install/public_headers_test.cmake checks that), and
# the static layers it links carry no include path of their own once installed.
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

# asynctp::asynctp: the C++ API (the public headers; the ops layer and everything below it).
add_library(asynctp_cxx INTERFACE)
target_link_libraries(asynctp_cxx INTERFACE asynctp_ops)
target_include_directories(asynctp_cxx INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                                 $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set_target_properties(asynctp_cxx PROPERTIES EXPORT_NAME asynctp)

set(_asynctp_layers asynctp_core asynctp_runtime asynctp_device asynctp_symm asynctp_ops)
if(TARGET asynctp_kernels)
  list(APPEND _asynctp_layers asynctp_kernels)
endif()
foreach(_layer graph_ir graph passes)
  if(TARGET asynctp_${_layer})
    list(APPEND _asynctp_layers asynctp_${_layer})
  endif()
endforeach()
install(TARGETS asynctp_c ${_asynctp_layers} asynctp_cxx asynctp_spdlog
        EXPORT asynctpTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS asynctp RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
file(GLOB _asynctp_public_headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/asynctp/*.h)
install(FILES ${_asynctp_public_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/asynctp
        COMPONENT development)

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
