# asynctp_add_layer(NAME <layer> DEPS <targets...> [SOURCES <files...>] [EXCLUDE <files...>]):
# one static library per layer folder, include root src/. Its sources: SOURCES, else those globbed
# from src/<layer> less EXCLUDE (the files a smaller library of the same folder builds).
function(asynctp_add_layer)
  cmake_parse_arguments(L "" "NAME" "DEPS;EXTRA_SOURCES;SOURCES;EXCLUDE" ${ARGN})
  if(L_SOURCES)
    set(_srcs ${L_SOURCES})
  else()
    file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
    foreach(_excluded IN LISTS L_EXCLUDE)
      list(REMOVE_ITEM _srcs ${CMAKE_CURRENT_SOURCE_DIR}/${_excluded})
    endforeach()
  endif()
  add_library(asynctp_${L_NAME} STATIC ${_srcs} ${L_EXTRA_SOURCES})
  target_include_directories(asynctp_${L_NAME} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
                             $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
  target_link_libraries(asynctp_${L_NAME} PUBLIC ${L_DEPS})
  target_compile_options(asynctp_${L_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
endfunction()

# asynctp_add_test(NAME <name> LABEL <cpu|gpu> [STREAMS <gtest filter>] [TIMEOUT <s>] SOURCES ...
# DEPS ...): one gtest binary, every test case registered with ctest under the label, with a
# time budget of TIMEOUT seconds (default 300). CPU tests run with the CPU streams' jitter seeded
# by the first of ASYNCTP_JITTER_SEEDS (tests/CMakeLists.txt); the tests that STREAMS selects
# (those that run the ops' schedules across streams and ranks) run again under each other seed,
# named <test>/jitter<seed>. NVTX_TOOL: where the build has NVTX (cmake/Nvtx.cmake), every test
# case runs again, named <test>/nvtx_tool, with the test NVTX tool loaded (NVTX_INJECTION64_PATH
# names tests/support/nvtx_recorder.cpp's library; support/nvtx_record.h reads its record).
function(asynctp_add_test)
  cmake_parse_arguments(T "NVTX_TOOL" "NAME;LABEL;TIMEOUT;STREAMS" "SOURCES;DEPS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} asynctp_test_support GTest::gtest_main)
  target_compile_options(${T_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  set(_seeds 0)
  if(T_LABEL STREQUAL "cpu" AND ASYNCTP_JITTER_SEEDS)
    set(_seeds ${ASYNCTP_JITTER_SEEDS})
  endif()
  list(POP_FRONT _seeds _first)
  gtest_discover_tests(${T_NAME} PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT}
                                            ENVIRONMENT ASYNCTP_CPU_STREAM_JITTER=${_first}
                       DISCOVERY_TIMEOUT 60)
  if(T_NVTX_TOOL AND ASYNCTP_NVTX_ENABLED)
    add_dependencies(${T_NAME} asynctp_nvtx_recorder)
    gtest_discover_tests(${T_NAME} TEST_SUFFIX "/nvtx_tool"
                         PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT}
                                    ENVIRONMENT NVTX_INJECTION64_PATH=${ASYNCTP_NVTX_RECORDER}
                         DISCOVERY_TIMEOUT 60)
  endif()
  if(T_STREAMS)
    foreach(_seed IN LISTS _seeds)
      gtest_discover_tests(${T_NAME} TEST_SUFFIX "/jitter${_seed}" TEST_FILTER "${T_STREAMS}"
                           PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT}
                                      ENVIRONMENT ASYNCTP_CPU_STREAM_JITTER=${_seed}
                           DISCOVERY_TIMEOUT 60)
    endforeach()
  endif()
endfunction()
