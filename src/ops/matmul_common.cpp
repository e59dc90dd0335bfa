#include "ops/matmul_common.h"

#include <algorithm>
#include <array>
#include <span>

#include "device/nvtx.h"

namespace asynctp::detail {

std::optional<Tensor> as_gemm_3d(const Tensor& t, int split) {
  const int r = t.dim();
  int64_t batch = 1, m = 1;
  for (int d = 0; d < split; ++d)
    batch *= t.size(d);
  for (int d = split; d < r - 1; ++d)
    m *= t.size(d);
  const Dims shape{batch, m, t.size(-1)};
  Dims strides;
  if (!compute_view_strides(t.shape(), t.strides(), shape, &strides)) return std::nullopt;
  return Tensor(t.data(), t.dtype(), shape, strides, t.device());
}

Tensor gemm_view(const Tensor& t, int split, const char* what) {
  auto v = as_gemm_3d(t, split);
  ASYNCTP_CHECK(v.has_value(), "{} {} cannot be viewed as a batch of matrices", what, t.describe());
  return *v;
}

PathDecision choose_path(OpContext& ctx, std::optional<PathChoice> requested, size_t symm_bytes,
                         const char* op, const CallPaths& paths) {
  const PathChoice choice = requested.value_or(ctx.options().path);
  if (choice == PathChoice::kFallback)
    return {Path::kFallback, "the caller asked for the fallback", true};
  auto symm_problem = [&](size_t bytes) -> std::string {
    if (!ctx.workspace().unavailable_reason().empty()) return ctx.workspace().unavailable_reason();
    if (!ctx.workspace().fits(bytes)) {
      return fmt::format(
          "it needs {} bytes of symmetric workspace per rank and the limit is {} "
          "(ASYNCTP_MAX_WORKSPACE_MB)",
          bytes, ctx.workspace().max_bytes());
    }
    return "";
  };
  const std::string split_why = symm_problem(symm_bytes);
  std::string native_why = paths.native_unsupported;
  if (native_why.empty()) native_why = symm_problem(paths.native_symm_bytes);
  // The native path's first route (where nothing is measured or it is forced).
  const bool first_pushes = !paths.native_copies && paths.native_kernel_pushes;
  if (native_why.empty()) {
    ASYNCTP_CHECK(paths.native_copies || paths.native_kernel_pushes,
                  "{}: the native path can run, but by no route", op);
  }
  if (choice == PathChoice::kNative) {
    ASYNCTP_PATH_CHECK(native_why.empty(), "{}: the native path was requested but cannot run: {}",
                       op, native_why);
    return {Path::kNative, "", true, false, true, first_pushes};
  }
  if (choice == PathChoice::kSplit) {
    ASYNCTP_PATH_CHECK(split_why.empty(), "{}: the split path was requested but {}", op, split_why);
    return {Path::kSplit, "", true};
  }
  // In order of preference where nothing is measured (and for ties); no allocation: every auto
  // call passes here.
  std::array<Route, 4> candidates{};
  size_t count = 0;
  if (native_why.empty()) {
    if (paths.native_copies) candidates[count++] = Route(Path::kNative, false);
    if (paths.native_kernel_pushes) candidates[count++] = Route(Path::kNative, true);
  }
  if (split_why.empty()) candidates[count++] = Path::kSplit;
  if (count == 0) return {Path::kFallback, split_why};
  if (!ctx.backend().times_paths())
    return {candidates[0].path, "", false, false, true, candidates[0].kernel_push};
  candidates[count++] = Path::kFallback;
  const Route route =
      ctx.dispatcher().pick(paths.key, std::span<const Route>(candidates.data(), count), paths.run);
  return {route.path, route.path == Path::kFallback ? "measured fastest" : "", false,
          true,       ctx.dispatcher().decision(paths.key).has_value(),        route.kernel_push};
}

PossiblePaths possible_paths(OpContext& ctx, std::optional<PathChoice> requested,
                             size_t symm_bytes) {
  const PathChoice choice = requested.value_or(ctx.options().path);
  const bool fits =
      ctx.workspace().unavailable_reason().empty() && ctx.workspace().fits(symm_bytes);
  PossiblePaths p;
  if (choice == PathChoice::kFallback) {
    p.fallback = true;
  } else if (choice != PathChoice::kAuto) {
    p.overlapped = true;  // the op throws where it cannot run; reserve as it would
    p.native = choice == PathChoice::kNative;
  } else {
    p.overlapped = fits;
    p.native = fits;
    p.fallback = !fits || ctx.backend().times_paths();
  }
  return p;
}

std::string problem_key(OpContext& ctx, const char* op, int64_t m, int64_t n, int64_t k, DType in,
                        DType out, const Tensor& b, const std::string& variant) {
  const bool b_row_major = b.stride(1) == 1 || b.size(1) == 1;
  return fmt::format("{}|{}x{}x{}|{}->{}|B {}|ws{}|{}{}{}", op, m, n, k, in, out,
                     b_row_major ? "row" : "col", ctx.world_size(), ctx.backend().hardware(),
                     variant.empty() ? "" : "|", variant);
}

uint32_t path_color(Path path) {
  switch (path) {
    case Path::kNative:
      return nvtx::kNativeColor;
    case Path::kSplit:
      return nvtx::kSplitColor;
    case Path::kFallback:
      return nvtx::kFallbackColor;
  }
  ASYNCTP_FAIL("path_color: unknown path {}", static_cast<int>(path));
}

std::string shapes_text(std::span<const Tensor> ts) {
  std::string text;
  for (const Tensor& t : ts)
    text += fmt::format("{}{}", text.empty() ? "" : " ", t.shape());
  return text;
}

std::string_view scales_text(bool scaled, bool rowwise) {
  if (!scaled) return "";
  return rowwise ? ", row-wise scales" : ", tensor-wise scales";
}

namespace {
void* dummy_address() {
  return reinterpret_cast<void*>(uintptr_t{1} << 20);
}
}  // namespace

int64_t offset_from_16_bytes(const Tensor& t) {
  return t.defined() ? static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data()) % 16) : 0;
}

