// compressed-tensors NVFP4 ("nvfp4-pack-quantized") writer pieces and reader.
#include "scalesweep/io/compressed_tensors.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "io/atomic_file.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/file.h"
#include "scalesweep/quant/index_string.h"

namespace scalesweep::io {
namespace {

using nlohmann::json;

json nvfp4_args(bool activations) {
  // Field set and order of QuantizationArgs.model_dump() in compressed-tensors 0.14.0 to
  // 0.18.0 (kCompressedTensorsVersion), llm-compressor's NVFP4A16 / NVFP4 presets: the
  // weights' observer defaults to "memoryless_minmax" there (0.13: "minmax", 0.19: none),
  // zp_dtype serializes as null for symmetric args.
  json a = json::object();
  a["num_bits"] = 4;
  a["type"] = "float";
  a["symmetric"] = true;
  a["group_size"] = 16;
  a["strategy"] = "tensor_group";
  a["block_structure"] = nullptr;
  a["dynamic"] = activations ? json("local") : json(false);
  a["actorder"] = nullptr;
  a["scale_dtype"] = "torch.float8_e4m3fn";
  a["zp_dtype"] = nullptr;
  a["observer"] = activations ? "static_minmax" : "memoryless_minmax";
  a["observer_kwargs"] = json::object();
  return a;
}

TensorRef need(const TensorLookup& lookup, const std::string& name) {
  TensorRef r = lookup(name);
  if (!r.file || !r.info)
    throw IoError("compressed-tensors checkpoint: tensor '" + name + "' is missing");
  return r;
}

void expect(const TensorRef& r, StDType dtype, const std::vector<int64_t>& shape) {
  if (r.info->dtype != dtype || r.info->shape != shape)
    throw IoError(r.file->path() + ": tensor '" + r.info->name + "' is " +
                  std::string(dtype_name(r.info->dtype)) + " " + shape_str(r.info->shape) +
                  ", expected " + std::string(dtype_name(dtype)) + " " + shape_str(shape));
}

float read_scalar_f32(const TensorRef& r) {
  if (r.info->dtype != StDType::kF32 || r.info->numel() != 1)
    throw IoError(r.file->path() + ": tensor '" + r.info->name + "' is " +
                  std::string(dtype_name(r.info->dtype)) + " " + shape_str(r.info->shape) +
                  ", expected F32 [1]");
  float v;
  std::memcpy(&v, r.file->raw(*r.info).data(), 4);
  return v;
}

}  // namespace

json nvfp4_quantization_config(bool w4a4, int group_size, const std::vector<std::string>& ignore) {
  json weights = nvfp4_args(false);
  weights["group_size"] = group_size;
  json group = json::object();
  group["targets"] = json::array({"Linear"});
  group["weights"] = weights;
  if (w4a4) {
    json in = nvfp4_args(true);
    in["group_size"] = group_size;
    group["input_activations"] = in;
  } else {
    group["input_activations"] = nullptr;
  }
  group["output_activations"] = nullptr;
  group["format"] = "nvfp4-pack-quantized";
  json q = json::object();
  q["config_groups"] = json{{"group_0", group}};
  q["quant_method"] = "compressed-tensors";
  q["kv_cache_scheme"] = nullptr;
  q["format"] = "nvfp4-pack-quantized";
  q["quantization_status"] = "compressed";
  q["global_compression_ratio"] = nullptr;
  q["ignore"] = ignore;
  q["sparsity_config"] = json::object();
  q["transform_config"] = json::object();
  q["version"] = kCompressedTensorsVersion;
  return q;
}

CtInfo parse_quantization_config(const json& config, const std::string& where) {
  CtInfo info;
  if (!config.is_object() || !config.contains("quantization_config")) return info;
  const json& q = config["quantization_config"];
  if (q.is_null()) return info;
  info.present = true;
  auto bad = [&](const std::string& what) {
    return IoError(where + ": quantization_config: " + what +
                   " (supported: compressed-tensors nvfp4-pack-quantized, FP4 E2M1 weights "
                   "with FP8 E4M3 block scales, group size 16)");
  };
  if (!q.is_object()) throw bad("not an object");
  // Typed fields: absent (or null) reads as "" / 0, any other type than the one expected is
  // refused naming the field (nlohmann's own type_error would name neither file nor field).
  auto str = [&](const json& o, const char* key, const std::string& at) -> std::string {
    if (!o.contains(key) || o[key].is_null()) return "";
    if (!o[key].is_string()) throw bad(at + "'" + key + "' is " + o[key].dump() + ", not a string");
    return o[key].get<std::string>();
  };
  auto num = [&](const json& o, const char* key, const std::string& at) -> int64_t {
    if (!o.contains(key) || o[key].is_null()) return 0;
    if (!o[key].is_number_integer())
      throw bad(at + "'" + key + "' is " + o[key].dump() + ", not an integer");
    return o[key].is_number_unsigned() && o[key].get<uint64_t>() > INT64_MAX
               ? -1
               : o[key].get<int64_t>();
  };
  info.quant_method = str(q, "quant_method", "");
  if (info.quant_method != "compressed-tensors")
    throw bad("quant_method '" + info.quant_method + "' is not supported");
  info.format = str(q, "format", "");
  if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty())
    throw bad("no config_groups");
  bool first = true;
  for (const auto& [gname, g] : q["config_groups"].items()) {
    const std::string at = "group '" + gname + "' ";
    if (!g.is_object()) throw bad(at + "is not an object");
    const std::string gfmt =
        g.contains("format") && !g["format"].is_null() ? str(g, "format", at) : info.format;
    if (gfmt != "nvfp4-pack-quantized") throw bad(at + "has format '" + gfmt + "'");
    if (!g.contains("weights") || !g["weights"].is_object()) throw bad(at + "has no weights");
    const json& w = g["weights"];
    const std::string wat = at + "weights ";
    if (num(w, "num_bits", wat) != 4 || str(w, "type", wat) != "float")
      throw bad(at + "weights are not 4-bit float");
    const std::string strategy = str(w, "strategy", wat);
    if (strategy != "tensor_group" && strategy != "group")
      throw bad(at + "weight strategy '" + strategy + "'");
    const int64_t gs = num(w, "group_size", wat);
    if (gs != 16) throw bad(at + "group_size " + std::to_string(gs));
    const bool acts = g.contains("input_activations") && g["input_activations"].is_object();
    if (acts) {
      // NVFP4 activations as vLLM runs them: 4-bit float, 16-blocks with E4M3 scales chosen
      // per token at run time ("local"), one static global scale per Linear.
      const json& a = g["input_activations"];
      const std::string aat = at + "input_activations ";
      if (num(a, "num_bits", aat) != 4 || str(a, "type", aat) != "float" ||
          num(a, "group_size", aat) != 16 || str(a, "strategy", aat) != "tensor_group" ||
          !a.contains("dynamic") || a["dynamic"] != json("local"))
        throw bad(at + "input_activations " + a.dump() +
                  " are not NVFP4 (num_bits 4, type float, group_size 16, strategy "
                  "tensor_group, dynamic \"local\")");
    }
    for (const char* k : {"output_activations"})
      if (g.contains(k) && !g[k].is_null())
        throw bad(at + "has " + k + ", which the runtime does not implement");
    if (first) {
      info.group_size = static_cast<int>(gs);
      info.w4a4 = acts;
      first = false;
    } else if (info.w4a4 != acts) {
      throw bad("groups differ in input_activations (some W4A4, some weight-only)");
    }
  }
  if (q.contains("kv_cache_scheme") && !q["kv_cache_scheme"].is_null())
    throw bad("kv_cache_scheme " + q["kv_cache_scheme"].dump() +
              " is declared, which the runtime does not implement");
  if (q.contains("ignore") && !q["ignore"].is_null()) {
    if (!q["ignore"].is_array()) throw bad("'ignore' is " + q["ignore"].dump() + ", not a list");
    for (size_t i = 0; i < q["ignore"].size(); ++i) {
      const json& e = q["ignore"][i];
      if (!e.is_string())
        throw bad("'ignore'[" + std::to_string(i) + "] is " + e.dump() + ", not a module name");
      info.ignore.push_back(e.get<std::string>());
    }
  }
  info.nvfp4 = true;
  return info;
}

