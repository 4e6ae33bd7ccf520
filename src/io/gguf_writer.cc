// GGUF v3 writer and the NVFP4 model writer (include/scalesweep/io/gguf_writer.h).
#include "scalesweep/io/gguf_writer.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "io/atomic_file.h"
#include "scalesweep/base/clock.h"
#include "scalesweep/base/option_error.h"
#include "scalesweep/format/minifloat.h"
#include "scalesweep/io/file.h"
#include "scalesweep/io/gguf_model.h"
#include "scalesweep/io/hf_names.h"
#include "scalesweep/io/tensor_order.h"
#include "scalesweep/model/weight.h"

namespace scalesweep::io {
namespace fs = std::filesystem;
using model::LinearId;

// ---- values -------------------------------------------------------------------------------------

GgufValue gguf_value(GgufValueType type, decltype(GgufValue::scalar) v) {
  GgufValue g;
  g.type = type;
  g.scalar = std::move(v);
  return g;
}
GgufValue gguf_value_u32(uint32_t v) {
  return gguf_value(GgufValueType::kU32, static_cast<uint64_t>(v));
}
GgufValue gguf_value_i32(int32_t v) {
  return gguf_value(GgufValueType::kI32, static_cast<int64_t>(v));
}
GgufValue gguf_value_u64(uint64_t v) { return gguf_value(GgufValueType::kU64, v); }
GgufValue gguf_value_f32(float v) {
  return gguf_value(GgufValueType::kF32, static_cast<double>(v));
}
GgufValue gguf_value_bool(bool v) { return gguf_value(GgufValueType::kBool, v); }
GgufValue gguf_value_string(std::string v) {
  return gguf_value(GgufValueType::kString, std::move(v));
}
GgufValue gguf_value_array(GgufValueType elem_type, std::vector<GgufValue> elems) {
  GgufValue g;
  g.type = GgufValueType::kArray;
  g.elem_type = elem_type;
  g.array = std::move(elems);
  return g;
}
namespace {
template <class T, class F>
GgufValue array_of(GgufValueType t, const std::vector<T>& v, F make) {
  std::vector<GgufValue> elems;
  elems.reserve(v.size());
  for (const T& x : v) elems.push_back(make(x));
  return gguf_value_array(t, std::move(elems));
}
}  // namespace
GgufValue gguf_value_string_array(const std::vector<std::string>& v) {
  return array_of(GgufValueType::kString, v,
                  [](const std::string& s) { return gguf_value_string(s); });
}
GgufValue gguf_value_f32_array(const std::vector<float>& v) {
  return array_of(GgufValueType::kF32, v, [](float x) { return gguf_value_f32(x); });
}
GgufValue gguf_value_i32_array(const std::vector<int32_t>& v) {
  return array_of(GgufValueType::kI32, v, [](int32_t x) { return gguf_value_i32(x); });
}

uint64_t ggml_tensor_bytes(uint32_t type, const std::vector<int64_t>& ne, const std::string& what) {
  const auto tr = ggml_type_traits(type);
  if (!tr) throw IoError(what + ": unknown ggml type " + std::to_string(type));
  if (ne.empty() || ne.size() > 4)
    throw IoError(what + ": " + std::to_string(ne.size()) + " dimensions (GGUF: 1 to 4)");
  uint64_t n = 1;
  for (size_t i = 0; i < ne.size(); ++i) {
    if (ne[i] <= 0)
      throw IoError(what + ": dimension " + std::to_string(i) + " is " + std::to_string(ne[i]));
    n *= static_cast<uint64_t>(ne[i]);
  }
  if (ne[0] % tr->block_elems != 0)
    throw IoError(what + ": row length " + std::to_string(ne[0]) + " is not a multiple of the " +
                  ggml_type_name(type) + " block of " + std::to_string(tr->block_elems));
  return n / static_cast<uint64_t>(tr->block_elems) * static_cast<uint64_t>(tr->block_bytes);
}

// ---- the file format
// ------------------------------------------------------------------------------

namespace {

void put_u32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string& b, const std::string& s) {
  put_u64(b, s.size());
  b += s;
}

// One value of type `t` (the payload only; the type id is written by the caller).
void put_value(std::string& b, GgufValueType t, const GgufValue& v, const std::string& key) {
  const auto bad = [&] {
    return IoError("key '" + key + "': value does not match its type " +
                   gguf_value_type_name(static_cast<uint32_t>(t)));
  };
  const auto uns = [&](uint64_t max) {
    const uint64_t* p = std::get_if<uint64_t>(&v.scalar);
    if (!p || *p > max) throw bad();
    return *p;
  };
  const auto sig = [&](int64_t lo, int64_t hi) {
    const int64_t* p = std::get_if<int64_t>(&v.scalar);
    if (!p || *p < lo || *p > hi) throw bad();
    return *p;
  };
  switch (t) {
    case GgufValueType::kU8:
      b.push_back(static_cast<char>(uns(0xFF)));
      return;
    case GgufValueType::kI8:
      b.push_back(static_cast<char>(sig(-128, 127)));
      return;
    case GgufValueType::kU16: {
      const uint16_t x = static_cast<uint16_t>(uns(0xFFFF));
      b.append(reinterpret_cast<const char*>(&x), 2);
      return;
    }
    case GgufValueType::kI16: {
      const int16_t x = static_cast<int16_t>(sig(-32768, 32767));
      b.append(reinterpret_cast<const char*>(&x), 2);
      return;
    }
    case GgufValueType::kU32:
      put_u32(b, static_cast<uint32_t>(uns(0xFFFFFFFFu)));
      return;
    case GgufValueType::kI32: {
      const int32_t x = static_cast<int32_t>(sig(INT32_MIN, INT32_MAX));
      b.append(reinterpret_cast<const char*>(&x), 4);
      return;
    }
    case GgufValueType::kU64:
      put_u64(b, uns(UINT64_MAX));
      return;
    case GgufValueType::kI64: {
      const int64_t x = sig(INT64_MIN, INT64_MAX);
      b.append(reinterpret_cast<const char*>(&x), 8);
      return;
    }
    case GgufValueType::kF32: {
      const double* p = std::get_if<double>(&v.scalar);
      if (!p) throw bad();
      const float x = static_cast<float>(*p);
      if (static_cast<double>(x) != *p && !std::isnan(*p)) throw bad();  // not an f32 exactly
      b.append(reinterpret_cast<const char*>(&x), 4);
      return;
    }
    case GgufValueType::kF64: {
      const double* p = std::get_if<double>(&v.scalar);
      if (!p) throw bad();
      b.append(reinterpret_cast<const char*>(p), 8);
      return;
    }
    case GgufValueType::kBool: {
      const bool* p = std::get_if<bool>(&v.scalar);
      if (!p) throw bad();
      b.push_back(*p ? 1 : 0);
      return;
    }
    case GgufValueType::kString: {
      const std::string* p = std::get_if<std::string>(&v.scalar);
      if (!p) throw bad();
      put_str(b, *p);
      return;
    }
    case GgufValueType::kArray: {
      put_u32(b, static_cast<uint32_t>(v.elem_type));
      put_u64(b, v.array.size());
      for (size_t i = 0; i < v.array.size(); ++i) {
        const GgufValue& e = v.array[i];
        if (e.type != v.elem_type)
          throw IoError("key '" + key + "': array element " + std::to_string(i) + " is " +
                        gguf_value_type_name(static_cast<uint32_t>(e.type)) + ", the array's " +
                        gguf_value_type_name(static_cast<uint32_t>(v.elem_type)));
        put_value(b, e.type, e, key + "[" + std::to_string(i) + "]");
      }
      return;
    }
  }
  throw IoError("key '" + key + "': unknown value type " +
                std::to_string(static_cast<uint32_t>(t)));
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

struct GgufWriter::Impl {
  uint64_t alignment;
  GgufMetadata kv;
  std::set<std::string, std::less<>> keys, names;
  struct Decl {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    uint64_t nbytes, offset;
  };
  std::vector<Decl> decls;
  uint64_t data_bytes = 0;  // padded data section so far (declarations)
  std::unique_ptr<AtomicFile> file;
  TensorWriteOrder order;
  uint64_t written = 0;  // bytes written to the file
  bool committed = false;
};

GgufWriter::GgufWriter(uint64_t alignment) : impl_(std::make_unique<Impl>()) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 30))
    throw IoError("GGUF alignment " + std::to_string(alignment) + " is not a power of two");
  impl_->alignment = alignment;
}
GgufWriter::~GgufWriter() = default;

