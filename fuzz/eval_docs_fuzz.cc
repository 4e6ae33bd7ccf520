// Eval task documents (JSONL): io::read_documents on a file named *.jsonl, as `eval` reads
// data/eval/<task>/<split>.jsonl and the user's --task-data files.
#include "fuzz_util.h"
#include "scalesweep/io/eval_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ss_fuzz::MemFile file(data, size);
  const std::string path = file.named("docs.jsonl");
  ss_fuzz::expect_clear_refusal([&] { (void)scalesweep::io::read_documents(path); });
  return 0;
}
