#include "device/cpu_native_gemm.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "core/deadline.h"
#include "core/error.h"
#include "device/backend.h"
#include "device/cpu_futex.h"
#include "device/cpu_loops.h"
#include "device/cpu_streams.h"
#include "kernels/activation.h"
#include "kernels/native/schedule.h"

namespace asynctp::cpu {

namespace {

using kernels::kBM;
using kernels::kBN;

// The launch as one CTA runs it: the resolved params, the plan on a grid of one, the walk.
struct Schedule {
  kernels::NativeGemmParams p;
  kernels::NativeGemmPlan plan;
  kernels::Walk walk;

  explicit Schedule(const kernels::NativeGemmParams& params)
      : p(kernels::resolved(params)), plan(kernels::plan_of(p, 1, 1)) {
    walk = kernels::walk_of(p, static_cast<int>(kernels::tile_height(p)), plan.group_m);
  }
  kernels::Unit unit(int u) const {
    return kernels::unit_at(u, plan, walk.num_tiles, walk.k_blocks);
  }
  // The first rows of the CTAs that compute the tile at m0: m0, and m0 + kBM for a cluster of
  // two (each CTA of a pair takes 128 rows of the 256-row tile, waits for its own rows' pieces
  // and reads the own chunk's rows in place where its 128 rows lie inside it).
  template <typename Fn>
  void for_each_cta(int64_t m0, Fn&& fn) const {
    const int ctas = kernels::uses_cluster(p) ? 2 : 1;
    for (int cta = 0; cta < ctas; ++cta)
      fn(m0 + int64_t{kBM} * cta);
  }
  int num_units() const { return kernels::num_units(plan, walk.num_tiles); }
  // Whether unit w at row m0 waits for the ready flags / ends in the reduce-scatter epilogue.
  bool waits_ready(int64_t m0) const { return p.ready != nullptr && !kernels::reads_own(p, m0); }
  bool sums(const kernels::Unit& w, int64_t m0) const { return kernels::sums_tile(p, plan, w, m0); }
};

// Calls fn(piece, first row, end row) for every ready piece that rows [m0, m0 + kBM) of A
// overlap, in row order (as the kernel's producer waits for them).
template <typename Fn>
void for_each_ready_piece(const kernels::NativeGemmParams& p, int64_t m0, Fn&& fn) {
  const int64_t end = std::min(p.m, m0 + kBM);
  for (int64_t row = m0; row < end;) {
    const kernels::ReadyPiece r = kernels::ready_piece_at(p, row);
    fn(r, row, std::min(r.end, end));
    row = r.end;
  }
}

// Calls fn(flag, peer, channel) for every peer's sum flag of the tile at (m0, n0), in rank order.
template <typename Fn>
void for_each_sum_flag(const Schedule& s, int64_t m0, int n0, Fn&& fn) {
  const kernels::NativeGemmParams& p = s.p;
  const int64_t q = kernels::sum_piece(p, s.plan, kernels::sum_row_of(p, m0), n0);
  for (int peer = 0; peer < p.sum_count; ++peer) {
    if (peer == p.sum_self) continue;
    fn(p.sum_flags + q * p.sum_flag_stride + peer, peer, p.sum_channel + static_cast<int>(q));
  }
}

// A wait's bound (timeout_ns, from when it starts).
Deadline wait_deadline(const kernels::NativeGemmParams& p) {
  return Deadline(Millis(std::max<int64_t>(1, static_cast<int64_t>(p.timeout_ns / 1'000'000))));
}

// Waits until *flag is up for op `value`; false on timeout.
bool wait_raised(const kernels::NativeGemmParams& p, const uint32_t* flag, uint32_t value) {
  return wait_word(
      flag, [value](uint32_t v) { return flag_raised(v, value); }, wait_deadline(p));
}

// The rows a dropped wait guarded, read as the GEMM starts (see native_gemm_waits).
struct EarlyReads {
  std::optional<NativeWait> wait;
  std::map<int64_t, std::vector<float>> a_rows;     // kReady: row of A -> its k values
  std::map<int64_t, float> a_scales;                // kReady, float8: row of A -> its scale
  std::map<int64_t, std::vector<float>> part_rows;  // kSum: sum row -> the peer's part row
};

class Run {
 public:
  Run(const kernels::NativeGemmParams& params, NativeGemmFaults* faults)
      : s_(params),
        p_(s_.p),
        b_cols_(kernels::b_cols(p_)),
        a_row_(p_.k),
        acc_(kBN),
        part_row_(kBN),
        faults_(faults) {
    // B as f32, [k, b_cols] (row kk: B's row kk, or column kk of a k-major B).
    b_.resize(static_cast<size_t>(p_.k * b_cols_));
    for (int64_t kk = 0; kk < p_.k; ++kk) {
      load_row(p_.in_dtype, p_.b, p_.b_k_major ? kk : kk * p_.ldb, p_.b_k_major ? p_.ldb : 1,
               b_cols_, b_.data() + kk * b_cols_);
    }
    if (faults_ != nullptr && faults_->drop >= 0)
      read_early(native_gemm_waits(params).at(static_cast<size_t>(faults_->drop)));
  }

