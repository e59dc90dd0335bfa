#include "symm/symm_communicator.h"

#include <vector>

namespace asynctp {

namespace {

// Channel 0 carries the barriers of every op (see NOTE [signal pads and channels]).
constexpr int kChannel = 0;

class SymmCommunicator final : public Communicator {
 public:
  SymmCommunicator(Backend& backend, SymmWorkspace& workspace, int rank, int world_size)
      : backend_(backend), workspace_(workspace), rank_(rank), world_size_(world_size) {}

  std::string_view name() const override { return "symm"; }

  void all_gather(const Tensor& out, const Tensor& in, Stream& stream) override {
    validate_all_gather(out, in, world_size_);
    const Tensor src = in.flatten();
    const Tensor dst = out.flatten();
    const int64_t n = src.numel();
    for_each_piece(n, 1, [&](int64_t start, int64_t len) {
      SymmetricMemory& sm = workspace_.get(len * in.element_size(), stream);
      backend_.copy(sm.buffer(rank_, {len}, in.dtype()), src.narrow(0, start, len), stream);
      sm.barrier(kChannel, stream);
      for (int i = 0; i < world_size_; ++i) {
        const int peer = (rank_ + i) % world_size_;
        backend_.copy(dst.narrow(0, peer * n + start, len), sm.buffer(peer, {len}, in.dtype()),
                      stream);
      }
      sm.barrier(kChannel, stream);
    });
  }

  void reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, Stream& stream) override {
    validate_reduce_scatter(out, in, world_size_);
    const Tensor src = in.flatten();
    const Tensor dst = out.flatten();
    const int64_t n = dst.numel();
    const size_t esize = in.element_size();
    for_each_piece(n, world_size_, [&](int64_t start, int64_t len) {
      SymmetricMemory& sm = workspace_.get(world_size_ * len * esize, stream);
      // Slot d of my buffer holds my contribution to rank d's piece.
      for (int d = 0; d < world_size_; ++d) {
        backend_.copy(sm.buffer(rank_, {len}, in.dtype(), d * len * esize),
                      src.narrow(0, d * n + start, len), stream);
      }
      sm.barrier(kChannel, stream);
      std::vector<Tensor> parts;
      for (int peer = 0; peer < world_size_; ++peer) {
        parts.push_back(sm.buffer(peer, {len}, in.dtype(), rank_ * len * esize));
      }
      backend_.reduce(dst.narrow(0, start, len), parts, op, stream);
      sm.barrier(kChannel, stream);
    });
  }

  void all_reduce(const Tensor& inout, ReduceOp op, Stream& stream) override {
    ASYNCTP_CHECK(inout.is_contiguous(), "all_reduce: tensor {} must be contiguous",
                  inout.describe());
    const Tensor flat = inout.flatten();
    for_each_piece(flat.numel(), 1, [&](int64_t start, int64_t len) {
      SymmetricMemory& sm = workspace_.get(len * inout.element_size(), stream);
      backend_.copy(sm.buffer(rank_, {len}, inout.dtype()), flat.narrow(0, start, len), stream);
      sm.barrier(kChannel, stream);
      std::vector<Tensor> parts;
      for (int peer = 0; peer < world_size_; ++peer)
        parts.push_back(sm.buffer(peer, {len}, inout.dtype()));
      backend_.reduce(flat.narrow(0, start, len), parts, op, stream);
      sm.barrier(kChannel, stream);
    });
  }

 private:
  // Splits n elements into pieces whose staging (slots * piece elements) fits the workspace.
  template <typename Fn>
  void for_each_piece(int64_t n, int slots, Fn&& fn) {
    ASYNCTP_CHECK(workspace_.unavailable_reason().empty(), "symmetric-memory collectives: {}",
                  workspace_.unavailable_reason());
    const int64_t max_elems = static_cast<int64_t>(workspace_.max_bytes() / (slots * 4));
    ASYNCTP_CHECK(max_elems > 0, "the symmetric workspace limit {} is too small",
                  workspace_.max_bytes());
    if (n == 0) return;
    for (int64_t start = 0; start < n; start += max_elems)
      fn(start, std::min(max_elems, n - start));
  }

  Backend& backend_;
  SymmWorkspace& workspace_;
  int rank_;
  int world_size_;
};

}  // namespace

std::unique_ptr<Communicator> make_symm_communicator(Backend& backend, SymmWorkspace& workspace,
                                                     int rank, int world_size) {
  return std::make_unique<SymmCommunicator>(backend, workspace, rank, world_size);
}

}  // namespace asynctp
