// `scalesweep inspect` (layer `pipeline`): which kind of file a path is, and the contents of
// a compressed-tensors NVFP4 checkpoint directory (any producer's) read back through the
// model loader's readers (io::HfTensorFiles, io::read_nvfp4_weight), optionally with every
// quantized Linear's dequantized weights written to a safetensors file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace scalesweep::pipeline {

enum class InspectKind { kCheckpoint, kGguf };

// kGguf for a file that starts like GGUF (io::GgufFile::sniff), kCheckpoint for a directory;
// throws io::IoError naming the path for anything else ("no such directory", "not a directory
// nor a GGUF file").
InspectKind inspect_kind(const std::string& path);

struct InspectedLinear {
  std::string name;  // module prefix (PREFIX.weight_packed)
  int64_t rows = 0, cols = 0;
  float weight_global_scale = 0;
  std::optional<float> input_global_scale;
  double mean_abs = 0;  // mean |w| of the dequantized weight
};

struct InspectedDense {  // a module of quantization_config.ignore stored as PREFIX.weight
  std::string name;
  int64_t rows = 0, cols = 0;
  std::string dtype;
};

struct CheckpointInspection {
  std::string dir, format;
  bool w4a4 = false;
  std::vector<std::string> ignore, files;  // files: names within `dir`
  std::vector<InspectedLinear> linears;    // in file order
  std::vector<InspectedDense> dense;
};

// The files `dir` holds (full paths), for an output check that must never name one of them.
std::vector<std::string> checkpoint_files(const std::string& dir);

// Reads the checkpoint in `dir`; when `dump` is non-empty writes the dequantized fp32 weights
// (PREFIX.weight) there. Throws io::IoError naming the file and field/tensor: no config.json,
// invalid JSON, no quantization_config, a packed weight that is not 2-D, ...
CheckpointInspection inspect_checkpoint(const std::string& dir, const std::string& dump = "");

}  // namespace scalesweep::pipeline
