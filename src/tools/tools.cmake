# Tools-side hook (included after the `scalesweep` target exists).
# CUDA operator: `scalesweep bench-gpu` is compiled in every build; with the kernels built
# (src/kernels/cuda, target ss_cuda) it is enabled by SS_HAVE_CUDA, otherwise it reports
# "built without CUDA".
if(TARGET ss_cuda)
  target_compile_definitions(scalesweep PRIVATE SS_HAVE_CUDA=1)
  target_link_libraries(scalesweep PRIVATE ss_cuda)
endif()

# Unit tests of the CLI helpers that have no library below them (src/tools/*_test.cc).
if(SS_BUILD_TESTS)
  file(GLOB tools_tests CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/tools/*_test.cc)
  if(tools_tests)
    add_executable(tools_test ${tools_tests} ${CMAKE_SOURCE_DIR}/src/tools/ui.cc
                              ${CMAKE_SOURCE_DIR}/src/tools/options.cc
                              ${CMAKE_SOURCE_DIR}/src/tools/output.cc)
    target_include_directories(tools_test PRIVATE ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(tools_test PRIVATE ss_io GTest::gtest GTest::gtest_main)
    gtest_discover_tests(tools_test DISCOVERY_TIMEOUT 120 PROPERTIES LABELS tools)
  endif()
endif()
