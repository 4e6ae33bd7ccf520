// Calibration statistics file (include/scalesweep/io/calib_stats.h).
#include "scalesweep/io/calib_stats.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "scalesweep/io/compressed_tensors.h"
#include "scalesweep/io/file.h"
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

namespace {

// Shapes of one layer's tensors.
struct LayerShape {
  std::array<int64_t, model::kNumInputs> dim{};
  int64_t q = 0, k = 0, v = 0;
  int64_t experts = 0, expert_in = 0, expert_mid = 0;  // a MoE layer's experts and widths
};

std::string expert_prefix(size_t l, size_t e) {
  return "layers." + std::to_string(l) + ".experts." + std::to_string(e) + ".";
}

// The records of one input: ΣxxT, tokens, amax (a MoE layer has no mlp_out: dim 0, none).
void declare_input(SafetensorsStreamWriter& w, const std::string& q, int64_t d) {
  if (d == 0) return;
  w.declare(q + ".xtx", StDType::kF64, {d, d});
  w.declare(q + ".tokens", StDType::kI64, {1});
  w.declare(q + ".amax", StDType::kF32, {1});
}

std::string input_prefix(size_t l, int i) {
  return "layers." + std::to_string(l) + "." +
         std::string(model::input_name(static_cast<model::InputId>(i)));
}

}  // namespace

struct CalibStatsWriter::Impl {
  SafetensorsStreamWriter w;
  std::vector<LayerShape> shapes;
  size_t next = 0;
  std::string path;
  int64_t experts = 0;  // the most experts of a layer (metadata n_experts)

  Impl(std::vector<LayerShape> sh, int64_t nsamples, int64_t seqlen, model::CalibDraw draw,
       const std::string& p)
      : shapes(std::move(sh)), path(p) {
    for (size_t l = 0; l < shapes.size(); ++l) {
      const LayerShape& S = shapes[l];
      for (int i = 0; i < model::kNumInputs; ++i)
        declare_input(w, input_prefix(l, i), S.dim[static_cast<size_t>(i)]);
      for (int64_t e = 0; e < S.experts; ++e) {
        const std::string q = expert_prefix(l, static_cast<size_t>(e));
        declare_input(w, q + "mlp_in", S.expert_in);
        declare_input(w, q + "mlp_out", S.expert_mid);
        w.declare(q + "routed", StDType::kI64, {1});
      }
      experts = std::max(experts, S.experts);
      const std::string p2 = "layers." + std::to_string(l) + ".";
      const std::pair<const char*, int64_t> qkv[] = {{"q", S.q}, {"k", S.k}, {"v", S.v}};
      for (const auto& [nm, n] : qkv) {
        w.declare(p2 + nm + ".amax", StDType::kF32, {1});
        w.declare(p2 + nm + ".sqnorm", StDType::kF64, {n});
      }
    }
    w.set_metadata("format", kFormat);
    w.set_metadata("n_layers", std::to_string(shapes.size()));
    w.set_metadata("nsamples", std::to_string(nsamples));
    w.set_metadata("seqlen", std::to_string(seqlen));
    w.set_metadata("seed", std::to_string(draw.seed));
    // Only when not random (older files have no key: random windows).
    if (draw.windows != model::CalibWindows::kRandom)
      w.set_metadata("windows", std::string(model::kCalibWindowNames.name(draw.windows)));
    // Only in files of MoE models: a file without it has no expert entries (older files).
    if (experts > 0) w.set_metadata("n_experts", std::to_string(experts));
    w.open(path);
  }

  void write_input(const model::InputStats& in, const std::string& q, int64_t d) {
    if (in.dim != d || in.xtx.size() != static_cast<size_t>(d * d))
      throw IoError(path + ": tensor '" + q + ".xtx' of dim " + std::to_string(d) + " given dim " +
                    std::to_string(in.dim) + " with " + std::to_string(in.xtx.size()) +
                    " values (ΣxxT is required)");
    if (d == 0) return;
    w.write(q + ".xtx", bytes_of(in.xtx));
    const int64_t tokens = in.tokens;
    w.write(q + ".tokens", bytes_of(tokens));
    w.write(q + ".amax", bytes_of(in.amax));
  }