void GgufWriter::add_kv(std::string key, GgufValue v) {
  if (impl_->file) throw std::logic_error("GgufWriter::add_kv after open()");
  if (key.empty()) throw IoError("GGUF metadata key is empty");
  if (!impl_->keys.insert(key).second) throw IoError("GGUF metadata key '" + key + "' is repeated");
  if (key == "general.alignment") {
    const uint64_t* a = std::get_if<uint64_t>(&v.scalar);
    if (v.type != GgufValueType::kU32 || !a || *a != impl_->alignment)
      throw IoError("key 'general.alignment' must be the u32 " + std::to_string(impl_->alignment) +
                    " the writer aligns to");
  }
  impl_->kv.emplace_back(std::move(key), std::move(v));
}

void GgufWriter::declare(std::string name, GgmlType type, std::vector<int64_t> ne) {
  if (impl_->file) throw std::logic_error("GgufWriter::declare after open()");
  if (name.empty() || name.size() >= 64)
    throw IoError("GGUF tensor name '" + name + "' is empty or longer than 63 bytes");
  if (!impl_->names.insert(name).second) throw IoError("GGUF tensor '" + name + "' is repeated");
  const uint64_t nb =
      ggml_tensor_bytes(static_cast<uint32_t>(type), ne, "GGUF tensor '" + name + "'");
  impl_->order.declare(name, nb);
  impl_->decls.push_back({std::move(name), type, std::move(ne), nb, impl_->data_bytes});
  impl_->data_bytes = align_up(impl_->data_bytes + nb, impl_->alignment);
}

void GgufWriter::open(const std::string& path) {
  if (impl_->file) throw std::logic_error("GgufWriter::open twice");
  if (!impl_->keys.contains("general.alignment"))
    impl_->kv.emplace_back("general.alignment",
                           gguf_value_u32(static_cast<uint32_t>(impl_->alignment)));
  std::string h = "GGUF";
  put_u32(h, 3);
  put_u64(h, impl_->decls.size());
  put_u64(h, impl_->kv.size());
  for (const auto& [k, v] : impl_->kv) {
    put_str(h, k);
    put_u32(h, static_cast<uint32_t>(v.type));
    put_value(h, v.type, v, k);
  }
  for (const auto& d : impl_->decls) {
    put_str(h, d.name);
    put_u32(h, static_cast<uint32_t>(d.ne.size()));
    for (int64_t x : d.ne) put_u64(h, static_cast<uint64_t>(x));
    put_u32(h, static_cast<uint32_t>(d.type));
    put_u64(h, d.offset);
  }
  h.resize(align_up(h.size(), impl_->alignment), '\0');
  check_free_space(path, h.size() + impl_->data_bytes);
  impl_->file = std::make_unique<AtomicFile>(path);
  impl_->file->write(h.data(), h.size());
  impl_->written = h.size();
}

void GgufWriter::write(std::string_view name, std::span<const uint8_t> bytes) {
  if (impl_->file) impl_->order.check_whole(impl_->file->path(), name, bytes.size());
  write_part(name, bytes);
}

void GgufWriter::write_part(std::string_view name, std::span<const uint8_t> bytes) {
  if (!impl_->file) throw std::logic_error("GgufWriter::write before open()");
  const size_t i = impl_->order.next();
  const bool complete = impl_->order.add_part(impl_->file->path(), name, bytes.size());
  impl_->file->write(bytes.data(), bytes.size());
  if (!complete) return;
  const uint64_t n = impl_->decls[i].nbytes, pad = align_up(n, impl_->alignment) - n;
  if (pad) {
    const std::vector<char> z(pad, 0);
    impl_->file->write(z.data(), z.size());
  }
  impl_->written += n + pad;
}

uint64_t GgufWriter::commit() {
  if (!impl_->file) throw std::logic_error("GgufWriter::commit before open()");
  impl_->order.check_complete(impl_->file->path());
  impl_->file->commit();
  return impl_->written;
}

// ---- encodings ----------------------------------------------------------------------------------

namespace {
constexpr int64_t kNvfp4Super = 64, kNvfp4Bytes = 36;
inline uint8_t ct_code(const QuantizedTensor& q, int64_t r, int64_t c) {
  const uint8_t b = q.codes[static_cast<size_t>(r * q.packed_cols() + c / 2)];
  return (c & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xF);
}
}  // namespace

std::vector<uint8_t> encode_ggml_nvfp4(const QuantizedTensor& q,
                                       const std::vector<int64_t>& row_order) {
  if (q.format != TensorFormat::kNvfp4 || q.block != 16)
    throw IoError("ggml NVFP4 needs NVFP4 with block 16 (got block " + std::to_string(q.block) +
                  ")");
  if (q.cols <= 0 || q.rows <= 0 || q.cols % kNvfp4Super != 0)
    throw IoError("ggml NVFP4 needs a row length that is a multiple of 64 (got " +
                  std::to_string(q.cols) + ")");
  if (q.codes.size() != static_cast<size_t>(q.rows * q.packed_cols()) ||
      q.scales.size() != static_cast<size_t>(q.rows * q.blocks_per_row()))
    throw IoError("ggml NVFP4: codes/scales sizes do not match " + std::to_string(q.rows) + "x" +
                  std::to_string(q.cols));
  if (!row_order.empty() && row_order.size() != static_cast<size_t>(q.rows))
    throw IoError("ggml NVFP4: row order has " + std::to_string(row_order.size()) +
                  " entries for " + std::to_string(q.rows) + " rows");
  const int64_t nsb = q.cols / kNvfp4Super, bpr = q.blocks_per_row();
  std::vector<uint8_t> out(static_cast<size_t>(q.rows * nsb * kNvfp4Bytes));
  for (int64_t r = 0; r < q.rows; ++r) {
    const int64_t src = row_order.empty() ? r : row_order[static_cast<size_t>(r)];
    if (src < 0 || src >= q.rows)
      throw IoError("ggml NVFP4: row order entry " + std::to_string(r) + " is out of range");
    for (int64_t b = 0; b < nsb; ++b) {
      uint8_t* blk = out.data() + (r * nsb + b) * kNvfp4Bytes;
      for (int s = 0; s < 4; ++s) {
        blk[s] = q.scales[static_cast<size_t>(src * bpr + b * 4 + s)];
        const int64_t e0 = b * kNvfp4Super + s * 16;
        for (int j = 0; j < 8; ++j)
          blk[4 + s * 8 + j] =
              static_cast<uint8_t>(ct_code(q, src, e0 + j) | (ct_code(q, src, e0 + j + 8) << 4));
      }
    }
  }
  return out;
}

