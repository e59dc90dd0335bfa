// View and data-movement kernels: permute/t/transpose/expand/slice/select/split/getitem return
// views sharing storage (as in PyTorch); view/reshape return a view when the strides allow it and
// a contiguous copy otherwise (the executor may lay a tensor out differently from the eager run
// whose strides were recorded, so a legal `view` there may need a copy here: the values are the
// same either way); cat, repeat and slice_scatter copy.
#include <algorithm>
#include <array>

#include "core/error.h"
#include "graph/kernel.h"

namespace asynctp::graph {

namespace {

using Table = std::vector<std::pair<std::string, Kernel>>;

int wrap(const Call& call, int64_t d, int rank, const char* what) {
  ASYNCTP_CHECK(d >= -rank && d < std::max(rank, 1), "{}: {} {} out of range for rank {}",
                call.where(), what, d, rank);
  return static_cast<int>(d < 0 ? d + rank : d);
}

Dims to_dims(const std::vector<int64_t>& v) {
  return Dims(std::span<const int64_t>(v));
}

RtValue reshape(Call& call) {
  const HostTensor& x = call.tensor(0, "self");
  const Dims shape = to_dims(call.int_list(1, "shape"));
  Dims strides;
  Dims resolved = shape;
  // Resolve -1 the way Tensor::view does, to try the view first.
  int64_t known = 1;
  int infer = -1;
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      ASYNCTP_CHECK(infer < 0, "{}: more than one -1 in shape {}", call.where(), shape);
      infer = i;
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    ASYNCTP_CHECK(known > 0 && x.t.numel() % known == 0, "{}: cannot reshape {} to {}",
                  call.where(), x.t.describe(), shape);
    resolved[infer] = x.t.numel() / known;
  }
  ASYNCTP_CHECK(resolved.product() == x.t.numel(), "{}: cannot reshape {} ({} elements) to {}",
                call.where(), x.t.describe(), x.t.numel(), shape);
  if (compute_view_strides(x.t.shape(), x.t.strides(), resolved, &strides)) {
    return RtValue::of(x.view_as(Tensor(x.t.data(), x.t.dtype(), resolved, strides, x.t.device())));
  }
  const HostTensor c = host_contiguous(x);
  return RtValue::of(c.view_as(c.t.view(resolved)));
}

RtValue permute(Call& call, const HostTensor& x, const std::vector<int64_t>& order) {
  ASYNCTP_CHECK(static_cast<int>(order.size()) == x.t.dim(), "{}: permutation of {} dims for {}",
                call.where(), order.size(), x.t.describe());
  std::vector<int> o;
  for (int64_t d : order)
    o.push_back(wrap(call, d, x.t.dim(), "dim"));
  return RtValue::of(x.view_as(x.t.permute(std::span<const int>(o))));
}

// t[start:end:step] along dim, as a view of t; the arguments dim, start, end, step sit at
// positions first, first + 1, ... (a missing or None start/end takes the whole dim, a negative
// one counts from the end, as in Python).
Tensor slice_view(const Call& call, const Tensor& t, size_t first) {
  const int d = wrap(call, call.integer_or(first, "dim", 0), t.dim(), "dim");
  const int64_t size = t.size(d);
  const int64_t step = call.integer_or(first + 3, "step", 1);
  ASYNCTP_CHECK(step >= 1, "{}: slice step must be positive, got {}", call.where(), step);
  auto clamp = [&](int64_t v) {
    if (v < 0) v += size;
    return std::clamp<int64_t>(v, 0, size);
  };
  const int64_t start = clamp(call.integer_or(first + 1, "start", 0));
  const int64_t end = std::max(start, clamp(call.integer_or(first + 2, "end", size)));
  const int64_t len = (end - start + step - 1) / step;
  Tensor v = t.narrow(d, start, len);
  Dims strides = v.strides();
  strides[d] *= step;
  return Tensor(len == 0 ? t.data() : v.data(), v.dtype(), v.shape(), strides, v.device());
}

RtValue slice(Call& call) {
  const HostTensor& x = call.tensor(0, "self");
  return RtValue::of(x.view_as(slice_view(call, x.t, 1)));
}

// slice_scatter(self, src, dim, start, end, step): a copy of self whose slice [start:end:step]
// along dim holds src.
RtValue slice_scatter(Call& call) {
  const HostTensor& x = call.tensor(0, "self");
  const HostTensor& src = call.tensor(1, "src");
  HostTensor out = call.alloc(x.t.shape(), x.t.dtype());
  copy_elements(out.t, x.t);
  const Tensor region = slice_view(call, out.t, 2);
  ASYNCTP_CHECK(src.t.shape() == region.shape() && src.t.dtype() == x.t.dtype(),
                "{}: src {} does not fit the slice {} of {}", call.where(), src.t.describe(),
                region.describe(), x.t.describe());
  if (region.numel() > 0) copy_elements(region, src.t);
  return RtValue::of(out);
}

RtValue split(Call& call, const HostTensor& x, std::vector<int64_t> sizes, int64_t dim) {
  const int d = wrap(call, dim, x.t.dim(), "dim");
  int64_t total = 0;
  for (int64_t s : sizes)
    total += s;
  ASYNCTP_CHECK(total == x.t.size(d), "{}: split sizes add up to {} but dim {} of {} is {}",
                call.where(), total, d, x.t.describe(), x.t.size(d));
  std::vector<RtValue> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(RtValue::of(x.view_as(x.t.narrow(d, start, s))));
    start += s;
  }
  return RtValue::list(std::move(parts));
}