  void write_layer(int l, const model::LayerStats& L) {
    if (l < 0 || static_cast<size_t>(l) != next)
      throw IoError(path + ": calibration layer " + std::to_string(l) + " written out of order " +
                    "(expected layer " + std::to_string(next) + ")");
    if (next >= shapes.size())
      throw IoError(path + ": calibration layer " + std::to_string(l) + " beyond the " +
                    std::to_string(shapes.size()) + " declared");
    const LayerShape& S = shapes[next];
    for (int i = 0; i < model::kNumInputs; ++i)
      write_input(L.inputs[static_cast<size_t>(i)], input_prefix(next, i),
                  S.dim[static_cast<size_t>(i)]);
    if (static_cast<int64_t>(L.experts.size()) != S.experts)
      throw IoError(path + ": calibration layer " + std::to_string(l) + " given " +
                    std::to_string(L.experts.size()) + " experts, declared " +
                    std::to_string(S.experts));
    for (size_t e = 0; e < L.experts.size(); ++e) {
      const std::string q = expert_prefix(next, e);
      write_input(L.experts[e].in, q + "mlp_in", S.expert_in);
      write_input(L.experts[e].mid, q + "mlp_out", S.expert_mid);
      w.write(q + "routed", bytes_of(L.experts[e].routed));
    }
    const std::string p = "layers." + std::to_string(next) + ".";
    const std::pair<const char*, std::pair<float, const std::vector<double>*>> qkv[] = {
        {"q", {L.q_amax, &L.q_sqnorm}},
        {"k", {L.k_amax, &L.k_sqnorm}},
        {"v", {L.v_amax, &L.v_sqnorm}}};
    for (const auto& [nm, val] : qkv) {
      w.write(p + nm + ".amax", bytes_of(val.first));
      w.write(p + nm + ".sqnorm", bytes_of(*val.second));
    }
    ++next;
  }
};

CalibStatsWriter::CalibStatsWriter(const model::Config& c, int64_t nsamples, int64_t seqlen,
                                   model::CalibDraw draw, const std::string& path) {
  std::vector<LayerShape> sh(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    LayerShape& S = sh[static_cast<size_t>(l)];
    for (int i = 0; i < model::kNumInputs; ++i)
      S.dim[static_cast<size_t>(i)] = model::input_dim(c, static_cast<model::InputId>(i), l);
    S.q = int64_t{c.n_heads} * c.head_dim;
    S.k = S.v = int64_t{c.n_kv_heads} * c.head_dim;
    if (c.moe_layer(l)) {
      S.experts = c.n_experts;
      S.expert_in = c.dim;
      S.expert_mid = c.moe_hidden_dim;
    }
  }
  impl_ = std::make_unique<Impl>(std::move(sh), nsamples, seqlen, draw, path);
}

CalibStatsWriter::~CalibStatsWriter() = default;

void CalibStatsWriter::write_layer(int l, const model::LayerStats& L) { impl_->write_layer(l, L); }

void CalibStatsWriter::commit() {
  if (impl_->next != impl_->shapes.size())
    throw IoError(impl_->path + ": calibration layer " + std::to_string(impl_->next) +
                  " was not written");
  impl_->w.commit();
}

void save_calib_stats(const model::CalibStats& s, const std::string& path) {
  std::vector<LayerShape> sh(s.layers.size());
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const auto& L = s.layers[l];
    for (int i = 0; i < model::kNumInputs; ++i)
      sh[l].dim[static_cast<size_t>(i)] = L.inputs[static_cast<size_t>(i)].dim;
    sh[l].q = static_cast<int64_t>(L.q_sqnorm.size());
    sh[l].k = static_cast<int64_t>(L.k_sqnorm.size());
    sh[l].v = static_cast<int64_t>(L.v_sqnorm.size());
    sh[l].experts = static_cast<int64_t>(L.experts.size());
    if (!L.experts.empty()) {
      sh[l].expert_in = L.experts[0].in.dim;
      sh[l].expert_mid = L.experts[0].mid.dim;
    }
  }
  CalibStatsWriter::Impl w(std::move(sh), s.nsamples, s.seqlen, s.draw, path);
  for (size_t l = 0; l < s.layers.size(); ++l) w.write_layer(static_cast<int>(l), s.layers[l]);
  w.w.commit();
}

namespace {

// The reading of one calibration statistics file: its tensors checked (dtype, rank, finite,
// non-negative) as they are read.
class CalibStatsReader {
 public:
  CalibStatsReader(const std::string& path, bool with_xtx)
      : f_(SafetensorsFile::open(path)), path_(path), with_xtx_(with_xtx) {}
  ~CalibStatsReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  CalibStatsReader(const CalibStatsReader&) = delete;
  CalibStatsReader& operator=(const CalibStatsReader&) = delete;