QuantizedTensor decode_ggml_nvfp4(const uint8_t* data, int64_t rows, int64_t cols,
                                  float global_scale) {
  if (rows <= 0 || cols <= 0 || cols % kNvfp4Super != 0)
    throw IoError("ggml NVFP4: bad shape " + std::to_string(rows) + "x" + std::to_string(cols));
  QuantizedTensor q;
  q.format = TensorFormat::kNvfp4;
  q.block = 16;
  q.rows = rows;
  q.cols = cols;
  q.global_scale = global_scale;
  const int64_t pc = q.packed_cols(), bpr = q.blocks_per_row(), nsb = cols / kNvfp4Super;
  q.codes.assign(static_cast<size_t>(rows * pc), 0);
  q.scales.assign(static_cast<size_t>(rows * bpr), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nsb; ++b) {
      const uint8_t* blk = data + (r * nsb + b) * kNvfp4Bytes;
      for (int s = 0; s < 4; ++s) {
        q.scales[static_cast<size_t>(r * bpr + b * 4 + s)] = blk[s];
        const int64_t e0 = b * kNvfp4Super + s * 16;
        for (int j = 0; j < 8; ++j) {
          const uint8_t v = blk[4 + s * 8 + j];
          for (int hi = 0; hi < 2; ++hi) {
            const int64_t e = e0 + j + 8 * hi;
            const uint8_t code = hi ? static_cast<uint8_t>(v >> 4) : static_cast<uint8_t>(v & 0xF);
            q.codes[static_cast<size_t>(r * pc + e / 2)] |=
                static_cast<uint8_t>(code << ((e & 1) * 4));
          }
        }
      }
    }
  return q;
}

float ggml_nvfp4_element(const uint8_t* data, int64_t cols, int64_t r, int64_t c) {
  const int64_t nsb = cols / kNvfp4Super;
  const uint8_t* blk = data + (r * nsb + c / kNvfp4Super) * kNvfp4Bytes;
  const int64_t k = c % kNvfp4Super, s = k / 16, j = k % 16;
  const uint8_t byte = blk[4 + s * 8 + (j % 8)];
  const uint8_t code = j < 8 ? static_cast<uint8_t>(byte & 0xF) : static_cast<uint8_t>(byte >> 4);
  const uint8_t d = blk[s];
  // ggml_ue4m3_to_fp32 (sign bit ignored, 0x7F = 0) x 2 and kvalues_mxfp4 / 2 = E2M1.
  const float scale = (d & 0x7F) == 0x7F ? 0.0f : format::E4M3::decode_f(d & 0x7F);
  return format::E2M1::decode_f(code) * scale;
}

std::vector<uint8_t> encode_q8_0(const float* x, int64_t n) {
  if (n % 32 != 0) throw IoError("Q8_0: " + std::to_string(n) + " elements are not whole blocks");
  std::vector<uint8_t> out(static_cast<size_t>(n / 32 * 34));
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* o = out.data() + b * 34;
    const uint16_t h = format::f32_to_f16(d);
    std::memcpy(o, &h, 2);
    for (int j = 0; j < 32; ++j)
      o[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(xb[j] * id)));
  }
  return out;
}

std::vector<int64_t> gguf_qk_row_order(int n_heads, int head_dim) {
  if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0)
    throw std::invalid_argument("q/k row order: bad heads " + std::to_string(n_heads) +
                                " x head_dim " + std::to_string(head_dim));
  std::vector<int64_t> o(static_cast<size_t>(n_heads) * static_cast<size_t>(head_dim));
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int a = 0; a < 2; ++a)
        o[static_cast<size_t>(h * head_dim + 2 * i + a)] = int64_t{h} * head_dim + a * half + i;
  return o;
}

std::vector<int64_t> gguf_qk_row_order_inverse(int n_heads, int head_dim) {
  const std::vector<int64_t> o = gguf_qk_row_order(n_heads, head_dim);
  std::vector<int64_t> inv(o.size());
  for (size_t r = 0; r < o.size(); ++r) inv[static_cast<size_t>(o[r])] = static_cast<int64_t>(r);
  return inv;
}

// ---- tokenizer metadata -------------------------------------------------------------------------

namespace {
// llama.cpp's llama_token_type (llama-vocab.h LLAMA_TOKEN_TYPE_*).
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6 };

bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.starts_with("<0x") && t[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>(t[3])) &&
         std::isxdigit(static_cast<unsigned char>(t[4]));
}
}  // namespace

GgufMetadata gguf_tokenizer_kv_copy(const GgufMetadata& m) {
  GgufMetadata out;
  for (const auto& [k, v] : m)
    if (k.starts_with("tokenizer.")) out.emplace_back(k, v);
  return out;
}

GgufMetadata gguf_tokenizer_kv_llama2c(const model::Llama2cTokenizer& t) {
  // The SentencePiece form of the vocabulary (▁ for spaces, <0xXX> bytes) as the converter
  // to tokenizer.json makes it; its checks refuse a malformed vocabulary.
  const model::BpeSpec s = model::sentencepiece_spec_from_llama2c(t.vocab(), t.scores());
  GgufMetadata out;
  out.emplace_back("tokenizer.ggml.model", gguf_value_string("llama"));
  out.emplace_back("tokenizer.ggml.tokens", gguf_value_string_array(s.vocab));
  out.emplace_back("tokenizer.ggml.scores", gguf_value_f32_array(t.scores()));
  std::vector<int32_t> types(s.vocab.size(), kNormal);
  for (size_t i = 0; i < s.vocab.size(); ++i)
    if (is_byte_token(s.vocab[i])) types[i] = kByte;
  if (s.unk_id >= 0) types[static_cast<size_t>(s.unk_id)] = kUnknown;
  if (s.bos_id >= 0) types[static_cast<size_t>(s.bos_id)] = kControl;
  if (s.eos_id >= 0) types[static_cast<size_t>(s.eos_id)] = kControl;
  out.emplace_back("tokenizer.ggml.token_type", gguf_value_i32_array(types));
  if (s.bos_id >= 0) out.emplace_back("tokenizer.ggml.bos_token_id", gguf_value_u32(s.bos_id));
  if (s.eos_id >= 0) out.emplace_back("tokenizer.ggml.eos_token_id", gguf_value_u32(s.eos_id));
  if (s.unk_id >= 0) out.emplace_back("tokenizer.ggml.unknown_token_id", gguf_value_u32(s.unk_id));
  out.emplace_back("tokenizer.ggml.add_bos_token", gguf_value_bool(t.add_bos()));
  out.emplace_back("tokenizer.ggml.add_eos_token", gguf_value_bool(false));
  return out;
}

