#include "validate.h"

#include <algorithm>
#include <climits>
#include <sstream>
#include <vector>

#include "params.h"

namespace flat::validate {

[[noreturn]] void fail(const std::string& tensor, const std::string& what) {
  throw Error("flat: " + tensor + ": " + what);
}

std::string shape_string(const Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (int d = 0; d < t.rank; ++d) s << (d ? ", " : "") << t.shape[size_t(d)];
  s << "]";
  return s.str();
}

namespace {

std::string expected_string(const std::vector<Axis>& axes) {
  std::ostringstream s;
  s << "[";
  for (size_t d = 0; d < axes.size(); ++d) {
    s << (d ? ", " : "") << axes[d].name;
    if (axes[d].size >= 0) s << "=" << axes[d].size;
  }
  s << "]";
  return s.str();
}

}  // namespace

void check_tensor(const std::string& name, const Tensor& t, const std::vector<Axis>& axes) {
  if (!t.present()) fail(name, "required tensor is missing");
  if (t.rank != int(axes.size()))
    fail(name, "expected rank " + std::to_string(axes.size()) + " " + expected_string(axes) + ", got rank " +
                   std::to_string(t.rank) + " " + shape_string(t));
  for (size_t d = 0; d < axes.size(); ++d) {
    const bool may_be_empty = axes[d].size == 0 || axes[d].size == kAnyOrEmpty;
    if (t.shape[d] < (may_be_empty ? 0 : 1))
      fail(name, std::string("axis ") + axes[d].name + " must be at least " + (may_be_empty ? "0" : "1") + ", got " +
                     std::to_string(t.shape[d]) + " in shape " + shape_string(t));
    if (t.shape[d] > INT_MAX)
      fail(name, std::string("axis ") + axes[d].name + " = " + std::to_string(t.shape[d]) + " is too large");
    if (axes[d].size >= 0 && t.shape[d] != axes[d].size)
      fail(name, "expected shape " + expected_string(axes) + ", got " + shape_string(t));
  }
  // A tensor of no elements is never read or written: frameworks give it no memory and any strides.
  if (element_count(t) == 0) return;
  // Nor is the stride of an axis of one element (its only index is 0): frameworks leave any there,
  // e.g. PyTorch on the transpose of a [.., 1, K] state. Nothing downstream reads it: the kernels
  // take a row's elements as contiguous, and the overlap and value checks skip such axes.
  for (size_t d = 0; d < axes.size(); ++d)
    if (t.stride[d] < 0 && t.shape[d] != 1) fail(name, std::string("negative stride on axis ") + axes[d].name);
  const size_t last = axes.size() - 1;
  if (t.stride[last] != 1 && t.shape[last] != 1)
    fail(name, "the last axis must be contiguous (stride 1), got stride " + std::to_string(t.stride[last]));
  if (t.data == nullptr) fail(name, "null data pointer");
}

int64_t element_count(const Tensor& t) {
  if (!t.present()) return 0;
  int64_t count = 1;
  for (int d = 0; d < t.rank; ++d) count *= t.shape[size_t(d)];
  return count;
}

namespace {

// A view's elements as byte intervals in increasing order: its axes of more than one element,
// outermost (largest stride) first, with the innermost ones merged into one contiguous run where
// they are packed. "Nested" when each axis steps past everything inside it, so that walking the
// indices in order gives disjoint intervals in increasing order; only then is `next` meaningful.
class Intervals {
 public:
  explicit Intervals(const Tensor& t) : element_(t.dtype == DType::bf16 ? 2 : 4) {
    base_ = reinterpret_cast<uintptr_t>(t.data);
    run_ = t.shape[size_t(t.rank - 1)];  // the last axis is contiguous (stride 1) or of one element
    for (int d = 0; d < t.rank - 1; ++d)
      if (t.shape[size_t(d)] > 1) axes_.push_back({t.shape[size_t(d)], t.stride[size_t(d)]});
    std::sort(axes_.begin(), axes_.end(), [](const Axis& a, const Axis& b) { return a.stride > b.stride; });
    while (!axes_.empty() && axes_.back().stride == run_) {
      run_ *= axes_.back().count;
      axes_.pop_back();
    }
    int64_t inner = run_;  // elements spanned by the axes inside
    nested_ = true;
    for (size_t d = axes_.size(); d-- > 0;) {
      nested_ = nested_ && axes_[d].stride >= inner;
      inner += (axes_[d].count - 1) * axes_[d].stride;
    }
    end_ = base_ + uintptr_t(inner) * element_;
    index_.assign(axes_.size(), 0);
  }

