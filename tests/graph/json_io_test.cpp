// fx-graph-json: round trips of real graphs, every kind of malformed input giving an error that
// names the node, and a fuzz test (mutated samples and random bytes never crash the reader).
#include <time.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "core/error.h"
#include "graph/json_io.h"
#include "graph/large_graph.h"

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

std::string nested_list(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// A node `y` whose fields are `fields` (JSON text without braces), between a placeholder and the
// output.
std::string doc_with_node(const std::string& fields) {
  return doc(std::string("[") + kPlaceholder +
             R"(, {"name": "y", "op": "call_function", "target": "t", )" + fields +
             R"(}, {"name": "output", "op": "output", "target": "output",
                    "args": [[{"node": "x"}]], "kwargs": {}}])");
}

// The time bound of the loading tests (thread CPU time): 1 s in an optimized build. ASan and UBSan
// at -O1, or a build without optimization, are several times slower; a quadratic reader still takes
// over ten times the bound there.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr double kLoadBoundS = 8.0;
#else
constexpr double kLoadBoundS = 1.0;
#endif

// The calling thread's CPU time, in seconds: what the loading bounds are on. Other processes'
// load (ctest -j on two cores, beside other jobs) stretches the wall time of a load several times
// over, but not this.
double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The shapes that overflowed the stack (issue 28: found by a mutation fuzzer), each 100,000
// levels deep: a deep list in an object printed by an error message, a deep value under a field
// the reader ignores (the document's and a node's), deep {"dict": ...} chains, a deep val.shape.
// Each is refused before parsing, naming its depth and the limit. tests/fuzz/corpus/graph_reader
// holds the same shapes for the fuzz target.
TEST(JsonIo, DeepNestingIsANamedErrorNotACrash) {
  constexpr size_t kDeep = 100000;
  std::string dicts;
  for (size_t i = 0; i < kDeep / 2; ++i)
    dicts += R"({"dict": {"k": )";
  dicts += "1";
  for (size_t i = 0; i < kDeep / 2; ++i)
    dicts += "}}";
  const std::string shapes[] = {
      doc_with_node(R"("args": [{"a": 1, "b": )" + nested_list(kDeep) + "}]"),
      doc_with_node(R"("args": [], "ignored": )" + nested_list(kDeep)),
      R"({"format": "fx-graph-json", "ignored": )" + nested_list(kDeep) + "}",
      doc_with_node(R"("args": [)" + dicts + "]"),
      doc(R"([{"name": "x", "op": "placeholder", "target": "x", "val": {"shape": )" +
          nested_list(kDeep) + R"(, "stride": [1], "dtype": "float32"}}])"),
      std::string(kDeep, '['),
      std::string(kDeep, '{'),
  };
  for (const std::string& text : shapes) {
    const std::string e = error_of(text);
    EXPECT_NE(e.find(fmt::format("at most {} levels", kMaxJsonNesting)), std::string::npos) << e;
    EXPECT_NE(e.find("nested 10000"), std::string::npos) << e;
    EXPECT_NE(e.find(", column "), std::string::npos) << e;
    EXPECT_LT(e.size(), 400u) << e;
  }
}