GgufMetadata gguf_tokenizer_kv_of_hf_dir(const std::string& dir) {
  if (!std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) return {};
  return gguf_tokenizer_kv_spec(model::load_tokenizer_json(dir), dir);
}

GgufMetadata gguf_tokenizer_kv_spec(const model::BpeSpec& s, const std::string& name) {
  GgufMetadata out;
  const bool bl = s.flavor == model::BpeFlavor::kByteLevel;
  std::vector<std::string> tokens = s.vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i].empty())
      throw IoError(name + ": tokenizer vocabulary id " + std::to_string(i) +
                    " has no token (GGUF needs a dense token list)");
  std::vector<int32_t> types(tokens.size(), kNormal);
  for (const model::HfAddedToken& a : s.added) {
    if (a.id < 0 || a.id >= static_cast<int>(tokens.size()))
      throw IoError(name + ": added token '" + a.content + "' has id " + std::to_string(a.id) +
                    " outside the vocabulary of " + std::to_string(tokens.size()));
    types[static_cast<size_t>(a.id)] = a.special ? kControl : kUserDefined;
  }
  std::vector<std::string> merges;
  merges.reserve(s.merges.size());
  for (size_t i = 0; i < s.merges.size(); ++i) {
    const auto& [a, b] = s.merges[i];
    if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
      throw IoError(name + ": merge " + std::to_string(i) +
                    " has a part with a space (GGUF stores merges as 'a b')");
    merges.push_back(a + " " + b);
  }
  if (bl) {
    const std::optional<std::string> pre = gguf_pre_tokenizer_name(s);
    if (!pre)
      throw IoError(name +
                    ": the byte-level pre-tokenizer of this tokenizer.json has no llama.cpp "
                    "tokenizer.ggml.pre name this writer knows (known: " +
                    [] {
                      std::string l;
                      for (const std::string& p : gguf_supported_pre_tokenizers())
                        l += (l.empty() ? "" : ", ") + p;
                      return l;
                    }() +
                    ")");
    if (s.add_prefix_space && *pre != "gpt2")
      throw IoError(name + ": add_prefix_space with pre-tokenizer '" + *pre +
                    "' cannot be stored in GGUF");
    out.emplace_back("tokenizer.ggml.model", gguf_value_string("gpt2"));
    out.emplace_back("tokenizer.ggml.pre", gguf_value_string(*pre));
    out.emplace_back("tokenizer.ggml.tokens", gguf_value_string_array(tokens));
    out.emplace_back("tokenizer.ggml.token_type", gguf_value_i32_array(types));
    out.emplace_back("tokenizer.ggml.merges", gguf_value_string_array(merges));
    if (s.add_prefix_space)
      out.emplace_back("tokenizer.ggml.add_space_prefix", gguf_value_bool(true));
  } else {
    if (!s.byte_fallback)
      throw IoError(name +
                    ": a SentencePiece-style tokenizer without byte_fallback cannot be stored "
                    "as a GGUF 'llama' tokenizer");
    // llama.cpp's SentencePiece merging ranks pairs by the merged token's score: the score of
    // a token is minus the rank of the first merge that builds it (0 for tokens no merge
    // builds), so llama.cpp merges in the tokenizer.json's order. The merges are stored too.
    std::map<std::string, size_t, std::less<>> id;
    for (size_t i = 0; i < tokens.size(); ++i) id.emplace(tokens[i], i);
    std::vector<float> scores(tokens.size(), 0.0f);
    std::vector<bool> seen(tokens.size(), false);
    for (size_t r = 0; r < s.merges.size(); ++r) {
      const auto it = id.find(s.merges[r].first + s.merges[r].second);
      if (it == id.end() || seen[it->second]) continue;
      seen[it->second] = true;
      scores[it->second] = -static_cast<float>(r);
    }
    for (size_t i = 0; i < tokens.size(); ++i)
      if (types[i] == kNormal && is_byte_token(tokens[i])) types[i] = kByte;
    if (s.unk_id >= 0) types[static_cast<size_t>(s.unk_id)] = kUnknown;
    out.emplace_back("tokenizer.ggml.model", gguf_value_string("llama"));
    out.emplace_back("tokenizer.ggml.tokens", gguf_value_string_array(tokens));
    out.emplace_back("tokenizer.ggml.scores", gguf_value_f32_array(scores));
    out.emplace_back("tokenizer.ggml.token_type", gguf_value_i32_array(types));
    out.emplace_back("tokenizer.ggml.merges", gguf_value_string_array(merges));
    out.emplace_back("tokenizer.ggml.add_space_prefix",
                     gguf_value_bool(s.prepend != model::PrependScheme::kNever));
  }
  if (s.bos_id >= 0) out.emplace_back("tokenizer.ggml.bos_token_id", gguf_value_u32(s.bos_id));
  if (s.eos_id >= 0) out.emplace_back("tokenizer.ggml.eos_token_id", gguf_value_u32(s.eos_id));
  if (s.unk_id >= 0) out.emplace_back("tokenizer.ggml.unknown_token_id", gguf_value_u32(s.unk_id));
  if (s.pad_id >= 0) out.emplace_back("tokenizer.ggml.padding_token_id", gguf_value_u32(s.pad_id));
  out.emplace_back("tokenizer.ggml.add_bos_token", gguf_value_bool(s.add_bos));
  out.emplace_back("tokenizer.ggml.add_eos_token", gguf_value_bool(s.add_eos));
  if (!s.chat_template.empty())
    out.emplace_back("tokenizer.chat_template", gguf_value_string(s.chat_template));
  return out;
}

GgufMetadata gguf_tokenizer_kv(const model::Tokenizer& t, const std::string& name) {
  if (const auto* l = dynamic_cast<const model::Llama2cTokenizer*>(&t))
    return gguf_tokenizer_kv_llama2c(*l);
  if (const auto* h = dynamic_cast<const model::HfBpeTokenizer*>(&t))
    return gguf_tokenizer_kv_spec(h->spec(), name);
  throw IoError(name + ": this tokenizer kind cannot be stored in GGUF");
}

// ---- the model writer ---------------------------------------------------------------------------

std::string gguf_linear_name(int layer, LinearId id) {
  static constexpr const char* kNames[7] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                            "ffn_gate", "ffn_up", "ffn_down"};
  return "blk." + std::to_string(layer) + "." + kNames[static_cast<size_t>(id)];
}