  IoError fail(const std::string& what) const { return IoError(path_ + ": " + what); }
  const SafetensorsFile& file() const { return f_; }

  // Metadata `key`; a file without it is not a calibration statistics file.
  std::string meta(const char* key) const {
    const auto& md = f_.metadata();
    auto it = md.find(key);
    if (it == md.end())
      throw fail(std::string("not a calibration statistics file (metadata '") + key + "' missing)");
    return it->second;
  }
  // Metadata `key` as a non-negative integer.
  int64_t num(const char* key) const {
    const std::string v = meta(key);
    try {
      size_t pos = 0;
      long long x = std::stoll(v, &pos);
      if (pos != v.size() || x < 0) throw std::invalid_argument(v);
      return x;
    } catch (const std::exception&) {
      throw fail(std::string("metadata ") + key + " = '" + v + "' is not a non-negative integer");
    }
  }

  // Opens the descriptor of the diagonal reads (with_xtx = false).
  void open_for_diagonal() {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw fail(std::string("cannot open: ") + std::strerror(errno));
  }

  // One layer's records, `n_experts` experts' when it is a MoE layer.
  void read_layer(int64_t l, int64_t n_experts, model::LayerStats& L);

 private:
  const TensorInfo& get(const std::string& name, StDType dt, int rank) const {
    const TensorInfo& t = f_.at(name);
    if (t.dtype != dt)
      throw fail("tensor '" + name + "' has dtype " + std::string(dtype_name(t.dtype)) +
                 ", expected " + std::string(dtype_name(dt)));
    if (static_cast<int>(t.shape.size()) != rank)
      throw fail("tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected rank " +
                 std::to_string(rank));
    return t;
  }
  std::vector<double> read_f64(const TensorInfo& t) const {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    auto raw = f_.raw(t);
    std::memcpy(v.data(), raw.data(), raw.size());
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        throw fail("tensor '" + t.name + "' element " + std::to_string(i) + " is not finite");
    return v;
  }
  float scalar_f32(const std::string& name) const {
    const TensorInfo& t = get(name, StDType::kF32, 1);
    if (t.numel() != 1) throw fail("tensor '" + name + "' must hold one value");
    float v;
    std::memcpy(&v, f_.raw(t).data(), 4);
    if (!std::isfinite(v) || v < 0) throw fail("tensor '" + name + "' = " + std::to_string(v));
    return v;
  }
  // A count: one non-negative I64.
  int64_t count_i64(const std::string& name) const {
    const TensorInfo& t = get(name, StDType::kI64, 1);
    if (t.numel() != 1) throw fail("tensor '" + t.name + "' must hold one value");
    int64_t v;
    std::memcpy(&v, f_.raw(t).data(), 8);
    if (v < 0) throw fail("tensor '" + t.name + "' is negative");
    return v;
  }
  void read_diagonal(const TensorInfo& x, model::InputStats& in);
  void read_input(model::InputStats& in, const std::string& q);
  void read_experts(size_t l, int64_t n_experts, model::LayerStats& L);

