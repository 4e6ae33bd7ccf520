// scalesweep inspect FILE.gguf (dispatched from the inspect command in cmd_quantize.cc): one
// io::GgufFile::open, then rendering; --dump-dequant is one io::write_dequantized_safetensors.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "scalesweep/io/gguf.h"
#include "tools/inspect_gguf.h"
#include "tools/output.h"
#include "tools/ui.h"

namespace scalesweep::tools {
namespace {

using nlohmann::json;

// Values as JSON; non-finite floats as the strings "nan", "inf", "-inf" (JSON has none).
json value_json(const io::GgufValue& v) {
  if (v.type == io::GgufValueType::kArray) {
    json a = json::array();
    for (const io::GgufValue& e : v.array) a.push_back(value_json(e));
    return a;
  }
  if (const auto* u = std::get_if<uint64_t>(&v.scalar)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.scalar)) return *i;
  if (const auto* b = std::get_if<bool>(&v.scalar)) return *b;
  if (const auto* s = std::get_if<std::string>(&v.scalar)) return *s;
  const double d = std::get<double>(v.scalar);
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  return d;
}

std::string type_str(const io::GgufValue& v) {
  std::string s = io::gguf_value_type_name(static_cast<uint32_t>(v.type));
  if (v.type == io::GgufValueType::kArray)
    s += "[" + io::gguf_value_type_name(static_cast<uint32_t>(v.elem_type)) + "]";
  return s;
}

// Short text form: scalars in full (strings up to 60 characters), arrays as a count and the
// first few elements.
std::string value_text(const io::GgufValue& v) {
  if (v.type == io::GgufValueType::kArray) {
    std::string s = strf("%zu: [", v.array.size());
    for (size_t i = 0; i < v.array.size() && i < 4; ++i)
      s += (i ? ", " : "") + value_text(v.array[i]);
    return s + (v.array.size() > 4 ? ", ...]" : "]");
  }
  if (const auto* str = std::get_if<std::string>(&v.scalar)) {
    std::string s = json(*str).dump(-1, ' ', false, json::error_handler_t::replace);
    return s.size() > 60 ? s.substr(0, 57) + "...\"" : s;
  }
  return value_json(v).dump();
}

std::string ne_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace

int run_inspect_gguf(const InspectGgufArgs& a) {
  if (!a.dump.empty()) check_output_file(a.dump, "--dump-dequant", a.force, {a.path});
  if (!a.tensors.empty() && a.dump.empty())
    throw std::invalid_argument("--tensor selects tensors for --dump-dequant; give --dump-dequant");
  const io::GgufFile f = io::GgufFile::open(a.path);
  size_t dumped = 0;
  if (!a.dump.empty()) dumped = io::write_dequantized_safetensors(f, a.tensors, a.dump);
  if (a.json_out) {
    json md = json::array();
    for (const auto& [k, v] : f.metadata()) {
      json e{{"key", k}, {"type", io::gguf_value_type_name(static_cast<uint32_t>(v.type))}};
      if (v.type == io::GgufValueType::kArray)
        e["elem_type"] = io::gguf_value_type_name(static_cast<uint32_t>(v.elem_type));
      e["value"] = value_json(v);
      md.push_back(std::move(e));
    }
    json ts = json::array();
    for (const io::GgufTensorInfo& t : f.tensors())
      ts.push_back({{"name", t.name},
                    {"type", io::ggml_type_name(t.type)},
                    {"type_id", t.type},
                    {"ne", t.ne},
                    {"offset", t.offset},
                    {"nbytes", t.nbytes}});
    json j{{"file", a.path},
           {"format", "gguf"},
           {"version", f.version()},
           {"alignment", f.alignment()},
           {"data_offset", f.data_offset()},
           {"metadata", md},
           {"tensors", ts}};
    if (!a.dump.empty()) j["dump_dequant"] = {{"path", a.dump}, {"tensors", dumped}};
    std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }
  Table m({"key", "type", "value"});
  for (const auto& [k, v] : f.metadata()) m.add_row({k, type_str(v), value_text(v)});
  m.print();
  std::printf("\n");
  Table t({"tensor", "type", "ne", "offset", "bytes"});
  uint64_t total = 0;
  for (const io::GgufTensorInfo& ti : f.tensors()) {
    t.add_row({ti.name, io::ggml_type_name(ti.type), ne_str(ti.ne), std::to_string(ti.offset),
               std::to_string(ti.nbytes)});
    total += ti.nbytes;
  }
  t.print();
  std::printf(
      "%s: GGUF v%u, alignment %llu, %zu metadata keys, %zu tensors, %llu bytes of data%s\n",
      a.path.c_str(), f.version(), (unsigned long long)f.alignment(), f.metadata().size(),
      f.tensors().size(), (unsigned long long)total,
      a.dump.empty() ? ""
                     : strf(", %zu tensors dequantized to %s", dumped, a.dump.c_str()).c_str());
  return 0;
}

}  // namespace scalesweep::tools