GgmlType gguf_dense_type_for(GgufDense d, int64_t cols) {
  switch (d) {
    case GgufDense::kF32:
      return GgmlType::kF32;
    case GgufDense::kF16:
      return GgmlType::kF16;
    case GgufDense::kBF16:
      return GgmlType::kBF16;
    case GgufDense::kQ8_0:
      return cols % 32 == 0 ? GgmlType::kQ8_0 : GgmlType::kF16;
  }
  return GgmlType::kF32;
}

namespace {

// fp32 values [rows, cols] in a ggml dense type.
std::vector<uint8_t> encode_dense(const std::vector<float>& x, GgmlType t) {
  std::vector<uint8_t> out;
  switch (t) {
    case GgmlType::kF32:
      out.resize(x.size() * 4);
      std::memcpy(out.data(), x.data(), out.size());
      return out;
    case GgmlType::kF16:
    case GgmlType::kBF16: {
      out.resize(x.size() * 2);
      for (size_t i = 0; i < x.size(); ++i) {
        const uint16_t h =
            t == GgmlType::kF16 ? format::f32_to_f16(x[i]) : format::f32_to_bf16(x[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      return out;
    }
    case GgmlType::kQ8_0:
      return encode_q8_0(x.data(), static_cast<int64_t>(x.size()));
    default:
      break;
  }
  throw std::logic_error("encode_dense: type " + ggml_type_name(static_cast<uint32_t>(t)));
}

uint32_t file_type_of(GgmlType t) {  // llama.h LLAMA_FTYPE_* of an all-`t` file
  switch (t) {
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

constexpr uint32_t kFtypeNvfp4 = 39;  // LLAMA_FTYPE_MOSTLY_NVFP4

// llama.cpp's stacked expert tensor of `id` in layer `l` ("blk.3.ffn_gate_exps").
std::string gguf_experts_name(int l, LinearId id) {
  return "blk." + std::to_string(l) + "." +
         (id == LinearId::kGate ? "ffn_gate_exps"
          : id == LinearId::kUp ? "ffn_up_exps"
                                : "ffn_down_exps");
}

}  // namespace

struct GgufModelWriter::Impl {
  GgufModelSpec spec;
  std::string out;
  GgufWriter w;
  double write_s = 0;
  int next_layer = 0;
  size_t next_gs = 0;  // index into spec.global_scales
  std::vector<int64_t> q_order, k_order;

  void put(const std::string& name, const std::vector<uint8_t>& bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    w.write(name, bytes);
    write_s += seconds_since(t0);
  }
  // A dense tensor (rows permuted by `order` when given).
  void dense(const std::string& name, const model::Tensor& t, GgmlType type,
             const std::vector<int64_t>& order = {}) {
    if (!t.present()) throw IoError(spec.source + ": tensor '" + name + "' is missing");
    // Every ggml type here encodes rows independently (blocks lie within a row): a tile of
    // rows at a time, so that a tensor stored in another precision is never widened whole.
    const int64_t rows = t.rows(), cols = t.cols(), tile = model::weight_tile_rows(cols);
    std::vector<float> x;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < rows; r += tile) {
      const int64_t r1 = std::min(rows, r + tile);
      x.resize(static_cast<size_t>((r1 - r) * cols));
      if (order.empty()) {
        model::dequantize_rows(t, r, r1, x.data());
      } else {
        for (int64_t i = r; i < r1; ++i)
          model::dequantize_rows(t, order[static_cast<size_t>(i)],
                                 order[static_cast<size_t>(i)] + 1, x.data() + (i - r) * cols);
      }
      w.write_part(name, encode_dense(x, type));  // no copy of the whole tensor's bytes
    }
    write_s += seconds_since(t0);
  }
  // The file's row order of Linear `id` (and of its bias): q/k permuted in the llama layout,
  // empty (as they are) otherwise.
  const std::vector<int64_t>& row_order(LinearId id) const {
    static const std::vector<int64_t> none;
    return id == LinearId::kQ ? q_order : id == LinearId::kK ? k_order : none;
  }
  // One decoder Linear: dense, or NVFP4 weight + .scale (1/gs), q/k rows permuted for llama.
  void linear(int layer, const model::LayerWeights& lw, const CheckpointLinear& cl) {
    const LinearId id = cl.id;
    const std::string n = gguf_linear_name(layer, id);
    const std::vector<int64_t>& order = row_order(id);
    const bool want_dense = spec.dense.contains(layer, id);
    if ((cl.q == nullptr) != want_dense)
      throw std::logic_error("GgufModelWriter: " + n + " dense/NVFP4 differs from the spec");
    if (want_dense) {
      check_no_input_scale(n, cl);
      const model::Tensor& t = linear_weight(lw, id);
      dense(n + ".weight", t, gguf_dense_type_for(spec.dense_type, t.cols()), order);
      return;
    }
    const QuantizedTensor& q = check_nvfp4(n, cl);
    if (!spec.global_scales.empty() &&
        std::memcmp(&spec.global_scales[next_gs++], &q.global_scale, 4) != 0)
      throw IoError(n + ": global scale " + std::to_string(q.global_scale) +
                    " differs from the one recorded in the header");
    put(n + ".weight", encode_ggml_nvfp4(q, order));
    const float scale = 1.0f / q.global_scale;  // decode direction, as llama.cpp multiplies
    std::vector<uint8_t> sb(4);
    std::memcpy(sb.data(), &scale, 4);
    put(n + ".scale", sb);
  }
  // llama.cpp has no W4A4 for decoder Linears: an input global scale is refused.
  static void check_no_input_scale(const std::string& what, const CheckpointLinear& cl) {
    if (cl.input_global_scale)
      throw IoError(what + ": input global scales (W4A4) cannot be stored for llama.cpp");
  }
  // An NVFP4 Linear llama.cpp can take: no input global scale, a positive finite global scale.
  // Returns its quantized tensor.
  static const QuantizedTensor& check_nvfp4(const std::string& what, const CheckpointLinear& cl) {
    check_no_input_scale(what, cl);
    const QuantizedTensor& q = *cl.q;
    if (!(q.global_scale > 0) || !std::isfinite(q.global_scale))
      throw IoError(what + ": global scale " + std::to_string(q.global_scale) +
                    " is not a positive finite number");
    return q;
  }
  // Linear `id`'s bias (qwen2's q/k/v), F32, its rows in the order of the weight's (permuted
  // q/k when stored as llama).
  void bias(int layer, LinearId id, const model::LayerWeights& lw) {
    const model::Tensor& b = id == LinearId::kQ ? lw.bq : id == LinearId::kK ? lw.bk : lw.bv;
    const std::string n = gguf_linear_name(layer, id) + ".bias";
    if (!b.present()) throw IoError(spec.source + ": tensor '" + n + "' is missing");
    const std::vector<int64_t>& order = row_order(id);
    const std::vector<float> x = model::to_f32(b);
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      y[i] = order.empty() ? x[i] : x[static_cast<size_t>(order[i])];
    put(n, std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(y.data()),
                                reinterpret_cast<const uint8_t*>(y.data()) + y.size() * 4));
  }
  // A MoE layer's experts, from `linears` (q, k, v, o, then each expert's gate, up, down):
  // per projection, every expert's NVFP4 rows in expert order (one stacked tensor, written an
  // expert at a time), then its `.scale` {n_expert} of 1/gs per expert.
  void experts(int layer, const std::vector<CheckpointLinear>& linears) {
    const int E = spec.config.n_experts;
    for (const LinearId id : {LinearId::kGate, LinearId::kUp, LinearId::kDown}) {
      const std::string n = gguf_experts_name(layer, id);
      const size_t k = id == LinearId::kGate ? 0 : id == LinearId::kUp ? 1 : 2;
      std::vector<float> scales(static_cast<size_t>(E));
      const auto t0 = std::chrono::steady_clock::now();
      for (int e = 0; e < E; ++e) {
        const CheckpointLinear& cl = linears[4 + 3 * static_cast<size_t>(e) + k];
        const std::string what = n + " expert " + std::to_string(e);
        if (cl.id != id || cl.expert != e)
          throw std::logic_error("GgufModelWriter: " + what + ": Linears out of order");
        if (cl.q == nullptr)
          throw IoError(what +
                        ": experts are written as NVFP4 only (a dense expert Linear "
                        "cannot be stacked with quantized ones)");
        const QuantizedTensor& q = check_nvfp4(what, cl);
        w.write_part(n + ".weight", encode_ggml_nvfp4(q, {}));
        scales[static_cast<size_t>(e)] = 1.0f / q.global_scale;
      }
      write_s += seconds_since(t0);
      put(n + ".scale", std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(scales.data()),
                                             reinterpret_cast<const uint8_t*>(scales.data()) +
                                                 scales.size() * sizeof(float)));
    }
  }
};

namespace {

[[noreturn]] void refuse(const std::string& src, const std::string& why) {
  throw IoError(src + ": cannot be written as a GGUF for llama.cpp: " + why);
}

// transformers' default YaRN attention factor; llama.cpp's rope applies exactly this one.
float yarn_default_attention(float factor) {
  return factor <= 1 ? 1.0f : static_cast<float>(0.1 * std::log(factor) + 1.0);
}

void check_gguf_rope(const model::Config& c, const std::string& src) {
  const model::RopeScaling& r = c.rope_scaling;
  switch (r.type) {
    case model::RopeType::kDefault:
    case model::RopeType::kLinear:
      return;
    case model::RopeType::kDynamic:
      refuse(src, "rope scaling 'dynamic' (dynamic NTK): llama.cpp has no such RoPE scaling");
    case model::RopeType::kLlama3:
      if (c.arch != model::Arch::kLlama)
        refuse(src, "rope scaling 'llama3' with the " +
                        std::string(model::kArchNames.name(c.arch)) +
                        " architecture: llama.cpp reads rope_freqs.weight for llama only");
      return;
    case model::RopeType::kYarn: {
      if (!r.truncate)
        refuse(src,
               "rope scaling 'yarn' with truncate = false: llama.cpp always rounds the "
               "correction range to whole dimensions");
      const float want = yarn_default_attention(r.factor);
      if (std::fabs(r.attention_factor - want) > 1e-6f * want)
        refuse(src, "rope scaling 'yarn' with attention_factor " +
                        std::to_string(r.attention_factor) + ": llama.cpp applies " +
                        std::to_string(want) + " (0.1 ln(factor) + 1)");
      return;
    }
  }
}

// Mixture-of-experts models as llama.cpp's qwen3moe and llama (Mixtral) graphs run them
// (build_moe_ffn: softmax over the router, top-k, the k weights renormalised; every layer's FFN
// an expert FFN; per-expert `.scale` {n_expert}).
void check_gguf_moe(const model::Config& c, const std::string& src) {
  if (c.arch != model::Arch::kQwen3Moe && c.arch != model::Arch::kMixtral)
    refuse(src, "experts with the " + std::string(model::kArchNames.name(c.arch)) +
                    " architecture (llama.cpp runs them as qwen3moe or Mixtral)");
  for (int l = 0; l < c.n_layers; ++l)
    if (!c.moe_layer(l))
      refuse(src, "layer " + std::to_string(l) +
                      " has a dense MLP between expert layers (decoder_sparse_step / "
                      "mlp_only_layers): llama.cpp's " +
                      gguf_arch_name(c.arch) + " has experts in every layer");
  if (!c.norm_topk_prob)
    refuse(src,
           "norm_topk_prob = false: llama.cpp's qwen3moe always renormalises the top-k routing "
           "weights");
  for (const auto& [what, cols] :
       {std::pair<const char*, int64_t>{"gate/up", c.dim}, {"down", c.moe_hidden_dim}})
    if (cols % 64 != 0)
      refuse(src, std::string("expert ") + what + " row length " + std::to_string(cols) +
                      " is not a multiple of ggml's 64-element NVFP4 super-block (the experts "
                      "of a GGUF are NVFP4)");
}

}  // namespace

std::string gguf_arch_name(model::Arch a) {
  switch (a) {
    case model::Arch::kQwen3Moe:
      return "qwen3moe";
    case model::Arch::kMixtral:
      return "llama";  // llama.cpp's Mixtral: llama with expert_count
    default:
      return std::string(model::kArchNames.name(a));
  }
}

std::string gguf_file_arch(const model::Config& c, GgufQwen2As qwen2_as) {
  return c.arch == model::Arch::kQwen2 && qwen2_as == GgufQwen2As::kLlama ? "llama"
                                                                          : gguf_arch_name(c.arch);
}

std::string gguf_nvfp4_obstacle(const model::Config& c, LinearId id, GgufQwen2As qwen2_as) {
  const bool ffn = model::is_ffn_linear(id), expert = c.moe() && ffn;
  const int64_t cols = !expert                 ? hf_linear_shape(c, id).second
                       : id == LinearId::kDown ? c.moe_hidden_dim
                                               : c.dim;
  if (cols % 64 != 0)
    return "row length " + std::to_string(cols) +
           " is not a multiple of ggml's 64-element NVFP4 super-block";
  if (c.arch == model::Arch::kQwen2 && qwen2_as == GgufQwen2As::kQwen2 && ffn)
    return "llama.cpp's qwen2 graph ignores the per-tensor .scale of the FFN Linears (its NVFP4 "
           "weights would be used 1/scale times too large; the default " +
           option_ref("gguf_arch") + " llama stores them NVFP4)";
  return "";
}

std::array<bool, 7> gguf_dense_linears(const model::Config& c, GgufQwen2As qwen2_as) {
  std::array<bool, 7> d{};
  for (LinearId id : kAllLinears)
    d[static_cast<size_t>(id)] = !gguf_nvfp4_obstacle(c, id, qwen2_as).empty();
  return d;
}

void check_gguf_config(const model::Config& c, const std::string& src) {
  const std::string arch(model::kArchNames.name(c.arch));
  if (c.moe()) check_gguf_moe(c, src);
  if (c.qkv_bias != (c.arch == model::Arch::kQwen2))
    refuse(src, c.qkv_bias ? "q/k/v biases with the " + arch +
                                 " architecture (llama.cpp's qwen2 has them, and our reader "
                                 "takes them for qwen2 only)"
                           : "a qwen2 model without q/k/v biases (llama.cpp's qwen2 needs them)");
  const bool qk_norm_arch = c.arch == model::Arch::kQwen3 || c.arch == model::Arch::kQwen3Moe;
  if (c.qk_norm != qk_norm_arch)
    refuse(src, c.qk_norm ? "q/k norms with the " + arch +
                                " architecture (llama.cpp's qwen3 and qwen3moe have them, and our "
                                "reader takes them for those only)"
                          : "a " + arch + " model without q/k norms (llama.cpp's " +
                                gguf_arch_name(c.arch) + " needs them)");
  check_gguf_rope(c, src);
}

namespace {

// {arch}.rope.* keys (and the llama3 parameters) as llama.cpp's converter writes them.
void add_rope_kv(GgufWriter& w, const std::string& p, const model::Config& c) {
  const model::RopeScaling& r = c.rope_scaling;
  w.add_kv(p + "rope.freq_base", gguf_value_f32(c.rope_theta));
  w.add_kv(p + "rope.dimension_count", gguf_value_u32(static_cast<uint32_t>(c.head_dim)));
  if (r.type == model::RopeType::kLinear || r.type == model::RopeType::kYarn) {
    w.add_kv(p + "rope.scaling.type",
             gguf_value_string(std::string(model::kRopeTypeNames.name(r.type))));
    w.add_kv(p + "rope.scaling.factor", gguf_value_f32(r.factor));
  }
  if (r.type == model::RopeType::kYarn) {
    w.add_kv(p + "rope.scaling.original_context_length",
             gguf_value_u32(static_cast<uint32_t>(r.original_max_position_embeddings)));
    w.add_kv(p + "rope.scaling.yarn_beta_fast", gguf_value_f32(r.beta_fast));
    w.add_kv(p + "rope.scaling.yarn_beta_slow", gguf_value_f32(r.beta_slow));
  }
  if (r.type == model::RopeType::kLlama3)
    w.add_kv(kGgufLlama3RopeKey,
             gguf_value_f32_array({r.factor, r.low_freq_factor, r.high_freq_factor,
                                   static_cast<float>(r.original_max_position_embeddings)}));
}

// general.* and {arch}.* keys, then the tokenizer's.
void add_model_kv(GgufWriter& w, const GgufModelSpec& s) {
  const model::Config& c = s.config;
  const std::string arch = gguf_file_arch(c, s.qwen2_as), p = arch + ".";
  size_t n_nvfp4 = 0;  // NVFP4 Linears (a MoE layer's experts each count)
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : kAllLinears)
      if (!s.dense.contains(l, id))
        n_nvfp4 +=
            c.moe_layer(l) && model::is_ffn_linear(id) ? static_cast<size_t>(c.n_experts) : 1;
  const bool any_nvfp4 = n_nvfp4 > 0;
  w.add_kv("general.architecture", gguf_value_string(arch));
  if (arch != gguf_arch_name(c.arch))
    w.add_kv(kGgufSourceArchKey, gguf_value_string(std::string(model::kArchNames.name(c.arch))));
  w.add_kv("general.name", gguf_value_string(s.name));
  w.add_kv("general.file_type",
           gguf_value_u32(any_nvfp4 ? kFtypeNvfp4
                                    : file_type_of(gguf_dense_type_for(s.dense_type, c.dim))));
  w.add_kv("general.quantization_version", gguf_value_u32(2));  // GGML_QNT_VERSION
  w.add_kv("general.alignment", gguf_value_u32(32));
  const auto u = [](int v) { return gguf_value_u32(static_cast<uint32_t>(v)); };
  w.add_kv(p + "context_length", u(c.max_seq_len));
  w.add_kv(p + "embedding_length", u(c.dim));
  w.add_kv(p + "block_count", u(c.n_layers));
  // Mixtral's experts are feed_forward_length wide (llama.cpp has no expert width key for it).
  w.add_kv(p + "feed_forward_length",
           u(c.arch == model::Arch::kMixtral ? c.moe_hidden_dim : c.hidden_dim));
  w.add_kv(p + "attention.head_count", u(c.n_heads));
  w.add_kv(p + "attention.head_count_kv", u(c.n_kv_heads));
  if (c.head_dim * c.n_heads != c.dim) {
    w.add_kv(p + "attention.key_length", u(c.head_dim));
    w.add_kv(p + "attention.value_length", u(c.head_dim));
  }
  w.add_kv(p + "attention.layer_norm_rms_epsilon", gguf_value_f32(c.norm_eps));
  if (c.moe()) {  // as llama.cpp's converter writes them (Mixtral's experts: feed_forward_length)
    w.add_kv(p + "expert_count", u(c.n_experts));
    w.add_kv(p + "expert_used_count", u(c.experts_per_tok));
    if (c.arch == model::Arch::kQwen3Moe)
      w.add_kv(p + "expert_feed_forward_length", u(c.moe_hidden_dim));
  }
  add_rope_kv(w, p, c);
  w.add_kv(p + "vocab_size", u(c.vocab_size));
  GgufMetadata kv = s.tokenizer_kv;
  if (s.chat) {
    set_chat_meta_kv(kv, *s.chat);
    // llama.cpp refuses a special token id outside the vocabulary: refused here, by name.
    for (const char* k : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
                          "tokenizer.ggml.padding_token_id"})
      if (const auto id = gguf_get_int(kv, k, s.source); id && *id >= c.vocab_size)
        throw IoError(s.source + ": " + k + " " + std::to_string(*id) +
                      " (from its generation config) is outside the vocabulary of " +
                      std::to_string(c.vocab_size));
  }
  for (const auto& [k, v] : kv) w.add_kv(k, v);
  // Without them in the tokenizer keys, the config's BOS/EOS ids (so they survive a round trip).
  if (!gguf_find_kv(kv, "tokenizer.ggml.bos_token_id") && c.bos_token_id >= 0)
    w.add_kv("tokenizer.ggml.bos_token_id", u(c.bos_token_id));
  if (!gguf_find_kv(kv, "tokenizer.ggml.eos_token_id") && c.eos_token_id >= 0)
    w.add_kv("tokenizer.ggml.eos_token_id", u(c.eos_token_id));
  if (!s.global_scales.empty()) {
    if (s.global_scales.size() != n_nvfp4)
      throw IoError(s.source + ": " + std::to_string(s.global_scales.size()) +
                    " global scales for " + std::to_string(n_nvfp4) + " NVFP4 Linears");
    w.add_kv(kGgufGlobalScalesKey, gguf_value_f32_array(s.global_scales));
  }
}

// Whether Linear `id` has a bias (qwen2's q/k/v), written F32 after its weight.
bool has_bias(const model::Config& c, LinearId id) {
  return c.qkv_bias && (id == LinearId::kQ || id == LinearId::kK || id == LinearId::kV);
}

// Every tensor in file order (the order write_embeddings/write_layer/write_head write them).
void declare_tensors(GgufWriter& w, const GgufModelSpec& s) {
  const model::Config& c = s.config;
  const int64_t D = c.dim, V = c.vocab_size, hd = c.head_dim;
  const auto dense2 = [&](int64_t cols) { return gguf_dense_type_for(s.dense_type, cols); };
  if (c.rope_scaling.type == model::RopeType::kLlama3)
    w.declare("rope_freqs.weight", GgmlType::kF32, {hd / 2});
  w.declare("token_embd.weight", dense2(D), {D, V});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    w.declare(p + "attn_norm.weight", GgmlType::kF32, {D});
    if (c.qk_norm) {
      w.declare(p + "attn_q_norm.weight", GgmlType::kF32, {hd});
      w.declare(p + "attn_k_norm.weight", GgmlType::kF32, {hd});
    }
    for (LinearId id : kAllLinears) {
      if (id == LinearId::kGate) w.declare(p + "ffn_norm.weight", GgmlType::kF32, {D});
      if (c.moe_layer(l) && model::is_ffn_linear(id)) {
        const int64_t E = c.n_experts, I = c.moe_hidden_dim;
        if (id == LinearId::kGate) w.declare(p + "ffn_gate_inp.weight", GgmlType::kF32, {D, E});
        const std::string n = gguf_experts_name(l, id);
        w.declare(
            n + ".weight", GgmlType::kNVFP4,
            id == LinearId::kDown ? std::vector<int64_t>{I, D, E} : std::vector<int64_t>{D, I, E});
        w.declare(n + ".scale", GgmlType::kF32, {E});
        continue;
      }
      const auto [rows, cols] = hf_linear_shape(c, id);
      const std::string n = gguf_linear_name(l, id);
      if (s.dense.contains(l, id)) {
        w.declare(n + ".weight", dense2(cols), {cols, rows});
      } else {
        w.declare(n + ".weight", GgmlType::kNVFP4, {cols, rows});
        w.declare(n + ".scale", GgmlType::kF32, {1});
      }
      if (has_bias(c, id)) w.declare(n + ".bias", GgmlType::kF32, {rows});
    }
  }
  w.declare("output_norm.weight", GgmlType::kF32, {D});
  if (s.write_lm_head) w.declare("output.weight", dense2(D), {D, V});
}

}  // namespace