std::vector<TensorBlob> nvfp4_linear_tensors(const std::string& prefix, const QuantizedTensor& q,
                                             std::optional<float> input_global_scale) {
  if (q.format != TensorFormat::kNvfp4 || q.block != 16)
    throw IoError(prefix + ": compressed-tensors NVFP4 needs NVFP4 with block 16 (got block " +
                  std::to_string(q.block) + ")");
  std::vector<TensorBlob> out;
  out.push_back({prefix + ".weight_packed", StDType::kU8, {q.rows, q.packed_cols()}, q.codes});
  out.push_back(
      {prefix + ".weight_scale", StDType::kF8E4M3, {q.rows, q.blocks_per_row()}, q.scales});
  std::vector<uint8_t> g(4);
  std::memcpy(g.data(), &q.global_scale, 4);
  out.push_back({prefix + ".weight_global_scale", StDType::kF32, {1}, g});
  if (input_global_scale) {
    std::memcpy(g.data(), &*input_global_scale, 4);
    out.push_back({prefix + ".input_global_scale", StDType::kF32, {1}, g});
  }
  return out;
}

bool has_nvfp4_weight(const TensorLookup& lookup, const std::string& prefix) {
  const TensorRef r = lookup(prefix + ".weight_packed");
  return r.file && r.info;
}

