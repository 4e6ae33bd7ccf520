// .npy: io::parse_npy over the bytes, and io::read_npy_f32 over the same bytes as a file.
#include "fuzz_util.h"
#include "scalesweep/io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::io;
  ss_fuzz::expect_clear_refusal([&] {
    NpyArray a = parse_npy(std::span<const uint8_t>(data, size), "fuzz.npy");
    if (a.numel() * static_cast<int64_t>(dtype_size(a.dtype)) !=
        static_cast<int64_t>(a.data.size()))
      std::abort();  // parse_npy promises data matching the shape
  });
  ss_fuzz::MemFile f(data, size);
  ss_fuzz::expect_clear_refusal([&] {
    NpyF32 a = read_npy_f32(f.path());
    int64_t n = 1;
    for (int64_t d : a.shape) n *= d;
    if (n != static_cast<int64_t>(a.data.size())) std::abort();
  });
  return 0;
}
