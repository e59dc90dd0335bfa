// The `asynctp` binary: `asynctp launch` end to end (environment, output tags, failing and
// killed ranks, timeouts, signals sent to the launcher, /dev/shm cleanup), every subcommand's
// --help, and the demo under the launcher.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "run_command.h"

#ifndef ASYNCTP_BIN
#error "ASYNCTP_BIN (the path of the asynctp binary) must be defined by the build"
#endif

namespace asynctp {
namespace {

using ::testing::AllOf;
using testing::Child;
using testing::Finished;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::run_command;

const std::string kBin = ASYNCTP_BIN;

// The environment of every command: `asynctp` on the PATH (the commands below name it so, as a
// user would), and no rendezvous variables inherited from whatever runs the tests.
std::map<std::string, std::string> test_env() {
  const std::string dir = std::filesystem::path(kBin).parent_path().string();
  const char* path = std::getenv("PATH");
  std::map<std::string, std::string> env = testing::unset_rendezvous_env();
  env["PATH"] = dir + ":" + (path ? path : "/usr/bin:/bin");
  return env;
}

Finished asynctp(const std::vector<std::string>& args, Millis limit = Millis(60'000)) {
  std::vector<std::string> argv{kBin};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, test_env(), limit);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

// The run id the launcher gave the job, from a line "run=<id>" a rank printed.
std::string run_id_in(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("run=([0-9a-f]+)"))) return "";
  return m[1];
}

// /dev/shm entries of one run.
std::vector<std::string> shm_of_run(const std::string& run_id) {
  std::vector<std::string> found;
  const std::string prefix = "asynctp-" + run_id + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  return found;
}

bool process_exists(pid_t pid) {
  return ::kill(pid, 0) == 0 || errno != ESRCH;
}

// ---------------------------------------------------------------------------------------------
// --help and argument errors

TEST(Cli, HelpForEveryCommand) {
  const Finished top = asynctp({"--help"});
  ASSERT_TRUE(top.exited && top.exit_code == 0) << top.describe();
  EXPECT_THAT(top.out, AllOf(HasSubstr("launch"), HasSubstr("bench"), HasSubstr("demo")));

  const Finished launch = asynctp({"launch", "--help"});
  ASSERT_TRUE(launch.exited && launch.exit_code == 0) << launch.describe();
  EXPECT_THAT(launch.out,
              AllOf(HasSubstr("--nproc"), HasSubstr("--timeout"), HasSubstr("--no-prefix"),
                    HasSubstr("--master-port"), HasSubstr("--master-addr"), HasSubstr("--grace"),
                    HasSubstr("asynctp launch --nproc 4 -- asynctp demo")));

  const Finished bench = asynctp({"bench", "--help"});
  ASSERT_TRUE(bench.exited && bench.exit_code == 0) << bench.describe();
  EXPECT_THAT(bench.out, AllOf(HasSubstr("--shape"), HasSubstr("ag-mm"), HasSubstr("mm-rs"),
                               HasSubstr("--json")));

  const Finished demo = asynctp({"demo", "--help"});
  ASSERT_TRUE(demo.exited && demo.exit_code == 0) << demo.describe();
  EXPECT_THAT(demo.out, AllOf(HasSubstr("--json"), HasSubstr("--tokens"), HasSubstr("--dtype")));

  const Finished version = asynctp({"--version"});
  EXPECT_TRUE(version.exited && version.exit_code == 0) << version.describe();
  EXPECT_THAT(version.out, HasSubstr("asynctp 0.1.0"));
}

// The bench's table (one rank, CPU backend, a tiny shape): its title names the hardware, a column
// for every header, and the native path with pieces gets its own ("npiece") only when
// --native-pieces asks for it.
TEST(Cli, BenchTableHasAColumnPerHeader) {
  for (const bool pieces : {false, true}) {
    SCOPED_TRACE(pieces ? "--native-pieces" : "no --native-pieces");
    std::vector<std::string> args{"bench", "ag-mm",    "--shape", "256x64x256", "--iters",
                                  "2",     "--warmup", "0",       "--backend",  "cpu"};
    if (pieces) {
      args.push_back("--native-pieces");
      args.push_back("1048576");
    }
    const Finished bench = asynctp(args);
    ASSERT_TRUE(bench.exited && bench.exit_code == 0) << bench.describe();
    // The title names the hardware the timings belong to.
    EXPECT_THAT(bench.out, HasSubstr("backend cpu (cpu)")) << bench.out;
    std::vector<std::string> header, row;
    for (const auto& line : lines_of(bench.out)) {
      std::istringstream words(line);
      std::vector<std::string> w{std::istream_iterator<std::string>(words), {}};
      if (!w.empty() && w[0] == "op") header = w;
      if (!w.empty() && w[0] == "ag-mm") row = w;
    }
    ASSERT_FALSE(header.empty()) << bench.out;
    ASSERT_FALSE(row.empty()) << bench.out;
    // "auto took" is two words over one column.
    EXPECT_EQ(row.size() + 1, header.size()) << bench.out;
    const auto npiece = std::find(header.begin(), header.end(), "npiece");
    EXPECT_EQ(npiece != header.end(), pieces) << bench.out;
    if (pieces && npiece != header.end()) {
      // The CPU backend runs the native path too: the column holds its time.
      EXPECT_NE(row[npiece - header.begin()], "-") << bench.out;
      EXPECT_GT(std::stod(row[npiece - header.begin()]), 0.0) << bench.out;
    }
  }
}

// The float8 table at two ranks (CPU backend, a shape both native paths take): both ops, each
// path, validated against the unfused reference and timed with both scalings, exact and with
// --fast-accum (fast accumulation allowed in every GEMM), the JSON holding every column and saying
// which accumulation it timed: the native path and the native kernel alone run only with fast
// accumulation (the kernel has none exact), their columns null otherwise; a bad scaling, or an
// option of the 16-bit table (--dtype, --native-pieces), is an error naming the option.
TEST(Cli, ScaledBenchValidatesAndTimesBothOps) {
  for (const std::string scaling : {"rowwise", "tensorwise"}) {
    for (const std::string op : {"ag-mm", "mm-rs"}) {
      for (const bool fast : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} fast {}", scaling, op, fast));
        std::vector<std::string> args = {
            "launch",   "--nproc", "2",          "--no-prefix", "--",    kBin,      "bench",
            op,         "--shape", "256x64x256", "--scaled",    scaling, "--iters", "2",
            "--warmup", "0",       "--backend",  "cpu",         "--json"};
        if (fast) args.push_back("--fast-accum");
        if (fast && op == "mm-rs") args.push_back("--trace");  // taken; traces only on a GPU
        const Finished bench = asynctp(args);
        ASSERT_TRUE(bench.exited && bench.exit_code == 0) << bench.describe();
        const auto doc = nlohmann::json::parse(bench.out);
        EXPECT_EQ(doc.at("scaling"), scaling);
        EXPECT_EQ(doc.at("fast_accum"), fast);
        ASSERT_EQ(doc.at("results").size(), 1u);
        const auto& r = doc.at("results")[0];
        EXPECT_EQ(r.at("op"), op);
        EXPECT_EQ(r.at("fast_accum"), fast);
        EXPECT_LE(r.at("rel_error_fused_vs_baseline").get<double>(), 1e-2);
        EXPECT_LE(r.at("rel_error_split_path").get<double>(), 1e-2);
        for (const char* key : {"gemm_ms", "baseline_ms", "fused_ms", "split_path_ms"})
          EXPECT_GT(r.at(key).get<double>(), 0.0) << key;
        if (fast) {
          EXPECT_LE(r.at("rel_error_native_path").get<double>(), 1e-2);
          EXPECT_GT(r.at("native_path_ms").get<double>(), 0.0);
          EXPECT_GT(r.at("native_gemm_ms").get<double>(), 0.0);  // the kernel alone
          EXPECT_EQ(r.at("path"), "native");  // the CPU backend's auto: native where it runs
        } else {
          EXPECT_TRUE(r.at("rel_error_native_path").is_null());
          EXPECT_TRUE(r.at("native_path_ms").is_null());
          EXPECT_TRUE(r.at("native_gemm_ms").is_null());
          EXPECT_EQ(r.at("path"), "split");
        }
      }
    }
  }
  const Finished bad = asynctp(
      {"bench", "ag-mm", "--shape", "128x64x96", "--scaled", "blockwise", "--backend", "cpu"});
  EXPECT_TRUE(bad.exited && bad.exit_code != 0) << bad.describe();
  EXPECT_THAT(bad.err, AllOf(HasSubstr("--scaled"), HasSubstr("blockwise")));
  // Options of the 16-bit table are refused with --scaled, not ignored.
  const Finished dtype = asynctp({"bench", "ag-mm", "--shape", "128x64x96", "--scaled", "rowwise",
                                  "--dtype", "f16", "--backend", "cpu"});
  EXPECT_TRUE(dtype.exited && dtype.exit_code != 0) << dtype.describe();
  EXPECT_THAT(dtype.err, AllOf(HasSubstr("--dtype f16"), HasSubstr("--scaled")));
  const Finished pieces = asynctp({"bench", "ag-mm", "--shape", "128x64x96", "--scaled", "rowwise",
                                   "--native-pieces", "65536", "--backend", "cpu"});
  EXPECT_TRUE(pieces.exited && pieces.exit_code != 0) << pieces.describe();
  EXPECT_THAT(pieces.err, AllOf(HasSubstr("--native-pieces"), HasSubstr("--scaled")));
}

