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

# The opt-in bf16 compute mode (model/bf16_gemm.h) runs its matrix products with oneDNN
# (Debian libdnnl-dev, scripts/setup.sh). Optional: without it the build goes on and
# --compute bf16 is refused with a message.
# (Found by header and library: Debian's dnnl CMake config also demands OpenCL, which the CPU
# runtime does not use.)
find_path(SS_DNNL_INCLUDE oneapi/dnnl/dnnl.hpp)
find_library(SS_DNNL_LIB dnnl)
find_package(OpenMP COMPONENTS CXX)  # Debian's oneDNN threads with OpenMP (libgomp)
if(SS_DNNL_INCLUDE AND SS_DNNL_LIB AND OpenMP_CXX_FOUND)
  message(STATUS "oneDNN (${SS_DNNL_LIB}): bf16 compute mode (--compute bf16) enabled")
  target_include_directories(ss_model PRIVATE ${SS_DNNL_INCLUDE})
  target_link_libraries(ss_model PRIVATE ${SS_DNNL_LIB} OpenMP::OpenMP_CXX)
  target_compile_definitions(ss_model PRIVATE SS_HAVE_DNNL=1)
else()
  message(WARNING "oneDNN (libdnnl-dev) or OpenMP not found: --compute bf16 will be refused with a "
                  "message; install it (scripts/setup.sh) to enable the bf16 compute mode")
endif()
