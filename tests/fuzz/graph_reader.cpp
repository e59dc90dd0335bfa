// libFuzzer target: the fx-graph-json reader on arbitrary bytes. The reader must either return a
// graph or throw asynctp::Error; a crash, a sanitizer report or any other exception is a finding.
// A graph it returns must write back to a document that reads back to the same text (what
// `asynctp passes` does with every graph it is given).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "graph/json_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string written;
  try {
    written = asynctp::graph::dump_graph(asynctp::graph::parse_graph(text, "fuzz"));
  } catch (const asynctp::Error&) {
    return 0;
  }
  const std::string again =
      asynctp::graph::dump_graph(asynctp::graph::parse_graph(written, "fuzz, written back"));
  if (again != written) __builtin_trap();
  return 0;
}
