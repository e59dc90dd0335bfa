# asynctp_add_layer(NAME <layer> DEPS <targets...>): one static library per layer folder,
# sources globbed from src/<layer>, include root src/.
function(asynctp_add_layer)
  cmake_parse_arguments(L "" "NAME" "DEPS;EXTRA_SOURCES" ${ARGN})
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  add_library(asynctp_${L_NAME} STATIC ${_srcs} ${L_EXTRA_SOURCES})
  target_include_directories(asynctp_${L_NAME} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
                             $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
  target_link_libraries(asynctp_${L_NAME} PUBLIC ${L_DEPS})
  target_compile_options(asynctp_${L_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
endfunction()

# asynctp_add_test(NAME <name> LABEL <cpu|gpu> SOURCES ... DEPS ...): one gtest binary, every
# test case registered with ctest under the label.
function(asynctp_add_test)
  cmake_parse_arguments(T "" "NAME;LABEL;TIMEOUT" "SOURCES;DEPS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} asynctp_test_support GTest::gtest_main)
  target_compile_options(${T_NAME} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  gtest_discover_tests(${T_NAME} PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT}
                       DISCOVERY_TIMEOUT 60)
endfunction()
