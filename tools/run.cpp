// `flat run`: reads one problem from .npy files (with its sequences and state pool, run_io.h's
// SequenceFiles), runs forward (and backward when dy.npy is given) and writes the results as .npy
// files. Every file is read and checked and every kernel has run before the output directory is
// even created, so a rejected run leaves nothing behind.
#include "run.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include "flat/call.h"
#include "npy.h"
#include "params.h"
#include "variants.h"
#include "run_io.h"
#include "validate.h"
#include "run_conv.h"
#include "run_norm.h"

namespace flat::tool {
namespace {

namespace fs = std::filesystem;

// dtype: of q, k, v, beta, b, w, dy and of y and their gradients; gates and states stay fp32.
// The options are the library's, by its names (flat/call.h), parsed by its parser.
struct Config : RunArgs {
  Variant variant = Variant::la;
  NamedOptions named_options;
  Options options;
};

// The command line's options and the library's names for them (--l2norm a flag, the others take
// a value).
constexpr std::pair<std::string_view, std::string_view> kOptionNames[] = {
    {"--chunk", "chunk"}, {"--scale", "scale"}, {"--l2norm", "l2norm_qk"}, {"--solve", "solve"},
    {"--precision", "precision"}, {"--gate-group", "gate_group"}};

Config parse_args(const std::vector<std::string>& args) {
  Config config;
  bool has_variant = false;
  const auto option = [&](const std::string& arg, const OptionText& value) {
    for (const auto& [flag, name] : kOptionNames) {
      if (arg != flag) continue;
      config.named_options.emplace_back(std::string(name), arg == "--l2norm" ? flat::OptionValue(true)
                                                                             : flat::OptionValue(value()));
      return true;
    }
    return false;
  };
  const auto positional = [&](const std::string& arg) {
    if (has_variant) throw RunError("unexpected argument '" + arg + "'");
    config.variant = parse_variant(arg);
    has_variant = true;
  };
  static_cast<RunArgs&>(config) = parse_run_args(args, option, positional);
  if (!has_variant) {
    std::string names;
    for (const VariantInfo& v : all_variants()) names += (names.empty() ? "" : ", ") + std::string(v.name);
    throw RunError("missing VARIANT (" + names + ")");
  }
  config.options = recurrence_options(config.named_options);
  // A group of channels has at least one; the library's 0 (the default) is not given as a size.
  for (const auto& [name, value] : config.named_options)
    if (name == "gate_group" && config.options.gate_group < 1) throw RunError("--gate-group: expected a positive integer");
  return config;
}

// g.npy in the variant's layout (src/variants.h). A variant without a gate refuses a g.npy that
// is there (it would not read it).
std::optional<NpyArray> read_gate(const fs::path& dir, const VariantInfo& variant, const Options& options, int64_t B,
                                  int64_t S, int64_t K) {
  switch (variant.gate) {
    case Gate::none:
      refuse_unread(dir, "g.npy", std::string(variant.name) + " takes no gate");
      return std::nullopt;
    case Gate::per_sequence: return read_input(dir, "g.npy", {{"Ng"}});
    case Gate::per_token: return read_input(dir, "g.npy", {{"B", B}, {"S", S}, {"Ng"}});
    case Gate::per_channel: return read_input(dir, "g.npy", {{"B", B}, {"S", S}, {"Ng"}, {"K", K}});
    case Gate::grouped: {
      // One value per group of G channels: G from --gate-group, or the variant's default, or
      // g.npy's last axis.
      const int64_t group = options.gate_group > 0 ? options.gate_group : variant.default_gate_group;
      if (group > 0 && K % group != 0)
        throw RunError("--gate-group: G = " + std::to_string(group) +
                       (options.gate_group > 0 ? "" : std::string(" (") + variant.name + "'s default)") +
                       " does not divide K = " + std::to_string(K));
      NpyArray g = read_input(dir, "g.npy", {{"B", B}, {"S", S}, {"Ng"}, {"K/G", group > 0 ? K / group : -1}});
      if (K % g.shape[3] != 0)
        throw RunError("g.npy: the last axis (K/G = " + std::to_string(g.shape[3]) + ") must divide K = " +
                       std::to_string(K));
      return g;
    }
  }
  return std::nullopt;
}

// The delta rule's strengths: beta.npy (B, S, Nb), or the erase gate b.npy (B, S, Nb, K) and the
// write gate w.npy (B, S, Nw, V).
struct Strengths {
  std::optional<NpyArray> beta, b, w;
};

Strengths read_strengths(const fs::path& dir, const VariantInfo& variant, int64_t B, int64_t S, int64_t K,
                         int64_t V) {
  Strengths strengths;
  const std::string name(variant.name);
  if (variant.has_beta()) strengths.beta = read_input(dir, "beta.npy", {{"B", B}, {"S", S}, {"Nb"}});
  else refuse_unread(dir, "beta.npy", name + " takes no strength beta");
  if (variant.has_erase_write()) {
    strengths.b = read_input(dir, "b.npy", {{"B", B}, {"S", S}, {"Nb"}, {"K", K}});
    strengths.w = read_input(dir, "w.npy", {{"B", B}, {"S", S}, {"Nw"}, {"V", V}});
  } else {
    refuse_unread(dir, "b.npy", name + " takes no erase gate b");
    refuse_unread(dir, "w.npy", name + " takes no write gate w");
  }
  return strengths;
}

// Reads and checks the inputs, runs the kernels and returns the outputs, writing nothing.
std::vector<Output> compute(const Config& config) {
  const fs::path& dir = config.in;
  NpyArray q = read_input(dir, "q.npy", {{"B"}, {"S"}, {"Nq"}, {"K"}});
  const int64_t B = q.shape[0], S = q.shape[1], K = q.shape[3];
  NpyArray k = read_input(dir, "k.npy", {{"B", B}, {"S", S}, {"Nk"}, {"K", K}});
  NpyArray v = read_input(dir, "v.npy", {{"B", B}, {"S", S}, {"Nv"}, {"V"}});
  const int64_t V = v.shape[3];
  const VariantInfo& variant = info(config.variant);
  std::optional<NpyArray> g = read_gate(dir, variant, config.options, B, S, K);
  Strengths strengths = read_strengths(dir, variant, B, S, K, V);

  // Every head count divides N, the largest (the spec's head sharing).
  const int64_t Ng = !g ? 0 : g->shape.size() == 1 ? g->shape[0] : g->shape[2];
  const int64_t Nbeta = strengths.beta ? strengths.beta->shape[2] : 0;
  const int64_t Nb = strengths.b ? strengths.b->shape[2] : 0, Nw = strengths.w ? strengths.w->shape[2] : 0;
  const int64_t N = validate::head_count({{"q.npy", "Nq", q.shape[2]},
                                          {"k.npy", "Nk", k.shape[2]},
                                          {"v.npy", "Nv", v.shape[2]},
                                          {"g.npy", "Ng", Ng},
                                          {"beta.npy", "Nb", Nbeta},
                                          {"b.npy", "Nb", Nb},
                                          {"w.npy", "Nw", Nw}});

  const SequenceFiles sequences = read_sequences(dir, B, S, "h0.npy", "ht.npy");
  const std::vector<int64_t> state_row{N, K, V};
  std::optional<NpyArray> h0 =
      read_optional(dir, "h0.npy", {sequences.initial_state_axis(), {"N", N}, {"K", K}, {"V", V}});
  std::optional<NpyArray> dy = read_optional(dir, "dy.npy", {{"B", B}, {"S", S}, {"N", N}, {"V", V}});
  if (!dy) refuse_unread(dir, "dht.npy", "the gradient of ht is read by a backward, which runs with dy.npy");
  std::optional<NpyArray> dht =
      dy ? read_optional(dir, "dht.npy", {sequences.sequence_axis(), {"N", N}, {"K", K}, {"V", V}}) : std::nullopt;

  const DType dtype = config.dtype;
  Buffer qb(std::move(q), dtype), kb(std::move(k), dtype), vb(std::move(v), dtype);
  std::optional<Buffer> gb = buffer(std::move(g), DType::f32), h0b = buffer(std::move(h0), DType::f32);
  std::optional<Buffer> betab = buffer(std::move(strengths.beta), dtype), bb = buffer(std::move(strengths.b), dtype),
                        wb = buffer(std::move(strengths.w), dtype);
  Buffer y({B, S, N, V}, dtype), ht = sequences.final_states(h0b, state_row);

  const std::vector<std::pair<std::string, Tensor>> inputs{{"q", qb.view()},         {"k", kb.view()},
                                                            {"v", vb.view()},         {"g", view(gb)},
                                                            {"h0", view(h0b)},        {"beta", view(betab)},
                                                            {"b", view(bb)},          {"w", view(wb)}};
  NamedCall forward_call{Operation::forward, config.variant, inputs, sequences.forward(), config.named_options};
  forward_call.tensors.insert(forward_call.tensors.end(), {{"y", y.view()}, {"ht", ht.view()}});
  call(forward_call, config.context);

  std::vector<Output> outputs;
  outputs.push_back({"y.npy", std::move(y)});
  outputs.push_back({"ht.npy", std::move(ht)});
  if (!dy) return outputs;

  std::optional<Buffer> dyb = buffer(std::move(dy), dtype), dhtb = buffer(std::move(dht), DType::f32);
  // Gradients take their input's shape and dtype.
  Buffer dq(qb.shape, dtype), dk(kb.shape, dtype), dv(vb.shape, dtype);
  std::optional<Buffer> dg = gradient_of(gb), dbeta = gradient_of(betab), db = gradient_of(bb), dw = gradient_of(wb);
  // A row per sequence, also when h0 is a pool: the gradient of each sequence's initial state.
  std::optional<Buffer> dh0;
  if (h0b) dh0.emplace(sequences.per_sequence(state_row), DType::f32);

  NamedCall backward_call{Operation::backward, config.variant, inputs, sequences.backward(), config.named_options};
  backward_call.tensors.insert(backward_call.tensors.end(),
                               {{"dy", view(dyb)}, {"dht", view(dhtb)}, {"dq", dq.view()}, {"dk", dk.view()},
                                {"dv", dv.view()}, {"dg", view(dg)}, {"dh0", view(dh0)}, {"dbeta", view(dbeta)},
                                {"db", view(db)}, {"dw", view(dw)}});
  call(backward_call, config.context);

  outputs.push_back({"dq.npy", std::move(dq)});
  outputs.push_back({"dk.npy", std::move(dk)});
  outputs.push_back({"dv.npy", std::move(dv)});
  for (auto& [name, grad] : {std::pair{"dg.npy", &dg}, std::pair{"dbeta.npy", &dbeta}, std::pair{"db.npy", &db},
                             std::pair{"dw.npy", &dw}, std::pair{"dh0.npy", &dh0}})
    if (*grad) outputs.push_back({name, std::move(**grad)});
  return outputs;
}

}  // namespace

int run_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const std::string variant = run_variant(args);
  if (variant == "conv") return run_conv_command(args, out, err);
  if (variant == "norm_gate") return run_norm_gate_command(args, out, err);
  return run_and_write(args, parse_args, compute, out, err);
}

}  // namespace flat::tool
