# GPTQ needs BLAS (dger/dgemm/dsymm) and LAPACK (dpotrf/dpotri) through their C interfaces.
target_link_libraries(ss_gptq PRIVATE openblas lapacke)
