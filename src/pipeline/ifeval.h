// Internal to pipeline/eval: ifeval's scoring by lm-eval 0.4.13's own checkers, run as a
// subprocess (scripts/ifeval_score.py), and the one place this project starts a process.
//
// The scorer is found, in order: EvalData::ifeval_scorer, $SS_IFEVAL_SCORER, then
// scripts/ifeval_score.py in the folder of the running executable or any folder above it
// (build/scalesweep, build/src/...: the repository the binary was built in, whatever the cwd),
// then in the data folder (absolute) or any folder above it (data/eval of a checkout; this
// also serves the Python module, whose executable is python). The python: EvalData::python,
// $SS_PYTHON, else `python3` on PATH. NLTK's tables: <data dir>/nltk (scripts/get-ifeval.sh).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "scalesweep/pipeline/eval.h"

namespace scalesweep::pipeline::detail {

// A finished child: exit status (128 + signal number when killed) and what it wrote.
struct ProcessResult {
  int status = 0;
  std::string out, err;
};

// Runs argv (argv[0] looked up on PATH unless it holds a '/') with stdin from /dev/null and
// stdout/stderr into temporary files, and waits for it. No shell: arguments are passed as
// they are. Throws std::system_error (its errno: ENOENT for a missing program) when the
// program cannot be started.
ProcessResult run_process(const std::vector<std::string>& argv);

struct IfevalScorer {
  std::string python, script, nltk_data;
};

// The scorer for `data` (see above); throws std::runtime_error naming where it looked and
// SS_IFEVAL_SCORER when no scorer script is found.
IfevalScorer find_ifeval_scorer(const EvalData& data);

// Runs the scorer's --check (lm-eval 0.4.13, its checkers' modules and punkt_tab importable):
// throws std::runtime_error with one message naming scripts/get-lm-eval.sh or
// scripts/get-ifeval.sh otherwise.
void check_ifeval_scorer(const IfevalScorer& s);

// Per-instruction results of one document.
struct IfevalFollow {
  std::vector<bool> strict, loose;
};

// Scores responses[i] of docs[i] (each {key, prompt, instruction_id_list, kwargs}) in one run
// of the scorer; throws std::runtime_error (one message, as check_ifeval_scorer) when it cannot
// run, fails, or answers with other documents or list lengths than asked.
std::vector<IfevalFollow> ifeval_score(const IfevalScorer& s,
                                       const std::vector<nlohmann::json>& docs,
                                       const std::vector<std::string>& responses);

}  // namespace scalesweep::pipeline::detail
