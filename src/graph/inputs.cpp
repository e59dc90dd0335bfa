#include "graph/inputs.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/random.h"

namespace asynctp::graph {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s)
    h = (h ^ ch) * 1099511628211ull;
  return h;
}

// The recorded tensor metadata of a placeholder, or nullptr for a non-tensor one.
const TensorMeta* placeholder_meta(const Node& node) {
  if (node.op != OpKind::kPlaceholder || !node.val.is_tensor()) return nullptr;
  return &node.val.tensor;
}

DType supported_dtype(const Node& node, const TensorMeta& meta) {
  auto dtype = dtype_from_torch(meta.dtype);
  ASYNCTP_CHECK(dtype.has_value(), "placeholder {}: dtype {} is not supported by the executor",
                node.name, meta.dtype);
  return *dtype;
}

}  // namespace

Inputs random_inputs(const Graph& graph, int rank, uint64_t seed) {
  Inputs inputs;
  for (const Node& node : graph.nodes()) {
    const TensorMeta* meta = placeholder_meta(node);
    if (meta == nullptr) continue;
    const DType dtype = supported_dtype(node, *meta);
    HostTensor t = host_empty(meta->shape, dtype, meta->stride);
    uint64_t state =
        seed * 0x2545F4914F6CDD1Dull ^ fnv1a(node.name) ^ (static_cast<uint64_t>(rank) << 48);
    std::vector<float> values(static_cast<size_t>(t.t.numel()));
    for (float& v : values) {
      const double u = uniform01(state);
      // Integers (RNG seeds and offsets, positions) in [0, 1024); bool: true or false.
      v = dtype == DType::kBool       ? (u < 0.5 ? 1.0f : 0.0f)
          : !is_floating_point(dtype) ? std::floor(static_cast<float>(1024.0 * u))
                                      : static_cast<float>(2.0 * u - 1.0);
    }
    store_f32(t.t, values);  // rounds to bf16/f16/float8 as the dtype requires
    inputs.emplace(node.name, t);
  }
  return inputs;
}

HostTensor read_raw(const std::string& path, const Dims& shape, DType dtype) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  ASYNCTP_CHECK(in.good(), "cannot open tensor file '{}'", path);
  const auto size = static_cast<size_t>(in.tellg());
  HostTensor t = host_empty(shape, dtype);
  ASYNCTP_CHECK(size == t.t.nbytes(), "tensor file '{}' holds {} bytes but {}{} needs {}", path,
                size, dtype, shape, t.t.nbytes());
  in.seekg(0);
  in.read(static_cast<char*>(t.t.data()), static_cast<std::streamsize>(size));
  ASYNCTP_CHECK(in.good() || size == 0, "reading tensor file '{}' failed", path);
  return t;
}

void write_raw(const std::string& path, const Tensor& t) {
  HostTensor c = host_contiguous(HostTensor{nullptr, t});
  std::ofstream out(path, std::ios::binary);
  ASYNCTP_CHECK(out.good(), "cannot write tensor file '{}'", path);
  out.write(static_cast<const char*>(c.t.data()), static_cast<std::streamsize>(c.t.nbytes()));
  ASYNCTP_CHECK(out.good(), "writing tensor file '{}' failed", path);
}

Inputs read_inputs(const Graph& graph, int rank, const std::string& dir) {
  Inputs inputs;
  for (const Node& node : graph.nodes()) {
    const TensorMeta* meta = placeholder_meta(node);
    if (meta == nullptr) continue;
    const DType dtype = supported_dtype(node, *meta);
    std::string path = fmt::format("{}/{}.rank{}.bin", dir, node.name, rank);
    if (!std::filesystem::exists(path)) path = fmt::format("{}/{}.bin", dir, node.name);
    ASYNCTP_CHECK(std::filesystem::exists(path),
                  "placeholder {}: neither {}/{}.rank{}.bin nor {} "
                  "exists",
                  node.name, dir, node.name, rank, path);
    HostTensor t = read_raw(path, meta->shape, dtype);
    // Lay it out as recorded (a transposed weight stays transposed).
    HostTensor laid = host_empty(meta->shape, dtype, meta->stride);
    copy_elements(laid.t, t.t);
    inputs.emplace(node.name, laid);
  }
  return inputs;
}

void write_outputs(const std::vector<RtValue>& outputs, int rank, const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].is_tensor()) continue;
    const Tensor& t = outputs[i].tensor.t;
    const std::string stem = fmt::format("{}/output{}.rank{}", dir, i, rank);
    write_raw(stem + ".bin", t);
    nlohmann::json meta = {{"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())},
                           {"dtype", std::string(torch_dtype_name(t.dtype()))}};
    std::ofstream(stem + ".json") << meta.dump() << "\n";
  }
}

}  // namespace asynctp::graph
