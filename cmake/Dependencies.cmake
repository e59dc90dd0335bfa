# Every third-party dependency comes from a Debian package (scripts/deps.sh installs them).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
if(ASYNCTP_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

# spdlog and fmt header-only, so that the binaries depend on no shared library but the CUDA ones
# (the GPU machines carry none of the build machine's packages). spdlog's own header-only target
# still links the shared fmt, hence this one.
get_target_property(_spdlog_include spdlog::spdlog_header_only INTERFACE_INCLUDE_DIRECTORIES)
add_library(asynctp_spdlog INTERFACE)
target_include_directories(asynctp_spdlog SYSTEM INTERFACE ${_spdlog_include})
target_compile_definitions(asynctp_spdlog INTERFACE SPDLOG_FMT_EXTERNAL)
target_link_libraries(asynctp_spdlog INTERFACE fmt::fmt-header-only Threads::Threads)
