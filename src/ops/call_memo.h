// What an op worked out for a call, kept for the next call with the same metadata. An eager op's
// host time delays its first GPU work on an idle GPU, and most of it before the first launch is
// spent on metadata alone: the argument checks, the native plan, the dispatcher's key (a
// formatted string) and its lookup. A training or serving loop calls each op with the same
// shapes, strides, dtypes and options step after step, only the data pointers differ; so the
// ops key each call by that metadata and, on a hit, skip straight to the path they chose.
//
// What the key holds: the op (its name's address: each op passes a string literal), every
// option that the checks or the choice read, and for each tensor argument its dtype, device,
// shape, strides and its data's offset from a 16-byte boundary (an undefined tensor as one
// word). Pointers are not in it, only those offsets: all that the native GEMM's alignment checks
// read of them (16 bytes for TMA, 8 or 4 for some outputs and the scales).
// Only settled decisions are kept (PathDecision::settled): a path the caller asked for, or one
// the dispatcher measured (or took unmeasured on a backend that does not time paths), never a
// capture's provisional first candidate.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include <asynctp/tensor.h>
#include "ops/matmul_common.h"

namespace asynctp::detail {

struct CallMemo {
  PathDecision decision;
  int dim = 0;  // the call's gather or scatter dim, wrapped
  // The op's native plan, if it has one for this call (its meaning is the op's).
  bool has_plan = false;
  std::array<int64_t, 3> plan{};
};

class CallMemos {
 public:
  // Starts the key of a call of `op` (a string literal).
  void start(const char* op);
  void add(int64_t word) { key_.push_back(word); }
  void add(const Tensor& t);
  void add(std::span<const Tensor> ts);
  // The memo of the key built since start(), or nullptr.
  const CallMemo* find() const;
  // Keeps `memo` under the key built since start(); a context that has met many different calls
  // (dynamic shapes) starts over rather than grow without bound.
  void remember(const CallMemo& memo);
  size_t size() const { return memos_.size(); }

  static constexpr size_t kMaxMemos = 1024;

 private:
  struct Hash {
    size_t operator()(const std::vector<int64_t>& key) const;
  };
  std::vector<int64_t> key_;  // reused: building a key allocates nothing once it has grown
  std::unordered_map<std::vector<int64_t>, CallMemo, Hash> memos_;
};

}  // namespace asynctp::detail
