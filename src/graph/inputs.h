// Graph inputs and outputs: seeded random values for every placeholder, or raw files.
//
// Random inputs: placeholder P on rank r gets values uniform in [-1, 1) from a generator seeded by
// (seed, r, P's name), so any rank can rebuild every other rank's inputs; float8 placeholders get
// such values rounded to their format (they lie well inside its range, so they survive the cast).
// int64 and uint64 placeholders (RNG seeds and offsets) get integers in [0, 1024), bool ones true
// or false.
//
// Tensor files ("raw" format): DIR/NAME.rank<R>.bin, else DIR/NAME.bin for every rank: the
// tensor's elements in row-major order of its shape, little-endian, in its own dtype (bool: one
// byte, 0 or 1), nothing else; the shape and dtype come from the graph's `val` (inputs) or from the
// result (outputs, written with a NAME.rank<R>.json beside each holding {"shape", "dtype"}).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/executor.h"

namespace asynctp::graph {

Inputs random_inputs(const Graph& graph, int rank, uint64_t seed);
Inputs read_inputs(const Graph& graph, int rank, const std::string& dir);

// Writes tensor outputs as DIR/output<i>.rank<R>.bin (+ .json); None outputs are skipped.
void write_outputs(const std::vector<RtValue>& outputs, int rank, const std::string& dir);

// Reads one raw tensor file of `shape` and `dtype` (its size must match exactly).
HostTensor read_raw(const std::string& path, const Dims& shape, DType dtype);
void write_raw(const std::string& path, const Tensor& t);

}  // namespace asynctp::graph
