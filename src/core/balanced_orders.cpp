#include "core/balanced_orders.h"

#include <numeric>

namespace asynctp {

std::vector<std::vector<size_t>> balanced_orders(size_t n) {
  if (n == 0) return {{}};
  // First row 0, 1, n-1, 2, n-2, ...; row i adds i (mod n). Between consecutive places the
  // first row's differences (1, -2, 3, -4, ... mod n) are all distinct, so in the n rows every
  // ordered pair of variants is adjacent once; for odd n two differences coincide mod n, and
  // the reversed rows make up for it.
  std::vector<size_t> first(n);
  for (size_t j = 0, lo = 1, hi = n - 1; j < n; ++j)
    first[j] = j == 0 ? 0 : (j % 2 == 1 ? lo++ : hi--);
  std::vector<std::vector<size_t>> rows;
  for (size_t i = 0; i < n; ++i) {
    std::vector<size_t> row(n);
    for (size_t j = 0; j < n; ++j)
      row[j] = (first[j] + i) % n;
    rows.push_back(std::move(row));
  }
  if (n % 2 == 1) {
    for (size_t i = 0; i < n; ++i)
      rows.emplace_back(rows[i].rbegin(), rows[i].rend());
  }
  return rows;
}

size_t balanced_order_rows(size_t n) {
  return n == 0 ? 1 : n % 2 == 1 ? 2 * n : n;
}

const std::vector<size_t>& round_order(const std::vector<std::vector<size_t>>& rows, size_t round) {
  const size_t count = rows.size();
  const size_t block = round / count;
  std::vector<size_t> strides;
  for (size_t s = 1; s < count; ++s) {
    if (std::gcd(s, count) == 1) strides.push_back(s);
  }
  const size_t stride = strides.empty() ? 1 : strides[block % strides.size()];
  return rows[(round % count) * stride % count];
}

}  // namespace asynctp
