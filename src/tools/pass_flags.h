// The flags of the graph passes that `asynctp passes` and `asynctp run --check` share: declared,
// turned into passes::PassOptions and written back out as a command line (for the ranks `run`
// launches) in one place, so that a new option of the passes is added once.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "passes/pipeline.h"

namespace asynctp::tools {

struct PassFlags {
  std::vector<double> bucket_mb;
  bool enable_last_dim = false;
  bool no_last_dim_scatter = false;
  bool enable_transpose = false;
  bool enable_swiglu = false;
  bool no_fuse = false;

  // The passes' options these flags give (strict is the caller's).
  passes::PassOptions options() const;
  // The flags again, as command-line arguments.
  std::vector<std::string> args() const;
};

// Declares the flags on cmd, each help text after `context` ("" or "passes of --check: ").
void add_pass_flags(CLI::App* cmd, PassFlags& flags, const std::string& context);

}  // namespace asynctp::tools
