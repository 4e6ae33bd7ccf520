// model.safetensors.index.json: io::HfTensorFiles over a directory holding two fixed valid
// shards (tensors a, b in model-00001-of-00002.safetensors; c in model-00002-of-00002) and the
// fuzzed bytes as the index.
#include <filesystem>
#include <fstream>

#include "fuzz_util.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/safetensors.h"

namespace {
std::string make_dir() {
  namespace fs = std::filesystem;
  const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  const fs::path dir = base / ("ss_fuzz_index_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  using scalesweep::io::SafetensorsWriter;
  SafetensorsWriter s1;
  const float v[4] = {1, 2, 3, 4};
  s1.add_f32("a", {2}, std::span<const float>(v, 2));
  s1.add_f32("b", {2, 1}, std::span<const float>(v + 2, 2));
  s1.write((dir / "model-00001-of-00002.safetensors").string());
  SafetensorsWriter s2;
  s2.add_f32("c", {4}, std::span<const float>(v, 4));
  s2.write((dir / "model-00002-of-00002.safetensors").string());
  return dir.string();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace scalesweep::io;
  static const std::string dir = make_dir();
  {
    std::ofstream o(dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    o.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  ss_fuzz::expect_clear_refusal([&] {
    HfTensorFiles files(dir);
    for (const char* n : {"a", "b", "c", "d"}) (void)files.find(n);
  });
  return 0;
}
