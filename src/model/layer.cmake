# Layer `model`: the CPU runtime uses BLAS sgemm/sgemv (OpenBLAS, threaded) for prefill and
# decode, and dsyrk for calibration Hessians.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(SS_OPENBLAS QUIET IMPORTED_TARGET openblas)
endif()
if(SS_OPENBLAS_FOUND)
  target_link_libraries(ss_model PRIVATE PkgConfig::SS_OPENBLAS)
  target_compile_definitions(ss_model PRIVATE SS_HAVE_OPENBLAS=1)
else()
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS REQUIRED)
  find_path(SS_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas openblas-pthread
            x86_64-linux-gnu/openblas-pthread REQUIRED)
  target_include_directories(ss_model PRIVATE ${SS_CBLAS_INCLUDE})
  target_link_libraries(ss_model PRIVATE BLAS::BLAS)
  target_compile_definitions(ss_model PRIVATE SS_HAVE_OPENBLAS=1)
endif()
