#include "tools/pass_flags.h"

#include <fmt/format.h>

#include "tools/options.h"

namespace asynctp::tools {

passes::PassOptions PassFlags::options() const {
  passes::PassOptions o;
  o.fuse = !no_fuse;
  o.tp.enable_last_dim = enable_last_dim;
  o.tp.enable_last_dim_scatter = !no_last_dim_scatter;
  o.tp.enable_transpose = enable_transpose;
  o.tp.enable_swiglu = enable_swiglu;
  o.bucket.cap_mb = bucket_mb;
  return o;
}

std::vector<std::string> PassFlags::args() const {
  std::vector<std::string> a;
  for (double mb : bucket_mb)
    a.insert(a.end(), {"--bucket-mb", fmt::format("{}", mb)});
  if (enable_last_dim) a.push_back("--enable-last-dim");
  if (no_last_dim_scatter) a.push_back("--no-last-dim-scatter");
  if (enable_transpose) a.push_back("--enable-transpose");
  if (enable_swiglu) a.push_back("--enable-swiglu");
  if (no_fuse) a.push_back("--no-fuse");
  return a;
}

void add_pass_flags(CLI::App* cmd, PassFlags& f, const std::string& context) {
  cmd->add_flag("--no-fuse", f.no_fuse, context + "skip the fusion pass (bucketing only)");
  add_numbers_option(cmd, "--bucket-mb", options::kBucketMb, &f.bucket_mb,
                     context +
                         "bucket the remaining all-gathers and reduce-scatters up to this many "
                         "MiB per bucket (inf: one bucket); several values give the caps of "
                         "buckets 0, 1, ... (the last repeats)");
  cmd->add_flag("--enable-last-dim", f.enable_last_dim,
                context +
                    "also fuse gathers on the contraction (last) dim (each rank's product "
                    "becomes a partial sum)");
  cmd->add_flag("--no-last-dim-scatter", f.no_last_dim_scatter,
                context +
                    "leave reduce-scatters on the output (last) dim unfused (fused by "
                    "default)");
  cmd->add_flag("--enable-transpose", f.enable_transpose,
                context + "also fuse mm(A, all_gather(B).t()) through the transposed product");
  cmd->add_flag("--enable-swiglu", f.enable_swiglu,
                context +
                    "also move silu(g) * u after a fused gather's product [g | u] into the "
                    "GEMM's epilogue (asynctp.fused_all_gather_matmul_swiglu)");
}

}  // namespace asynctp::tools
