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

#include "flat/flat.h"
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
struct Config : RunArgs {
  Variant variant = Variant::la;
  Options options;
};

Config parse_args(const std::vector<std::string>& args) {
  Config config;
  bool has_variant = false;
  const auto option = [&](const std::string& arg, const OptionValue& value) {
    if (arg == "--chunk") {
      config.options.chunk = parse_number<int>(arg, value());
    } else if (arg == "--scale") {
      config.options.scale = parse_number<float>(arg, value());
    } else if (arg == "--l2norm") {
      config.options.l2norm_qk = true;
    } else if (arg == "--solve") {
      config.options.solve = parse_solve(value());
    } else if (arg == "--gate-group") {
      config.options.gate_group = parse_number<int>(arg, value());
      if (config.options.gate_group < 1) throw RunError(arg + ": expected a positive integer");
    } else {
      return false;
    }
    return true;
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

  ForwardArgs forward_args;
  forward_args.q = qb.view();
  forward_args.k = kb.view();
  forward_args.v = vb.view();
  forward_args.g = view(gb);
  forward_args.h0 = view(h0b);
  forward_args.beta = view(betab);
  forward_args.b = view(bb);
  forward_args.w = view(wb);
  forward_args.y = y.view();
  forward_args.ht = ht.view();
  forward_args.sequences = sequences.forward();
  forward(config.variant, forward_args, config.options, config.context);

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

  BackwardArgs backward_args{forward_args};
  backward_args.sequences = sequences.backward();
  backward_args.dy = view(dyb);
  backward_args.dht = view(dhtb);
  backward_args.dq = dq.view();
  backward_args.dk = dk.view();
  backward_args.dv = dv.view();
  backward_args.dg = view(dg);
  backward_args.dh0 = view(dh0);
  backward_args.dbeta = view(dbeta);
  backward_args.db = view(db);
  backward_args.dw = view(dw);
  backward(config.variant, backward_args, config.options, config.context);

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
  return run_and_write(
      [&] {
        const Config config = parse_args(args);
        return RunResult{config.out, compute(config)};
      },
      out, err);
}

}  // namespace flat::tool
