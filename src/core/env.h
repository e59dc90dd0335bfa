// The ASYNCTP_* environment variables, each declared once below with its name, kind, allowed
// values, default and one line of doc (the idea of NCCL's param.h). Every read in the library
// goes through an EnvVar's typed accessor, which parses the value strictly: a value that is not
// of the variable's kind or lies outside its range throws asynctp::Error naming the variable, the
// value and what is allowed; it never becomes 0, a default or "logging off". `asynctp env` prints
// the table with the current values, and README.md's table is `asynctp env --markdown`
// (tests/tools checks that they agree).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace asynctp {

struct EnvVar {
  enum class Kind {
    kInteger,  // decimal digits (a leading '-' only for negative values) in [min, max]
    kNumber,   // decimal number, fractions and exponents allowed, in [min, max] or (min, max]
    kFlag,     // 1/0, true/false, yes/no, on/off, in any case
    kChoice,   // one of `choices`, in any case
    kName,     // 1 to 64 letters, digits, '.', '_' or '-' (it names files under /dev/shm)
    kText,     // any text
  };
  // Who reads it: the library (and so every program built on it), or only the test suite and
  // scripts/ (registered so that they are documented and checked in one place too).
  enum class Scope { kLibrary, kTests };

  std::string_view name;
  Kind kind;
  // kInteger, kNumber, kFlag, kChoice: the value an unset (or empty) variable has, in the
  // variable's own syntax (the registry's test parses each one). kName, kText: unset has no value
  // (the accessor returns nullopt); this says what happens then.
  std::string_view default_value;
  std::string_view doc;        // one line
  std::string_view unit = "";  // kInteger, kNumber: "seconds", "MiB", "bytes", ...
  double min = 0;
  double max = 0;                                  // +infinity: no upper bound (kNumber only)
  bool min_exclusive = false;                      // kNumber: the value must be > min, not >= min
  std::string_view special = "";                   // kNumber: a word accepted for +infinity ("inf")
  std::span<const std::string_view> choices = {};  // kChoice: canonical (lower-case) spellings
  Scope scope = Scope::kLibrary;

  // The raw value: nullopt when unset or empty (an empty variable counts as unset, as a shell's
  // `VAR= cmd` is meant to).
  std::optional<std::string> raw() const;

  // Typed accessors: the current value, or the default when unset; they throw Error when the
  // value is invalid, and check that the variable is of the kind they read.
  int64_t integer() const;                  // kInteger
  double number() const;                    // kNumber (+infinity for `special`)
  bool flag() const;                        // kFlag
  std::string_view choice() const;          // kChoice: the canonical spelling
  std::optional<std::string> text() const;  // kName, kText: nullopt when unset

  // What is allowed, in words ("an integer from 1 to 4", "auto, native, fused or fallback").
  std::string allowed() const;
  // nullopt when unset or valid, else the message the typed accessor would throw.
  std::optional<std::string> problem() const;
};

// A command-line number read as a variable's value is read: the same syntax, range check and
// message, naming spec.name, which for an option is its flag ("--timeout 'nan' is not a finite
// number; allowed: ..."). The tools declare an EnvVar per numeric option (tools/options.h).
// Throws Error; spec must be of the kind read.
int64_t parse_integer(const EnvVar& spec, std::string_view text);
double parse_number(const EnvVar& spec, std::string_view text);

