#include "cpu/values.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "bf16.h"
#include "cpu/kernels/any_broken__generic.h"

namespace flat::cpu {
namespace {

// The first element of a contiguous row of n that breaks the rule, or n: the target's pass, then,
// where it found one, a scalar look for where.
template <class Element>
int64_t first_broken(bool (*any_broken)(const Element*, int64_t, validate::Values), const Element* row, int64_t n,
                     validate::Values rule) {
  if (!any_broken(row, n, rule)) return n;
  for (int64_t c = 0; c < n; ++c)
    if (breaks(bits_of(row[c]), rule)) return c;
  return n;
}

}  // namespace

void check_values(const std::string& name, const Tensor& t, validate::Values rule, const Target& target,
                  const Workers& workers) {
  if (validate::element_count(t) == 0) return;
  // Trailing axes that are packed merge into one contiguous run; the axes before it are walked.
  int outer = t.rank - 1;
  int64_t run = t.shape[size_t(outer)];
  while (outer > 0 && t.stride[size_t(outer - 1)] == run) run *= t.shape[size_t(--outer)];
  int64_t rows = 1;
  for (int d = 0; d < outer; ++d) rows *= t.shape[size_t(d)];
  // Work in pieces of at most kPiece elements of one row, so that a single long run is split too;
  // small tensors (a decode step's gates) are scanned on the calling thread alone.
  constexpr int64_t kPiece = int64_t{1} << 16;
  const int64_t pieces = (run + kPiece - 1) / kPiece;
  const int64_t element_bytes = t.dtype == DType::bf16 ? 2 : 4;
  const bool large = rows * run >= 4 * kPiece;
  // The smallest logical index (row * run + column) of a broken element.
  const int64_t none = rows * run;
  std::atomic<int64_t> first{none};
  parallel_ranges(rows * pieces, large ? workers : Workers{}, [&](int64_t begin, int64_t end) {
    int64_t row = begin / pieces, piece = begin % pieces;
    std::vector<int64_t> index(static_cast<size_t>(outer));  // the row's indices along the walked axes
    int64_t offset = 0;
    for (int64_t d = outer - 1, rest = row; d >= 0; --d) {
      index[size_t(d)] = rest % t.shape[size_t(d)];
      rest /= t.shape[size_t(d)];
      offset += index[size_t(d)] * t.stride[size_t(d)];
    }
    for (int64_t item = begin; item < end; ++item) {
      const int64_t c0 = piece * kPiece, n = std::min(kPiece, run - c0);
      const char* data = static_cast<const char*>(t.data) + (offset + c0) * element_bytes;
      const int64_t c = t.dtype == DType::bf16
                            ? first_broken(target.values.any_broken_bf16, reinterpret_cast<const uint16_t*>(data), n, rule)
                            : first_broken(target.values.any_broken_f32, reinterpret_cast<const float*>(data), n, rule);
      if (c < n) {
        const int64_t at = row * run + c0 + c;
        for (int64_t seen = first.load(); at < seen && !first.compare_exchange_weak(seen, at);) {
        }
        return;
      }
      if (++piece < pieces) continue;
      piece = 0;
      ++row;
      for (int d = outer - 1; d >= 0; --d) {  // the next row: an odometer over the walked axes
        offset += t.stride[size_t(d)];
        if (++index[size_t(d)] < t.shape[size_t(d)]) break;
        offset -= index[size_t(d)] * t.stride[size_t(d)];
        index[size_t(d)] = 0;
      }
    }
  });
  const int64_t at = first.load();
  if (at == none) return;
  // The broken element's offset from its logical index, and its value.
  int64_t offset = 0;
  for (int64_t d = t.rank - 1, rest = at; d >= 0; --d) {
    offset += rest % t.shape[size_t(d)] * t.stride[size_t(d)];
    rest /= t.shape[size_t(d)];
  }
  const char* element = static_cast<const char*>(t.data) + offset * element_bytes;
  validate::refuse_value(name, t, rule, at,
                         t.dtype == DType::bf16 ? bf16_to_f32(*reinterpret_cast<const uint16_t*>(element))
                                                : *reinterpret_cast<const float*>(element));
}

}  // namespace flat::cpu
