// Reading a compressed-tensors checkpoint back (include/scalesweep/pipeline/inspect.h).
#include "scalesweep/pipeline/inspect.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/gguf.h"
#include "scalesweep/io/hf.h"
#include "scalesweep/io/safetensors.h"

namespace scalesweep::pipeline {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool ends_with(const std::string& s, const std::string& x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

// The input features of the Linear `prefix` from config.json (packed weights store K/2 bytes
// per row, and a partial last block would make it ambiguous).
int64_t in_features(const json& cfg, const std::string& prefix, const std::string& where) {
  auto geti = [&](const char* k) -> int64_t {
    if (!cfg.contains(k) || !cfg[k].is_number_integer())
      throw io::IoError(where + ": config.json has no integer '" + std::string(k) + "'");
    return cfg[k].get<int64_t>();
  };
  if (ends_with(prefix, "o_proj")) {
    const int64_t hd = cfg.contains("head_dim") && cfg["head_dim"].is_number_integer()
                           ? cfg["head_dim"].get<int64_t>()
                           : geti("hidden_size") / geti("num_attention_heads");
    return geti("num_attention_heads") * hd;
  }
  if (ends_with(prefix, "down_proj")) return geti("intermediate_size");
  return geti("hidden_size");
}

}  // namespace

InspectKind inspect_kind(const std::string& path) {
  if (!fs::is_directory(path) && io::GgufFile::sniff(path)) return InspectKind::kGguf;
  if (!fs::is_directory(path))
    throw io::IoError(path + (fs::exists(path)
                                  ? ": not a directory nor a GGUF file (inspect reads a "
                                    "compressed-tensors checkpoint directory or a "
                                    "GGUF file)"
                                  : ": no such directory"));
  return InspectKind::kCheckpoint;
}

std::vector<std::string> checkpoint_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().string());
  return out;
}

CheckpointInspection inspect_checkpoint(const std::string& dir, const std::string& dump) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  std::ifstream f(cfg_path);
  if (!f) throw io::IoError(cfg_path + ": cannot read");
  json cfg;
  try {
    cfg = json::parse(f);
  } catch (const std::exception& e) {
    throw io::IoError(cfg_path + ": invalid JSON: " + e.what());
  }
  const io::CtInfo info = io::parse_quantization_config(cfg, cfg_path);
  if (!info.present)
    throw io::IoError(cfg_path + ": no quantization_config: not a quantized checkpoint");
  CheckpointInspection r;
  r.dir = dir;
  r.format = info.format;
  r.w4a4 = info.w4a4;
  r.ignore = info.ignore;
  // Files: model.safetensors or the shards of model.safetensors.index.json, as the model
  // loader reads them (io::HfTensorFiles).
  const io::HfTensorFiles files(dir);
  const io::TensorLookup lookup = files.lookup();
  io::SafetensorsWriter dumper;
  for (const auto& flp : files.files()) r.files.push_back(fs::path(flp->path()).filename());
  const std::string suf = ".weight_packed";
  for (const auto& flp : files.files())
    for (const auto& ti : flp->tensors()) {
      if (ti.name.size() <= suf.size() || !ends_with(ti.name, suf)) continue;
      const std::string prefix = ti.name.substr(0, ti.name.size() - suf.size());
      if (ti.shape.size() != 2) throw io::IoError(flp->path() + ": '" + ti.name + "' is not 2-D");
      InspectedLinear l;
      l.name = prefix;
      l.rows = ti.shape[0];
      l.cols = in_features(cfg, prefix, cfg_path);
      const std::vector<float> w = io::read_nvfp4_weight(lookup, prefix, l.rows, l.cols);
      l.weight_global_scale = io::read_nvfp4_quantized(lookup, prefix, l.rows, l.cols).global_scale;
      l.input_global_scale = io::read_input_global_scale(lookup, prefix);
      double s = 0;
      for (float v : w) s += std::fabs(v);
      l.mean_abs = s / static_cast<double>(w.size());
      if (!dump.empty()) dumper.add_f32(prefix + ".weight", {l.rows, l.cols}, w);
      r.linears.push_back(std::move(l));
    }
  // Modules the config leaves dense (ignore) that are stored as a plain PREFIX.weight.
  for (const std::string& m : info.ignore) {
    const io::TensorRef t = files.find(m + ".weight");
    if (t.info && t.info->shape.size() == 2)
      r.dense.push_back(
          {m, t.info->shape[0], t.info->shape[1], std::string(io::dtype_name(t.info->dtype))});
  }
  if (!dump.empty()) dumper.write(dump);
  return r;
}

}  // namespace scalesweep::pipeline