GgufModelWriter::GgufModelWriter(const std::string& out, const GgufModelSpec& s)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.spec = s;
  m.out = out;
  const model::Config& c = s.config;
  check_gguf_config(c, s.source);
  for (int l = 0; l < c.n_layers; ++l)
    for (LinearId id : kAllLinears)
      if (const std::string why = gguf_nvfp4_obstacle(c, id, s.qwen2_as);
          !s.dense.contains(l, id) && !why.empty())
        refuse(s.source, std::string(model::linear_name(id)) + " as NVFP4: " + why + " (" +
                             gguf_linear_name(l, id) + ")");
  if (!s.overwrite && fs::exists(out))
    throw IoError(out + ": already exists (pass " + option_ref("force") + " to replace it)");
  add_model_kv(m.w, s);
  declare_tensors(m.w, s);
  // llama.cpp's converter permutes q/k for its llama architecture (Mixtral included) only, and
  // so for a Qwen2 model stored as llama.
  if (gguf_file_arch(c, s.qwen2_as) == "llama") {
    m.q_order = gguf_qk_row_order(c.n_heads, c.head_dim);
    m.k_order = gguf_qk_row_order(c.n_kv_heads, c.head_dim);
  }
  m.w.open(out);
  if (c.rope_scaling.type == model::RopeType::kLlama3) {
    const std::vector<float> f = gguf_llama3_rope_factors(c);
    m.put("rope_freqs.weight", std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(f.data()),
                                                    reinterpret_cast<const uint8_t*>(f.data()) +
                                                        f.size() * sizeof(float)));
  }
}