model::Tensor view_nvfp4_weight(const TensorLookup& lookup, const std::string& prefix, int64_t rows,
                                int64_t cols) {
  if (rows <= 0 || cols <= 0)
    throw IoError(prefix + ": bad expected shape " + index_string(rows, cols));
  const int64_t pc = (cols + 1) / 2, bpr = (cols + 15) / 16;
  const TensorRef packed = need(lookup, prefix + ".weight_packed");
  const TensorRef scale = need(lookup, prefix + ".weight_scale");
  const TensorRef gscale = need(lookup, prefix + ".weight_global_scale");
  expect(packed, StDType::kU8, {rows, pc});
  expect(scale, StDType::kF8E4M3, {rows, bpr});
  model::Tensor t;
  t.shape = {rows, cols};
  t.dtype = model::WeightDType::kNvfp4;
  t.nvfp4_global_scale = read_scalar_f32(gscale);
  if (!std::isfinite(t.nvfp4_global_scale) || !(t.nvfp4_global_scale > 0))
    throw IoError(gscale.file->path() + ": tensor '" + gscale.info->name + "' = " +
                  std::to_string(t.nvfp4_global_scale) + " is not a finite positive global scale");
  const auto pb = packed.file->raw(*packed.info);
  const auto sb = scale.file->raw(*scale.info);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < bpr; ++b) {
      const uint8_t s = sb[static_cast<size_t>(r * bpr + b)];
      if ((s & 0x7F) == 0x7F)
        throw IoError(scale.file->path() + ": tensor '" + scale.info->name + "' element " +
                      index_string(r, b) + " is NaN (0x" + (s == 0xFF ? "FF" : "7F") + ")");
      if (s & 0x80)
        throw IoError(scale.file->path() + ": tensor '" + scale.info->name + "' element " +
                      index_string(r, b) + " is a negative block scale");
    }
  if (cols & 1)
    for (int64_t r = 0; r < rows; ++r)
      if (pb[static_cast<size_t>(r * pc + cols / 2)] >> 4)
        throw IoError(packed.file->path() + ": tensor '" + packed.info->name + "' row " +
                      std::to_string(r) + ": the pad nibble after column " +
                      std::to_string(cols - 1) + " is not zero");
  t.raw = pb.data();
  t.nvfp4_scales = sb.data();
  return t;
}

QuantizedTensor read_nvfp4_quantized(const TensorLookup& lookup, const std::string& prefix,
                                     int64_t rows, int64_t cols) {
  const model::Tensor v = view_nvfp4_weight(lookup, prefix, rows, cols);
  QuantizedTensor q;
  q.format = TensorFormat::kNvfp4;
  q.rows = rows;
  q.cols = cols;
  q.block = 16;
  q.global_scale = v.nvfp4_global_scale;
  const auto* codes = static_cast<const uint8_t*>(v.raw);
  q.codes.assign(codes, codes + rows * q.packed_cols());
  q.scales.assign(v.nvfp4_scales, v.nvfp4_scales + rows * q.blocks_per_row());
  return q;
}

