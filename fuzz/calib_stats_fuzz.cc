// Calibration statistics files: io::load_calib_stats (with and without X^T X) over the bytes
// as a file.
#include "fuzz_util.h"
#include "scalesweep/io/calib_stats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::io;
  ss_fuzz::MemFile f(data, size);
  for (bool xtx : {true, false})
    ss_fuzz::expect_clear_refusal([&] { (void)load_calib_stats(f.path(), xtx); });
  return 0;
}
