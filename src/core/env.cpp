#include "core/env.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace asynctp {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
           return lower(x) == lower(y);
         });
}

// A bound as a reader writes it: integers in full (the registry's bounds are below 2^53, where
// doubles are exact), anything else in the shortest form that reads back the same.
std::string bound(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::trunc(v) && std::fabs(v) < 9007199254740992.0) {
    return fmt::format("{}", static_cast<int64_t>(v));
  }
  return fmt::format("{}", v);
}

// "a | b | c" -> "a, b or c".
std::string one_of(std::span<const std::string_view> words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += i + 1 == words.size() ? " or " : ", ";
    out += words[i];
  }
  return out;
}

constexpr std::string_view kTrueWords[] = {"1", "true", "yes", "on"};
constexpr std::string_view kFalseWords[] = {"0", "false", "no", "off"};
constexpr size_t kMaxNameLength = 64;

// A value of any kind, parsed; `error` is empty when it is valid, else the whole message.
struct Parsed {
  int64_t integer = 0;
  double number = 0;
  bool flag = false;
  std::string_view choice;
  std::string error;
};

Parsed parse(const EnvVar& var, std::string_view text) {
  Parsed p;
  const auto fail = [&](std::string_view what) {
    // A value of thousands of digits stays readable: show its start and its length.
    const std::string shown =
        text.size() <= 80 ? std::string(text)
                          : fmt::format("{}... ({} characters)", text.substr(0, 64), text.size());
    // A variable as the shell sets it, an option as it is typed.
    p.error = fmt::format("{}{}'{}' is {}; allowed: {}", var.name,
                          var.name.starts_with("-") ? " " : "=", shown, what, var.allowed());
  };
  const char* const begin = text.data();
  const char* const end = text.data() + text.size();
  switch (var.kind) {
    case EnvVar::Kind::kInteger: {
      const auto [ptr, ec] = std::from_chars(begin, end, p.integer);
      if (ec == std::errc::result_out_of_range) {
        fail("out of range");
      } else if (ec != std::errc() || ptr != end) {
        fail("not an integer");
      } else if (static_cast<double>(p.integer) < var.min ||
                 static_cast<double>(p.integer) > var.max) {
        fail("out of range");
      }
      break;
    }
    case EnvVar::Kind::kNumber: {
      if (!var.special.empty() && iequals(text, var.special)) {
        p.number = std::numeric_limits<double>::infinity();
        break;
      }
      const auto [ptr, ec] = std::from_chars(begin, end, p.number, std::chars_format::general);
      if (ec == std::errc::result_out_of_range) {
        fail("out of range");
      } else if (ec != std::errc() || ptr != end) {
        fail("not a number");
      } else if (!std::isfinite(p.number)) {
        fail("not a finite number");
      } else if (p.number < var.min || (var.min_exclusive && p.number == var.min) ||
                 p.number > var.max) {
        fail("out of range");
      }
      break;
    }
    case EnvVar::Kind::kFlag: {
      const auto in = [&](std::span<const std::string_view> words) {
        return std::any_of(words.begin(), words.end(),
                           [&](std::string_view w) { return iequals(text, w); });
      };
      if (in(kTrueWords)) {
        p.flag = true;
      } else if (!in(kFalseWords)) {
        fail("not a flag");
      }
      break;
    }
    case EnvVar::Kind::kChoice: {
      const auto it = std::find_if(var.choices.begin(), var.choices.end(),
                                   [&](std::string_view c) { return iequals(text, c); });
      if (it == var.choices.end()) {
        fail("not one of the choices");
      } else {
        p.choice = *it;
      }
      break;
    }
    case EnvVar::Kind::kName: {
      const bool good_chars = std::all_of(begin, end, [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-';
      });
      if (text.empty() || text.size() > kMaxNameLength || !good_chars) fail("not a name");
      break;
    }
    case EnvVar::Kind::kText:
      break;
  }
  return p;
}

// The value the typed accessors read: the variable's, else its default.
Parsed parse_current(const EnvVar& var) {
  const std::optional<std::string> raw = var.raw();
  Parsed p = parse(var, raw ? std::string_view(*raw) : var.default_value);
  if (!p.error.empty()) ASYNCTP_FAIL("{}", p.error);
  return p;
}