bool off_16_bytes(const Tensor& t) {
  return offset_from_16_bytes(t) != 0;
}

bool off_16_bytes(std::span<const Tensor> ts) {
  return std::any_of(ts.begin(), ts.end(), [](const Tensor& t) { return off_16_bytes(t); });
}

Tensor shape_only(const Tensor& t) {
  if (!t.defined()) return Tensor();
  return Tensor(dummy_address(), t.dtype(), t.shape(), t.strides(), t.device());
}

Tensor shape_only_contiguous(DType dtype, const Dims& shape, Device device) {
  return Tensor(dummy_address(), dtype, shape, device);
}

Tensor shape_only_matrix(DType dtype, int64_t rows, int64_t cols, Device device) {
  return Tensor(dummy_address(), dtype, {rows, cols}, {cols, 1}, device);
}

void check_on_device(OpContext& ctx, const Tensor& t, const char* op, const std::string& name) {
  ASYNCTP_CHECK(t.defined(), "{}: {} is undefined", op, name);
  ASYNCTP_CHECK(t.device() == ctx.backend().device(), "{}: {} is on {} but the context runs on {}",
                op, name, t.device().to_string(), ctx.backend().device().to_string());
}

void check_gemm_dtype(const Tensor& t, const char* op, const std::string& name, bool scaled) {
  ASYNCTP_CHECK(is_floating_point(t.dtype()), "{}: {} is {}; GEMM operands are float dtypes", op,
                name, t.dtype());
  if (scaled) {
    ASYNCTP_CHECK(is_float8(t.dtype()), "{}: {} must be float8 (f8e4m3 or f8e5m2), got {}", op,
                  name, t.dtype());
  } else {
    ASYNCTP_CHECK(!is_float8(t.dtype()),
                  "{}: {} is {}; float8 operands need the scaled form of "
                  "this op, with scales",
                  op, name, t.dtype());
  }
}