  void run() {
    for (int u = 0; u < s_.num_units(); ++u) {
      const kernels::Unit w = s_.unit(u);
      const kernels::Tile tile = s_.walk.tile(w.t);
      s_.for_each_cta(tile.m0, [&](int64_t m0) {
        produce(w.t, m0);
        const bool sums = s_.sums(w, m0);
        if (sums) wait_sum_parts(w.t, m0, tile.n0);
        for (int half = 0; half < 2; ++half)
          consume(m0, tile.n0, m0 + 64 * half, sums);
      });
    }
    if (!timeout_.empty()) ASYNCTP_TIMEOUT("{}", timeout_);
    if (!stale_.empty()) ASYNCTP_FAIL("{}", stale_);
  }

 private:
  bool dropped(NativeWait::Kind kind, const uint32_t* flag, int t) const {
    return early_.wait && early_.wait->kind == kind && early_.wait->flag == flag &&
           early_.wait->tile == t;
  }

  // The producer's waits for the rows of A the tile reads.
  void produce(int t, int64_t m0) {
    if (!waiting_ || !s_.waits_ready(m0)) return;
    for_each_ready_piece(p_, m0, [&](const kernels::ReadyPiece& r, int64_t, int64_t) {
      const uint32_t* flag = p_.ready + kernels::ready_index(p_, r);
      if (!waiting_ || dropped(NativeWait::Kind::kReady, flag, t)) return;
      if (wait_raised(p_, flag, p_.ready_value)) return;
      waiting_ = false;
      timeout_ = fmt::format(
          "rank {}: the native GEMM waited {} on cpu for chunk {} of A (piece {}) to land (the "
          "copy of rank {}'s shard never completed: is that peer alive and in the same op?)",
          p_.rank, wait_deadline(p_).describe(), r.chunk, r.piece, r.chunk);
    });
  }

  // The epilogue's waits for the peers' parts of the tile.
  void wait_sum_parts(int t, int64_t m0, int n0) {
    for_each_sum_flag(s_, m0, n0, [&](const uint32_t* flag, int peer, int channel) {
      if (!sum_waiting_ || dropped(NativeWait::Kind::kSum, flag, t)) return;
      if (wait_raised(p_, flag, p_.sum_value)) return;
      sum_waiting_ = false;
      timeout_ = fmt::format(
          "rank {}: the reduction on cpu waited {} for the partial of rank {} on channel {} (is "
          "that peer alive and in the same op?)",
          p_.rank, wait_deadline(p_).describe(), peer, channel);
    });
  }

