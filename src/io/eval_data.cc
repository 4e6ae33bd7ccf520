#include "scalesweep/io/eval_data.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#ifndef SS_HAVE_ARROW
#define SS_HAVE_ARROW 0
#endif
#if SS_HAVE_ARROW
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include "scalesweep/io/file.h"
#endif

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw IoError(path + ": " + what);
}

const char* json_kind(const json& j) {
  switch (j.type()) {
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::null:
      return "null";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
      return "a number";
    default:
      return "not an object";
  }
}

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<json> docs;
  size_t first_blank = 0;  // 1-based line of the first blank line after the last document
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
      if (first_blank == 0) first_blank = line_no;
      continue;
    }
    const std::string where = "line " + std::to_string(line_no);
    if (first_blank != 0)
      fail(path, "line " + std::to_string(first_blank) +
                     ": blank line between documents (JSONL has one JSON object per line)");
    json doc;
    try {
      doc = json::parse(line);
    } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e400
      fail(path, where + ": not valid JSON (" + e.what() + ")");
    }
    if (!doc.is_object()) fail(path, where + ": not a JSON object (" + json_kind(doc) + ")");
    docs.push_back(std::move(doc));
  }
  if (docs.empty())
    fail(path, text.empty() ? "empty file: no documents" : "no documents (only blank lines)");
  return docs;
}

// A Hugging Face save_to_disk folder: the data files that state.json lists, in its order.
std::vector<std::string> save_to_disk_files(const std::string& dir) {
  const std::string state = (fs::path(dir) / "state.json").string();
  std::ifstream in(state, std::ios::binary);
  if (!in)
    fail(dir,
         "a folder without state.json (expected a Hugging Face save_to_disk folder, or a "
         ".jsonl, .parquet or .arrow file)");
  json st;
  try {
    st = json::parse(in);
  } catch (const json::parse_error& e) {
    fail(state, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!st.is_object() || !st.contains("_data_files") || !st["_data_files"].is_array() ||
      st["_data_files"].empty())
    fail(state, "no _data_files list (not a Hugging Face save_to_disk state)");
  std::vector<std::string> files;
  for (const json& f : st["_data_files"]) {
    if (!f.is_object() || !f.contains("filename") || !f["filename"].is_string())
      fail(state, "a _data_files entry without a filename");
    const std::string name = f["filename"].get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      fail(state, "data file name '" + name + "' is not a plain file name");
    files.push_back((fs::path(dir) / name).string());
  }
  return files;
}

#if SS_HAVE_ARROW

template <typename T>
T check_result(arrow::Result<T> r, const std::string& path) {
  if (!r.ok()) fail(path, r.status().ToString());
  return std::move(r).ValueOrDie();
}

void check_status(const arrow::Status& s, const std::string& path) {
  if (!s.ok()) fail(path, s.ToString());
}

struct Where {
  const std::string& path;
  int64_t row;
  const std::string& column;
  [[noreturn]] void unsupported(const arrow::DataType& t) const {
    fail(path, "row " + std::to_string(row) + ": column '" + column + "': type " + t.ToString() +
                   " has no JSON form here (strings, integers, floats, bools, lists and structs "
                   "are read)");
  }
};

json to_json(const arrow::Array& a, int64_t i, const Where& w);

template <typename ListArray>
json list_to_json(const arrow::Array& a, int64_t i, const Where& w) {
  const auto& l = static_cast<const ListArray&>(a);
  json out = json::array();
  const int64_t off = l.value_offset(i), n = l.value_length(i);
  for (int64_t k = 0; k < n; ++k) out.push_back(to_json(*l.values(), off + k, w));
  return out;
}

template <typename NumArray>
auto num(const arrow::Array& a, int64_t i) {
  return static_cast<const NumArray&>(a).Value(i);
}

json to_json(const arrow::Array& a, int64_t i, const Where& w) {
  if (a.IsNull(i)) return nullptr;
  switch (a.type_id()) {
    case arrow::Type::NA:
      return nullptr;
    case arrow::Type::BOOL:
      return num<arrow::BooleanArray>(a, i);
    case arrow::Type::INT8:
      return static_cast<int64_t>(num<arrow::Int8Array>(a, i));
    case arrow::Type::INT16:
      return static_cast<int64_t>(num<arrow::Int16Array>(a, i));
    case arrow::Type::INT32:
      return static_cast<int64_t>(num<arrow::Int32Array>(a, i));
    case arrow::Type::INT64:
      return static_cast<int64_t>(num<arrow::Int64Array>(a, i));
    case arrow::Type::UINT8:
      return static_cast<uint64_t>(num<arrow::UInt8Array>(a, i));
    case arrow::Type::UINT16:
      return static_cast<uint64_t>(num<arrow::UInt16Array>(a, i));
    case arrow::Type::UINT32:
      return static_cast<uint64_t>(num<arrow::UInt32Array>(a, i));
    case arrow::Type::UINT64:
      return static_cast<uint64_t>(num<arrow::UInt64Array>(a, i));
    case arrow::Type::FLOAT:
      return static_cast<double>(num<arrow::FloatArray>(a, i));
    case arrow::Type::DOUBLE:
      return num<arrow::DoubleArray>(a, i);
    case arrow::Type::STRING:
      return std::string(static_cast<const arrow::StringArray&>(a).GetView(i));
    case arrow::Type::LARGE_STRING:
      return std::string(static_cast<const arrow::LargeStringArray&>(a).GetView(i));
    case arrow::Type::STRING_VIEW:
      return std::string(static_cast<const arrow::StringViewArray&>(a).GetView(i));
    case arrow::Type::LIST:
      return list_to_json<arrow::ListArray>(a, i, w);
    case arrow::Type::LARGE_LIST:
      return list_to_json<arrow::LargeListArray>(a, i, w);
    case arrow::Type::FIXED_SIZE_LIST:
      return list_to_json<arrow::FixedSizeListArray>(a, i, w);
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      json out = json::object();
      for (int k = 0; k < s.num_fields(); ++k)
        out[s.struct_type()->field(k)->name()] = to_json(*s.field(k), i, w);
      return out;
    }
    case arrow::Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return to_json(*d.dictionary(), d.GetValueIndex(i), w);
    }
    default:
      w.unsupported(*a.type());
  }
}