void check_out_dtype(const Tensor& t, const char* op, const std::string& name) {
  ASYNCTP_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16,
                "{}: {} must be f32, bf16 or f16, got {}", op, name, t.dtype());
}

bool is_rowwise_scale(const Tensor& scale, const Tensor& like) {
  if (!scale.defined() || scale.dim() != like.dim()) return false;
  Dims expected = like.shape();
  expected[expected.size() - 1] = 1;
  return scale.shape() == expected;
}

void check_a_scale(const Tensor& scale, const Tensor& like, const char* op,
                   const std::string& name) {
  ASYNCTP_CHECK(scale.defined(), "{}: {} is undefined", op, name);
  ASYNCTP_CHECK(scale.dtype() == DType::kF32, "{}: {} must be f32, got {}", op, name,
                scale.dtype());
  if (scale.numel() == 1 || is_rowwise_scale(scale, like)) return;
  Dims expected = like.shape();
  expected[expected.size() - 1] = 1;
  ASYNCTP_FAIL("{}: {} must hold one element (tensor-wise) or have shape {} (row-wise), got {}", op,
               name, expected, scale.describe());
}

void check_b_scale(const Tensor& scale, int64_t n, const char* op, const std::string& name) {
  ASYNCTP_CHECK(scale.defined(), "{}: {} is undefined", op, name);
  ASYNCTP_CHECK(scale.dtype() == DType::kF32, "{}: {} must be f32, got {}", op, name,
                scale.dtype());
  if (scale.numel() == 1) return;
  ASYNCTP_CHECK(
      scale.shape() == Dims({1, n}),
      "{}: {} must hold one element (tensor-wise) or have shape [1, {}] (column-wise), got {}", op,
      name, n, scale.describe());
}

PushPieces push_pieces(int64_t rows, size_t bytes, size_t piece_bytes) {
  constexpr int64_t kTileRows = 128;
  PushPieces p{1, rows};
  if (piece_bytes == 0 || rows <= kTileRows) return p;
  const int64_t wanted =
      std::min<int64_t>(kMaxPushPieces, static_cast<int64_t>(bytes / piece_bytes));
  if (wanted <= 1) return p;
  const int64_t per = (rows + wanted - 1) / wanted;
  p.rows = (per + kTileRows - 1) / kTileRows * kTileRows;
  p.count = static_cast<int>((rows + p.rows - 1) / p.rows);
  if (p.count <= 1) p.rows = rows;
  return p;
}

RsPieces native_rs_pieces(int64_t n, size_t bytes, int max_pieces) {
  constexpr int64_t kTileCols = 256;
  for (int wanted = std::min(max_pieces, kMaxPushPieces); wanted > 1; --wanted) {
    const int64_t cols = (n + kTileCols * wanted - 1) / (kTileCols * wanted) * kTileCols;
    const int count = static_cast<int>((n + cols - 1) / cols);
    if (count > 1 && bytes / count >= kRsPieceBytes) return {count, cols};
  }
  return {1, 0};
}

void set_native_rs_reduction(ChunkedGemmArgs& args, int rank, int ws, const RsPieces& pieces,
                             const Tensor& parts, const Tensor& out, uint32_t* done,
                             const uint32_t* flags, uint32_t value, int channel, bool avg) {
  args.done = done;
  args.done_rows = 0;  // the chunk's rows
  args.done_cols = pieces.cols;
  args.sum_chunk = rank;
  args.sum_parts = parts;
  args.sum_out = out;
  args.sum_self = rank;
  args.sum_avg = avg;
  args.sum_flags = flags;
  args.sum_value = value;
  args.sum_rows = 0;
  args.sum_cols = pieces.cols;
  args.sum_flag_stride = ws;
  args.sum_channel = channel;
}

}  // namespace asynctp::detail