  // One consumer: the 64 rows from r0 of the tile at (m0, n0), then its epilogue.
  void consume(int64_t m0, int n0, int64_t r0, bool sums) {
    const int64_t width = std::min<int64_t>(p_.n, n0 + s_.walk.width) - n0;
    uint32_t* counter = !sums && p_.done != nullptr && r0 < p_.m
                            ? p_.done + kernels::done_index(p_, s_.plan, r0, n0)
                            : nullptr;
    if (counter != nullptr && faults_ != nullptr) {
      const uint32_t* expected = counter;
      if (faults_->held.compare_exchange_strong(expected, nullptr))
        std::this_thread::sleep_for(kFaultStall);
    }
    const bool own = kernels::reads_own(p_, m0);
    for (int64_t r = r0; r < std::min(r0 + 64, p_.m); ++r) {
      std::fill(acc_.begin(), acc_.end(), 0.0f);
      load_a_row(r, own);
      if (p_.a_out != nullptr && n0 == 0)  // the copy of A: by the first column's tiles
        store_row(p_.in_dtype, p_.a_out, r * p_.a_out_ld, 1, p_.k, a_row_.data());
      if (p_.swiglu) {
        swiglu_row(r, n0, width);
        continue;
      }
      accumulate_row(a_row_.data(), p_.k, b_.data() + n0, b_cols_, width, acc_.data());
      scale_row(r, n0, width);
      if (sums) {
        add_parts(kernels::sum_row_of(p_, r), n0, width);
        store_row(p_.c_dtype, p_.sum_out, kernels::sum_row_of(p_, r) * p_.sum_ldo + n0, 1, width,
                  acc_.data());
      } else if (p_.push_chunks > 0) {  // the kernel's own pushes: into the owner's slot
        const int64_t chunk = r / p_.chunk_rows;
        store_row(p_.c_dtype, p_.push_c[chunk], (r - chunk * p_.chunk_rows) * p_.push_ld + n0, 1,
                  width, acc_.data());
      } else {
        store_row(p_.c_dtype, p_.c, r * p_.ldc + n0, 1, width, acc_.data());
      }
    }
    if (counter != nullptr) {
      // Counted once stored (release): the stream waits on it then read the rows; with the
      // kernel's own pushes, the count that completes the piece raises the owner's flag (this
      // thread made every count of this run, so it needs no acquire to see the piece's rows).
      const uint32_t before =
          std::atomic_ref<uint32_t>(*counter).fetch_add(1, std::memory_order_release);
      futex_wake(counter);
      if (p_.push_chunks > 0) raise_pushed(counter, before);
      // A counter starts every GEMM at 0 (its push resets it, and the next op's GEMM starts
      // behind that reset): a count on top of an earlier one lets the push that waits on it pass
      // before these rows are stored. On a GPU that is a race on the data; here it is an error.
      if (counted_.insert(counter).second && before != 0 && stale_.empty()) {
        stale_ = fmt::format(
            "rank {}: the native GEMM's done counter {} read {} as it started counting (the "
            "previous op's count: its reset had not landed, so the push that waits on it could "
            "pass before the rows are stored)",
            p_.rank, counter - p_.done, before);
      }
    }
  }

  // The kernel's own pushes: the count that completed piece `counter` (before + 1 reached its
  // done_count) sets it back to 0 and raises the piece's flag on the chunk's owner (epilogue.cuh,
  // publish_done).
  void raise_pushed(uint32_t* counter, uint32_t before) {
    const int64_t index = counter - p_.done;
    if (before + 1 != kernels::done_count(p_, index)) return;
    std::atomic_ref<uint32_t>(*counter).store(0, std::memory_order_relaxed);
    const int64_t per_chunk = p_.chunk_rows / p_.done_rows * s_.plan.done_col_pieces;
    const int64_t chunk = index / per_chunk;
    uint32_t* flag = p_.push_flags[chunk] + (index - chunk * per_chunk) * p_.push_flag_stride;
    std::atomic_ref<uint32_t>(*flag).store(p_.push_value, std::memory_order_release);
    futex_wake(flag);
  }

