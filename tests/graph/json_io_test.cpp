// fx-graph-json: round trips of real graphs, every kind of malformed input giving an error that
// names the node, and a fuzz test (mutated samples and random bytes never crash the reader).
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "core/error.h"
#include "graph/json_io.h"

namespace asynctp::graph {
namespace {

std::string test_graph(const std::string& name) {
  return std::string(ASYNCTP_TEST_GRAPHS_DIR) + "/" + name;
}

// A minimal valid document around `nodes` (a JSON array text).
std::string doc(const std::string& nodes) {
  return R"({"format": "fx-graph-json", "version": 1, "source": "t", "world_size": 2, "nodes": )" +
         nodes + "}";
}

const char* kPlaceholder =
    R"({"name": "x", "op": "placeholder", "target": "x", "args": [], "kwargs": {},
  "val": {"shape": [2, 3], "stride": [3, 1], "dtype": "float32", "device": "cpu"}})";

std::string error_of(const std::string& text) {
  try {
    parse_graph(text, "t.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonIo, RealGraphsRoundTrip) {
  for (const char* name :
       {"sp_block.fwd.pre.json", "sp_block.bwd.pre.json", "fp8_rowwise_mlp.fwd.post.json"}) {
    const Graph g = read_graph_file(test_graph(name));
    EXPECT_GT(g.size(), 10u);
    EXPECT_EQ(g.world_size, 4);
    const std::string text = dump_graph(g);
    const Graph again = parse_graph(text);
    ASSERT_EQ(again.size(), g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_EQ(again.nodes()[i].name, g.nodes()[i].name);
      EXPECT_EQ(again.nodes()[i].target, g.nodes()[i].target);
      EXPECT_TRUE(again.nodes()[i].args == g.nodes()[i].args) << g.nodes()[i].name;
      EXPECT_TRUE(again.nodes()[i].val == g.nodes()[i].val) << g.nodes()[i].name;
    }
    EXPECT_EQ(dump_graph(again), text);
  }
}

TEST(JsonIo, UnknownTargetsAndValuesArePassedThrough) {
  const std::string text = doc(std::string("[") + kPlaceholder + R"(,
    {"name": "y", "op": "call_function", "target": "mylib.custom.default",
     "args": [{"node": "x"}, {"repr": "torch.contiguous_format"}, {"dict": {"k": [1, 2.5, null]}},
              {"device": "cuda:0"}, {"layout": "strided"}, {"memory_format": "channels_last"}],
     "kwargs": {"inf": {"repr": "inf"}}, "val": null},
    {"name": "output", "op": "output", "target": "output", "args": [[{"node": "y"}]], "kwargs": {}, "val": null}])");
  const Graph g = parse_graph(text);
  const Node& y = g.nodes()[1];
  EXPECT_EQ(y.target, "mylib.custom.default");
  EXPECT_EQ(y.args[2].kind, Value::Kind::kDict);
  EXPECT_TRUE(std::isinf(y.kwarg("inf")->as_double()));
  EXPECT_EQ(dump_graph(parse_graph(dump_graph(g))), dump_graph(g));
}

TEST(JsonIo, MalformedInputNamesTheNode) {
  const std::string out =
      R"({"name": "output", "op": "output", "target": "output", "args": [[{"node": "x"}]], "kwargs": {}})";
  // Dangling reference.
  EXPECT_NE(error_of(doc(std::string("[") + kPlaceholder +
                         R"(, {"name": "output", "op": "output", "target": "output",
      "args": [[{"node": "nope"}]], "kwargs": {}}])"))
                .find("node output reads 'nope', which is not a node"),
            std::string::npos);
  // Forward reference (not topologically sorted).
  EXPECT_NE(
      error_of(
          doc(R"([{"name": "y", "op": "call_function", "target": "aten.neg.default", "args": [{"node": "x"}]},)" +
              std::string(kPlaceholder) + "," + out + "]"))
          .find("defined only after it"),
      std::string::npos);
  // A name used twice.
  EXPECT_NE(error_of(doc(std::string("[") + kPlaceholder + "," + kPlaceholder + "," + out + "]"))
                .find("'x' is used twice"),
            std::string::npos);
  // Missing output, output not last.
  EXPECT_NE(error_of(doc(std::string("[") + kPlaceholder + "]")).find("no output node"),
            std::string::npos);
  EXPECT_NE(error_of(doc("[" + out + "," + kPlaceholder + "]")).find("must be last"),
            std::string::npos);
  // Wrong argument kinds.
  EXPECT_NE(error_of(doc(std::string("[") + kPlaceholder +
                         R"(, {"name": "y", "op": "call_function", "target": "t",
      "args": {"a": 1}}, )" +
                         out + "]"))
                .find("node y: 'args' must be a list"),
            std::string::npos);
  EXPECT_NE(error_of(doc(std::string("[") + kPlaceholder +
                         R"(, {"name": "y", "op": "call_function", "target": "t",
      "args": [{"node": 3}]}, )" +
                         out + "]"))
                .find("node y, args[0]"),
            std::string::npos);
  EXPECT_NE(error_of(doc(std::string("[") + kPlaceholder +
                         R"(, {"name": "y", "op": "call_method", "target": "t"}, )" + out + "]"))
                .find("node y: op 'call_method' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(doc(std::string("[") + kPlaceholder +
                         R"(, {"name": "y", "op": "call_function", "target": "t",
      "val": {"shape": [2], "stride": [1, 1], "dtype": "float32"}}, )" +
                         out + "]"))
                .find("node y, val"),
            std::string::npos);
  // Document-level defects.
  EXPECT_NE(error_of("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": "other"})").find("'format'"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": "fx-graph-json", "version": 2})").find("'version'"),
            std::string::npos);
}

// Random mutations of a real graph and random bytes: the reader either accepts the input or
// throws asynctp::Error; nothing else escapes and nothing crashes (CI also runs this under ASan).
TEST(JsonIo, FuzzedInputNeverCrashes) {
  std::ifstream in(test_graph("sp_mlp.fwd.pre.json"));
  const std::string base((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(base.empty());
  std::mt19937_64 rng(1234);
  const std::string alphabet = "{}[]\":,0123456789-.eE nulltruefalsenodedtypeargsvalshape";
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t pos = rng() % text.size();
      switch (rng() % 4) {
        case 0:
          text[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          text.erase(pos, 1 + rng() % 16);
          break;
        case 2:
          text.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
        case 3: {  // duplicate a slice (repeated names, nested lists)
          const size_t len = std::min<size_t>(1 + rng() % 200, text.size() - pos);
          text.insert(rng() % text.size(), text.substr(pos, len));
          break;
        }
      }
    }
    if (i % 10 == 0) {  // random bytes
      text.resize(rng() % 512);
      for (char& c : text)
        c = static_cast<char>(rng() & 0xFF);
    }
    try {
      parse_graph(text, "fuzz");
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << i << ": non-asynctp exception: " << e.what();
    }
  }
  EXPECT_GT(rejected, 0);
  std::string deep(100000, '[');
  EXPECT_THROW(parse_graph(deep), Error);
  EXPECT_THROW(parse_graph(doc(std::string(5000, '[') + std::string(5000, ']'))), Error);
}

}  // namespace
}  // namespace asynctp::graph
