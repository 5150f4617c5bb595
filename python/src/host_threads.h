// Parallel-fors of host frameworks, for flat::ExecutionContext::parallel_for.
#pragma once

#include <functional>

namespace flat::python {

// Runs the parts on the OpenMP runtime the process has loaded, in one parallel region. PyTorch
// loads its own libgomp (soname libgomp.so.1) and runs its intra-op work on it, so once torch is
// imported these are PyTorch's intra-op threads, and torch.set_num_threads sizes them.
void openmp_parallel_for(int parts, const std::function<void(int)>& run_part);

// The number of threads the last such region ran on (the tests check that torch's thread count
// is what a call used).
int last_openmp_team();

}  // namespace flat::python
