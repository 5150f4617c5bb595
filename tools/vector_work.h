// `flat bench`'s vector work: a pass's time with its chunk products taken out
// (tools/vector_work_stages.h), the work beside the products that a faster product unit leaves in
// place; and its product census: a pass's product work by the unit each product runs on. Timing
// and counting only: the results are wrong. It lives in the tool, never in the library: no target
// list, FLAT_ISA or call of the library reaches it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>

#include "cpu/targets.h"

namespace flat::tool {

// `target` with its chunk stages' products replaced by a kernel that only zeroes C where the
// product would write it (its convolution, norm and microkernel table as they are); empty for a
// target built without such stages (the software models, whose time is the model's, and every
// target under the sanitizers, whose build compiles none).
std::optional<cpu::Target> vector_work_target(const cpu::Target& target);

// Multiply-adds a pass asked of a target's chunk products and diagonal blocks: those the target
// runs on its product unit (the tiles, the bf16 dot products: any product for which its table
// chooses another kernel than for fp32 operands at exact precision) and those on fp32 FMA (the
// rest, and the diagonal blocks).
struct ProductCensus {
  int64_t on_unit = 0, on_fma = 0;
  // The share of the work on fp32 FMA (1 for a pass of no product work).
  double fma_share() const { return on_unit + on_fma > 0 ? double(on_fma) / double(on_unit + on_fma) : 1.0; }
};

// The census of one run of `pass` on `target` (cpu::forward_on or backward_on with the target it
// is given), its products counted and zeroed; empty where vector_work_target is. One census at a
// time: the counts are the process's.
std::optional<ProductCensus> product_census(const cpu::Target& target,
                                            const std::function<void(const cpu::Target&)>& pass);

// The census's counters, which the counting stages of every target add to.
extern std::atomic<int64_t> census_on_unit, census_on_fma;

}  // namespace flat::tool
