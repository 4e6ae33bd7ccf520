#include "scalesweep/io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <span>

#include "io/atomic_file.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/file.h"

namespace scalesweep::io {

using nlohmann::json;

namespace {

struct DTypeEntry {
  StDType d;
  size_t bits;
  bool readable;
};
// Every dtype of the reference implementation (huggingface/safetensors `Dtype`, with its
// `bitsize`; names in kStDTypeNames); the last six are accepted in a file but their data is not
// read here.
constexpr DTypeEntry kDTypes[] = {
    {StDType::kF64, 64, true},        {StDType::kF32, 32, true},
    {StDType::kF16, 16, true},        {StDType::kBF16, 16, true},
    {StDType::kI64, 64, true},        {StDType::kI32, 32, true},
    {StDType::kI16, 16, true},        {StDType::kI8, 8, true},
    {StDType::kU64, 64, true},        {StDType::kU32, 32, true},
    {StDType::kU16, 16, true},        {StDType::kU8, 8, true},
    {StDType::kBool, 8, true},        {StDType::kF8E4M3, 8, true},
    {StDType::kF8E5M2, 8, true},      {StDType::kF8E8M0, 8, true},
    {StDType::kF4, 4, false},         {StDType::kF6E2M3, 6, false},
    {StDType::kF6E3M2, 6, false},     {StDType::kF8E4M3FNUZ, 8, false},
    {StDType::kF8E5M2FNUZ, 8, false}, {StDType::kC64, 64, false},
};

const DTypeEntry& entry(StDType d) {
  for (const auto& e : kDTypes) {
    if (e.d == d) return e;
  }
  throw IoError("internal: unknown dtype enum");
}

std::string qname(std::string_view s) {
  // JSON-escaped, so control characters in hostile names stay readable.
  const std::string j = json(std::string(s)).dump(-1, ' ', true, json::error_handler_t::replace);
  std::string out(1, '\'');
  out.append(j, 1, j.size() - 2);
  out.push_back('\'');
  return out;
}

// Bytes of `shape` elements of dtype `d`, computed as the reference implementation's
// `validate` does: numel * bits, which must be a multiple of 8, then / 8. Returns false
// with *why set on overflow or a bit count that is not a whole number of bytes.
bool byte_size(const std::vector<int64_t>& shape, StDType d, uint64_t* out, std::string* why) {
  uint64_t n = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(dim), &n)) {
      *why = "shape " + shape_str(shape) + " overflows";
      return false;
    }
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(entry(d).bits), &bits)) {
    *why = "shape " + shape_str(shape) + " overflows";
    return false;
  }
  if (bits % 8 != 0) {
    *why = std::string(dtype_name(d)) + " " + shape_str(shape) + " is " + std::to_string(bits) +
           " bits, not a whole number of bytes";
    return false;
  }
  *out = bits / 8;
  return true;
}

}  // namespace

std::string_view dtype_name(StDType d) { return kStDTypeNames.name(d); }
size_t dtype_bits(StDType d) { return entry(d).bits; }
size_t dtype_size(StDType d) {
  const DTypeEntry& e = entry(d);
  if (e.bits % 8 != 0) {
    throw IoError("dtype " + std::string(dtype_name(d)) + " has " + std::to_string(e.bits) +
                  "-bit elements, no whole-byte element size");
  }
  return e.bits / 8;
}
bool dtype_is_readable(StDType d) { return entry(d).readable; }
bool dtype_is_float(StDType d) {
  return d == StDType::kF32 || d == StDType::kF16 || d == StDType::kBF16 || d == StDType::kF64;
}