TEST(JsonIo, NestingUpToTheLimitIsRead) {
  // The document and the node's object take 3 levels: a field the reader ignores may nest the
  // rest. One level more is refused.
  const size_t inner = kMaxJsonNesting - 3;
  EXPECT_EQ(error_of(doc_with_node(R"("args": [], "ignored": )" + nested_list(inner))), "");
  EXPECT_NE(error_of(doc_with_node(R"("args": [], "ignored": )" + nested_list(inner + 1)))
                .find(fmt::format("nested {} deep", kMaxJsonNesting + 1)),
            std::string::npos);
  // Brackets inside strings are text, not nesting.
  EXPECT_EQ(error_of(doc_with_node(R"("args": ["\"[[[)" + std::string(1000, '[') + R"("])")), "");
}

TEST(JsonIo, InvalidJsonNamesLineColumnAndByte) {
  const std::string e = error_of("{\"format\": [1, 2,\n  tru]}");
  EXPECT_NE(e.find("t.json: not valid JSON at line 2, column 6 (byte 23)"), std::string::npos) << e;
  EXPECT_NE(e.find("invalid literal"), std::string::npos) << e;
  // Number overflow, which nlohmann's own DOM parser reports without a position.
  const std::string overflow = error_of(R"({"format": 1e400})");
  EXPECT_NE(overflow.find("not valid JSON at line 1, column 16 (byte 15)"), std::string::npos)
      << overflow;
  EXPECT_NE(overflow.find("number overflow"), std::string::npos) << overflow;
  EXPECT_NE(error_of("").find("not valid JSON at line 1, column 1 (byte 0)"), std::string::npos);
}

// Messages show bounded excerpts: a huge value (long string, large list or object) is described,
// not printed.
TEST(JsonIo, ErrorMessagesShowBoundedExcerpts) {
  const std::string big_string(100000, 'a');
  std::string big_object = R"({"a": 1)";
  for (int i = 0; i < 10000; ++i)
    big_object += fmt::format(R"(, "k{}": [1, 2, 3])", i);
  big_object += "}";
  std::string big_list = "[0";
  for (int i = 0; i < 10000; ++i)
    big_list += ", {\"x\": 1}";
  big_list += "]";
  const std::string cases[] = {
      doc_with_node(R"("args": [)" + big_object + "]"),
      doc_with_node(R"("args": [{"node": )" + big_list + "}]"),
      doc_with_node(R"("args": [{")" + big_string + R"(": 1}])"),
      doc_with_node(R"("op": ")" + big_string + R"(")"),
      doc_with_node(R"("args": [{"dict": ")" + big_string + R"("}])"),
      doc(R"([{"name": ")" + big_string +
          R"(", "op": "placeholder", "target": "x", "args": [1]}])"),
      doc(R"([{"name": "x", "op": "placeholder", "target": "x", "val": {"shape": [")" + big_string +
          R"("], "stride": [1], "dtype": "float32"}}])"),
  };
  for (const std::string& text : cases) {
    const std::string e = error_of(text);
    EXPECT_FALSE(e.empty());
    EXPECT_LT(e.size(), 400u) << e.substr(0, 600);
  }
  EXPECT_NE(error_of(cases[0]).find(R"(an object of 10001 keys ("a", "k0", "k1", ...))"),
            std::string::npos);
  EXPECT_NE(error_of(cases[1]).find("a list of 10001"), std::string::npos);
}

TEST(JsonIo, IntegersAboveInt64AreRefused) {
  const std::string e = error_of(doc_with_node(R"("args": [9223372036854775808])"));
  EXPECT_NE(e.find("node y, args[0]: integer 9223372036854775808 is out of range"),
            std::string::npos)
      << e;
  const Graph g =
      parse_graph(doc_with_node(R"("args": [9223372036854775807, -9223372036854775808])"));
  EXPECT_EQ(g.nodes()[1].args[0].i, INT64_MAX);
  EXPECT_EQ(g.nodes()[1].args[1].i, INT64_MIN);
}

// Objects with many keys load in linear time too (ordered_json's own lookup walks the object:
// 0.9 s for 40,000 keys, minutes for 400,000), keep document order, and a repeated key keeps its
// last value, as nlohmann's parser does, before and after the reader indexes an object's keys.
TEST(JsonIo, ObjectsWithManyKeysLoadInLinearTime) {
  for (const int keys : {10, 100}) {
    std::string kwargs;
    for (int i = 0; i < keys; ++i)
      kwargs += fmt::format(R"({}"k{}": {})", i == 0 ? "" : ", ", i, i);
    kwargs += R"(, "k5": -5)";
    const Graph g = parse_graph(doc_with_node(R"("args": [], "kwargs": {)" + kwargs + "}"));
    const Node& y = g.nodes()[1];
    ASSERT_EQ(y.kwargs.size(), static_cast<size_t>(keys)) << keys;
    EXPECT_EQ(y.kwargs[5].first, "k5");
    EXPECT_EQ(y.kwargs[5].second.i, -5) << keys;
    EXPECT_EQ(y.kwargs.back().first, fmt::format("k{}", keys - 1));
  }
  std::string many = "{";
  for (int i = 0; i < 400000; ++i)
    many += fmt::format(R"({}"k{}": 1)", i == 0 ? "" : ", ", i);
  many += "}";
  const std::string text = doc_with_node(R"("args": [], "ignored": )" + many);
  const double start = thread_cpu_seconds();
  EXPECT_EQ(error_of(text), "");
  const double seconds = thread_cpu_seconds() - start;
  EXPECT_LT(seconds, kLoadBoundS);
}

// Loading is linear in the number of nodes: 20,000 nodes (a whole model's post-grad graph) in
// well under a second. A reader whose appends drop the name index rebuilds it for every node's
// duplicate check, which is quadratic: 2.4 s for 10,000 nodes, 12 s for 20,000.
TEST(JsonIo, LargeGraphLoadsInLinearTime) {
  const std::string text = testing::large_graph_json(20000);
  const double start = thread_cpu_seconds();
  const Graph g = parse_graph(text, "large");
  const double seconds = thread_cpu_seconds() - start;
  EXPECT_GE(g.size(), 19990u);
  EXPECT_LE(g.size(), 20000u);
  EXPECT_EQ(g.output().args[0].list[0].s, g.nodes()[g.size() - 2].name);
  EXPECT_LT(seconds, kLoadBoundS) << g.size() << " nodes";
}

}  // namespace
}  // namespace asynctp::graph
