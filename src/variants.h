// What each variant is made of, in one table: its gate, its state update, the tensors it takes
// and their shapes, and the work a pass does (FLOPs and bytes). The API's validation, `flat run`,
// `flat bench`, the float64 oracle and the tests all read it here, and none of them switches on a
// variant. Adding a variant whose math exists (a gate and an update the kernels have) takes its
// name in flat::Variant and a row of kVariants (src/variants.cpp); docs/variants.md states the
// math of each.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "flat/flat.h"

namespace flat {

// How the forget gate is shaped as the caller stores g (log-decays, <= 0).
enum class Gate {
  none,          // no gate
  per_sequence,  // g [Ng]: one per head, the same for every batch and token
  per_token,     // g [B, S, Ng]: one per head and token
  per_channel,   // g [B, S, Ng, K]: one per channel
  grouped,       // g [B, S, Ng, K / G]: one per group of G consecutive channels
};

// The state update.
enum class Update {
  additive,     // H_t = D_t H_{t-1} + k_t v_t^T
  delta,        // the delta rule with one write strength beta [B, S, Nb] per head and token
  erase_write,  // the delta rule with an erase gate b [B, S, Nb, K] and a write gate w [B, S, Nw, V]
};

struct VariantInfo {
  Variant variant;
  const char* name;
  Gate gate;
  Update update;
  // Gate::grouped: channels per gate value when Options::gate_group is 0 (0: from g's last axis).
  int default_gate_group;
  const char* summary;  // the update in one line
  // The shape `flat bench` measures the variant at, where it is not the bench's: keys this wide
  // (0: the bench's K), shared by this many value heads each (SLA-R4: K = 256, 4 value heads).
  int bench_K, bench_value_heads;

  bool has_gate() const { return gate != Gate::none; }
  bool has_beta() const { return update == Update::delta; }
  bool has_erase_write() const { return update == Update::erase_write; }
  bool is_delta() const { return update != Update::additive; }
  // Gate values per head and token for K channels and G channels per value: 0, 1, K or K / G.
  int64_t gate_width(int64_t K, int64_t G) const;
  // g's shape (empty without a gate).
  std::vector<int64_t> gate_shape(int64_t B, int64_t S, int64_t Ng, int64_t K, int64_t G) const;
  // The names of g's axes, as messages print them: "[Ng]", "[B, S, Ng]", ...
  std::vector<std::string> gate_axes() const;
};

// Every variant, in the order of flat::Variant.
std::span<const VariantInfo> all_variants();
const VariantInfo& info(Variant variant);

// The work of one pass, as `flat bench` reports it (docs/performance.md, "FLOPs" and "Bytes").
// Items are (batch, key head), each with R value heads side by side (R = 1 but for sla).
struct ProblemSize {
  int64_t B = 1, S = 1, N = 1, K = 1, V = 1;
  int64_t R = 1;       // value heads per key head: q, k, g, beta at N / R heads
  int64_t G = 1;       // channels per gate value (Gate::grouped)
  int chunk = 64;
  DType dtype = DType::bf16;  // of q, k, v, beta / b / w, y and their gradients; g, dg are fp32

  int64_t key_heads() const { return N / R; }
};

// FLOPs of the chunkwise algorithm, a multiply-add as 2, no padding counted.
double chunk_flops(const VariantInfo& v, const ProblemSize& w, bool backward);
// FLOPs of the step-by-step recurrence.
double recurrent_flops(const VariantInfo& v, const ProblemSize& w, bool backward);
// Bytes a pass must move: every input read once and every output written once.
double io_bytes(const VariantInfo& v, const ProblemSize& w, bool backward);

}  // namespace flat
