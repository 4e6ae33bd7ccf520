// Test helpers of pipeline/eval: a fake ifeval scorer (the real one, against lm-eval:
// python/tests/test_eval_ifeval.py).
#pragma once

#include <string>

namespace scalesweep::pipeline::testing {

// An sh script acting as scripts/ifeval_score.py: `--check` exits 0; scoring answers, per
// input line, strict [true, false, ...] and loose all true, as long as the document's
// instruction list, with the document's key, and insists on `--nltk-data`. `extra` is shell
// run first (to fail on purpose).
inline std::string fake_ifeval_scorer_script(const std::string& extra = "") {
  return extra + R"(
if [ "$1" = --check ]; then exit 0; fi
[ "$2" = --nltk-data ] || { echo "no --nltk-data" >&2; exit 9; }
awk '{
  match($0, /"key":-?[0-9]+/); k = substr($0, RSTART + 6, RLENGTH - 6)
  match($0, /"instruction_id_list":\[[^]]*\]/); ids = substr($0, RSTART, RLENGTH)
  n = gsub(/","/, "", ids) + 1
  s = "[true"; l = "[true"
  for (i = 1; i < n; ++i) { s = s ",false"; l = l ",true" }
  printf "{\"key\": %s, \"follow_instruction_list_strict\": %s], \"follow_instruction_list_loose\": %s]}\n", k, s, l
}' "$1"
)";
}

}  // namespace scalesweep::pipeline::testing
