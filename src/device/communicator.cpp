#include "device/communicator.h"

#include <cstring>

#include <asynctp/group.h>

namespace asynctp {

void validate_all_gather(const Tensor& out, const Tensor& in, int world_size) {
  ASYNCTP_CHECK(in.defined() && out.defined(), "all_gather: input and output must be given");
  ASYNCTP_CHECK(in.is_contiguous() && out.is_contiguous(),
                "all_gather: input {} and output {} must be contiguous", in.describe(),
                out.describe());
  ASYNCTP_CHECK(in.dtype() == out.dtype(), "all_gather: input is {} but output is {}", in.dtype(),
                out.dtype());
  ASYNCTP_CHECK(in.dim() >= 1 && out.dim() == in.dim(),
                "all_gather: input {} and output {} must "
                "have the same rank (>= 1)",
                in.describe(), out.describe());
  Dims expected = in.shape();
  expected[0] *= world_size;
  ASYNCTP_CHECK(out.shape() == expected,
                "all_gather: output must be {} for input {} on {} ranks, got {}", expected,
                in.describe(), world_size, out.describe());
}

void validate_reduce_scatter(const Tensor& out, const Tensor& in, int world_size) {
  ASYNCTP_CHECK(in.defined() && out.defined(), "reduce_scatter: input and output must be given");
  ASYNCTP_CHECK(in.is_contiguous() && out.is_contiguous(),
                "reduce_scatter: input {} and output {} must be contiguous", in.describe(),
                out.describe());
  ASYNCTP_CHECK(in.dtype() == out.dtype(), "reduce_scatter: input is {} but output is {}",
                in.dtype(), out.dtype());
  ASYNCTP_CHECK(in.dim() >= 1 && out.dim() == in.dim(),
                "reduce_scatter: input {} and output {} must have the same rank (>= 1)",
                in.describe(), out.describe());
  ASYNCTP_CHECK(in.size(0) % world_size == 0,
                "reduce_scatter: input dim 0 ({}) is not divisible by the world size {}",
                in.size(0), world_size);
  Dims expected = in.shape();
  expected[0] /= world_size;
  ASYNCTP_CHECK(out.shape() == expected, "reduce_scatter: output must be {} for input {}, got {}",
                expected, in.describe(), out.describe());
}

namespace {

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data()), t.nbytes());
}

class StoreCommunicator final : public Communicator {
 public:
  StoreCommunicator(Backend& backend, Group& group) : backend_(backend), group_(group) {
    ASYNCTP_CHECK(backend.device().is_cpu(), "the store communicator needs host memory, not {}",
                  backend.device().to_string());
  }
  std::string_view name() const override { return "store"; }

  void all_gather(const Tensor& out, const Tensor& in, Stream& stream) override {
    validate_all_gather(out, in, group_.world_size());
    const std::string key = group_.next_key("coll/all_gather");
    const int rank = group_.rank();
    // The host reads `in` and writes `out`: after the work enqueued before on the stream.
    stream.synchronize();
    group_.store().set(fmt::format("{}/{}", key, rank), bytes_of(in));
    const auto chunks = out.chunk(group_.world_size(), 0);
    for (int r = 0; r < group_.world_size(); ++r) {
      const std::string data = group_.store().get(fmt::format("{}/{}", key, r));
      ASYNCTP_CHECK(data.size() == chunks[r].nbytes(),
                    "all_gather: rank {} sent {} bytes, expected {}", r, data.size(),
                    chunks[r].nbytes());
      std::memcpy(chunks[r].data(), data.data(), data.size());
    }
    finish(key);
  }

  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, Stream& stream) override {
    validate_reduce_scatter(out, in, group_.world_size());
    const std::string key = group_.next_key("coll/reduce_scatter");
    const int rank = group_.rank();
    const int ws = group_.world_size();
    const auto chunks = in.chunk(ws, 0);
    stream.synchronize();  // the host reads `in`
    for (int dst = 0; dst < ws; ++dst) {
      group_.store().set(fmt::format("{}/{}/{}", key, rank, dst), bytes_of(chunks[dst]));
    }
    reduce_from(
        key, [&](int src) { return fmt::format("{}/{}/{}", key, src, rank); }, out, op, stream);
    for (int dst = 0; dst < ws; ++dst)
      group_.store().erase(fmt::format("{}/{}/{}", key, rank, dst));
  }

  void all_reduce(const Tensor& inout, ReduceOp op, Stream& stream) override {
    ASYNCTP_CHECK(inout.is_contiguous(), "all_reduce: tensor {} must be contiguous",
                  inout.describe());
    const std::string key = group_.next_key("coll/all_reduce");
    stream.synchronize();  // the host reads `inout`
    group_.store().set(fmt::format("{}/{}", key, group_.rank()), bytes_of(inout));
    reduce_from(
        key, [&](int src) { return fmt::format("{}/{}", key, src); }, inout, op, stream);
    group_.store().erase(fmt::format("{}/{}", key, group_.rank()));
  }

 private:
  // out = op over ranks (in rank order) of the tensor each rank stored under key_of(rank).
  template <typename KeyOf>
  void reduce_from(const std::string& key, KeyOf key_of, const Tensor& out, ReduceOp op,
                   Stream& stream) {
    std::vector<std::string> data;
    std::vector<Tensor> inputs;
    data.reserve(group_.world_size());
    for (int src = 0; src < group_.world_size(); ++src) {
      data.push_back(group_.store().get(key_of(src)));
      ASYNCTP_CHECK(data.back().size() == out.nbytes(),
                    "reduce: rank {} sent {} bytes, expected {}", src, data.back().size(),
                    out.nbytes());
      inputs.push_back(out.with_data(data.back().data()));
    }
    backend_.reduce(out, inputs, op, stream);
    stream.synchronize();  // the reduction reads `data`, which goes with this call
    group_.barrier(key + "/read");
  }

  void finish(const std::string& key) {
    group_.barrier(key + "/read");
    group_.store().erase(fmt::format("{}/{}", key, group_.rank()));
  }

  Backend& backend_;
  Group& group_;
};

}  // namespace

std::unique_ptr<Communicator> make_store_communicator(Backend& backend, Group& group) {
  return std::make_unique<StoreCommunicator>(backend, group);
}

}  // namespace asynctp
