// The native async-input GEMM on the CPU: an emulation of the kernel (kernels/native/kernel.cuh)
// that follows its contract (kernels/native/params.h) with the kernel's own schedule math
// (kernels/native/schedule.h), so that the native paths of the ops run, and are tested, without a
// GPU.
//
// It runs as one CTA would with the whole grid to itself: the units of the walk one after the
// other (tile_at from the pivot, groups of group_m_of; no tail split: there are no idle CTAs to
// split for), each unit in the kernel's steps:
//
//   producer:  [tiles not wholly inside the own chunk: wait until ready[] is up for every piece
//              of A its 128 rows overlap (flag_raised, acquire)]; rows from own_a or a
//              [tiles of the first column: each row also into a_out, the copy of A]
//   consumers: acc[r][j] = sum over k in increasing k of a[r][k] * b[k][j], f32, per 64-row half
//              (cpu::accumulate_row, the CPU reference GEMM's row kernel: the same bits)
//   epilogue:  a tile of sum_chunk: [wait until sum_flags[] is up for every peer of its piece];
//              acc += part_s for s = 0, 1, .. but sum_self, in that order, in f32; x 1/count
//              (avg); rounded once into sum_out; not counted
//              a SwiGLU tile (tile_width output columns j): g = acc[r][j], u = acc[r][n + j];
//              [g, u rounded once into pre]; swiglu_f32(g, u) rounded once into C (the CUDA
//              kernel's swiglu_epilogue_f32 may differ in the last bits)
//              any other tile: rounded once into C; then done[] += 1 per 64-row half inside m
//              (release, and a futex wake for the stream waits on it)
//
// Every wait is bounded by timeout_ns from when it starts. As the kernel does, a wait that times
// out stops that kind of wait for the rest of the GEMM (which finishes with whatever has landed,
// so that counters still complete and nothing waits on it forever); the GEMM then throws the
// first timeout, a TimeoutError naming the rank and the chunk (or the peer) and piece.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "kernels/native/params.h"

namespace asynctp::cpu {

// One flag the GEMM waits for: the first wait on it in walk order (a later tile that waits on
// the same flag finds it up, the GEMM being one CTA).
struct NativeWait {
  enum class Kind { kReady, kSum } kind;
  const uint32_t* flag;
  int tile;     // the walk's tile number of that first wait
  int peer;     // kReady: the chunk; kSum: the peer whose part the flag stands for
  int channel;  // kReady: the piece of the chunk; kSum: sum_channel + the piece
};

// The flag waits of a GEMM over `params` (checked: kernels::native_gemm_unsupported), in the
// order it makes them.
std::vector<NativeWait> native_gemm_waits(const kernels::NativeGemmParams& params);

// What the flag waits' fault switch (cpu::testing::reset_flag_waits) asks of one GEMM.
struct NativeGemmFaults {
  // The index in native_gemm_waits of a wait to drop (-1: none): it does not wait, and the rows
  // it guarded are read as the GEMM starts.
  int64_t drop = -1;
  // A done counter whose tiles to hold back (a dropped stream wait on it sets it, possibly while
  // the GEMM runs): before the first of them the GEMM sleeps as held-back work does.
  std::atomic<const uint32_t*> held{nullptr};
};

// Runs the GEMM (faults: none where null).
void run_native_gemm(const kernels::NativeGemmParams& params, NativeGemmFaults* faults = nullptr);

}  // namespace asynctp::cpu
