// What each variant is made of, in one table: its gate, its state update, the tensors it takes
// and their shapes. The API's validation, `flat run`, `flat bench` (whose shapes and model of the
// work live in tools/bench_model.h), the float64 oracle and the tests all read it here, and none
// of them switches on a variant. Adding a variant whose math exists (a gate and an update the
// kernels have) takes its name in flat::Variant and a row of kVariants (src/variants.cpp);
// docs/variants.md states the math of each.
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
  int default_gate_group = 0;
  const char* summary;  // the update in one line

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

}  // namespace flat