StDType parse_dtype(std::string_view s) {
  if (const auto d = kStDTypeNames.find(s)) return *d;
  throw IoError("unsupported dtype " + qname(s) +
                " (not a dtype of the safetensors format, so its byte size cannot be checked)");
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// ----------------------------------------------------------------------- SafetensorsFile

namespace {

// Builds the errors of one file's reading: "<path>: <what>".
struct FileError {
  const std::string& path;
  IoError operator()(const std::string& what) const { return IoError(path + ": " + what); }
};

// The JSON header's text: the 8-byte little-endian length, then that many bytes from '{'.
std::string_view header_text(std::span<const uint8_t> bytes, const FileError& fail) {
  const uint64_t fsize = bytes.size();
  if (fsize < 8) {
    throw fail("truncated: " + std::to_string(fsize) +
               " bytes, a safetensors file starts with an 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > SafetensorsFile::kMaxHeaderBytes) {
    throw fail("header length " + std::to_string(n) + " exceeds the limit of " +
               std::to_string(SafetensorsFile::kMaxHeaderBytes) +
               " bytes (corrupt or not a safetensors file)");
  }
  if (n > fsize - 8) {
    throw fail("header length " + std::to_string(n) + " runs past the end of the file (" +
               std::to_string(fsize) + " bytes): truncated or corrupt");
  }
  if (n < 2) throw fail("header of " + std::to_string(n) + " bytes is too short for JSON");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), n);
  if (text.front() != '{') throw fail("header does not start with '{' (not a safetensors file)");
  return text;
}

// Parses the header, rejecting duplicate top-level names (nlohmann would silently keep the
// last one).
json parse_header(std::string_view text, const FileError& fail) {
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key) {
      const std::string k = parsed.get<std::string>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json h;
  try {
    h = json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) throw fail("header names " + qname(duplicate) + " twice");
  if (!h.is_object()) throw fail("header is not a JSON object");
  return h;
}

// The header's entry of tensor `name`: dtype, shape and data_offsets (relative to the data
// region of `data_size` bytes at `data_start`), the byte count matching the shape.
TensorInfo parse_tensor_entry(const std::string& name, const json& v, uint64_t data_start,
                              uint64_t data_size, const FileError& fail) {
  const std::string tn = "tensor " + qname(name);
  if (name.empty()) throw fail("a tensor has an empty name");
  if (!v.is_object()) throw fail(tn + ": entry is not an object");
  for (auto k = v.begin(); k != v.end(); ++k) {
    if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets") {
      throw fail(tn + ": unknown field " + qname(k.key()));
    }
  }
  if (!v.contains("dtype") || !v["dtype"].is_string()) throw fail(tn + ": missing dtype");
  if (!v.contains("shape") || !v["shape"].is_array()) throw fail(tn + ": missing shape");
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
      v["data_offsets"].size() != 2) {
    throw fail(tn + ": data_offsets must be [begin, end]");
  }
  TensorInfo t;
  t.name = name;
  try {
    t.dtype = parse_dtype(v["dtype"].get<std::string>());
  } catch (const IoError& e) {
    throw fail(tn + ": " + e.what());
  }
  const json& shape = v["shape"];
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!shape[i].is_number_unsigned() || shape[i].get<uint64_t>() > (uint64_t{1} << 62)) {
      throw fail(tn + ": shape[" + std::to_string(i) + "] = " + shape[i].dump() +
                 " is not a non-negative integer");
    }
    t.shape.push_back(static_cast<int64_t>(shape[i].get<uint64_t>()));
  }
  const json& off = v["data_offsets"];
  for (int i = 0; i < 2; ++i) {
    if (!off[i].is_number_unsigned()) {
      throw fail(tn + ": data_offsets[" + std::to_string(i) + "] = " + off[i].dump() +
                 " is not a non-negative integer");
    }
  }
  const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
  const std::string range = "data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + ")";
  if (e < b) throw fail(tn + ": " + range + " end before begin");
  if (e > data_size) {
    throw fail(tn + ": " + range + " beyond the data region of " + std::to_string(data_size) +
               " bytes (file truncated or header lies)");
  }
  uint64_t need = 0;
  std::string why;
  if (!byte_size(t.shape, t.dtype, &need, &why)) throw fail(tn + ": " + why);
  if (need != e - b) {
    throw fail(tn + ": " + range + " hold " + std::to_string(e - b) + " bytes but " +
               std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape) + " needs " +
               std::to_string(need));
  }
  t.offset = data_start + b;
  t.nbytes = e - b;
  return t;
}

