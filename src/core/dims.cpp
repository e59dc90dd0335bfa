#include <asynctp/dims.h>

#include "core/error.h"

namespace asynctp {

namespace detail {
void throw_too_many_dims(int64_t size) {
  ASYNCTP_CHECK(size >= 0, "dims size {} is negative", size);
  ASYNCTP_FAIL("at most {} dims are supported, got {}", kMaxDims, size);
}
}  // namespace detail

std::string Dims::to_string() const {
  return fmt::format("[{}]", fmt::join(span(), ", "));
}

}  // namespace asynctp