// The 16-bit table at two ranks (CPU backend) on a shape the native paths take: every column
// timed, the native GEMM with its flags ("ngsig") included, whose done counters each run starts
// from 0 (the CPU backend's GEMM refuses a count left over from the run before).
TEST(Cli, BenchTimesEveryColumnOnNativeShapes) {
  for (const std::string op : {"ag-mm", "mm-rs"}) {
    SCOPED_TRACE(op);
    const Finished bench =
        asynctp({"launch", "--nproc", "2", "--no-prefix", "--", kBin, "bench", op, "--shape",
                 "256x64x256", "--iters", "3", "--warmup", "1", "--backend", "cpu", "--json"});
    ASSERT_TRUE(bench.exited && bench.exit_code == 0) << bench.describe();
    const auto doc = nlohmann::json::parse(bench.out);
    ASSERT_EQ(doc.at("results").size(), 1u);
    const auto& r = doc.at("results")[0];
    EXPECT_EQ(r.at("path"), "native");
    for (const char* key : {"gemm_ms", "native_gemm_ms", "native_gemm_signalled_ms",
                            "native_path_ms", "split_path_ms", "fused_ms"})
      EXPECT_GT(r.at(key).get<double>(), 0.0) << key;
    EXPECT_LE(r.at("rel_error_native_path").get<double>(), 1e-2);
  }
}