std::vector<float> read_nvfp4_weight(const TensorLookup& lookup, const std::string& prefix,
                                     int64_t rows, int64_t cols) {
  const QuantizedTensor q = read_nvfp4_quantized(lookup, prefix, rows, cols);
  // Decoded here (not through scalesweep::dequantize) so that the reader stands on its own;
  // the arithmetic is the same: fl(fl(q * s) / gs) with q * s exact.
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const int64_t pc = q.packed_cols(), bpr = q.blocks_per_row();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t b = q.codes[static_cast<size_t>(r * pc + c / 2)];
      const uint8_t code = (c & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 15);
      const float s = format::E4M3::decode_f(q.scales[static_cast<size_t>(r * bpr + c / 16)]);
      out[static_cast<size_t>(r * cols + c)] = (format::kFp4Values.v[code] * s) / q.global_scale;
    }
  return out;
}

std::optional<float> read_input_global_scale(const TensorLookup& lookup,
                                             const std::string& prefix) {
  const TensorRef r = lookup(prefix + ".input_global_scale");
  if (!r.file || !r.info) return std::nullopt;
  const float v = read_scalar_f32(r);
  if (!std::isfinite(v) || !(v > 0))
    throw IoError(r.file->path() + ": tensor '" + r.info->name +
                  "' is not a finite positive global scale");
  return v;
}

// ---------------------------------------------------------------------------------------
namespace {
// Bytes of a declared tensor; `who` prefixes the error for a negative dimension.
uint64_t declared_nbytes(const std::string& who, const std::string& name, StDType dtype,
                         const std::vector<int64_t>& shape) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) throw IoError(who + ": tensor '" + name + "' has a negative shape");
    n *= static_cast<uint64_t>(d);
  }
  return n;
}
}  // namespace

struct SafetensorsStreamWriter::Impl {
  std::unique_ptr<AtomicFile> file;
};

SafetensorsStreamWriter::~SafetensorsStreamWriter() { delete impl_; }

void SafetensorsStreamWriter::declare(std::string name, StDType dtype, std::vector<int64_t> shape) {
  if (impl_) throw IoError("safetensors stream: declare() after open()");
  if (name.empty() || name.rfind("__", 0) == 0)
    throw IoError("safetensors stream: bad tensor name '" + name + "'");
  for (const auto& d : decls_)
    if (d.name == name) throw IoError("safetensors stream: duplicate tensor '" + name + "'");
  const uint64_t n = declared_nbytes("safetensors stream", name, dtype, shape);
  order_.declare(name, n);
  decls_.push_back({std::move(name), dtype, std::move(shape), n});
}

void SafetensorsStreamWriter::open(const std::string& path) {
  if (impl_) throw IoError(path + ": safetensors stream opened twice");
  json h = json::object();
  uint64_t off = 0;
  for (const auto& d : decls_) {
    h[d.name] = json{{"dtype", std::string(dtype_name(d.dtype))},
                     {"shape", d.shape},
                     {"data_offsets", json::array({off, off + d.nbytes})}};
    off += d.nbytes;
  }
  if (!metadata_.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h["__metadata__"] = m;
  }
  std::string text = h.dump();
  while ((8 + text.size()) % 8) text.push_back(' ');
  check_free_space(path, 8 + text.size() + off);
  impl_ = new Impl;
  impl_->file = std::make_unique<AtomicFile>(path);
  uint8_t len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  impl_->file->write(len, 8);
  impl_->file->write(text.data(), text.size());
  header_bytes_ = 8 + n;
}

void SafetensorsStreamWriter::write(std::string_view name, std::span<const uint8_t> bytes) {
  if (impl_) order_.check_whole(impl_->file->path(), name, bytes.size());
  write_part(name, bytes);
}

void SafetensorsStreamWriter::write_part(std::string_view name, std::span<const uint8_t> bytes) {
  if (!impl_) throw IoError("safetensors stream: write() before open()");
  order_.add_part(impl_->file->path(), name, bytes.size());  // checked before a byte is written
  impl_->file->write(bytes.data(), bytes.size());
}

void SafetensorsStreamWriter::commit() {
  if (!impl_) throw IoError("safetensors stream: commit() before open()");
  order_.check_complete(impl_->file->path());
  impl_->file->commit();
}

uint64_t SafetensorsStreamWriter::total_bytes() const {
  uint64_t t = header_bytes_;
  for (const auto& d : decls_) t += d.nbytes;
  return t;
}