  uintptr_t begin() const { return base_; }
  uintptr_t end() const { return end_; }
  bool nested() const { return nested_; }
  bool has_zero_stride() const {
    return std::any_of(axes_.begin(), axes_.end(), [](const Axis& a) { return a.stride == 0; });
  }

  // The current interval [first, last) and a step to the next; false past the end.
  bool current(uintptr_t* first, uintptr_t* last) const {
    if (done_) return false;
    int64_t offset = 0;
    for (size_t d = 0; d < axes_.size(); ++d) offset += index_[d] * axes_[d].stride;
    *first = base_ + uintptr_t(offset) * element_;
    *last = *first + uintptr_t(run_) * element_;
    return true;
  }
  void next() {
    for (size_t d = axes_.size(); d-- > 0;) {
      if (++index_[d] < axes_[d].count) return;
      index_[d] = 0;
    }
    done_ = true;
  }

 private:
  struct Axis {
    int64_t count, stride;
  };
  int64_t element_;
  uintptr_t base_ = 0, end_ = 0;
  int64_t run_ = 1;
  std::vector<Axis> axes_;
  std::vector<int64_t> index_;
  bool nested_ = true, done_ = false;
};

// Whether two views share a byte. Apart extents answer at once; nested views are walked together,
// interval by interval (a fused projection's column blocks: one interval per row); views that are
// not nested and whose extents meet are taken to overlap.
bool share_memory(const Tensor& a, const Tensor& b) {
  Intervals x(a), y(b);
  if (x.end() <= y.begin() || y.end() <= x.begin()) return false;
  if (!x.nested() || !y.nested()) return true;
  uintptr_t x0, x1, y0, y1;
  while (x.current(&x0, &x1) && y.current(&y0, &y1)) {
    if (x0 < y1 && y0 < x1) return true;
    if (x1 <= y1) x.next();
    else y.next();
  }
  return false;
}

bool same_view(const Tensor& a, const Tensor& b) {
  return a.data == b.data && a.dtype == b.dtype && a.rank == b.rank && a.shape == b.shape && a.stride == b.stride;
}

}  // namespace

void check_no_overlap(const std::vector<Named>& outputs, const std::vector<Named>& inputs,
                      const std::vector<std::pair<std::string, std::string>>& in_place) {
  for (const Named& out : outputs) {
    if (element_count(*out.tensor) == 0) continue;
    const Intervals own(*out.tensor);
    if (own.has_zero_stride()) fail(out.name, "an output's elements must not overlap, got a stride of 0");
    if (!own.nested()) fail(out.name, "an output's elements must not overlap, got strides that make them");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Named& out = outputs[i];
    if (element_count(*out.tensor) == 0) continue;
    for (size_t j = i + 1; j < outputs.size(); ++j)
      if (element_count(*outputs[j].tensor) > 0 && share_memory(*out.tensor, *outputs[j].tensor))
        fail(out.name, std::string("outputs must not overlap, got memory shared with ") + outputs[j].name);
    for (const Named& in : inputs) {
      if (element_count(*in.tensor) == 0 || !share_memory(*out.tensor, *in.tensor)) continue;
      const bool allowed = std::find(in_place.begin(), in_place.end(), std::pair<std::string, std::string>(out.name, in.name)) !=
                           in_place.end();
      if (allowed && same_view(*out.tensor, *in.tensor)) continue;
      fail(out.name, std::string("an output must not overlap an input, got memory shared with ") + in.name +
                         (allowed ? std::string(" (it may be the very same view as ") + in.name + ", updated in place)"
                                  : std::string()));
    }
  }
}

Device common_device(const std::vector<Named>& tensors) {
  const Named* first = nullptr;
  for (const Named& t : tensors) {
    if (!t.tensor->present()) continue;
    if (!first) first = &t;
    else if (t.tensor->device != first->tensor->device)
      fail(t.name, "on " + std::string(device_name(t.tensor->device)) + ", expected " +
                       std::string(device_name(first->tensor->device)) + " like " + first->name);
  }
  return first ? first->tensor->device : Device::cpu;
}

int64_t head_count(const std::vector<HeadCount>& counts) {
  size_t largest = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i].count > counts[largest].count) largest = i;
  const int64_t N = counts[largest].count;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i].count == 0 || N % counts[i].count == 0) continue;
    const HeadCount &culprit = counts[std::max(i, largest)], &other = counts[std::min(i, largest)];
    fail(culprit.tensor, std::string("head count ") + culprit.axis + " = " + std::to_string(culprit.count) +
                             " does not fit " + other.axis + " = " + std::to_string(other.count) + " of " +
                             other.tensor + ": every head count must divide the largest, N = " + std::to_string(N));
  }
  return N;
}