  SafetensorsFile f_;
  const std::string& path_;
  bool with_xtx_;
  int fd_ = -1;  // for the diagonal reads (with_xtx = false)
};

// Only the diagonal of ΣxxT `x`: one double per row, read with pread. Reading it through the
// mapping would fault in (fault-around) most of the matrix's pages, which then count in the
// resident set although ΣxxT is not kept.
void CalibStatsReader::read_diagonal(const TensorInfo& x, model::InputStats& in) {
  in.xdiag.resize(static_cast<size_t>(in.dim));
  for (int64_t j = 0; j < in.dim; ++j) {
    const uint64_t at = x.offset + static_cast<uint64_t>(j * in.dim + j) * 8;
    if (::pread(fd_, &in.xdiag[j], 8, static_cast<off_t>(at)) != 8)
      throw fail("tensor '" + x.name + "': cannot read element " + std::to_string(j * in.dim + j) +
                 ": " + std::strerror(errno));
    if (!std::isfinite(in.xdiag[j]))
      throw fail("tensor '" + x.name + "' element " + std::to_string(j * in.dim + j) +
                 " is not finite");
  }
}

// The records of input `q`: ΣxxT (or its diagonal), tokens, amax.
void CalibStatsReader::read_input(model::InputStats& in, const std::string& q) {
  const TensorInfo& x = get(q + ".xtx", StDType::kF64, 2);
  if (x.shape[0] != x.shape[1])
    throw fail("tensor '" + x.name + "' has shape " + shape_str(x.shape) + ", not square");
  in.dim = x.shape[0];
  if (with_xtx_) {
    in.xtx = read_f64(x);
    in.xdiag.resize(static_cast<size_t>(in.dim));
    for (int64_t j = 0; j < in.dim; ++j) in.xdiag[j] = in.xtx[j * in.dim + j];
  } else {
    read_diagonal(x, in);
  }
  for (int64_t j = 0; j < in.dim; ++j)
    if (in.xdiag[j] < 0)
      throw fail("tensor '" + x.name + "' diagonal element " + std::to_string(j) + " is negative");
  in.tokens = count_i64(q + ".tokens");
  in.amax = scalar_f32(q + ".amax");
}

// The `n_experts` experts' records of MoE layer l, all of expert 0's widths.
void CalibStatsReader::read_experts(size_t l, int64_t n_experts, model::LayerStats& L) {
  L.experts.resize(static_cast<size_t>(n_experts));
  for (size_t e = 0; e < L.experts.size(); ++e) {
    model::ExpertStats& ex = L.experts[e];
    const std::string q = expert_prefix(l, e);
    read_input(ex.in, q + "mlp_in");
    read_input(ex.mid, q + "mlp_out");
    ex.routed = count_i64(q + "routed");
    if (ex.in.dim != L.experts[0].in.dim || ex.mid.dim != L.experts[0].mid.dim)
      throw fail("tensor '" + q + "mlp_in.xtx' or '" + q +
                 "mlp_out.xtx' has a width other than expert 0's");
  }
}

void CalibStatsReader::read_layer(int64_t l, int64_t n_experts, model::LayerStats& L) {
  const std::string p = "layers." + std::to_string(l) + ".";
  const bool moe_layer = n_experts > 0 && f_.contains(expert_prefix(l, 0) + "routed");
  for (int i = 0; i < model::kNumInputs; ++i) {
    const std::string q = p + std::string(model::input_name(static_cast<model::InputId>(i)));
    if (moe_layer && static_cast<model::InputId>(i) == model::InputId::kMlpOut &&
        !f_.contains(q + ".xtx"))
      continue;  // a MoE layer has no dense down projection: dim 0
    read_input(L.inputs[i], q);
  }
  if (moe_layer) read_experts(static_cast<size_t>(l), n_experts, L);
  L.q_amax = scalar_f32(p + "q.amax");
  L.k_amax = scalar_f32(p + "k.amax");
  L.v_amax = scalar_f32(p + "v.amax");
  L.q_sqnorm = read_f64(get(p + "q.sqnorm", StDType::kF64, 1));
  L.k_sqnorm = read_f64(get(p + "k.sqnorm", StDType::kF64, 1));
  L.v_sqnorm = read_f64(get(p + "v.sqnorm", StDType::kF64, 1));
}

}  // namespace

model::CalibStats load_calib_stats(const std::string& path, bool with_xtx) {
  CalibStatsReader r(path, with_xtx);
  if (r.meta("format") != kFormat)
    throw r.fail("metadata format '" + r.meta("format") + "', expected '" + kFormat + "'");
  model::CalibStats s;
  const int64_t n_layers = r.num("n_layers");
  if (n_layers > 100000) throw r.fail("metadata n_layers = " + std::to_string(n_layers));
  s.nsamples = r.num("nsamples");
  s.seqlen = r.num("seqlen");
  s.draw.seed = static_cast<uint64_t>(std::stoull(r.meta("seed")));
  if (r.file().metadata().count("windows")) {
    const auto w = model::kCalibWindowNames.find(r.meta("windows"));
    if (!w)
      throw r.fail("metadata windows '" + r.meta("windows") + "', expected one of " +
                   model::kCalibWindowNames.accepted());
    s.draw.windows = *w;
  }
  if (!with_xtx) r.open_for_diagonal();
  // MoE models' files (metadata n_experts): a layer with layers.{l}.experts.0.routed holds
  // n_experts experts' records.
  const int64_t n_experts = r.file().metadata().count("n_experts") ? r.num("n_experts") : 0;
  if (n_experts > 1000000) throw r.fail("metadata n_experts = " + std::to_string(n_experts));
  s.layers.resize(static_cast<size_t>(n_layers));
  for (int64_t l = 0; l < n_layers; ++l) r.read_layer(l, n_experts, s.layers[l]);
  return s;
}

}  // namespace scalesweep::io
