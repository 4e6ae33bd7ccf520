# quant layer extras: the fast CPU kernels (src/quant/simd) use Highway runtime dispatch.
find_package(hwy REQUIRED)
target_link_libraries(ss_quant PRIVATE hwy::hwy)