void refuse_value(const std::string& name, const Tensor& t, Values rule, int64_t at, float value) {
  std::vector<int64_t> index(static_cast<size_t>(t.rank));
  for (int64_t d = t.rank - 1, rest = at; d >= 0; --d) {
    index[size_t(d)] = rest % t.shape[size_t(d)];
    rest /= t.shape[size_t(d)];
  }
  std::ostringstream where, got;
  for (int d = 0; d < t.rank; ++d) where << (d ? ", " : "[") << index[size_t(d)];
  where << "]";
  got << value;
  fail(name, std::string("expected finite values") +
                 (rule == Values::finite_nonpositive ? " <= 0 (log-space gates)" : "") + ", got " + got.str() +
                 " at " + where.str());
}

void check_dtype(const std::string& name, const Tensor& t, DType expected, const std::string& why) {
  if (t.dtype != expected)
    fail(name,
         "expected dtype " + std::string(dtype_name(expected)) + why + ", got " + std::string(dtype_name(t.dtype)));
}

void check_sequences(const Sequences& s, const std::string& tensor, int64_t B, int64_t S, bool final_states) {
  const std::span<const int64_t> cu = s.cu_seqlens;
  const auto at = [&](size_t i) { return "cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(cu[i]); };
  if (!cu.empty()) {
    if (B != 1)
      fail("cu_seqlens", "packs the sequences along S of one batch row, expected B = 1 in " + tensor + ", got B = " +
                             std::to_string(B));
    if (cu.size() < 2) fail("cu_seqlens", "expected num_seqs + 1 offsets, num_seqs at least 1, got 1 offset");
    if (cu[0] != 0) fail("cu_seqlens", "expected the first offset to be 0, got " + at(0));
    for (size_t i = 1; i < cu.size(); ++i) {
      if (cu[i] > S)
        fail("cu_seqlens", "expected offsets up to S = " + std::to_string(S) + " (the length of " + tensor +
                               "), got " + at(i) + ", past the end");
      if (cu[i] < cu[i - 1])
        fail("cu_seqlens", "expected non-decreasing offsets, got " + at(i - 1) + " > " + at(i));
    }
    if (cu.back() != S)
      fail("cu_seqlens", "expected the last offset to be S = " + std::to_string(S) + " (the length of " + tensor +
                             "), got " + at(cu.size() - 1));
  }
  for (const auto& [name, indices] : {std::pair{"final_state_indices", s.final_state_indices},
                                      std::pair{"token_state_indices", s.token_state_indices}})
    if (!final_states && !indices.empty())
      fail(name, "expected none: a backward writes no states (dht and dh0 have a row per sequence), got " +
                     std::to_string(indices.size()) + " indices");
  const int64_t count = cu.empty() ? B : int64_t(cu.size()) - 1;
  for (const auto& [name, indices] : {std::pair{"initial_state_indices", s.initial_state_indices},
                                      std::pair{"final_state_indices", s.final_state_indices}})
    if (!indices.empty() && int64_t(indices.size()) != count)
      fail(name, std::string("expected one index per sequence, ") + (cu.empty() ? "B" : "num_seqs") + " = " +
                     std::to_string(count) + ", got " + std::to_string(indices.size()));
  if (!s.token_state_indices.empty() && int64_t(s.token_state_indices.size()) != B * S)
    fail("token_state_indices", "expected one index per token, B * S = " + std::to_string(B * S) + " (the tokens of " +
                                    tensor + "), got " + std::to_string(s.token_state_indices.size()));
}

Axis state_axis(const Sequences& s, int64_t B, bool pool) {
  if (pool) return {"P", -1};
  if (s.cu_seqlens.empty()) return {"B", B};
  return {"num_seqs", int64_t(s.cu_seqlens.size()) - 1};
}

bool writes_pool(const Sequences& s) { return !s.final_state_indices.empty() || !s.token_state_indices.empty(); }

void check_indices(const std::string& name, std::span<const int64_t> indices, const Named& pool) {
  if (indices.empty()) return;
  if (!pool.tensor->present())
    fail(name, std::string("given, but there is no ") + pool.name + " (the pool it indexes)");
  const int64_t P = pool.tensor->shape[0];
  for (size_t i = 0; i < indices.size(); ++i)
    if (indices[i] < -1 || indices[i] >= P)
      fail(name, "expected indices from -1 (none) to P-1 = " + std::to_string(P - 1) + " (the rows of " + pool.name +
                     "), got " + name + "[" + std::to_string(i) + "] = " + std::to_string(indices[i]));
}

void check_pool_writes(const Sequences& s, int64_t B, int64_t S, const Named& initial, const Named& final) {
  check_indices("final_state_indices", s.final_state_indices, final);
  check_indices("token_state_indices", s.token_state_indices, final);
  // Without indices sequence i reads and writes row i alone.
  if (!final.tensor->present() || (s.initial_state_indices.empty() && !writes_pool(s))) return;
  const SequenceLayout rows(s);
  const int64_t count = rows.count(int(B));
  // Each row's writer: its sequence and the index array entry that names the row (none: the
  // sequence's own row, without final_state_indices). Named only in an error.
  struct Writer {
    int64_t sequence = -1;
    const char* array = nullptr;
    int64_t index = 0;
    std::string name() const { return std::string(array) + "[" + std::to_string(index) + "]"; }
  };
  std::vector<Writer> writers(size_t(final.tensor->shape[0]));
  const auto write = [&](int64_t r, const Writer& writer) {
    if (r < 0) return;
    Writer& w = writers[size_t(r)];
    if (w.sequence >= 0)  // two writers means an index array (two sequences' own rows differ)
      fail(writer.array, "expected each row of " + std::string(final.name) + " written once, got " + w.name() +
                             " and " + writer.name() + " both writing row " + std::to_string(r));
    w = writer;
  };
  for (int64_t i = 0; i < count; ++i) {
    write(rows.write_row(i), rows.write_rows.empty() ? Writer{i} : Writer{i, "final_state_indices", i});
    const std::span<const int64_t> tokens = rows.token_rows(i, int(S));
    const int64_t first = tokens.empty() ? 0 : tokens.data() - s.token_state_indices.data();
    for (size_t t = 0; t < tokens.size(); ++t)
      write(tokens[t], Writer{i, "token_state_indices", first + int64_t(t)});
  }
  if (!initial.tensor->present() || !same_view(*initial.tensor, *final.tensor)) return;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = rows.read_row(i);
    if (r < 0) continue;
    const Writer& w = writers[size_t(r)];
    if (w.sequence < 0 || w.sequence == i) continue;
    fail(w.array ? w.array : "initial_state_indices",
         std::string(initial.name) + " and " + final.name +
             " are one pool updated in place, so a row one sequence reads may be written by no other; got row " +
             std::to_string(r) + " read by sequence " + std::to_string(i) + " and written by sequence " +
             std::to_string(w.sequence) + (w.array ? " (" + w.name() + ")" : ""));
  }
}

}  // namespace flat::validate