  // The SwiGLU epilogue of row r, output columns [n0, n0 + width): the gate's accumulators in
  // acc_[0, width), the up projection's in acc_[kBN / 2, ..) (as the kernel's B tile holds them),
  // each stored into pre if asked for, then silu(g) * u rounded once into C.
  void swiglu_row(int64_t r, int n0, int64_t width) {
    float* gate = acc_.data();
    float* up = acc_.data() + kBN / 2;
    accumulate_row(a_row_.data(), p_.k, b_.data() + kernels::b_col_of(p_, n0, 0), b_cols_, width,
                   gate);
    accumulate_row(a_row_.data(), p_.k, b_.data() + kernels::b_col_of(p_, n0, kBN / 2), b_cols_,
                   width, up);
    if (p_.pre != nullptr) {
      store_row(p_.pre_dtype, p_.pre, r * p_.pre_ld + n0, 1, width, gate);
      store_row(p_.pre_dtype, p_.pre, r * p_.pre_ld + p_.n + n0, 1, width, up);
    }
    for (int64_t j = 0; j < width; ++j)
      gate[j] = kernels::swiglu_f32(gate[j], up[j]);
    store_row(p_.c_dtype, p_.c, r * p_.ldc + n0, 1, width, gate);
  }

  // The scaled GEMM (float8): acc_[j] = acc_[j] * sa(r) * sb(n0 + j), left to right, as the
  // kernel's epilogue (and the CPU backend's scaled GEMM) rounds it, before the peers' parts are
  // added (params.h).
  void scale_row(int64_t r, int n0, int64_t width) {
    const float* sa = kernels::a_scale_at(p_, r);
    if (sa == nullptr && p_.b_scale == nullptr) return;
    float row_scale = sa != nullptr ? *sa : 1.0f;
    if (auto it = early_.a_scales.find(r); it != early_.a_scales.end()) row_scale = it->second;
    for (int64_t j = 0; j < width; ++j) {
      const float col_scale =
          p_.b_scale != nullptr ? p_.b_scale[(n0 + j) * p_.b_scale_stride] : 1.0f;
      acc_[j] = acc_[j] * row_scale * col_scale;
    }
  }

  // a_row_ <- row r of A: from own_a for a tile wholly inside the own chunk, else from a (or
  // what a dropped wait read of it as the GEMM started).
  void load_a_row(int64_t r, bool own) {
    if (own) {
      load_row(p_.in_dtype, p_.own_a, (r - kernels::own_first_row(p_)) * p_.own_lda, 1, p_.k,
               a_row_.data());
    } else if (auto it = early_.a_rows.find(r); it != early_.a_rows.end()) {
      std::copy(it->second.begin(), it->second.end(), a_row_.begin());
    } else {
      load_row(p_.in_dtype, p_.a, r * p_.lda, 1, p_.k, a_row_.data());
    }
  }

  // acc_ += the peers' parts of sum-chunk row `row`, columns [n0, n0 + width), in rank order,
  // then x 1/count for avg: the kernel's sum, in f32.
  void add_parts(int64_t row, int n0, int64_t width) {
    for (int peer = 0; peer < p_.sum_count; ++peer) {
      if (peer == p_.sum_self) continue;
      const float* part = part_row_.data();
      const auto early = early_.part_rows.find(row);
      if (early_.wait && early_.wait->kind == NativeWait::Kind::kSum && early_.wait->peer == peer &&
          n0 == early_n0_ && early != early_.part_rows.end()) {
        part = early->second.data();
      } else {
        load_row(p_.c_dtype, p_.sum_parts, peer * p_.sum_part_stride + row * p_.sum_ld + n0, 1,
                 width, part_row_.data());
      }
      for (int64_t j = 0; j < width; ++j)
        acc_[j] += part[j];
    }
    if (p_.sum_avg) {
      const float inv = 1.0f / static_cast<float>(p_.sum_count);
      for (int64_t j = 0; j < width; ++j)
        acc_[j] *= inv;
    }
  }

