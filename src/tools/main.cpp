// asynctp: asynchronous tensor parallelism, from the command line.
#include <cstdio>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "asynctp: overlap the all-gather and reduce-scatter of tensor-parallel layers with their "
      "GEMMs through symmetric memory."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "asynctp 0.1.0");
  const std::vector<asynctp::tools::Command> commands{
      asynctp::tools::add_launch_command(app), asynctp::tools::add_bench_command(app),
      asynctp::tools::add_demo_command(app),   asynctp::tools::add_passes_command(app),
      asynctp::tools::add_run_command(app),    asynctp::tools::add_env_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (const auto& command : commands) {
      if (!command.app->parsed()) continue;
      // A bad ASYNCTP_* value stops every command at once (`env` lists them instead).
      if (command.app->get_name() != "env") asynctp::envvars::check_all();
      return command.run();
    }
  } catch (const asynctp::Error& e) {
    std::fprintf(stderr, "asynctp: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asynctp: unexpected error: %s\n", e.what());
    return 1;
  }
  return 1;
}
