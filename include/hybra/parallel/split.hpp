#pragma once
// Data parallelism, step one (Gluon's split_and_load): a batch is cut along
// axis 0 into one part per device and each part is copied to its device. The
// copies are engine ops queued on their destination devices, so they overlap
// with each other and with whatever else is queued.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "../ops/layout.hpp"

namespace hybra {

namespace detail {

// split_sizes, with errors naming the calling op and what it splits (e.g.
// "a batch of shape (8, 3)").
inline std::vector<std::int64_t> split_sizes(std::int64_t rows, std::int64_t parts, std::span<const double> shares,
                                             const char* op, const std::string& what) {
  if (parts <= 0) fail<ValueError>(op, ": cannot split ", what, " into ", parts, " parts");
  if (rows < 0) fail<ValueError>(op, ": cannot split ", what, ": negative row count");
  const auto n = static_cast<std::size_t>(parts);
  std::vector<std::int64_t> sizes(n, rows / parts);
  if (shares.empty()) {
    std::fill_n(sizes.begin(), rows % parts, rows / parts + 1);
    return sizes;
  }
  if (shares.size() != n) fail<ValueError>(op, ": ", shares.size(), " shares for ", parts, " parts of ", what);
  for (std::size_t k = 0; k < n; ++k)
    if (!(shares[k] > 0) || !std::isfinite(shares[k]))
      fail<ValueError>(op, ": share ", k, " is ", shares[k], " (splitting ", what, " into ", parts,
                       " parts); shares must be positive and finite");
  const double total = std::accumulate(shares.begin(), shares.end(), 0.0);
  std::vector<double> remainders(n);
  std::int64_t assigned = 0;
  for (std::size_t k = 0; k < n; ++k) {
    // shares[k] / total first: equal shares give bit-identical quotas, so
    // their remainders tie exactly and the earlier part wins.
    const double quota = static_cast<double>(rows) * (shares[k] / total);
    sizes[k] = std::min(rows, static_cast<std::int64_t>(std::floor(quota)));
    remainders[k] = quota - static_cast<double>(sizes[k]);
    assigned += sizes[k];
  }
  std::vector<std::size_t> by_remainder(n);
  std::iota(by_remainder.begin(), by_remainder.end(), std::size_t{0});
  std::stable_sort(by_remainder.begin(), by_remainder.end(),
                   [&](std::size_t a, std::size_t b) { return remainders[a] > remainders[b]; });
  // The floors sum to at most `rows` and fall short by at most n.
  for (std::size_t r = 0; assigned < rows; ++r, ++assigned) ++sizes[by_remainder[r]];
  if (rows >= parts)
    for (auto& size : sizes)
      if (size == 0) {
        --*std::max_element(sizes.begin(), sizes.end());
        size = 1;
      }
  return sizes;
}

inline std::vector<Tensor> split_data(const Tensor& batch, std::int64_t parts, std::span<const double> shares,
                                      const char* op) {
  batch.require(op);
  if (batch.ndim() == 0) fail<ShapeError>(op, ": a 0-d tensor (shape ()) has no batch axis to split");
  const std::vector<std::int64_t> sizes =
      split_sizes(batch.shape()[0], parts, shares, op, concat("a batch of shape ", to_string(batch.shape())));
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  std::int64_t begin = 0;
  for (std::int64_t size : sizes) {
    out.push_back(slice(batch, 0, begin, begin + size));
    begin += size;
  }
  return out;
}

}  // namespace detail

// How many rows of a batch of `rows` each of `parts` parts gets. Without
// shares the sizes differ by at most one, the larger parts first. With
// shares (relative speeds) they are proportional, rounded by largest
// remainder (ties to the earlier part) so they sum to `rows`; while there are
// at least as many rows as parts, every part then gets at least one (taken
// from the largest). With fewer rows than parts some parts get none.
inline std::vector<std::int64_t> split_sizes(std::int64_t rows, std::int64_t parts, std::span<const double> shares = {}) {
  return detail::split_sizes(rows, parts, shares, "split_sizes", detail::concat(rows, " rows"));
}

// The batch cut along axis 0 into `parts` views (no copy), sized by
// split_sizes. Parts may have 0 rows when the batch has fewer rows than parts.
inline std::vector<Tensor> split_data(const Tensor& batch, std::int64_t parts, std::span<const double> shares = {}) {
  return detail::split_data(batch, parts, shares, "split_data");
}
inline std::vector<Tensor> split_data(const Tensor& batch, std::int64_t parts, std::initializer_list<double> shares) {
  return split_data(batch, parts, std::span<const double>(shares.begin(), shares.size()));
}

// One part of the batch per device (split_data), each on its device: the
// part for the batch's own device is a view of the batch, every other part a
// copy queued on its device (to()). Parts come back in the devices' order.
inline std::vector<Tensor> split_and_load(const Tensor& batch, std::span<const Device> devices,
                                          std::span<const double> shares = {}) {
  if (devices.empty())
    fail<ValueError>("split_and_load: no devices to split a batch of shape ",
                     to_string(batch.require("split_and_load").shape()), " over");
  std::vector<Tensor> parts =
      detail::split_data(batch, static_cast<std::int64_t>(devices.size()), shares, "split_and_load");
  for (std::size_t k = 0; k < parts.size(); ++k) parts[k] = parts[k].to(devices[k]);
  return parts;
}
// split_and_load(x, {cpu(0), cpu(1)}, {3, 1}): std::span takes no braced list.
inline std::vector<Tensor> split_and_load(const Tensor& batch, std::initializer_list<Device> devices,
                                          std::initializer_list<double> shares = {}) {
  return split_and_load(batch, std::span<const Device>(devices.begin(), devices.size()),
                        std::span<const double>(shares.begin(), shares.size()));
}

}  // namespace hybra