void check_kind(const EnvVar& var, EnvVar::Kind want, std::string_view accessor) {
  ASYNCTP_CHECK(var.kind == want, "{} cannot be read with EnvVar::{}(): it is of another kind",
                var.name, accessor);
}

}  // namespace

int64_t parse_integer(const EnvVar& spec, std::string_view text) {
  check_kind(spec, EnvVar::Kind::kInteger, "integer");
  Parsed p = parse(spec, text);
  if (!p.error.empty()) ASYNCTP_FAIL("{}", p.error);
  return p.integer;
}

double parse_number(const EnvVar& spec, std::string_view text) {
  check_kind(spec, EnvVar::Kind::kNumber, "number");
  Parsed p = parse(spec, text);
  if (!p.error.empty()) ASYNCTP_FAIL("{}", p.error);
  return p.number;
}

std::optional<std::string> EnvVar::raw() const {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int64_t EnvVar::integer() const {
  check_kind(*this, Kind::kInteger, "integer");
  return parse_current(*this).integer;
}

double EnvVar::number() const {
  check_kind(*this, Kind::kNumber, "number");
  return parse_current(*this).number;
}

bool EnvVar::flag() const {
  check_kind(*this, Kind::kFlag, "flag");
  return parse_current(*this).flag;
}

std::string_view EnvVar::choice() const {
  check_kind(*this, Kind::kChoice, "choice");
  return parse_current(*this).choice;
}

std::optional<std::string> EnvVar::text() const {
  ASYNCTP_CHECK(kind == Kind::kName || kind == Kind::kText,
                "{} cannot be read with EnvVar::text(): it is of another kind", name);
  std::optional<std::string> value = raw();
  if (value) {
    const Parsed p = parse(*this, *value);
    if (!p.error.empty()) ASYNCTP_FAIL("{}", p.error);
  }
  return value;
}

std::string EnvVar::allowed() const {
  const std::string in_unit = unit.empty() ? "" : fmt::format(", in {}", unit);
  switch (kind) {
    case Kind::kInteger:
      if (max - min == 1) return fmt::format("{} or {}{}", bound(min), bound(max), in_unit);
      return fmt::format("an integer from {} to {}{}", bound(min), bound(max), in_unit);
    case Kind::kNumber: {
      const std::string or_special = special.empty() ? "" : fmt::format(", or {}", special);
      std::string range;
      if (std::isinf(max)) {
        range = fmt::format("{} {}", min_exclusive ? ">" : ">=", bound(min));
      } else if (min_exclusive) {
        range = fmt::format("> {} and <= {}", bound(min), bound(max));
      } else {
        range = fmt::format("from {} to {}", bound(min), bound(max));
      }
      return fmt::format("a number {}{}{}", range, or_special, in_unit);
    }
    case Kind::kFlag:
      return fmt::format("{}; {} (any case)", one_of(kTrueWords), one_of(kFalseWords));
    case Kind::kChoice: {
      const bool has_letters = std::any_of(choices.begin(), choices.end(), [](std::string_view c) {
        return std::any_of(c.begin(), c.end(), [](char x) { return x >= 'a' && x <= 'z'; });
      });
      return fmt::format("{}{}", one_of(choices), has_letters ? " (any case)" : "");
    }
    case Kind::kName:
      return fmt::format("1 to {} letters, digits, '.', '_' or '-'", kMaxNameLength);
    case Kind::kText:
      return "any text";
  }
  return "";
}

std::optional<std::string> EnvVar::problem() const {
  const std::optional<std::string> value = raw();
  if (!value) return std::nullopt;
  Parsed p = parse(*this, *value);
  if (p.error.empty()) return std::nullopt;
  return std::move(p.error);
}

namespace envvars {

const EnvVar* find(std::string_view name) {
  for (const EnvVar* var : kAll) {
    if (var->name == name) return var;
  }
  return nullptr;
}

void check_all() {
  std::string problems;
  for (const EnvVar* var : kAll) {
    if (var->scope != EnvVar::Scope::kLibrary) continue;
    if (const std::optional<std::string> problem = var->problem())
      problems += (problems.empty() ? "" : "\n") + *problem;
  }
  ASYNCTP_CHECK(problems.empty(), "{}", problems);
}

}  // namespace envvars
}  // namespace asynctp