void append_batch(const arrow::RecordBatch& batch, const std::string& path, int64_t& row,
                  std::vector<json>& docs) {
  const auto& schema = *batch.schema();
  for (int64_t r = 0; r < batch.num_rows(); ++r, ++row) {
    json doc = json::object();
    for (int c = 0; c < batch.num_columns(); ++c) {
      const Where w{path, row, schema.field(c)->name()};
      doc[schema.field(c)->name()] = to_json(*batch.column(c), r, w);
    }
    docs.push_back(std::move(doc));
  }
}

// An Arrow IPC file: the stream format (what datasets' save_to_disk writes) or the file format
// (magic "ARROW1" at the start).
void read_arrow(const std::string& path, std::vector<json>& docs, int64_t& row) {
  auto file = check_result(arrow::io::ReadableFile::Open(path), path);
  char magic[6] = {};
  const int64_t got = check_result(file->ReadAt(0, 6, magic), path);
  if (got == 6 && std::string_view(magic, 6) == "ARROW1") {
    auto reader = check_result(arrow::ipc::RecordBatchFileReader::Open(file), path);
    for (int b = 0; b < reader->num_record_batches(); ++b)
      append_batch(*check_result(reader->ReadRecordBatch(b), path), path, row, docs);
    return;
  }
  check_status(file->Seek(0), path);  // the stream reader reads from the position
  auto reader = check_result(arrow::ipc::RecordBatchStreamReader::Open(file), path);
  for (;;) {
    std::shared_ptr<arrow::RecordBatch> batch;
    check_status(reader->ReadNext(&batch), path);
    if (!batch) break;
    append_batch(*batch, path, row, docs);
  }
}

void read_parquet(const std::string& path, std::vector<json>& docs, int64_t& row) {
  auto file = check_result(arrow::io::ReadableFile::Open(path), path);
  std::unique_ptr<parquet::arrow::FileReader> reader;
  std::shared_ptr<arrow::Table> table;
  try {
    reader = check_result(parquet::arrow::OpenFile(file, arrow::default_memory_pool()), path);
    table = check_result(reader->ReadTable(), path);
  } catch (const parquet::ParquetException& e) {
    fail(path, e.what());
  }
  arrow::TableBatchReader batches(*table);
  for (;;) {
    std::shared_ptr<arrow::RecordBatch> batch;
    check_status(batches.ReadNext(&batch), path);
    if (!batch) break;
    append_batch(*batch, path, row, docs);
  }
}

#else

[[noreturn]] void refuse_arrow(const std::string& path) {
  fail(path,
       "this build of scalesweep reads only JSONL (.jsonl); for Parquet, Arrow and save_to_disk "
       "folders install pyarrow (python3 -m pip install pyarrow) and reconfigure "
       "(cmake -DSS_ARROW=ON), or convert the data: python3 scripts/eval_data.py convert '" +
           path + "' OUT.jsonl");
}

#endif  // SS_HAVE_ARROW

}  // namespace

bool reads_arrow() { return SS_HAVE_ARROW != 0; }

std::vector<json> read_documents(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail(path, "no such file or folder");
  const std::string ext = fs::path(path).extension().string();
  const bool dir = fs::is_directory(st);
  if (!dir && (ext == ".jsonl" || ext == ".json")) return read_jsonl(path);
  if (!dir && ext != ".parquet" && ext != ".arrow")
    fail(path, "unknown kind of data file '" + ext +
                   "' (expected .jsonl, .json, .parquet, .arrow or a save_to_disk folder)");
#if SS_HAVE_ARROW
  std::vector<json> docs;
  int64_t row = 0;
  if (dir) {
    for (const std::string& f : save_to_disk_files(path)) read_arrow(f, docs, row);
  } else if (ext == ".parquet") {
    read_parquet(path, docs, row);
  } else {
    read_arrow(path, docs, row);
  }
  if (docs.empty()) fail(path, "no documents (0 rows)");
  return docs;
#else
  if (dir) save_to_disk_files(path);  // a folder that is not one gets that message first
  refuse_arrow(path);
#endif
}

}  // namespace scalesweep::io
