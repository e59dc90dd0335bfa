#include "ops/call_memo.h"

namespace asynctp::detail {

void CallMemos::start(const char* op) {
  key_.clear();
  key_.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(op)));
}

void CallMemos::add(const Tensor& t) {
  if (!t.defined()) {
    key_.push_back(-1);
    return;
  }
  // dtype, device, rank and the data's offset from a 16-byte boundary in one word, then the shape
  // and the strides.
  key_.push_back(static_cast<int64_t>(t.dtype()) | static_cast<int64_t>(t.device().kind) << 8 |
                 static_cast<int64_t>(t.device().index) << 16 | int64_t{t.dim()} << 32 |
                 offset_from_16_bytes(t) << 40);
  for (int d = 0; d < t.dim(); ++d) {
    key_.push_back(t.size(d));
    key_.push_back(t.stride(d));
  }
}

void CallMemos::add(std::span<const Tensor> ts) {
  key_.push_back(static_cast<int64_t>(ts.size()));
  for (const Tensor& t : ts)
    add(t);
}

const CallMemo* CallMemos::find() const {
  auto it = memos_.find(key_);
  return it == memos_.end() ? nullptr : &it->second;
}

void CallMemos::remember(const CallMemo& memo) {
  if (memos_.size() >= kMaxMemos) memos_.clear();
  memos_.insert_or_assign(key_, memo);
}

size_t CallMemos::Hash::operator()(const std::vector<int64_t>& key) const {
  // FNV-1a over the words, each mixed whole (shapes and strides differ in few bits).
  uint64_t h = 1469598103934665603ull;
  for (const int64_t word : key) {
    h ^= static_cast<uint64_t>(word) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  }
  return static_cast<size_t>(h);
}

}  // namespace asynctp::detail
