// ifeval's scorer subprocess (pipeline/ifeval.h).
#include "pipeline/ifeval.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

extern char** environ;

namespace scalesweep::pipeline::detail {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kInstall =
    "scripts/get-lm-eval.sh, then scripts/get-ifeval.sh, install what it needs";

// A private temporary folder, removed with its content.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "ss_ifeval.XXXXXX").string();
    if (!::mkdtemp(t.data()))
      throw std::system_error(errno, std::generic_category(), "mkdtemp " + t);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* e = std::getenv(name);
  return e && *e ? e : fallback;
}

// The last lines of a child's stderr (a Python traceback ends with its message), on one line.
std::string tail_lines(const std::string& s, int lines = 3) {
  size_t e = s.find_last_not_of(" \n\r\t");
  if (e == std::string::npos) return "(no message)";
  size_t b = e + 1;
  for (int n = 0; n < lines && b > 0; ++n) {
    const size_t nl = s.rfind('\n', b - 1);
    b = nl == std::string::npos ? 0 : nl;
  }
  std::string t = s.substr(b, e + 1 - b);
  if (!t.empty() && t[0] == '\n') t.erase(0, 1);
  for (char& c : t)
    if (c == '\n') c = ' ';
  return t.size() > 2000 ? "..." + t.substr(t.size() - 2000) : t;
}

// Runs the scorer with `args`; one message for every way it can fail.
ProcessResult run_scorer(const IfevalScorer& s, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {s.python, s.script};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--nltk-data", s.nltk_data});
  ProcessResult r;
  try {
    r = run_process(argv);
  } catch (const std::system_error& e) {
    throw std::runtime_error(
        "ifeval: cannot run python \"" + s.python + "\" (" + e.code().message() +
        "): set SS_PYTHON to the python3 that has lm-eval 0.4.13 (" + kInstall + ")");
  }
  if (r.status == 3)  // the scorer's own "missing dependency" message names the script
    throw std::runtime_error("ifeval: " + tail_lines(r.err, 1));
  if (r.status != 0)
    throw std::runtime_error("ifeval: the scorer " + s.script + " (run by " + s.python +
                             ") failed with exit status " + std::to_string(r.status) + ": " +
                             tail_lines(r.err) + " (" + kInstall + ")");
  return r;
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0].empty()) throw std::invalid_argument("run_process: no program");
  TempDir tmp;
  const std::string out = (tmp.path / "stdout").string(), err = (tmp.path / "stderr").string();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  // glibc reports a failed exec (missing program) as posix_spawnp's result.
  const int rc = posix_spawnp(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::system_error(rc, std::generic_category(), argv[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) throw std::system_error(errno, std::generic_category(), "waitpid");
  ProcessResult r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  r.out = read_all(out);
  r.err = read_all(err);
  return r;
}

IfevalScorer find_ifeval_scorer(const EvalData& data) {
  IfevalScorer s;
  std::error_code ec;
  s.python = !data.python.empty() ? data.python : env_or("SS_PYTHON", "python3");
  s.nltk_data = fs::absolute(fs::path(data.dir) / "nltk", ec).string();
  const std::string given =
      !data.ifeval_scorer.empty() ? data.ifeval_scorer : env_or("SS_IFEVAL_SCORER", "");
  if (!given.empty()) {
    if (!fs::is_regular_file(given, ec))
      throw std::runtime_error("ifeval: scorer " + given +
                               " (SS_IFEVAL_SCORER) is not a file: scripts/ifeval_score.py of "
                               "this project");
    s.script = fs::absolute(given, ec).string();
    return s;
  }
  std::vector<fs::path> starts;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  starts.push_back(fs::absolute(data.dir, ec).lexically_normal());
  std::string looked;
  for (const fs::path& start : starts) {
    for (fs::path p = start; !p.empty(); p = p.parent_path()) {
      const fs::path c = p / "scripts" / "ifeval_score.py";
      if (fs::is_regular_file(c, ec)) {
        s.script = c.string();
        return s;
      }
      if (p == p.root_path()) break;
    }
    looked += (looked.empty() ? "" : " nor above ") + start.string();
  }
  throw std::runtime_error("ifeval: scripts/ifeval_score.py not found above " + looked +
                           ": set SS_IFEVAL_SCORER to its path");
}

void check_ifeval_scorer(const IfevalScorer& s) { run_scorer(s, {"--check"}); }

std::vector<IfevalFollow> ifeval_score(const IfevalScorer& s, const std::vector<json>& docs,
                                       const std::vector<std::string>& responses) {
  if (docs.size() != responses.size())
    throw std::invalid_argument("ifeval_score: documents and responses differ in number");
  TempDir tmp;
  const fs::path in = tmp.path / "responses.jsonl";
  {
    std::ofstream f(in, std::ios::binary);
    for (size_t i = 0; i < docs.size(); ++i) {
      json d = docs[i];
      d["response"] = responses[i];
      f << d.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
    if (!f) throw std::runtime_error("ifeval: cannot write " + in.string());
  }
  const ProcessResult r = run_scorer(s, {in.string()});
  std::vector<IfevalFollow> out;
  std::istringstream lines(r.out);
  std::string line;
  auto bad = [&](const std::string& why) {
    return std::runtime_error("ifeval: the scorer " + s.script + " answered " + why);
  };
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const size_t i = out.size();
    if (i >= docs.size())
      throw bad("more lines than the " + std::to_string(docs.size()) + " asked");
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw bad("a line that is not a JSON object");
    const size_t n = docs[i].at("instruction_id_list").size();
    IfevalFollow f;
    for (const auto& [field, v] : {std::pair{"follow_instruction_list_strict", &f.strict},
                                   std::pair{"follow_instruction_list_loose", &f.loose}}) {
      const auto it = j.find(field);
      if (it == j.end() || !it->is_array() || it->size() != n)
        throw bad(std::string("no ") + field + " of " + std::to_string(n) +
                  " values for document " + std::to_string(i));
      for (const json& b : *it) {
        if (!b.is_boolean()) throw bad(std::string(field) + " holding a non-boolean");
        v->push_back(b.get<bool>());
      }
    }
    if (j.value("key", json()) != docs[i].at("key"))
      throw bad("key " + j.value("key", json()).dump() + " for document " + std::to_string(i) +
                " (key " + docs[i].at("key").dump() + ")");
    out.push_back(std::move(f));
  }
  if (out.size() != docs.size())
    throw bad(std::to_string(out.size()) + " lines for " + std::to_string(docs.size()) +
              " documents");
  return out;
}

}  // namespace scalesweep::pipeline::detail
