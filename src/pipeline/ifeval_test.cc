// The subprocess behind ifeval's scoring (pipeline/ifeval.h): run_process, where the scorer is
// found, and every way the scorer can fail, with fake scorers written here (sh scripts). The
// real scorer against lm-eval: python/tests/test_eval_ifeval.py.
#include "pipeline/ifeval.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <system_error>

#include "base/test_util.h"
#include "pipeline/eval_test_util.h"

namespace scalesweep::pipeline::detail {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A temporary directory (removed with the object) and the files the tests write in it.
struct TempFolder {
  scalesweep::testing::TempDir tmp{"ss_ifeval_test"};
  const fs::path& dir = tmp.p;
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  }
};

using scalesweep::testing::error_of;

TEST(RunProcess, ArgumentsStatusAndOutputs) {
  // No shell between us and the program: spaces, quotes and $(...) arrive as they are.
  ProcessResult r = run_process({"printf", "%s|", "a b", "$(echo x)", "'q'"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "a b|$(echo x)|'q'|");
  r = run_process({"sh", "-c", "echo out; echo err >&2; exit 7"});
  EXPECT_EQ(r.status, 7);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  r = run_process({"sh", "-c", "kill -9 $$"});
  EXPECT_EQ(r.status, 128 + 9);
  r = run_process({"cat"});  // stdin is /dev/null: returns at once
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "");
  try {
    run_process({"/nonexistent/program"});
    FAIL();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
  }
  try {
    run_process({"no-such-program-on-path-ss"});
    FAIL();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
  }
}

// A fake scorer: --check exits with $1 of the check line; scoring answers, per input line,
// strict [true, false, ...] and loose all true, as long as the document's instruction list,
// with the document's key; `extra` is shell run first (to fail on purpose).
std::string fake_scorer(const TempFolder& t, const std::string& extra = "") {
  return t.write("fake.sh", testing::fake_ifeval_scorer_script(extra));
}

std::vector<json> docs() {
  return {
      {{"key", 7}, {"prompt", "p"}, {"instruction_id_list", {"a:b", "c:d"}}, {"kwargs", {{}, {}}}},
      {{"key", 9}, {"prompt", "q"}, {"instruction_id_list", {"a:b"}}, {"kwargs", {{}}}}};
}

TEST(IfevalScorer, ScoresThroughTheSubprocess) {
  TempFolder t;
  const IfevalScorer s{"sh", fake_scorer(t), (t.dir / "nltk").string()};
  EXPECT_NO_THROW(check_ifeval_scorer(s));
  const auto f = ifeval_score(s, docs(), {"response \"one\"\n", "two $(x)"});
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].strict, (std::vector<bool>{true, false}));
  EXPECT_EQ(f[0].loose, (std::vector<bool>{true, true}));
  EXPECT_EQ(f[1].strict, (std::vector<bool>{true}));
}

TEST(IfevalScorer, FailuresGiveOneMessageNamingTheInstallScripts) {
  TempFolder t;
  const std::string nltk = (t.dir / "nltk").string();
  // No python.
  std::string m = error_of([&] { check_ifeval_scorer({"/nonexistent/python3", "x.py", nltk}); });
  EXPECT_NE(m.find("cannot run python \"/nonexistent/python3\""), std::string::npos) << m;
  EXPECT_NE(m.find("SS_PYTHON"), std::string::npos) << m;
  EXPECT_NE(m.find("scripts/get-lm-eval.sh"), std::string::npos) << m;
  // The scorer's "missing" status (3): its own last line, which names the script.
  IfevalScorer s{"sh",
                 fake_scorer(t,
                             "echo 'ifeval_score: lm-eval is not installed: run "
                             "scripts/get-lm-eval.sh' >&2; exit 3"),
                 nltk};
  m = error_of([&] { check_ifeval_scorer(s); });
  EXPECT_EQ(m, "ifeval: ifeval_score: lm-eval is not installed: run scripts/get-lm-eval.sh");
  // Any other failure: the status, the end of its stderr, the install scripts.
  s.script = fake_scorer(t, "printf 'Traceback\\n  line\\nValueError: boom\\n' >&2; exit 1");
  m = error_of([&] { ifeval_score(s, docs(), {"a", "b"}); });
  EXPECT_NE(m.find("failed with exit status 1: Traceback   line ValueError: boom"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("scripts/get-ifeval.sh"), std::string::npos) << m;
  // Answers that do not fit the question.
  s.script = t.write("short.sh", "head -n 1 \"$1\" >/dev/null; echo '{\"key\": 7}'");
  m = error_of([&] { ifeval_score(s, docs(), {"a", "b"}); });
  EXPECT_NE(m.find("answered no follow_instruction_list_strict of 2 values for document 0"),
            std::string::npos)
      << m;
  s.script = t.write("none.sh", "exit 0");
  m = error_of([&] { ifeval_score(s, docs(), {"a", "b"}); });
  EXPECT_NE(m.find("answered 0 lines for 2 documents"), std::string::npos) << m;
  s.script = t.write("key.sh",
                     "echo '{\"key\": 99, \"follow_instruction_list_strict\": [true, true], "
                     "\"follow_instruction_list_loose\": [true, true]}'");
  m = error_of([&] { ifeval_score(s, docs(), {"a", "b"}); });
  EXPECT_NE(m.find("answered key 99 for document 0 (key 7)"), std::string::npos) << m;
  s.script = fake_scorer(t);
  EXPECT_THROW(ifeval_score(s, docs(), {"only one"}), std::invalid_argument);
}

TEST(IfevalScorer, Found) {
  TempFolder t;
  EvalData d;
  d.dir = (t.dir / "data/eval").string();
  d.ifeval_scorer = (t.dir / "missing.py").string();
  std::string m = error_of([&] { find_ifeval_scorer(d); });
  EXPECT_NE(m.find("missing.py (SS_IFEVAL_SCORER) is not a file"), std::string::npos) << m;
  d.ifeval_scorer = t.write("mine.py", "");
  d.python = "/opt/py/bin/python3";
  IfevalScorer s = find_ifeval_scorer(d);
  EXPECT_EQ(s.script, d.ifeval_scorer);
  EXPECT_EQ(s.python, "/opt/py/bin/python3");
  EXPECT_EQ(s.nltk_data, (t.dir / "data/eval/nltk").string());
  // Unset: the repository's own (this test runs from its build folder), whatever the cwd.
  d.ifeval_scorer.clear();
  d.python.clear();
  if (!std::getenv("SS_IFEVAL_SCORER")) {
    const fs::path cwd = fs::current_path();
    fs::current_path(t.dir);
    s = find_ifeval_scorer(d);
    fs::current_path(cwd);
    EXPECT_EQ(fs::path(s.script).filename(), "ifeval_score.py");
    EXPECT_TRUE(fs::is_regular_file(s.script));
    if (!std::getenv("SS_PYTHON")) {
      EXPECT_EQ(s.python, "python3");
    }
  }
}

}  // namespace
}  // namespace scalesweep::pipeline::detail