GgufModelWriter::~GgufModelWriter() = default;

void GgufModelWriter::write_embeddings(const model::Tensor& e) {
  impl_->dense("token_embd.weight", e, gguf_dense_type_for(impl_->spec.dense_type, e.cols()));
}

void GgufModelWriter::write_layer(int layer, const model::LayerWeights& lw,
                                  const std::vector<CheckpointLinear>& linears) {
  Impl& m = *impl_;
  if (layer != m.next_layer)
    throw std::logic_error("GgufModelWriter: layer " + std::to_string(layer) + " written, " +
                           std::to_string(m.next_layer) + " due");
  const model::Config& c = m.spec.config;
  const bool moe = c.moe_layer(layer);
  const size_t n_linears = moe ? 4 + 3 * static_cast<size_t>(c.n_experts) : 7;
  if (linears.size() != n_linears)
    throw std::logic_error("GgufModelWriter: layer " + std::to_string(layer) + " has " +
                           std::to_string(n_linears) + " Linears, " +
                           std::to_string(linears.size()) + " given");
  const std::string p = "blk." + std::to_string(layer) + ".";
  m.dense(p + "attn_norm.weight", lw.attn_norm, GgmlType::kF32);
  if (m.spec.config.qk_norm) {
    m.dense(p + "attn_q_norm.weight", lw.q_norm, GgmlType::kF32);
    m.dense(p + "attn_k_norm.weight", lw.k_norm, GgmlType::kF32);
  }
  for (size_t i = 0; i < 7; ++i) {
    const CheckpointLinear& cl = linears[i];
    const LinearId id = kAllLinears[i];
    if (id == LinearId::kGate) m.dense(p + "ffn_norm.weight", lw.ffn_norm, GgmlType::kF32);
    if (moe && model::is_ffn_linear(id)) {
      if (id == LinearId::kGate) {
        m.dense(p + "ffn_gate_inp.weight", lw.router, GgmlType::kF32);
        m.experts(layer, linears);
      }
      continue;
    }
    if (cl.id != id) throw std::logic_error("GgufModelWriter: Linears out of order");
    m.linear(layer, lw, cl);
    if (has_bias(m.spec.config, id)) m.bias(layer, id, lw);
  }
  ++m.next_layer;
}

void GgufModelWriter::write_head(const model::Tensor& final_norm, const model::Tensor& lm_head) {
  Impl& m = *impl_;
  if (m.next_layer != m.spec.config.n_layers)
    throw std::logic_error("GgufModelWriter: head written before every layer");
  m.dense("output_norm.weight", final_norm, GgmlType::kF32);
  if (m.spec.write_lm_head)
    m.dense("output.weight", lm_head, gguf_dense_type_for(m.spec.dense_type, lm_head.cols()));
}

CheckpointFiles GgufModelWriter::commit() {
  CheckpointFiles f;
  const auto t0 = std::chrono::steady_clock::now();
  f.bytes = impl_->w.commit();
  impl_->write_s += seconds_since(t0);
  f.files = {fs::path(impl_->out).filename().string()};
  f.write_seconds = impl_->write_s;
  return f;
}

}  // namespace scalesweep::io