  // What the dropped wait guarded, read now (the GEMM's start).
  void read_early(const NativeWait& w) {
    early_.wait = w;
    const kernels::Tile tile = s_.walk.tile(w.tile);
    if (w.kind == NativeWait::Kind::kReady) {
      s_.for_each_cta(tile.m0, [&](int64_t m0) {
        for_each_ready_piece(p_, m0, [&](const kernels::ReadyPiece& r, int64_t first, int64_t end) {
          if (p_.ready + kernels::ready_index(p_, r) != w.flag) return;
          for (int64_t row = first; row < end; ++row) {
            std::vector<float>& v = early_.a_rows[row];
            v.resize(static_cast<size_t>(p_.k));
            load_row(p_.in_dtype, p_.a, row * p_.lda, 1, p_.k, v.data());
            // A row-wise scale lands with its rows (the op pushes it ahead of them).
            if (const float* s = kernels::a_scale_at(p_, row)) early_.a_scales[row] = *s;
          }
        });
      });
      return;
    }
    // The rows of the tile's CTAs that wait on the flag (with pairs, both CTAs' where their
    // rows lie in one piece of the sum flags).
    early_n0_ = tile.n0;
    const int64_t width = std::min<int64_t>(p_.n, tile.n0 + kBN) - tile.n0;
    s_.for_each_cta(tile.m0, [&](int64_t m0) {
      bool waits = false;
      for_each_sum_flag(s_, m0, tile.n0,
                        [&](const uint32_t* flag, int, int) { waits = waits || flag == w.flag; });
      if (!waits) return;
      for (int64_t row = kernels::sum_row_of(p_, m0); row < kernels::sum_row_of(p_, m0) + kBM;
           ++row) {
        std::vector<float>& v = early_.part_rows[row];
        v.resize(static_cast<size_t>(width));
        load_row(p_.c_dtype, p_.sum_parts, w.peer * p_.sum_part_stride + row * p_.sum_ld + tile.n0,
                 1, width, v.data());
      }
    });
  }

  Schedule s_;
  const kernels::NativeGemmParams& p_;
  int64_t b_cols_;  // B's columns: n, or 2n with the SwiGLU epilogue
  std::vector<float> b_, a_row_, acc_, part_row_;
  bool waiting_ = true, sum_waiting_ = true;
  std::string timeout_;                // the first wait that timed out
  std::set<const uint32_t*> counted_;  // the done counters counted in so far
  std::string stale_;                  // the first counter that did not start at 0
  EarlyReads early_;
  int early_n0_ = -1;  // kSum: the dropped wait's tile's first column
  NativeGemmFaults* faults_;
};

}  // namespace

std::vector<NativeWait> native_gemm_waits(const kernels::NativeGemmParams& params) {
  const Schedule s(params);
  std::vector<NativeWait> waits;
  std::set<const uint32_t*> seen;
  for (int u = 0; u < s.num_units(); ++u) {
    const kernels::Unit w = s.unit(u);
    const kernels::Tile tile = s.walk.tile(w.t);
    s.for_each_cta(tile.m0, [&](int64_t m0) {
      if (!s.waits_ready(m0)) return;
      for_each_ready_piece(s.p, m0, [&](const kernels::ReadyPiece& r, int64_t, int64_t) {
        const uint32_t* flag = s.p.ready + kernels::ready_index(s.p, r);
        if (seen.insert(flag).second) {
          waits.push_back({NativeWait::Kind::kReady, flag, w.t, static_cast<int>(r.chunk),
                           static_cast<int>(r.piece)});
        }
      });
    });
    s.for_each_cta(tile.m0, [&](int64_t m0) {
      if (!s.sums(w, m0)) return;
      for_each_sum_flag(s, m0, tile.n0, [&](const uint32_t* flag, int peer, int channel) {
        if (seen.insert(flag).second)
          waits.push_back({NativeWait::Kind::kSum, flag, w.t, peer, channel});
      });
    });
  }
  return waits;
}

void run_native_gemm(const kernels::NativeGemmParams& params, NativeGemmFaults* faults) {
  Run(params, faults).run();
}

}  // namespace asynctp::cpu