RtValue cat(Call& call) {
  const std::vector<HostTensor> xs = call.tensor_list(0, "tensors");
  ASYNCTP_CHECK(!xs.empty(), "{}: cat of no tensors", call.where());
  const int d = wrap(call, call.integer_or(1, "dim", 0), xs[0].t.dim(), "dim");
  Dims shape = xs[0].t.shape();
  shape[d] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& t = xs[i].t;
    ASYNCTP_CHECK(t.dtype() == xs[0].t.dtype(), "{}: tensors[{}] is {} but tensors[0] is {}",
                  call.where(), i, t.dtype(), xs[0].t.dtype());
    ASYNCTP_CHECK(t.dim() == shape.size(), "{}: tensors[{}] {} differs in rank", call.where(), i,
                  t.describe());
    for (int k = 0; k < t.dim(); ++k) {
      ASYNCTP_CHECK(k == d || t.size(k) == xs[0].t.size(k),
                    "{}: tensors[{}] {} does not match "
                    "tensors[0] {} outside dim {}",
                    call.where(), i, t.describe(), xs[0].t.describe(), d);
    }
    shape[d] += t.size(d);
  }
  HostTensor out = call.alloc(shape, xs[0].t.dtype());
  int64_t start = 0;
  for (const auto& x : xs) {
    copy_elements(out.t.narrow(d, start, x.t.size(d)), x.t);
    start += x.t.size(d);
  }
  return RtValue::of(out);
}

RtValue repeat(Call& call) {
  const HostTensor& x = call.tensor(0, "self");
  const std::vector<int64_t> reps = call.int_list(1, "repeats");
  ASYNCTP_CHECK(static_cast<int>(reps.size()) >= x.t.dim(), "{}: {} repeats for {}", call.where(),
                reps.size(), x.t.describe());
  const int rank = static_cast<int>(reps.size());
  Dims in_shape = Dims::filled(rank, 1);
  for (int i = 0; i < x.t.dim(); ++i)
    in_shape[rank - x.t.dim() + i] = x.t.size(i);
  Dims shape = Dims::filled(rank, 1);
  for (int i = 0; i < rank; ++i) {
    ASYNCTP_CHECK(reps[i] >= 0, "{}: negative repeat {}", call.where(), reps[i]);
    shape[i] = in_shape[i] * reps[i];
  }
  const std::vector<float> in = load_f32(x.t);
  const Dims in_strides = contiguous_strides(in_shape);
  std::vector<float> out(static_cast<size_t>(shape.product()));
  std::array<int64_t, kMaxDims> index{};
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t src = 0;
    for (int k = 0; k < rank; ++k)
      src += (index[k] % in_shape[k]) * in_strides[k];
    out[i] = in[static_cast<size_t>(src)];
    for (int k = rank - 1; k >= 0; --k) {
      if (++index[k] < shape[k]) break;
      index[k] = 0;
    }
  }
  HostTensor result = call.alloc(shape, x.t.dtype());
  store_f32(result.t, out);
  return RtValue::of(result);
}

RtValue squeeze(Call& call, const HostTensor& x, std::vector<int> dims) {
  Dims shape, strides;
  for (int i = 0; i < x.t.dim(); ++i) {
    const bool listed = std::find(dims.begin(), dims.end(), i) != dims.end();
    if (listed && x.t.size(i) == 1) continue;
    shape.push_back(x.t.size(i));
    strides.push_back(x.t.stride(i));
  }
  return RtValue::of(x.view_as(Tensor(x.t.data(), x.t.dtype(), shape, strides, x.t.device())));
}

}  // namespace

