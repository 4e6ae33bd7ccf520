// The one events sink of every long job (layer `pipeline`: quantize, calibrate, experiment,
// eval, the run-time setup of ppl/generate). Reporting only, no policy: notes for the user (one
// line each, without "note: "; a note whose first word is a field, such as the cap of
// "calib_seqlen", names it as OptionError does) and the progress of a stage (its name, the unit
// counted, done and total; the total known up front). The stages: "calibrate" (unit "seq"),
// "quantize" ("linear"), a task name ("doc"), the experiment's own ("tok", "tensor", ...).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace scalesweep::pipeline {

struct JobEvents {
  std::function<void(const std::string&)> note;
  std::function<void(const std::string& stage, const char* unit, int64_t done, int64_t total)>
      progress;

  void say(const std::string& text) const {
    if (note) note(text);
  }
  void step(const std::string& stage, const char* unit, int64_t done, int64_t total) const {
    if (progress) progress(stage, unit, done, total);
  }
};

}  // namespace scalesweep::pipeline