// --hide-launch: taken, and the JSON records the delay applied: none on the CPU backend, whose
// timing ignores it (as it does --pace).
TEST(Cli, BenchRecordsTheLaunchDelay) {
  const Finished bench = asynctp({"launch", "--nproc", "2", "--no-prefix", "--", kBin, "bench",
                                  "ag-mm", "--shape", "128x64x96", "--iters", "2", "--warmup", "0",
                                  "--backend", "cpu", "--hide-launch", "200000", "--json"});
  ASSERT_TRUE(bench.exited && bench.exit_code == 0) << bench.describe();
  EXPECT_EQ(nlohmann::json::parse(bench.out).at("hide_launch_cycles"), 0);
}

// --fast-accum: the table's title says which accumulation was timed; without --scaled the flag
// is an error naming both options; --help describes it.
TEST(Cli, ScaledBenchFastAccumSaysWhichItTimed) {
  const Finished table =
      asynctp({"launch", "--nproc", "2", "--no-prefix", "--", kBin, "bench", "mm-rs", "--shape",
               "128x64x96", "--scaled", "tensorwise", "--fast-accum", "--iters", "2", "--warmup",
               "0", "--backend", "cpu"});
  ASSERT_TRUE(table.exited && table.exit_code == 0) << table.describe();
  EXPECT_THAT(table.out, HasSubstr("fast accumulation"));
  const Finished lone =
      asynctp({"bench", "ag-mm", "--shape", "128x64x96", "--fast-accum", "--backend", "cpu"});
  EXPECT_TRUE(lone.exited && lone.exit_code != 0) << lone.describe();
  EXPECT_THAT(lone.err, AllOf(HasSubstr("--fast-accum"), HasSubstr("--scaled")));
  const Finished help = asynctp({"bench", "--help"});
  EXPECT_THAT(help.out, HasSubstr("--fast-accum"));
}

TEST(Cli, BadArgumentsFailNamingTheOption) {
  const Finished none = asynctp({});
  EXPECT_TRUE(none.exited && none.exit_code != 0) << none.describe();
  EXPECT_THAT(none.err, HasSubstr("subcommand"));

  const Finished no_nproc = asynctp({"launch", "--", "true"});
  EXPECT_TRUE(no_nproc.exited && no_nproc.exit_code != 0) << no_nproc.describe();
  EXPECT_THAT(no_nproc.err, HasSubstr("--nproc"));

  const Finished zero = asynctp({"launch", "--nproc", "0", "--", "true"});
  EXPECT_TRUE(zero.exited && zero.exit_code != 0) << zero.describe();
  EXPECT_THAT(zero.err, HasSubstr("nproc"));

  const Finished no_command = asynctp({"launch", "--nproc", "2"});
  EXPECT_TRUE(no_command.exited && no_command.exit_code != 0) << no_command.describe();
  EXPECT_THAT(no_command.err, HasSubstr("command"));

  const Finished bad_timeout = asynctp({"launch", "--nproc", "1", "--timeout", "-1", "--", "true"});
  EXPECT_TRUE(bad_timeout.exited && bad_timeout.exit_code != 0) << bad_timeout.describe();
  EXPECT_THAT(bad_timeout.err, HasSubstr("timeout"));
}