namespace envvars {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline constexpr std::string_view kPathChoices[] = {"auto", "native", "split", "fallback",
                                                    "unfused"};
inline constexpr std::string_view kLogLevelChoices[] = {"trace", "debug",    "info", "warn",
                                                        "error", "critical", "off"};
inline constexpr std::string_view kSkipAsanChoices[] = {"0", "1"};
inline constexpr std::string_view kKernelPushChoices[] = {"auto",  "0",    "1",  "off", "on",
                                                          "false", "true", "no", "yes"};

inline constexpr EnvVar kTimeout{
    .name = "ASYNCTP_TIMEOUT",
    .kind = EnvVar::Kind::kNumber,
    .default_value = "300",
    .doc =
        "Bound on every wait (store, signals, barriers, chunk flags, rank start-up); values "
        "above 1e7 and inf mean 1e7 s.",
    .unit = "seconds",
    .min = 0,
    .max = kInf,
    .min_exclusive = true,
    .special = "inf",
};

inline constexpr EnvVar kMaxWorkspaceMb{
    .name = "ASYNCTP_MAX_WORKSPACE_MB",
    .kind = EnvVar::Kind::kNumber,
    .default_value = "2048",
    .doc =
        "Symmetric workspace limit per rank; an op whose workspace would exceed it takes the "
        "unfused fallback.",
    .unit = "MiB",
    .min = 0,
    .max = 17592186044415.0,  // 2^44 - 1: the limit in bytes must fit in 64 bits
};

inline constexpr EnvVar kPath{
    .name = "ASYNCTP_PATH",
    .kind = EnvVar::Kind::kChoice,
    .default_value = "auto",
    .doc = "The fused ops' path: measured per problem (auto), or forced (unfused is fallback).",
    .choices = kPathChoices,
};

inline constexpr EnvVar kTunePace{
    .name = "ASYNCTP_TUNE_PACE",
    .kind = EnvVar::Kind::kNumber,
    .default_value = "0",
    .doc =
        "How `auto` times the paths of a new problem: 0, back to back after warming up at that "
        "load for 300 ms (the power-capped clocks of a training step); or each run followed by "
        "an idle pause this many times its length (1: paced, the clocks of short bursts). "
        "Choices are cached per pace.",
    .min = 0,
    .max = 10,
};

inline constexpr EnvVar kCacheDir{
    .name = "ASYNCTP_CACHE_DIR",
    .kind = EnvVar::Kind::kText,
    .default_value = "$XDG_CACHE_HOME/asynctp, else ~/.cache/asynctp",
    .doc = "Folder of dispatch.json, the measured path choices of `auto`.",
};

inline constexpr EnvVar kLogLevel{
    .name = "ASYNCTP_LOG_LEVEL",
    .kind = EnvVar::Kind::kChoice,
    .default_value = "warn",
    .doc = "Log level on stderr; any other value is an error.",
    .choices = kLogLevelChoices,
};

inline constexpr EnvVar kHostId{
    .name = "ASYNCTP_HOST_ID",
    .kind = EnvVar::Kind::kText,
    .default_value = "host name and boot id",
    .doc = "Node identity, for when host names do not tell nodes apart.",
};

inline constexpr EnvVar kRunId{
    .name = "ASYNCTP_RUN_ID",
    .kind = EnvVar::Kind::kName,
    .default_value = "made up by rank 0",
    .doc = "Names the job's shared resources (/dev/shm); `asynctp launch` sets it.",
};

inline constexpr EnvVar kStorePort{
    .name = "ASYNCTP_STORE_PORT",
    .kind = EnvVar::Kind::kInteger,
    .default_value = "0",
    .doc =
        "TCP port of asynctp's store; 0: MASTER_PORT, or MASTER_PORT + 1 under torchrun's "
        "agent store.",
    .min = 0,
    .max = 65535,
};

inline constexpr EnvVar kStoreSecret{
    .name = "ASYNCTP_STORE_SECRET",
    .kind = EnvVar::Kind::kText,
    .default_value = "made by `asynctp launch`; required with several ranks otherwise",
    .doc =
        "The job's store secret, 32 to 128 hex digits: every store connection proves it knows "
        "it (never sent; `asynctp env` hides it).",
};

inline constexpr EnvVar kGemmStreams{
    .name = "ASYNCTP_GEMM_STREAMS",
    .kind = EnvVar::Kind::kInteger,
    .default_value = "1",
    .doc = "How many streams the split pipeline's chunk GEMMs alternate between.",
    .min = 1,
    .max = 2,
};

inline constexpr EnvVar kPushPieceBytes{
    .name = "ASYNCTP_PUSH_PIECE_BYTES",
    .kind = EnvVar::Kind::kInteger,
    .default_value = "0",
    .doc =
        "The native all_gather_matmul pushes each shard in up to 4 flagged pieces of at least "
        "this size; 0: one piece.",
    .unit = "bytes",
    .min = 0,
    .max = 1099511627776.0,  // 1 TiB: far above any shard, and exact in a double
};

inline constexpr EnvVar kPushStreams{
    .name = "ASYNCTP_PUSH_STREAMS",
    .kind = EnvVar::Kind::kInteger,
    .default_value = "2",
    .doc =
        "The copy streams the native matmul_reduce_scatter pushes its pieces on, where it pushes "
        "them beside (CUDA graphs, eager calls below ASYNCTP_PUSH_INLINE_MIN_K).",
    .min = 1,
    .max = 4,
};

inline constexpr EnvVar kPushInlineMinK{
    .name = "ASYNCTP_PUSH_INLINE_MIN_K",
    .kind = EnvVar::Kind::kInteger,
    .default_value = "0",
    .doc =
        "An eager native matmul_reduce_scatter with K at least this pushes each chunk in at most "
        "2 pieces on one copy stream, its flags inline (a third of the host calls); below it, in "
        "up to 4 pieces on ASYNCTP_PUSH_STREAMS streams, flags beside.",
    .min = 0,
    .max = 1099511627776.0,
};

inline constexpr EnvVar kKernelPush{
    .name = "ASYNCTP_KERNEL_PUSH",
    .kind = EnvVar::Kind::kChoice,
    .default_value = "auto",
    .doc =
        "1: the native matmul_reduce_scatter's GEMM stores each peer's rows into that peer's "
        "memory itself and raises its flags (one launch: 13-20 us less host time a call, faster "
        "on small shapes, slower on large ones at ws 2); 0: copy streams push them; auto: "
        "ASYNCTP_PATH=auto measures both per problem, else copy streams.",
    .choices = kKernelPushChoices,
};

inline constexpr EnvVar kGemmAutotune{
    .name = "ASYNCTP_GEMM_AUTOTUNE",
    .kind = EnvVar::Kind::kFlag,
    .default_value = "1",
    .doc = "Time cuBLASLt's candidate algorithms once per shape; 0 takes its first heuristic.",
};

inline constexpr EnvVar kAllowTf32{
    .name = "ASYNCTP_ALLOW_TF32",
    .kind = EnvVar::Kind::kFlag,
    .default_value = "0",
    .doc = "Run f32 GEMMs on TF32 tensor cores.",
};

inline constexpr EnvVar kHostProfile{
    .name = "ASYNCTP_HOST_PROFILE",
    .kind = EnvVar::Kind::kFlag,
    .default_value = "0",
    .doc =
        "Time each fused op call's host steps; a context prints them to stderr when it is "
        "destroyed (asynctp.bench.host reads them without it).",
};

inline constexpr EnvVar kSharedGpus{
    .name = "ASYNCTP_SHARED_GPUS",
    .kind = EnvVar::Kind::kInteger,
    .default_value = "1",
    .doc =
        "How many ranks may share one GPU; above 1 for testing only (no NCCL, each native GEMM "
        "on its share of the SMs).",
    .min = 1,
    .max = 8,
};

inline constexpr EnvVar kCpuStreamJitter{
    .name = "ASYNCTP_CPU_STREAM_JITTER",
    .kind = EnvVar::Kind::kInteger,
    .default_value = "0",
    .doc =
        "CPU backend: a seed for random delays (0-200 us, before one item in two of each "
        "stream) that show a missing event edge; 0: no delays.",
    .min = 0,
    .max = 9007199254740991.0,  // 2^53 - 1: exact in a double
};

inline constexpr EnvVar kSharedDir{
    .name = "ASYNCTP_SHARED_DIR",
    .kind = EnvVar::Kind::kText,
    .default_value = "shared/ beside the checkout, else /work/shared",
    .doc = "Where the tests find the project's sample graphs (its graphs/ folder).",
    .scope = EnvVar::Scope::kTests,
};

inline constexpr EnvVar kSkipAsan{
    .name = "ASYNCTP_SKIP_ASAN",
    .kind = EnvVar::Kind::kChoice,
    .default_value = "0",
    .doc = "1: scripts/test.sh skips its AddressSanitizer stage.",
    .choices = kSkipAsanChoices,
    .scope = EnvVar::Scope::kTests,
};

inline constexpr EnvVar kLibrary{
    .name = "ASYNCTP_LIBRARY",
    .kind = EnvVar::Kind::kText,
    .default_value = "the package's lib/libasynctp_c.so",
    .doc = "Python only: the C library the asynctp package loads when it has none of its own.",
};

inline constexpr EnvVar kBuildTests{
    .name = "ASYNCTP_BUILD_TESTS",
    .kind = EnvVar::Kind::kText,
    .default_value = "OFF",
    .doc =
        "ON or OFF (a CMake boolean): `pip install .` builds the C++ tests too, so that the "
        "wheel can share a build dir with ctest.",
    .scope = EnvVar::Scope::kTests,
};

// Every variable, in the order `asynctp env` and the README list them.
inline constexpr const EnvVar* kAll[] = {
    &kTimeout,     &kMaxWorkspaceMb,  &kPath,       &kTunePace,     &kCacheDir,    &kLogLevel,
    &kHostId,      &kRunId,           &kStorePort,  &kStoreSecret,  &kGemmStreams, &kPushPieceBytes,
    &kPushStreams, &kPushInlineMinK,  &kKernelPush, &kGemmAutotune, &kAllowTf32,   &kHostProfile,
    &kSharedGpus,  &kCpuStreamJitter, &kLibrary,    &kSharedDir,    &kSkipAsan,    &kBuildTests,
};

// The registered variable of that name; nullptr when there is none.
const EnvVar* find(std::string_view name);

// Throws Error naming every variable of Scope::kLibrary set to an invalid value (one a line), so
// that a bad value stops a program at start-up rather than at its first use, or, for the log
// level, leaves no logger at a level nobody asked for. The `asynctp` command calls it before
// each subcommand but `env` (which lists the problems), Group::create before a rendezvous.
void check_all();

}  // namespace envvars
}  // namespace asynctp
