#include "scalesweep/io/gguf.h"

namespace scalesweep::io {

// Skeleton: the API compiles; the implementation follows in the next commits.
std::string ggml_type_name(uint32_t type) { return "type " + std::to_string(type); }
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t) { return std::nullopt; }
std::string gguf_value_type_name(uint32_t type) { return "type " + std::to_string(type); }
int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}
GgufFile GgufFile::open(const std::string& path) {
  throw IoError(path + ": GGUF reader not implemented yet");
}
bool GgufFile::sniff(const std::string&) { return false; }
const GgufValue* GgufFile::find_kv(std::string_view) const { return nullptr; }
std::optional<std::string> GgufFile::get_string(std::string_view) const { return std::nullopt; }
std::optional<int64_t> GgufFile::get_int(std::string_view) const { return std::nullopt; }
std::optional<double> GgufFile::get_float(std::string_view) const { return std::nullopt; }
std::optional<bool> GgufFile::get_bool(std::string_view) const { return std::nullopt; }
std::optional<std::vector<std::string>> GgufFile::get_string_array(std::string_view) const {
  return std::nullopt;
}
std::optional<std::vector<double>> GgufFile::get_float_array(std::string_view) const {
  return std::nullopt;
}
std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view) const {
  return std::nullopt;
}
const GgufTensorInfo* GgufFile::find_tensor(std::string_view) const { return nullptr; }
std::vector<float> GgufFile::dequantize(const GgufTensorInfo& t) const {
  throw IoError(path() + ": tensor '" + t.name + "': dequantization not implemented yet");
}
void ggml_dequantize(uint32_t type, const uint8_t*, int64_t, float*) {
  throw IoError("dequantization of " + ggml_type_name(type) + " not implemented yet");
}

}  // namespace scalesweep::io