// Numeric options are read by the ASYNCTP_* registry's parser: inf, NaN, overflow and values out
// of range are errors that name the option and its bounds in words, before anything starts.
TEST(Cli, NumericOptionsAreCheckedNamedAndBoundedInWords) {
  const std::string graph =
      std::string(ASYNCTP_SOURCE_DIR) + "/tests/passes/graphs/sp_mlp.fwd.pre.json";
  const std::string out = ::testing::TempDir() + "/asynctp_cli_options.json";
  const std::string timeout_range = "allowed: a number > 0 and <= 10000000, in seconds";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"launch", "-n", "1", "--timeout", "1e16", "--", "true"},
       "--timeout '1e16' is out of range; " + timeout_range},
      {{"launch", "-n", "1", "--timeout", "nan", "--", "true"},
       "--timeout 'nan' is not a finite number; " + timeout_range},
      {{"launch", "-n", "1", "--timeout", "inf", "--", "true"}, "--timeout 'inf' is not a finite"},
      {{"launch", "-n", "1", "--timeout", "1e400", "--", "true"},
       "--timeout '1e400' is out of range; " + timeout_range},
      {{"launch", "-n", "1", "--master-port", "-5", "--", "true"},
       "--master-port '-5' is out of range; allowed: an integer from 0 to 65535"},
      {{"launch", "-n", "1", "--master-port", "70000", "--", "true"}, "--master-port '70000'"},
      {{"launch", "-n", "99999999999999999999", "--", "true"},
       "--nproc '99999999999999999999' is out of range; allowed: an integer from 1 to 4096"},
      {{"launch", "-n", "1", "--grace", "-1", "--", "true"}, "--grace '-1' is out of range"},
      {{"run", graph, "--tolerance", "nan"}, "--tolerance 'nan' is not a finite number"},
      {{"run", graph, "--tolerance", "-0.5"},
       "--tolerance '-0.5' is out of range; allowed: a number >= 0"},
      {{"run", graph, "--seed", "-1"}, "--seed '-1' is out of range"},
      {{"passes", graph, "-o", out, "--bucket-mb", "64", "0"},
       "--bucket-mb '0' is out of range; allowed: a number > 0, or inf, in MiB"},
      {{"demo", "--tokens", "0"}, "--tokens '0' is out of range"},
      {{"demo", "--warmup-ms", "-1"}, "--warmup-ms '-1' is out of range"},
      {{"bench", "ag-mm", "--iters", "1.5"}, "--iters '1.5' is not an integer"},
      {{"bench", "ag-mm", "--hide-launch", "-1"}, "--hide-launch '-1' is out of range"},
  };
  for (const auto& [args, message] : cases) {
    const Finished f = asynctp(args, Millis(30'000));
    const std::string command = fmt::format("asynctp {}", fmt::join(args, " "));
    EXPECT_TRUE(f.exited && f.exit_code != 0) << command << ": " << f.describe();
    EXPECT_THAT(f.err, HasSubstr(message)) << command;
    // Readable bounds: no number of hundreds of digits (CLI11's own range check prints 309).
    EXPECT_FALSE(std::regex_search(f.err, std::regex("[0-9]{30}"))) << command << ": " << f.err;
    EXPECT_LT(f.seconds, 10.0) << command << ": refused at once, before anything starts";
  }
  // Values in range still work, in any of the registry's spellings.
  const Finished ok = asynctp({"launch", "-n", "1", "--timeout", "1E3", "--master-port", "0",
                               "--grace", "0.5", "--", "true"});
  EXPECT_TRUE(ok.exited && ok.exit_code == 0) << ok.describe();
  const Finished buckets =
      asynctp({"passes", graph, "-o", out, "--bucket-mb", "64", "inf", "--report"});
  EXPECT_TRUE(buckets.exited && buckets.exit_code == 0) << buckets.describe();
}

// A graph nested 100,000 deep (200 KB; it overflowed the stack of `passes` and of every rank of
// `run`) is a named error of each command, never a signal.
TEST(Cli, DeeplyNestedGraphIsANamedErrorNotASignal) {
  const std::string file = ::testing::TempDir() + "/asynctp_cli_deep.json";
  {
    std::ofstream out(file);
    out << R"({"format": "fx-graph-json", "version": 1, "world_size": 2, "nodes": [)"
        << R"({"name": "x", "op": "placeholder", "target": "x", "val": {"shape": )"
        << std::string(100000, '[') << std::string(100000, ']') << "}}]}";
  }
  const std::string message = "nested 100004 deep; at most 256 levels are read";
  const Finished passes = asynctp({"passes", file, "-o", file + ".out"});
  EXPECT_TRUE(passes.exited && passes.exit_code == 1) << passes.describe();
  EXPECT_THAT(passes.err, HasSubstr(message));
  // `run` reads the graph before it starts any rank (to check --nproc against it).
  const Finished run = asynctp({"run", file, "--nproc", "2"});
  EXPECT_TRUE(run.exited && run.exit_code == 1) << run.describe();
  EXPECT_THAT(run.err, AllOf(HasSubstr("asynctp: error: " + file), HasSubstr(message)));
  EXPECT_THAT(run.err, Not(HasSubstr("[rank"))) << run.describe();
  std::filesystem::remove(file);
}

// An invalid ASYNCTP_* value stops every command at start-up, naming the variable (an unknown
// log level among them, which must not leave the job logging at some other level); `asynctp env`
// lists it instead. Log levels are read in any case.
TEST(Cli, InvalidEnvironmentStopsEveryCommandAtStartUp) {
  const std::string graph =
      std::string(ASYNCTP_SOURCE_DIR) + "/tests/passes/graphs/sp_mlp.fwd.pre.json";
  const std::string out = ::testing::TempDir() + "/asynctp_cli_env.json";
  const auto with = [&](const std::string& name, const std::string& value,
                        const std::vector<std::string>& args) {
    std::map<std::string, std::string> env = test_env();
    env[name] = value;
    std::vector<std::string> argv{kBin};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, env, Millis(60'000));
  };
  const std::vector<std::string> launch{"launch", "-n", "2", "--", "sh", "-c", "echo started"};
  const std::vector<std::string> passes{"passes", graph, "-o", out};
  for (const auto& args : {launch, passes}) {
    const Finished bogus = with("ASYNCTP_LOG_LEVEL", "verbose", args);
    EXPECT_TRUE(bogus.exited && bogus.exit_code == 1) << bogus.describe();
    EXPECT_THAT(bogus.err, HasSubstr("ASYNCTP_LOG_LEVEL='verbose' is not one of the choices; "
                                     "allowed: trace, debug, info, warn, error, critical or off"));
    EXPECT_THAT(bogus.out, Not(HasSubstr("started")));
    const Finished inf = with("ASYNCTP_MAX_WORKSPACE_MB", "inf", args);
    EXPECT_TRUE(inf.exited && inf.exit_code == 1) << inf.describe();
    EXPECT_THAT(inf.err, HasSubstr("ASYNCTP_MAX_WORKSPACE_MB='inf' is not a finite number"));
    const Finished huge = with("ASYNCTP_MAX_WORKSPACE_MB", "17592186044416", args);  // 2^44
    EXPECT_TRUE(huge.exited && huge.exit_code == 1) << huge.describe();
    EXPECT_THAT(huge.err, HasSubstr("is out of range; allowed: a number from 0 to 17592186044415"));
    const Finished upper = with("ASYNCTP_LOG_LEVEL", "DEBUG", args);
    EXPECT_TRUE(upper.exited && upper.exit_code == 0) << upper.describe();
  }
  const Finished listed = with("ASYNCTP_LOG_LEVEL", "verbose", {"env"});
  EXPECT_THAT(listed.out, HasSubstr("ASYNCTP_LOG_LEVEL='verbose' is not one of the choices"));
}

// ---------------------------------------------------------------------------------------------
// asynctp launch

TEST(LaunchCli, EveryRankGetsItsVariablesAndATaggedOutput) {
  const Finished run = asynctp({"launch", "--nproc", "4", "--", "sh", "-c",
                                "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE "
                                "$MASTER_ADDR $MASTER_PORT"});
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.describe();
  const auto lines = lines_of(run.out);
  ASSERT_EQ(lines.size(), 4u) << run.describe();
  std::set<int> ranks;
  std::set<std::string> ports;
  const std::regex line_re(R"(\[rank (\d)\] (\d) 4 (\d) 4 127\.0\.0\.1 (\d+))");
  for (const auto& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << line;
    EXPECT_EQ(m[1], m[2]);
    EXPECT_EQ(m[2], m[3]);
    ranks.insert(std::stoi(m[1]));
    ports.insert(m[4]);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(ports.size(), 1u) << "every rank must get the same MASTER_PORT";
}

TEST(LaunchCli, MasterAddressAndPortArePassedOn) {
  const Finished run =
      asynctp({"launch", "--nproc", "2", "--master-addr", "localhost", "--master-port", "29533",
               "--", "sh", "-c", "echo $MASTER_ADDR:$MASTER_PORT"});
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.describe();
  auto lines = lines_of(run.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines,
            (std::vector<std::string>{"[rank 0] localhost:29533", "[rank 1] localhost:29533"}))
      << run.describe();
}

TEST(LaunchCli, NoPrefix) {
  const Finished run = asynctp(
      {"launch", "--nproc", "3", "--no-prefix", "--", "sh", "-c", "echo out; echo err >&2"});
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.describe();
  EXPECT_EQ(run.out, "out\nout\nout\n");
  EXPECT_EQ(run.err, "err\nerr\nerr\n");
  const Finished tagged = asynctp({"launch", "--nproc", "1", "--", "sh", "-c", "echo err >&2"});
  EXPECT_EQ(tagged.err, "[rank 0] err\n");
}

TEST(LaunchCli, FailingRankStopsTheJobAndIsNamed) {
  const Finished run = asynctp(
      {"launch", "--nproc", "4", "--", "sh", "-c", "[ \"$RANK\" = 3 ] && exit 42; exec sleep 30"});
  EXPECT_TRUE(run.exited) << run.describe();
  EXPECT_EQ(run.exit_code, 42) << run.describe();
  EXPECT_THAT(run.err, AllOf(HasSubstr("rank 3 (pid "), HasSubstr("exited with code 42")));
  EXPECT_LT(run.seconds, 10.0) << "the other ranks were not stopped quickly";
}

// The issue's acceptance test: a rank killed by SIGKILL ends the job quickly, named.
TEST(LaunchCli, RankKilledBySigkillIsNamedAndStopsTheOthers) {
  const Finished run = asynctp({"launch", "--nproc", "4", "--timeout", "60", "--", "sh", "-c",
                                "[ \"$RANK\" = 2 ] && kill -9 $$; exec sleep 30"},
                               Millis(40'000));
  ASSERT_FALSE(run.timed_out) << run.describe();
  EXPECT_TRUE(run.exited) << run.describe();
  EXPECT_NE(run.exit_code, 0);
  EXPECT_EQ(run.exit_code, 128 + SIGKILL);
  EXPECT_THAT(run.err,
              AllOf(HasSubstr("rank 2 (pid "), HasSubstr("was killed by signal 9 (SIGKILL)"),
                    HasSubstr("stopping the other ranks")));
  EXPECT_LT(run.seconds, 10.0) << run.describe();
}

TEST(LaunchCli, TimeoutKillsEverythingAndExits124) {
  const Finished run = asynctp({"launch", "--nproc", "3", "--timeout", "1", "--grace", "0.5", "--",
                                "sh", "-c", "trap '' TERM; sleep 30"},
                               Millis(40'000));
  EXPECT_TRUE(run.exited) << run.describe();
  EXPECT_EQ(run.exit_code, 124) << run.describe();
  EXPECT_THAT(run.err, HasSubstr("timeout after 1 s; stopping every rank"));
  EXPECT_GE(run.seconds, 0.9);
  EXPECT_LT(run.seconds, 10.0) << "ranks ignoring SIGTERM were not killed after the grace";
}

TEST(LaunchCli, CommandThatDoesNotExistFailsClearly) {
  const Finished run = asynctp({"launch", "--nproc", "2", "--", "asynctp-no-such-command", "x"});
  EXPECT_TRUE(run.exited) << run.describe();
  EXPECT_EQ(run.exit_code, 127) << run.describe();
  EXPECT_THAT(run.err,
              HasSubstr("cannot run 'asynctp-no-such-command': No such file or directory"));
  EXPECT_LT(run.seconds, 10.0);
}

// The pids the ranks printed as "<name>=<pid>", for every name that `names` (a regex) matches.
std::vector<pid_t> printed_pids(const std::string& out, const std::string& names) {
  std::vector<pid_t> pids;
  const std::regex re("(?:" + names + ")=(\\d+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  return pids;
}

// Dead or a zombie (which never runs again; it waits for whoever adopted it to reap it).
bool process_gone(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

// Waits up to `limit` for every process of `pids` to be gone; returns those still there.
std::vector<pid_t> wait_gone(const std::vector<pid_t>& pids, Millis limit) {
  const Deadline deadline(limit);
  while (true) {
    std::vector<pid_t> alive;
    for (const pid_t pid : pids) {
      if (!process_gone(pid)) alive.push_back(pid);
    }
    if (alive.empty() || deadline.expired()) return alive;
    std::this_thread::sleep_for(Millis(20));
  }
}

// Signals sent to the launcher go to every rank, and everything stops.
class LaunchSignals : public ::testing::TestWithParam<int> {};

TEST_P(LaunchSignals, AreForwardedAndEverythingStops) {
  const int sig = GetParam();
  Child launcher(
      {kBin, "launch", "--nproc", "3", "--", "sh", "-c", "echo ready pid=$$; exec sleep 30"},
      test_env());
  ASSERT_TRUE(launcher.wait_for_stdout("ready", 3, Millis(20'000))) << launcher.out();
  const std::vector<pid_t> rank_pids = printed_pids(launcher.out(), "pid");
  ASSERT_EQ(rank_pids.size(), 3u);

  const auto sent = Clock::now();
  launcher.send(sig);
  const Finished run = launcher.wait(Millis(20'000));
  EXPECT_TRUE(run.exited) << run.describe();
  EXPECT_EQ(run.exit_code, 128 + sig) << run.describe();
  EXPECT_THAT(run.err,
              HasSubstr(fmt::format("got SIG{}, forwarding it to every rank", sigabbrev_np(sig))));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - sent).count(), 4.0)
      << "the ranks did not stop before the 5 s grace ran out";
  for (pid_t pid : rank_pids) {
    EXPECT_FALSE(process_exists(pid)) << "rank pid " << pid << " lives";
  }
}

INSTANTIATE_TEST_SUITE_P(Signals, LaunchSignals, ::testing::Values(SIGTERM, SIGINT),
                         [](const auto& info) { return std::string(sigabbrev_np(info.param)); });

TEST(LaunchCli, SecondSignalSkipsTheGrace) {
  // Ranks ignore SIGTERM; the default grace is 5 s, but a second SIGTERM kills at once.
  Child launcher(
      {kBin, "launch", "--nproc", "2", "--", "sh", "-c", "trap '' TERM; echo ready; exec sleep 30"},
      test_env());
  ASSERT_TRUE(launcher.wait_for_stdout("ready", 2, Millis(20'000))) << launcher.out();
  const auto first = Clock::now();
  launcher.send(SIGTERM);
  std::this_thread::sleep_for(Millis(300));
  launcher.send(SIGTERM);
  const Finished run = launcher.wait(Millis(20'000));
  const double after_first = std::chrono::duration<double>(Clock::now() - first).count();
  EXPECT_EQ(run.exit_code, 128 + SIGTERM) << run.describe();
  EXPECT_LT(after_first, 4.0) << "the second signal did not skip the 5 s grace";
}

// The issue's acceptance test: the launcher SIGKILLed (as the OOM killer does); its ranks and the
// processes they started (compile workers, data loaders) are gone within 5 s.
TEST(LaunchCli, KilledLauncherTakesItsRanksAndTheirChildrenWithIt) {
  Child launcher({kBin, "launch", "--nproc", "3", "--", "sh", "-c",
                  "sleep 30 & sh -c 'sleep 30' & echo ready rank=$$ child=$!; wait"},
                 test_env());
  ASSERT_TRUE(launcher.wait_for_stdout("ready", 3, Millis(20'000))) << launcher.out();
  const std::vector<pid_t> pids = printed_pids(launcher.out(), "rank|child");
  ASSERT_EQ(pids.size(), 6u) << launcher.out();
  launcher.send(SIGKILL);
  const Finished run = launcher.wait(Millis(20'000));
  EXPECT_EQ(run.signal, SIGKILL) << run.describe();
  EXPECT_EQ(wait_gone(pids, Millis(5000)), std::vector<pid_t>{})
      << "ranks (rank=) or their children (child=) live on:\n"
      << launcher.out();
}

// Each rank's PR_SET_PDEATHSIG alone: with the guardian (NOTE [ranks die with their launcher])
// killed first, the ranks themselves still die with the launcher.
TEST(LaunchCli, RanksDieWithTheLauncherEvenWithoutItsGuardian) {
  Child launcher(
      {kBin, "launch", "--nproc", "2", "--", "sh", "-c", "echo ready rank=$$; exec sleep 30"},
      test_env());
  ASSERT_TRUE(launcher.wait_for_stdout("ready", 2, Millis(20'000))) << launcher.out();
  const std::vector<pid_t> ranks = printed_pids(launcher.out(), "rank");
  ASSERT_EQ(ranks.size(), 2u) << launcher.out();
  // The launcher's children are its ranks and the guardian.
  std::ifstream children(fmt::format("/proc/{0}/task/{0}/children", launcher.pid()));
  std::vector<pid_t> others;
  for (pid_t pid; children >> pid;) {
    if (std::find(ranks.begin(), ranks.end(), pid) == ranks.end()) others.push_back(pid);
  }
  ASSERT_EQ(others.size(), 1u) << "the guardian, beside the ranks";
  ::kill(others[0], SIGKILL);
  ASSERT_EQ(wait_gone(others, Millis(5000)), std::vector<pid_t>{}) << "the guardian";
  launcher.send(SIGKILL);
  launcher.wait(Millis(20'000));
  EXPECT_EQ(wait_gone(ranks, Millis(5000)), std::vector<pid_t>{}) << "ranks outlived the launcher";
}

TEST(LaunchCli, NprocTheDescriptorLimitCannotHoldIsRefusedAtOnce) {
  const Finished run =
      asynctp({"launch", "--nproc", "100", "--", "sh", "-c", "echo started"}, Millis(20'000));
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.describe();
  const Finished limited = run_command(
      {"sh", "-c", "ulimit -n 64 && exec asynctp launch --nproc 100 -- sh -c 'echo started'"},
      test_env(), Millis(20'000));
  EXPECT_TRUE(limited.exited && limited.exit_code != 0) << limited.describe();
  EXPECT_THAT(limited.err, HasSubstr("--nproc 100 needs 216 file descriptors"));
  EXPECT_THAT(limited.err, HasSubstr("this process may open 64 (RLIMIT_NOFILE"));
  EXPECT_THAT(limited.out, Not(HasSubstr("started"))) << "ranks were started";
}

// `asynctp run` checks --nproc against the graph before it starts a rank.
TEST(RunCli, NprocOtherThanTheGraphsIsAnErrorAtOnce) {
  const std::string graph =
      std::string(ASYNCTP_SOURCE_DIR) + "/tests/passes/graphs/sp_mlp.fwd.pre.json";
  for (const std::string nproc : {"4096", "2"}) {
    SCOPED_TRACE("--nproc " + nproc);
    const Finished run = asynctp({"run", graph, "--nproc", nproc, "--timeout", "60"});
    EXPECT_TRUE(run.exited && run.exit_code != 0) << run.describe();
    EXPECT_THAT(run.err, HasSubstr(fmt::format("--nproc {} but {} was recorded for world size 4: "
                                               "run it with --nproc 4",
                                               nproc, graph)));
    EXPECT_THAT(run.err + run.out, Not(HasSubstr("[rank "))) << "ranks were started";
    EXPECT_LT(run.seconds, 5.0);
  }
}

// ---------------------------------------------------------------------------------------------
// The demo under the launcher, and what it leaves in /dev/shm.

// The command as a user types it. Under the sanitizers (10-40x slower) the demo's default
// shapes take most of a minute on CI's two cores, so there it runs smaller ones: the same code,
// and still the fused paths.
std::vector<std::string> demo_command() {
  std::vector<std::string> args{"launch", "--nproc", "4", "--", "asynctp", "demo", "--json"};
#if defined(__SANITIZE_ADDRESS__)
  args.insert(args.end(), {"--tokens", "128", "--hidden", "64", "--ffn", "256", "--iters", "2"});
#endif
  return args;
}

TEST(LaunchCli, DemoOnFourRanksRunsFusedAndPrintsJson) {
  const Finished run = asynctp(demo_command(), Millis(240'000));
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.describe();
  // One JSON document, from rank 0.
  std::string json_line;
  for (const auto& line : lines_of(run.out)) {
    if (line.rfind("[rank 0] {", 0) == 0) {
      ASSERT_TRUE(json_line.empty()) << "two JSON documents:\n" << run.out;
      json_line = line.substr(std::string("[rank 0] ").size());
    } else {
      EXPECT_THAT(line, Not(HasSubstr("{"))) << "a JSON line from another rank";
    }
  }
  ASSERT_FALSE(json_line.empty()) << run.describe();
  const nlohmann::json doc = nlohmann::json::parse(json_line);
  EXPECT_EQ(doc.at("ok"), true) << json_line;
  EXPECT_EQ(doc.at("world_size"), 4);
  EXPECT_EQ(doc.at("backend"), "cpu");
  std::map<std::string, std::string> paths;
  for (const auto& op : doc.at("ops"))
    paths[op.at("op")] = op.at("path");
  // The CPU backend takes the native path wherever the kernel's contract allows it; the
  // sanitizers' smaller shapes leave MM+RS 32-row chunks, and its per-chunk completion needs
  // multiples of 128, so there it takes the split pipeline.
  EXPECT_EQ(paths["all_gather_matmul"], "native") << json_line;
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_EQ(paths["matmul_reduce_scatter"], "split") << json_line;
#else
  EXPECT_EQ(paths["matmul_reduce_scatter"], "native") << json_line;
#endif
  EXPECT_LE(doc.at("rel_error").at("out").get<double>(),
            doc.at("rel_error").at("tolerance").get<double>());
  // Every op and block timed both ways, and each block's three steps timed apart.
  for (const auto& op : doc.at("ops")) {
    EXPECT_GT(op.at("unfused_ms").get<double>(), 0) << json_line;
    EXPECT_GT(op.at("fused_ms").get<double>(), 0) << json_line;
  }
  std::vector<std::string> steps;
  for (const auto& step : doc.at("block_steps")) {
    steps.push_back(step.at("step"));
    EXPECT_GT(step.at("unfused_ms").get<double>(), 0) << json_line;
    EXPECT_GT(step.at("fused_ms").get<double>(), 0) << json_line;
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"all_gather_matmul", "silu", "matmul_reduce_scatter"}))
      << json_line;
  EXPECT_EQ(doc.at("timing").at("interleaved"), true) << json_line;
  EXPECT_EQ(doc.at("timing").at("warmup_ms"), 0.0) << "the CPU backend does not warm up";
}

TEST(LaunchCli, NothingIsLeftInDevShmAfterANormalRun) {
  const Finished run = asynctp({"launch", "--nproc", "3", "--", "sh", "-c",
                                "echo run=$ASYNCTP_RUN_ID; exec asynctp demo --tokens 48 "
                                "--hidden 32 --ffn 96 --iters 2"},
                               Millis(120'000));
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.describe();
  const std::string id = run_id_in(run.out);
  ASSERT_FALSE(id.empty()) << run.out;
  EXPECT_EQ(shm_of_run(id), std::vector<std::string>{});
  // The demo cleans up after itself: the launcher had nothing to remove.
  EXPECT_THAT(run.err, Not(HasSubstr("shared-memory segment")));
}

TEST(LaunchCli, NothingIsLeftInDevShmAfterAFailedRun) {
  // Rank 1's demo is killed while the job runs (symmetric memory allocated); rank 2 also leaves a
  // segment behind as a crash between shm_open and unlink would.
  const Finished run =
      asynctp({"launch", "--nproc", "3", "--", "sh", "-c",
               "echo run=$ASYNCTP_RUN_ID; "
               "[ \"$RANK\" = 2 ] && : > /dev/shm/asynctp-$ASYNCTP_RUN_ID-99-r2; "
               "[ \"$RANK\" = 1 ] && (sleep 1; kill -9 $$) & "
               "exec asynctp demo --tokens 48 --hidden 32 --ffn 96 --iters 1000000"},
              Millis(120'000));
  ASSERT_FALSE(run.timed_out) << run.describe();
  EXPECT_EQ(run.exit_code, 128 + SIGKILL) << run.describe();
  EXPECT_THAT(run.err, HasSubstr("rank 1 (pid "));
  const std::string id = run_id_in(run.out);
  ASSERT_FALSE(id.empty()) << run.out;
  EXPECT_EQ(shm_of_run(id), std::vector<std::string>{});
  EXPECT_THAT(run.err, HasSubstr("removed"));
}

}  // namespace
}  // namespace asynctp