// ---------------------------------------------------------------------------------------
void ShardedStreamWriter::declare(std::string name, StDType dtype, std::vector<int64_t> shape) {
  if (opened_) throw IoError("sharded safetensors: declare() after open()");
  const uint64_t n = declared_nbytes("sharded safetensors", name, dtype, shape);
  order_.declare(name, n);
  decls_.push_back({std::move(name), dtype, std::move(shape), n, 0});
}

void ShardedStreamWriter::open(const std::string& dir) {
  if (opened_) throw IoError(dir + ": sharded safetensors opened twice");
  // huggingface_hub split_state_dict_into_shards_factory, in stream order.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_size = 0;
  data_bytes_ = 0;
  for (size_t i = 0; i < decls_.size(); ++i) {
    const uint64_t b = decls_[i].nbytes;
    data_bytes_ += b;
    if (max_ > 0 && b > max_) {  // alone, numbered before the shard being filled
      shards.push_back({i});
      continue;
    }
    if (max_ > 0 && !current.empty() && current_size + b > max_) {
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += b;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  dir_ = dir;
  const size_t n = shards.size();
  files_.clear();
  for (size_t k = 0; k < n; ++k) {
    char name[64];
    if (n == 1)
      std::snprintf(name, sizeof name, "model.safetensors");
    else
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, n);
    files_.push_back(name);
  }
  shards_.clear();
  left_.assign(n, 0);
  started_.assign(n, false);
  sizes_.assign(n, 0);
  for (size_t k = 0; k < n; ++k) {
    auto w = std::make_unique<SafetensorsStreamWriter>();
    for (const auto& [key, v] : metadata_) w->set_metadata(key, v);
    for (size_t i : shards[k]) {
      decls_[i].shard = k;
      w->declare(decls_[i].name, decls_[i].dtype, decls_[i].shape);
      ++left_[k];
    }
    shards_.push_back(std::move(w));
  }
  // Every shard's data before the first is written (each shard checks its own file again).
  if (!files_.empty())
    check_free_space((std::filesystem::path(dir) / files_[0]).string(), data_bytes_);
  opened_ = true;
}

void ShardedStreamWriter::write(std::string_view name, std::span<const uint8_t> bytes) {
  if (opened_) order_.check_whole(dir_, name, bytes.size());
  write_part(name, bytes);
}

void ShardedStreamWriter::write_part(std::string_view name, std::span<const uint8_t> bytes) {
  if (!opened_) throw IoError("sharded safetensors: write() before open()");
  const size_t i = order_.next();
  const bool complete = order_.add_part(dir_, name, bytes.size());  // `name` is the one due
  const size_t k = decls_[i].shard;
  SafetensorsStreamWriter& w = *shards_[k];
  if (!started_[k]) {
    w.open((std::filesystem::path(dir_) / files_[k]).string());
    started_[k] = true;
  }
  w.write_part(name, bytes);
  if (complete && --left_[k] == 0) {  // the shard is complete: rename it, free its buffers
    w.commit();
    sizes_[k] = w.total_bytes();
    shards_[k].reset();
  }
}

void ShardedStreamWriter::commit() {
  if (!opened_) throw IoError("sharded safetensors: commit() before open()");
  order_.check_complete(dir_);
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (!shards_[k]) continue;
    // Only an empty shard (a model without tensors) is left here.
    shards_[k]->open((std::filesystem::path(dir_) / files_[k]).string());
    shards_[k]->commit();
    sizes_[k] = shards_[k]->total_bytes();
    shards_[k].reset();
  }
  if (files_.size() > 1) {
    json wm = json::object();  // std::map: keys sorted, as json.dumps(sort_keys=True)
    for (const auto& d : decls_) wm[d.name] = files_[d.shard];
    json index = json::object();
    // transformers' save_pretrained: {"total_parameters": model.num_parameters(), "total_size"}
    // (num_parameters counts the stored tensors' elements, packed ones as stored).
    uint64_t params = 0;
    for (const auto& d : decls_) params += d.nbytes / dtype_size(d.dtype);
    index["metadata"] = json{{"total_parameters", params}, {"total_size", data_bytes_}};
    index["weight_map"] = wm;
    write_file_atomic((std::filesystem::path(dir_) / "model.safetensors.index.json").string(),
                      index.dump(2) + "\n");
  }
}

uint64_t ShardedStreamWriter::file_bytes() const {
  uint64_t t = 0;
  for (uint64_t s : sizes_) t += s;
  return t;
}

}  // namespace scalesweep::io
