// Subcommands of the `asynctp` command line. Each registers its options on a CLI11 subcommand and
// returns it with the function that runs it (returning the process exit code).
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace asynctp::tools {

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_launch_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_demo_command(CLI::App& app);
Command add_passes_command(CLI::App& app);
Command add_run_command(CLI::App& app);
Command add_env_command(CLI::App& app);

}  // namespace asynctp::tools
