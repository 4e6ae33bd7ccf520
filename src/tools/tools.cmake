# Tools-side hook (included after the `scalesweep` target exists).
# CUDA operator: `scalesweep bench-gpu` is compiled in every build; with the kernels built
# (src/kernels/cuda, target ss_cuda) it is enabled by SS_HAVE_CUDA, otherwise it reports
# "built without CUDA".
if(TARGET ss_cuda)
  target_compile_definitions(scalesweep PRIVATE SS_HAVE_CUDA=1)
  target_link_libraries(scalesweep PRIVATE ss_cuda)
endif()
