#include <fmt/format.h>

#include "runtime/launcher.h"
#include "tools/commands.h"
#include "tools/options.h"

namespace asynctp::tools {

Command add_launch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "launch",
      "Start N ranks of a command on this node with RANK, WORLD_SIZE, LOCAL_RANK, "
      "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; tag their output with the rank; stop "
      "them all as soon as one fails, on SIGINT/SIGTERM, or at the timeout.");
  auto options = std::make_shared<LaunchOptions>();
  auto no_prefix = std::make_shared<bool>(false);
  auto timeout = std::make_shared<double>(0);
  add_integer_option(cmd, "--nproc,-n", options::kNproc, &options->nproc,
                     "number of ranks to start")
      ->required();
  add_number_option(cmd, "--timeout", options::kTimeout, timeout.get(),
                    "seconds after which every rank is stopped (exit 124)");
  cmd->add_option("--master-addr", options->master_addr, "address of rank 0's store")
      ->capture_default_str();
  add_integer_option(cmd, "--master-port", options::kMasterPort, &options->master_port,
                     "port of rank 0's store (default, or 0: a free one)");
  add_number_option(cmd, "--grace", options::kGrace, &options->grace_s,
                    "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->default_str(fmt::format("{}", options->grace_s));
  cmd->add_flag("--no-prefix", *no_prefix, "do not prefix output lines with [rank R]");
  cmd->add_option("command", options->command, "the command to run, after --")->required();
  cmd->positionals_at_end();
  cmd->footer("Example: asynctp launch --nproc 4 -- asynctp demo");
  return {cmd, [options, no_prefix, timeout] {
            options->tag_output = !*no_prefix;
            if (*timeout > 0) options->timeout_s = *timeout;
            return launch(*options);
          }};
}

}  // namespace asynctp::tools