// As the reference implementation (huggingface/safetensors, Metadata::validate and
// read_metadata): in offset order (`tensors` sorted so) every tensor starts exactly where the
// previous one ends (no gap, no overlap), the first at 0, and the last one ends at the end of
// the file.
void check_contiguous(const std::vector<TensorInfo>& tensors, uint64_t data_start, uint64_t fsize,
                      const FileError& fail) {
  auto rel = [&](uint64_t file_off) { return std::to_string(file_off - data_start); };
  auto range_of = [&](const TensorInfo& t) {
    return "data_offsets [" + rel(t.offset) + ", " + rel(t.offset + t.nbytes) + ")";
  };
  uint64_t expect = data_start;
  const TensorInfo* prev = nullptr;
  for (const auto& t : tensors) {
    if (t.offset < expect) {
      throw fail("tensors " + qname(prev->name) + " (" + range_of(*prev) + ") and " +
                 qname(t.name) + " (" + range_of(t) + ") overlap in the data region");
    }
    if (t.offset > expect) {
      throw fail("tensor " + qname(t.name) + ": " + range_of(t) + " leaves " +
                 std::to_string(t.offset - expect) + " unused bytes after " +
                 (prev ? "tensor " + qname(prev->name) + " (" + range_of(*prev) + ")"
                       : std::string("the start of the data region")) +
                 "; offsets must be contiguous");
    }
    expect = t.offset + t.nbytes;
    prev = &t;
  }
  if (expect != fsize) {
    throw fail("data region holds " + std::to_string(fsize - data_start) +
               " bytes but the tensors end at " + rel(expect) +
               (prev ? " (last: " + qname(prev->name) + ", " + range_of(*prev) + ")"
                     : std::string(" (no tensors)")) +
               ": " + std::to_string(fsize - expect) +
               " trailing bytes (truncated, appended to, or a corrupt header)");
  }
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.map_ = MappedFile(path);
  const auto bytes = f.map_.bytes();
  const uint64_t fsize = bytes.size();
  const FileError fail{path};
  const std::string_view text = header_text(bytes, fail);
  const json h = parse_header(text, fail);
  const uint64_t data_start = 8 + text.size();
  const uint64_t data_size = fsize - data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name != "__metadata__") {
      f.tensors_.push_back(parse_tensor_entry(name, v, data_start, data_size, fail));
      continue;
    }
    if (!v.is_object()) throw fail("__metadata__ is not an object");
    for (auto m = v.begin(); m != v.end(); ++m) {
      if (!m.value().is_string()) {
        throw fail("__metadata__ value of " + qname(m.key()) + " is not a string");
      }
      f.metadata_[m.key()] = m.value().get<std::string>();
    }
  }
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  check_contiguous(f.tensors_, data_start, fsize, fail);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::at(std::string_view name) const {
  if (const TensorInfo* t = find(name)) return *t;
  std::string names;
  size_t shown = 0;
  for (const auto& t : tensors_) {
    if (shown == 8) {
      names += ", ...";
      break;
    }
    names += (shown ? ", " : "") + t.name;
    ++shown;
  }
  throw IoError(path() + ": no tensor " + qname(name) + " (it has " +
                std::to_string(tensors_.size()) + ": " + names + ")");
}

std::span<const uint8_t> SafetensorsFile::raw(const TensorInfo& t) const {
  if (!dtype_is_readable(t.dtype)) {
    throw IoError(path() + ": tensor " + qname(t.name) + " has dtype " +
                  std::string(dtype_name(t.dtype)) +
                  ", which scalesweep does not read (the file is valid; this tensor's data "
                  "cannot be used)");
  }
  return map_.bytes().subspan(t.offset, t.nbytes);
}