void register_shape_kernels(Table& t) {
  for (const char* name :
       {"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default"}) {
    t.emplace_back(name, reshape);
  }
  t.emplace_back("aten.permute.default",
                 [](Call& c) { return permute(c, c.tensor(0, "self"), c.int_list(1, "dims")); });
  t.emplace_back("aten.t.default", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    ASYNCTP_CHECK(x.t.dim() <= 2, "{}: t() needs a tensor of rank <= 2, got {}", c.where(),
                  x.t.describe());
    return x.t.dim() < 2 ? RtValue::of(x) : RtValue::of(x.view_as(x.t.t()));
  });
  t.emplace_back("aten.transpose.int", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    const int a = wrap(c, c.integer(1, "dim0"), x.t.dim(), "dim0");
    const int b = wrap(c, c.integer(2, "dim1"), x.t.dim(), "dim1");
    return RtValue::of(x.view_as(x.t.transpose(a, b)));
  });
  t.emplace_back("aten.expand.default", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    Dims shape = to_dims(c.int_list(1, "size"));
    const int lead = shape.size() - x.t.dim();
    for (int i = 0; i < shape.size(); ++i) {
      if (shape[i] == -1) {
        ASYNCTP_CHECK(i >= lead, "{}: -1 in a new leading dim of expand", c.where());
        shape[i] = x.t.size(i - lead);
      }
    }
    return RtValue::of(x.view_as(expand_view(x.t, shape)));
  });
  t.emplace_back("aten.unsqueeze.default", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    return RtValue::of(x.view_as(x.t.unsqueeze(static_cast<int>(c.integer(1, "dim")))));
  });
  t.emplace_back("aten.squeeze.dim", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    if (x.t.dim() == 0) return RtValue::of(x);
    return squeeze(c, x, {wrap(c, c.integer(1, "dim"), x.t.dim(), "dim")});
  });
  t.emplace_back("aten.squeeze.dims", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    std::vector<int> dims;
    for (int64_t d : c.int_list(1, "dim"))
      dims.push_back(wrap(c, d, x.t.dim(), "dim"));
    return squeeze(c, x, dims);
  });
  t.emplace_back("aten.squeeze.default", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    std::vector<int> dims(x.t.dim());
    for (int i = 0; i < x.t.dim(); ++i)
      dims[i] = i;
    return squeeze(c, x, dims);
  });
  t.emplace_back("aten.alias.default", [](Call& c) { return RtValue::of(c.tensor(0, "self")); });
  t.emplace_back("aten.slice.Tensor", slice);
  t.emplace_back("aten.slice_scatter.default", slice_scatter);
  t.emplace_back("aten.select.int", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    const int d = wrap(c, c.integer(1, "dim"), x.t.dim(), "dim");
    int64_t index = c.integer(2, "index");
    if (index < 0) index += x.t.size(d);
    return RtValue::of(x.view_as(x.t.select(d, index)));
  });
  t.emplace_back("aten.split.Tensor", [](Call& c) {
    const HostTensor& x = c.tensor(0, "self");
    const int64_t dim = c.integer_or(2, "dim", 0);
    const int64_t size = x.t.size(wrap(c, dim, x.t.dim(), "dim"));
    const int64_t step = c.integer(1, "split_size");
    ASYNCTP_CHECK(step > 0, "{}: split_size must be positive, got {}", c.where(), step);
    std::vector<int64_t> sizes;
    for (int64_t s = 0; s < size; s += step)
      sizes.push_back(std::min(step, size - s));
    if (sizes.empty()) sizes.push_back(0);
    return split(c, x, sizes, dim);
  });
  t.emplace_back("aten.split_with_sizes.default", [](Call& c) {
    return split(c, c.tensor(0, "self"), c.int_list(1, "split_sizes"), c.integer_or(2, "dim", 0));
  });
  t.emplace_back("_operator.getitem", [](Call& c) {
    const RtValue& seq = c.value(0, "a");
    ASYNCTP_CHECK(seq.kind == RtValue::Kind::kList, "{}: getitem of {}, not of a tuple", c.where(),
                  seq.describe());
    const int64_t n = static_cast<int64_t>(seq.items.size());
    int64_t i = c.integer(1, "b");
    if (i < 0) i += n;
    ASYNCTP_CHECK(i >= 0 && i < n, "{}: index {} out of range for a tuple of {}", c.where(),
                  c.integer(1, "b"), n);
    return seq.items[static_cast<size_t>(i)];
  });
  t.emplace_back("aten.cat.default", cat);
  t.emplace_back("aten.repeat.default", repeat);
}

}  // namespace asynctp::graph
