// Calibration statistics file (include/scalesweep/io/calib_stats.h).
#include "scalesweep/io/calib_stats.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "scalesweep/io/safetensors.h"

namespace scalesweep::io {

namespace {

constexpr const char* kFormat = "scalesweep-calib-v1";

template <class T>
std::span<const uint8_t> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}
template <class T>
std::span<const uint8_t> bytes_of(const T& v) {
  return {reinterpret_cast<const uint8_t*>(&v), sizeof(T)};
}

}  // namespace

void save_calib_stats(const model::CalibStats& s, const std::string& path) {
  SafetensorsWriter w;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const auto& L = s.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    for (int i = 0; i < model::kNumInputs; ++i) {
      const auto& in = L.inputs[i];
      const std::string q = p + std::string(model::input_name(static_cast<model::InputId>(i)));
      w.add(q + ".xtx", DType::kF64, {in.dim, in.dim}, bytes_of(in.xtx));
      int64_t tokens = in.tokens;
      w.add(q + ".tokens", DType::kI64, {1}, bytes_of(tokens));
      w.add(q + ".amax", DType::kF32, {1}, bytes_of(in.amax));
    }
    const std::pair<const char*, std::pair<float, const std::vector<double>*>> qkv[] = {
        {"q", {L.q_amax, &L.q_sqnorm}},
        {"k", {L.k_amax, &L.k_sqnorm}},
        {"v", {L.v_amax, &L.v_sqnorm}}};
    for (const auto& [nm, val] : qkv) {
      w.add(p + nm + ".amax", DType::kF32, {1}, bytes_of(val.first));
      w.add(p + nm + ".sqnorm", DType::kF64, {static_cast<int64_t>(val.second->size())},
            bytes_of(*val.second));
    }
  }
  w.set_metadata("format", kFormat);
  w.set_metadata("n_layers", std::to_string(s.layers.size()));
  w.set_metadata("nsamples", std::to_string(s.nsamples));
  w.set_metadata("seqlen", std::to_string(s.seqlen));
  w.set_metadata("seed", std::to_string(s.seed));
  w.write(path);
}

model::CalibStats load_calib_stats(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::open(path);
  auto fail = [&](const std::string& what) -> IoError { return IoError(path + ": " + what); };
  const auto& md = f.metadata();
  auto meta = [&](const char* key) -> std::string {
    auto it = md.find(key);
    if (it == md.end())
      throw fail(std::string("not a calibration statistics file (metadata '") + key + "' missing)");
    return it->second;
  };
  if (meta("format") != kFormat)
    throw fail("metadata format '" + meta("format") + "', expected '" + kFormat + "'");
  auto num = [&](const char* key) -> int64_t {
    const std::string v = meta(key);
    try {
      size_t pos = 0;
      long long x = std::stoll(v, &pos);
      if (pos != v.size() || x < 0) throw std::invalid_argument(v);
      return x;
    } catch (const std::exception&) {
      throw fail(std::string("metadata ") + key + " = '" + v + "' is not a non-negative integer");
    }
  };
  model::CalibStats s;
  const int64_t n_layers = num("n_layers");
  if (n_layers > 100000) throw fail("metadata n_layers = " + std::to_string(n_layers));
  s.nsamples = num("nsamples");
  s.seqlen = num("seqlen");
  s.seed = static_cast<uint64_t>(std::stoull(meta("seed")));
  auto get = [&](const std::string& name, DType dt, int rank) -> const TensorInfo& {
    const TensorInfo& t = f.at(name);
    if (t.dtype != dt)
      throw fail("tensor '" + name + "' has dtype " + std::string(dtype_name(t.dtype)) +
                 ", expected " + std::string(dtype_name(dt)));
    if (static_cast<int>(t.shape.size()) != rank)
      throw fail("tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected rank " +
                 std::to_string(rank));
    return t;
  };
  auto read_f64 = [&](const TensorInfo& t) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    auto raw = f.raw(t);
    std::memcpy(v.data(), raw.data(), raw.size());
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        throw fail("tensor '" + t.name + "' element " + std::to_string(i) + " is not finite");
    return v;
  };
  auto scalar_f32 = [&](const std::string& name) {
    const TensorInfo& t = get(name, DType::kF32, 1);
    if (t.numel() != 1) throw fail("tensor '" + name + "' must hold one value");
    float v;
    std::memcpy(&v, f.raw(t).data(), 4);
    if (!std::isfinite(v) || v < 0) throw fail("tensor '" + name + "' = " + std::to_string(v));
    return v;
  };
  s.layers.resize(static_cast<size_t>(n_layers));
  for (int64_t l = 0; l < n_layers; ++l) {
    auto& L = s.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    for (int i = 0; i < model::kNumInputs; ++i) {
      auto& in = L.inputs[i];
      const std::string q = p + std::string(model::input_name(static_cast<model::InputId>(i)));
      const TensorInfo& x = get(q + ".xtx", DType::kF64, 2);
      if (x.shape[0] != x.shape[1])
        throw fail("tensor '" + x.name + "' has shape " + shape_str(x.shape) + ", not square");
      in.dim = x.shape[0];
      in.xtx = read_f64(x);
      for (int64_t j = 0; j < in.dim; ++j)
        if (in.xtx[j * in.dim + j] < 0)
          throw fail("tensor '" + x.name + "' diagonal element " + std::to_string(j) +
                     " is negative");
      const TensorInfo& tk = get(q + ".tokens", DType::kI64, 1);
      if (tk.numel() != 1) throw fail("tensor '" + tk.name + "' must hold one value");
      std::memcpy(&in.tokens, f.raw(tk).data(), 8);
      if (in.tokens < 0) throw fail("tensor '" + tk.name + "' is negative");
      in.amax = scalar_f32(q + ".amax");
    }
    L.q_amax = scalar_f32(p + "q.amax");
    L.k_amax = scalar_f32(p + "k.amax");
    L.v_amax = scalar_f32(p + "v.amax");
    L.q_sqnorm = read_f64(get(p + "q.sqnorm", DType::kF64, 1));
    L.k_sqnorm = read_f64(get(p + "k.sqnorm", DType::kF64, 1));
    L.v_sqnorm = read_f64(get(p + "v.sqnorm", DType::kF64, 1));
  }
  return s;
}

}  // namespace scalesweep::io
