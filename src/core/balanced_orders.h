// Orders in which to time n variants round-robin so that what ran just before each one (its
// data left in L2, the clocks it set) is spread evenly over the others: the bench's timing loop
// and the dispatcher's measurements use them.
#pragma once

#include <cstddef>
#include <vector>

namespace asynctp {

// Orders for rounds of n variants, a Williams design: every row runs each variant once, and
// over all rows each variant comes right after each other one within a row equally often (once
// in n rows for even n; twice in 2n rows for odd n, the rows and their reverses).
std::vector<std::vector<size_t>> balanced_orders(size_t n);
// How many rows balanced_orders(n) has (n, 2n for odd n, 1 for none), without building them.
size_t balanced_order_rows(size_t n);
// The order of round `round` of the timing loop: block b = round / rows.size() visits the rows
// with the b-th stride coprime to their count (1, then the next, ...), so that the pair across
// the boundary between two rounds (the last run of one, the first of the next), which the rows
// do not balance, changes from block to block: for an even number of variants, in the joined
// runs of as many blocks as there are strides (up to three tested) no ordered pair of distinct
// variants comes more than once more often than another (with one stride: up to twice as often).
const std::vector<size_t>& round_order(const std::vector<std::vector<size_t>>& rows, size_t round);

}  // namespace asynctp
