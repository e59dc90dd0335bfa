// The numeric options of the `asynctp` command line, each declared once as an EnvVar spec (kind,
// range, unit; the default is the command's) and read by the registry's parser (core/env.h), as the
// ASYNCTP_* variables are: the same syntax, inf, NaN and overflow refused, and an error that names
// the option and its bounds in words ("--timeout '1e16' is out of range; allowed: a number > 0 and
// <= 10000000, in seconds"). CLI11 stores the text; the option's callback parses it once, into the
// target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/deadline.h"
#include "core/env.h"

namespace asynctp::tools {

namespace options {

inline constexpr double kInf = envvars::kInf;

inline constexpr EnvVar kNproc{.name = "--nproc",
                               .kind = EnvVar::Kind::kInteger,
                               .default_value = "",
                               .doc = "ranks",
                               .min = 1,
                               .max = 4096};
inline constexpr EnvVar kTimeout{.name = "--timeout",
                                 .kind = EnvVar::Kind::kNumber,
                                 .default_value = "",
                                 .doc = "whole-job limit",
                                 .unit = "seconds",
                                 .min = 0,
                                 .max = kMaxTimeoutSeconds,
                                 .min_exclusive = true};
inline constexpr EnvVar kGrace{.name = "--grace",
                               .kind = EnvVar::Kind::kNumber,
                               .default_value = "",
                               .doc = "SIGTERM to SIGKILL",
                               .unit = "seconds",
                               .min = 0,
                               .max = 3600};
inline constexpr EnvVar kMasterPort{.name = "--master-port",
                                    .kind = EnvVar::Kind::kInteger,
                                    .default_value = "",
                                    .doc = "0: a free port",
                                    .min = 0,
                                    .max = 65535};
inline constexpr EnvVar kTolerance{.name = "--tolerance",
                                   .kind = EnvVar::Kind::kNumber,
                                   .default_value = "",
                                   .doc = "relative error",
                                   .min = 0,
                                   .max = kInf};
inline constexpr EnvVar kBucketMb{.name = "--bucket-mb",
                                  .kind = EnvVar::Kind::kNumber,
                                  .default_value = "",
                                  .doc = "bucket cap",
                                  .unit = "MiB",
                                  .min = 0,
                                  .max = kInf,
                                  .min_exclusive = true,
                                  .special = "inf"};
inline constexpr EnvVar kSeed{.name = "--seed",
                              .kind = EnvVar::Kind::kInteger,
                              .default_value = "",
                              .doc = "random inputs",
                              .min = 0,
                              .max = 9007199254740991.0};  // 2^53 - 1: exact in a double
inline constexpr EnvVar kIters{.name = "--iters",
                               .kind = EnvVar::Kind::kInteger,
                               .default_value = "",
                               .doc = "timed runs",
                               .min = 1,
                               .max = 1000000};
inline constexpr EnvVar kWarmup{.name = "--warmup",
                                .kind = EnvVar::Kind::kInteger,
                                .default_value = "",
                                .doc = "untimed runs",
                                .min = 0,
                                .max = 1000000};
inline constexpr EnvVar kWarmupMs{.name = "--warmup-ms",
                                  .kind = EnvVar::Kind::kNumber,
                                  .default_value = "",
                                  .doc = "warm-up time",
                                  .unit = "milliseconds",
                                  .min = 0,
                                  .max = 3.6e6};
inline constexpr EnvVar kPace{.name = "--pace",
                              .kind = EnvVar::Kind::kNumber,
                              .default_value = "",
                              .doc = "idle time per run",
                              .min = 0,
                              .max = 1000};
inline constexpr EnvVar kHideLaunch{.name = "--hide-launch",
                                    .kind = EnvVar::Kind::kInteger,
                                    .default_value = "",
                                    .doc = "device delay per run",
                                    .unit = "cycles",
                                    .min = 0,
                                    .max = 1e10};
inline constexpr EnvVar kNativePieces{
    .name = "--native-pieces",
    .kind = EnvVar::Kind::kInteger,
    .default_value = "",
    .doc = "piece size",
    .unit = "bytes",
    .min = 0,
    .max = 1099511627776.0};  // 1 TiB, as ASYNCTP_PUSH_PIECE_BYTES
// The demo's sizes: T, H, F.
inline constexpr EnvVar kTokens{.name = "--tokens",
                                .kind = EnvVar::Kind::kInteger,
                                .default_value = "",
                                .doc = "tokens",
                                .min = 1,
                                .max = 1048576};
inline constexpr EnvVar kHidden{.name = "--hidden",
                                .kind = EnvVar::Kind::kInteger,
                                .default_value = "",
                                .doc = "hidden size",
                                .min = 1,
                                .max = 1048576};
inline constexpr EnvVar kFfn{.name = "--ffn",
                             .kind = EnvVar::Kind::kInteger,
                             .default_value = "",
                             .doc = "FFN size",
                             .min = 1,
                             .max = 1048576};

}  // namespace options

// Registers `flags` ("--nproc,-n"), reading its value as `spec` says into `*target`; spec.name
// must be one of the flags. A default for --help is the caller's (->default_str).
CLI::Option* add_integer_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                int* target, const std::string& description);
CLI::Option* add_integer_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                int64_t* target, const std::string& description);
CLI::Option* add_integer_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                uint64_t* target, const std::string& description);
// An option that is absent unless given.
CLI::Option* add_integer_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                std::optional<size_t>* target, const std::string& description);
CLI::Option* add_number_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                               double* target, const std::string& description);
// One or more values (`--bucket-mb 64 128`).
CLI::Option* add_numbers_option(CLI::App* cmd, const std::string& flags, const EnvVar& spec,
                                std::vector<double>* target, const std::string& description);

}  // namespace asynctp::tools