std::vector<float> SafetensorsFile::read_f32(const TensorInfo& t) const {
  const auto b = raw(t);
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  switch (t.dtype) {
    case StDType::kF32:
      std::memcpy(out.data(), b.data(), n * 4);
      break;
    case StDType::kF16:
      for (size_t i = 0; i < n; ++i) {
        out[i] = format::f16_to_f32(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)));
      }
      break;
    case StDType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        out[i] = format::bf16_to_f32(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)));
      }
      break;
    case StDType::kF64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, b.data() + 8 * i, 8);
        if (std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max()) {
          throw IoError(path() + ": tensor " + qname(t.name) + ": element " + std::to_string(i) +
                        " = " + std::to_string(d) + " overflows float32");
        }
        out[i] = static_cast<float>(d);
      }
      break;
    default:
      throw IoError(path() + ": tensor " + qname(t.name) + " has dtype " +
                    std::string(dtype_name(t.dtype)) +
                    "; only F32, F16, BF16 and F64 convert to float");
  }
  return out;
}

// ---------------------------------------------------------------------- SafetensorsWriter

void SafetensorsWriter::add(std::string name, StDType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t>&& bytes) {
  if (name.empty()) throw IoError("safetensors writer: empty tensor name");
  if (name.rfind("__", 0) == 0) {
    throw IoError("safetensors writer: tensor name " + qname(name) + " starts with \"__\"");
  }
  for (const auto& e : entries_) {
    if (e.name == name) throw IoError("safetensors writer: duplicate tensor " + qname(name));
  }
  uint64_t need = 0;
  std::string why;
  if (!byte_size(shape, dtype, &need, &why)) {
    throw IoError("safetensors writer: tensor " + qname(name) + ": " + why);
  }
  if (need != bytes.size()) {
    throw IoError("safetensors writer: tensor " + qname(name) + ": " +
                  std::to_string(bytes.size()) + " bytes given but " +
                  std::string(dtype_name(dtype)) + " " + shape_str(shape) + " needs " +
                  std::to_string(need));
  }
  entries_.push_back({std::move(name), dtype, std::move(shape), std::move(bytes)});
}

void SafetensorsWriter::add(std::string name, StDType dtype, std::vector<int64_t> shape,
                            std::span<const uint8_t> bytes) {
  add(std::move(name), dtype, std::move(shape), std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

void SafetensorsWriter::add_f32(std::string name, std::vector<int64_t> shape,
                                std::span<const float> values) {
  std::vector<uint8_t> b(values.size() * 4);
  if (!values.empty()) std::memcpy(b.data(), values.data(), b.size());
  add(std::move(name), StDType::kF32, std::move(shape), std::move(b));
}

std::string SafetensorsWriter::header_json() const {
  json h = json::object();
  uint64_t off = 0;
  for (const auto& e : entries_) {
    h[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                 {"shape", e.shape},
                 {"data_offsets", {off, off + e.bytes.size()}}};
    off += e.bytes.size();
  }
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  std::string s = h.dump();
  while (s.size() % 8 != 0) s += ' ';
  return s;
}

std::vector<uint8_t> SafetensorsWriter::serialize() const {
  const std::string h = header_json();
  std::vector<uint8_t> out;
  size_t total = 8 + h.size();
  for (const auto& e : entries_) total += e.bytes.size();
  out.reserve(total);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), h.begin(), h.end());
  for (const auto& e : entries_) out.insert(out.end(), e.bytes.begin(), e.bytes.end());
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::string h = header_json();
  AtomicFile f(path);
  uint8_t len[8];
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  f.write(len, 8);
  f.write(h.data(), h.size());
  for (const auto& e : entries_) f.write(e.bytes.data(), e.bytes.size());
  f.commit();
}

bool split_tensor_spec(const std::string& spec, std::string* file, std::string* tensor) {
  const std::string ext = ".safetensors:";
  const size_t p = spec.rfind(ext);
  if (p == std::string::npos) return false;
  *file = spec.substr(0, p + ext.size() - 1);
  *tensor = spec.substr(p + ext.size());
  return true;
}

}  // namespace scalesweep::io
