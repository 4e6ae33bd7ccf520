// safetensors: SafetensorsFile::open (header and data-region validation) over the bytes as a
// file, then every tensor's raw bytes and, for the readable dtypes, its values as fp32.
#include "fuzz_util.h"
#include "scalesweep/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::io;
  ss_fuzz::MemFile f(data, size);
  ss_fuzz::expect_clear_refusal([&] {
    SafetensorsFile st = SafetensorsFile::open(f.path());
    for (const TensorInfo& t : st.tensors()) {
      std::span<const uint8_t> r = st.raw(t);
      if (r.size() != t.nbytes) std::abort();
      if (t.offset + t.nbytes > size) std::abort();  // validated against the file
      if (dtype_is_readable(t.dtype) && t.numel() <= ss_fuzz::kMaxDecodeElems) {
        std::vector<float> v = st.read_f32(t);
        if (static_cast<int64_t>(v.size()) != t.numel()) std::abort();
      }
      if (st.find(t.name) == nullptr) std::abort();
    }
    for (const auto& [k, v] : st.metadata()) (void)k, (void)v;
  });
  return 0;
}
