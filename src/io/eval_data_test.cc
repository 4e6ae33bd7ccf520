#include "scalesweep/io/eval_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "scalesweep/io/file.h"

namespace scalesweep::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Checked-in Arrow/Parquet fixtures (src/io/testdata/eval_data/make_fixtures.py wrote them).
const fs::path kFixtures = fs::path(SS_SOURCE_DIR) / "src/io/testdata/eval_data";

class EvalData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ss_eval_data_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  // The message of the IoError that read_documents(path) throws ("" when none).
  static std::string error_of(const std::string& path) {
    try {
      read_documents(path);
    } catch (const IoError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(EvalData, JsonlRoundTripKeepsOrderAndUnicode) {
  const std::vector<json> docs = {
      {{"question", "Café? 日本語 🙂"}, {"choices", {"a", "b\n\"c\""}}, {"label", 1}},
      {{"ctx_a", "A man is sitting on a roof."}, {"ind", 24}, {"ok", true}, {"x", -1.25}},
      {{"nested", {{"text", {"yes", "no"}}, {"label", {"A", "B"}}}}, {"none", nullptr}},
  };
  std::string text;
  for (const json& d : docs) text += d.dump() + "\n";
  // The same documents with non-ASCII written as \u escapes (json.dumps' default).
  std::string escaped;
  for (const json& d : docs) escaped += d.dump(-1, ' ', true) + "\r\n";
  EXPECT_NE(text, escaped);
  EXPECT_EQ(read_documents(write("a.jsonl", text)), docs);
  EXPECT_EQ(read_documents(write("b.jsonl", escaped + "\n  \n")), docs);  // blank lines at the end
  EXPECT_EQ(read_documents(write("c.json", docs[2].dump())),
            std::vector<json>{docs[2]});                                     // no final \n
  EXPECT_EQ(read_documents(write("d.jsonl", "\xEF\xBB\xBF" + text)), docs);  // UTF-8 BOM
  EXPECT_EQ(read_documents(write("e.jsonl", text))[0]["question"].get<std::string>(),
            "Caf\xC3\xA9? \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82");
}

TEST_F(EvalData, ErrorsNameTheFileAndTheLine) {
  const std::string missing = (dir_ / "nope.jsonl").string();
  EXPECT_EQ(error_of(missing), missing + ": no such file or folder");
  const std::string empty = write("empty.jsonl", "");
  EXPECT_EQ(error_of(empty), empty + ": empty file: no documents");
  const std::string blank = write("blank.jsonl", "\n \n");
  EXPECT_EQ(error_of(blank), blank + ": no documents (only blank lines)");
  std::string lines;
  for (int i = 0; i < 16; ++i) lines += "{\"goal\": \"g" + std::to_string(i) + "\"}\n";
  const std::string arr = write("arr.jsonl", lines + "[1, 2]\n");
  EXPECT_EQ(error_of(arr), arr + ": line 17: not a JSON object (an array)");
  const std::string str = write("str.jsonl", "\"x\"\n");
  EXPECT_EQ(error_of(str), str + ": line 1: not a JSON object (a string)");
  const std::string bad = write("bad.jsonl", "{\"a\": 1}\n{\"a\": }\n");
  EXPECT_EQ(error_of(bad).rfind(bad + ": line 2: not valid JSON (", 0), 0u) << error_of(bad);
  const std::string utf8 = write("utf8.jsonl", "{\"a\": \"\xC3\x28\"}\n");
  EXPECT_EQ(error_of(utf8).rfind(utf8 + ": line 1: not valid JSON (", 0), 0u) << error_of(utf8);
  // A number beyond double's range (nlohmann's out_of_range, found by fuzz/eval_docs_fuzz.cc).
  const std::string huge = write("huge.jsonl", "{\"a\": 1}\n{\"a\": 1e4002}\n");
  EXPECT_EQ(error_of(huge).rfind(huge + ": line 2: not valid JSON (", 0), 0u) << error_of(huge);
  const std::string gap = write("gap.jsonl", "{\"a\": 1}\n\n{\"a\": 2}\n");
  EXPECT_EQ(error_of(gap), gap +
                               ": line 2: blank line between documents (JSONL has one JSON "
                               "object per line)");
  const std::string csv = write("x.csv", "a,b\n");
  EXPECT_EQ(error_of(csv), csv +
                               ": unknown kind of data file '.csv' (expected .jsonl, .json, "
                               ".parquet, .arrow or a save_to_disk folder)");
  fs::create_directories(dir_ / "notsaved");
  const std::string folder = (dir_ / "notsaved").string();
  EXPECT_EQ(error_of(folder).rfind(folder + ": a folder without state.json", 0), 0u)
      << error_of(folder);
}

TEST_F(EvalData, ArrowAndParquetFixtures) {
  const std::vector<json> expected = read_documents((kFixtures / "expected.jsonl").string());
  ASSERT_EQ(expected.size(), 3u);
  if (!reads_arrow()) {
    // The refusal says how to get the other formats.
    const std::string p = (kFixtures / "docs.parquet").string();
    const std::string msg = error_of(p);
    EXPECT_NE(msg.find(p + ": this build of scalesweep reads only JSONL"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("cmake -DSS_ARROW=ON"), std::string::npos) << msg;
    EXPECT_NE(msg.find("scripts/eval_data.py convert"), std::string::npos) << msg;
    GTEST_SKIP() << "this build has no Arrow/Parquet (SS_ARROW off: pyarrow not found or not "
                    "linkable at configure); the refusal message was checked";
  }
  for (const char* name : {"docs.parquet", "docs.arrow", "docs_file.arrow", "saved"}) {
    SCOPED_TRACE(name);
    const std::vector<json> got = read_documents((kFixtures / name).string());
    EXPECT_EQ(got, expected);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0]["choices"]["label"], json({"A", "B"}));
    EXPECT_EQ(got[0]["big"].get<int64_t>(), int64_t{1} << 40);
    EXPECT_TRUE(got[2]["tags"].is_null());
  }
}

TEST_F(EvalData, ArrowErrorsNameTheFile) {
  if (!reads_arrow()) GTEST_SKIP() << "this build has no Arrow/Parquet (SS_ARROW off)";
  const std::string junk = write("junk.arrow", "not arrow at all");
  EXPECT_EQ(error_of(junk).rfind(junk + ": ", 0), 0u) << error_of(junk);
  const std::string pq = write("junk.parquet", "PAR1 not parquet");
  EXPECT_EQ(error_of(pq).rfind(pq + ": ", 0), 0u) << error_of(pq);
  fs::create_directories(dir_ / "saved");
  write("saved/state.json", R"({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})");
  const std::string absent = (dir_ / "saved/data-00000-of-00001.arrow").string();
  EXPECT_EQ(error_of((dir_ / "saved").string()).rfind(absent + ": ", 0), 0u)
      << error_of((dir_ / "saved").string());
}

// The installed task data (scripts/get-eval-data.sh): the files of MANIFEST.json under 1 MiB
// read back with their row counts (all 13 files, 26 MB, take 20 s under ASan in Debug;
// python/tests/test_eval_data.py checks every count), and known documents.
TEST(EvalDataInstalled, ManifestCountsAndKnownDocuments) {
  const fs::path dir = fs::path(SS_SOURCE_DIR) / "data/eval";
  std::ifstream in(dir / "MANIFEST.json");
  if (!in) GTEST_SKIP() << dir.string() << " absent: run scripts/get-eval-data.sh";
  const json manifest = json::parse(in);
  ASSERT_EQ(manifest["files"].size(), 13u);
  int read = 0;
  for (const auto& [name, entry] : manifest["files"].items()) {
    if (fs::file_size(dir / name) > (1u << 20)) continue;
    SCOPED_TRACE(name);
    EXPECT_EQ(read_documents((dir / name).string()).size(), entry["rows"].get<size_t>());
    ++read;
  }
  EXPECT_EQ(read, 9);
  const std::vector<json> arc = read_documents((dir / "arc_easy/test.jsonl").string());
  EXPECT_EQ(
      arc[0]["question"],
      "Which statement best explains why photosynthesis is the foundation of most food webs?");
  EXPECT_EQ(arc[0]["choices"]["label"], json({"A", "B", "C", "D"}));
  const std::vector<json> piqa = read_documents((dir / "piqa/validation.jsonl").string());
  EXPECT_EQ(piqa[0]["goal"], "How do I ready a guinea pig cage for it's new occupants?");
  EXPECT_EQ(piqa[0]["label"], 0);
}

}  // namespace
}  // namespace scalesweep::io
