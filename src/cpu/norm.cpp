// Drivers of the output norm and gate (norm.h).
#include "cpu/norm.h"

#include <algorithm>
#include <vector>

#include "cpu/buffer.h"

namespace flat::cpu {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t norm_block_rows(int D) { return std::max<int64_t>(1, kNormBlockElements / D); }

void norm_gate_forward(const NormGateParams& p, const Run& run) {
  const NormGateKernels& kernels = run.target.norm;
  const int64_t block = norm_block_rows(p.D), blocks = ceil_div(p.rows(), block);
  run_ranges(run, blocks, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(sizeof(float) * kernels.workspace_floats(p.D));
    kernels.forward(p, begin * block, std::min(p.rows(), end * block), workspace.floats());
  });
}

void norm_gate_backward(const NormGateParams& p, const Run& run) {
  const NormGateKernels& kernels = run.target.norm;
  const int64_t block = norm_block_rows(p.D), blocks = ceil_div(p.rows(), block);
  const size_t weights = size_t(p.weight_rows) * size_t(p.D);
  AlignedBuffer partials(sizeof(float) * weights * size_t(blocks));
  run_ranges(run, blocks, [&](int64_t begin, int64_t end) {
    AlignedBuffer workspace(sizeof(float) * kernels.workspace_floats(p.D));
    for (int64_t i = begin; i < end; ++i)
      kernels.backward(p, i * block, std::min(p.rows(), (i + 1) * block), workspace.floats(),
                       partials.floats() + weights * size_t(i));
  });
  // dweight: the blocks' fp32 partial sums added in float64 in block order, whatever the threads.
  std::vector<double> sum(weights, 0.0);
  for (int64_t i = 0; i < blocks; ++i) {
    const float* partial = partials.floats() + weights * size_t(i);
    for (size_t j = 0; j < weights; ++j) sum[j] += double(partial[j]);
  }
  for (size_t j = 0; j < weights; ++j) p.dweight[j] = float(sum[j]);
}

}  // namespace flat::cpu
