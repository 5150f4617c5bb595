#include "variants.h"

#include <string>

namespace flat {
namespace {

// The table. The math of each row: docs/variants.md.
constexpr VariantInfo kVariants[] = {
    {.variant = Variant::la, .name = "la", .gate = Gate::none, .update = Update::additive, .summary = "H = H + k v^T"},
    {.variant = Variant::retnet,
     .name = "retnet",
     .gate = Gate::per_sequence,
     .update = Update::additive,
     .summary = "H = gamma H + k v^T, gamma per head"},
    {.variant = Variant::mamba2,
     .name = "mamba2",
     .gate = Gate::per_token,
     .update = Update::additive,
     .summary = "H = exp(g_t) H + k v^T, g_t per head"},
    {.variant = Variant::gla,
     .name = "gla",
     .gate = Gate::per_channel,
     .update = Update::additive,
     .summary = "H = Diag(exp(g_t)) H + k v^T"},
    {.variant = Variant::deltanet,
     .name = "deltanet",
     .gate = Gate::none,
     .update = Update::delta,
     .summary = "H = (I - beta k k^T) H + beta k v^T"},
    {.variant = Variant::gated_deltanet,
     .name = "gated_deltanet",
     .gate = Gate::per_token,
     .update = Update::delta,
     .summary = "H = exp(g_t) (I - beta k k^T) H + beta k v^T"},
    {.variant = Variant::kda,
     .name = "kda",
     .gate = Gate::grouped,
     .update = Update::delta,
     .summary = "H = (I - beta k k^T) Diag(exp(g_t)) H + beta k v^T"},
    {.variant = Variant::gdn2,
     .name = "gdn2",
     .gate = Gate::grouped,
     .update = Update::erase_write,
     .summary = "H' = Diag(exp(g_t)) H; H = H' + k (w * v - H'^T (b * k))^T"},
    {.variant = Variant::sla,
     .name = "sla",
     .gate = Gate::grouped,
     .update = Update::delta,
     .default_gate_group = 64,
     .summary = "kda with one gate per 64 channels, value heads sharing keys"},
};

}  // namespace

std::span<const VariantInfo> all_variants() { return kVariants; }

const VariantInfo& info(Variant variant) {
  for (const VariantInfo& v : kVariants)
    if (v.variant == variant) return v;
  throw Error("flat: unknown variant " + std::to_string(int(variant)));
}

std::string_view variant_name(Variant variant) { return info(variant).name; }

std::vector<VariantSummary> variant_summaries() {
  static constexpr std::string_view kGates[] = {"none", "per_sequence", "per_token", "per_channel", "grouped"};
  static constexpr std::string_view kUpdates[] = {"additive", "delta", "erase_write"};
  std::vector<VariantSummary> out;
  for (const VariantInfo& v : kVariants)
    out.push_back({v.variant, v.name, kGates[int(v.gate)], kUpdates[int(v.update)], v.default_gate_group});
  return out;
}

Variant parse_variant(std::string_view name) {
  std::string names;
  for (const VariantInfo& v : kVariants) {
    if (v.name == name) return v.variant;
    names += names.empty() ? "" : ", ";
    names += v.name;
  }
  throw Error("flat: unknown variant '" + std::string(name) + "' (expected one of " + names + ")");
}

int64_t VariantInfo::gate_width(int64_t K, int64_t G) const {
  switch (gate) {
    case Gate::none: return 0;
    case Gate::per_sequence:
    case Gate::per_token: return 1;
    case Gate::per_channel: return K;
    case Gate::grouped: return K / G;
  }
  return 0;
}

std::vector<int64_t> VariantInfo::gate_shape(int64_t B, int64_t S, int64_t Ng, int64_t K, int64_t G) const {
  switch (gate) {
    case Gate::none: return {};
    case Gate::per_sequence: return {Ng};
    case Gate::per_token: return {B, S, Ng};
    case Gate::per_channel:
    case Gate::grouped: return {B, S, Ng, gate_width(K, G)};
  }
  return {};
}

std::vector<std::string> VariantInfo::gate_axes() const {
  switch (gate) {
    case Gate::none: return {};
    case Gate::per_sequence: return {"Ng"};
    case Gate::per_token: return {"B", "S", "Ng"};
    case Gate::per_channel: return {"B", "S", "Ng", "K"};
    case Gate::grouped: return {"B", "S", "Ng", "K/G"};
  }
  return {};
}

}  // namespace flat
