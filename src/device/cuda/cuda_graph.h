// Capture of work enqueued on a backend stream into a CUDA graph, and its replay: how the
// benchmarks measure the ops without launch overhead, and how tests prove they are capturable.
#pragma once

#include <memory>

#include "device/backend.h"

namespace asynctp::cuda {

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Everything enqueued on `stream` (and on streams joined to it through events) between begin
  // and end becomes the graph.
  void begin_capture(Stream& stream);
  void end_capture();
  void replay(Stream& stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace asynctp::cuda
