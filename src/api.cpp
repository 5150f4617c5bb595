// The public entry points: validate every argument, describe the problem as Params,
// then hand it to the device's backend (backend.h). Nothing is written before validation has passed.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <vector>

#include "backend.h"
#include "bf16.h"
#include "flat/flat.h"
#include "operations.h"
#include "params.h"
#include "validate.h"
#include "variants.h"

namespace flat {

std::string_view dtype_name(DType dtype) { return dtype == DType::bf16 ? "bf16" : "f32"; }

std::string_view activation_name(Activation activation) {
  switch (activation) {
    case Activation::none: return "none";
    case Activation::silu: return "silu";
    case Activation::sigmoid: return "sigmoid";
  }
  return "unknown";
}

Activation parse_activation(std::string_view name) {
  for (Activation a : {Activation::none, Activation::silu, Activation::sigmoid})
    if (activation_name(a) == name) return a;
  throw Error("flat: unknown activation '" + std::string(name) + "' (expected none, silu or sigmoid)");
}

std::string_view solve_name(Solve solve) {
  switch (solve) {
    case Solve::automatic: return "auto";
    case Solve::substitution: return "subst";
    case Solve::blocked: return "blocked";
    case Solve::doubling: return "doubling";
  }
  return "unknown";
}

Solve parse_solve(std::string_view name) {
  for (Solve s : {Solve::automatic, Solve::substitution, Solve::blocked, Solve::doubling})
    if (solve_name(s) == name) return s;
  throw Error("flat: solve: expected auto, subst, blocked or doubling, got '" + std::string(name) + "'");
}

std::string_view precision_name(Precision precision) {
  switch (precision) {
    case Precision::exact: return "exact";
    case Precision::fast: return "fast";
  }
  return "unknown";
}

Precision parse_precision(std::string_view name) {
  std::string names;
  for (Precision p : kPrecisions) {
    if (precision_name(p) == name) return p;
    names += (names.empty() ? "" : " or ") + std::string(precision_name(p));
  }
  throw Error("flat: precision: expected " + names + ", got '" + std::string(name) + "'");
}

Tensor Tensor::contiguous(void* data, DType dtype, std::span<const int64_t> shape) {
  if (shape.size() > 4) throw Error("flat: Tensor::contiguous: at most 4 axes, got " + std::to_string(shape.size()));
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.rank = int(shape.size());
  int d = 0;
  for (int64_t s : shape) t.shape[size_t(d++)] = s;
  int64_t step = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.stride[size_t(i)] = step;
    step *= t.shape[size_t(i)];
  }
  return t;
}

Tensor Tensor::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> stride) {
  if (shape.size() != stride.size() || shape.size() > 4)
    throw Error("flat: Tensor::strided: shape and stride must have the same rank, at most 4");
  Tensor t = contiguous(data, dtype, shape);
  int d = 0;
  for (int64_t s : stride) t.stride[size_t(d++)] = s;
  return t;
}

uint16_t to_bf16(float x) { return f32_to_bf16(x); }
float from_bf16(uint16_t x) { return bf16_to_f32(x); }

namespace {

using validate::Axis;
using validate::check_dtype;
using validate::check_tensor;
using validate::fail;
using validate::shape_string;

constexpr int kMaxHeadDim = 256;

void check_head_dim(const std::string& name, const char* axis, int64_t size) {
  if (size > kMaxHeadDim)
    fail(name, std::string(axis) + " = " + std::to_string(size) + " is not supported (1 to " +
                   std::to_string(kMaxHeadDim) + ")");
}

// The kernels' view of the gate and the update (src/params.h).
GateKind kernel_gate(Gate gate) {
  switch (gate) {
    case Gate::none: return GateKind::none;
    case Gate::per_sequence:
    case Gate::per_token: return GateKind::scalar;
    case Gate::per_channel:
    case Gate::grouped: return GateKind::channel;
  }
  return GateKind::none;
}

Delta kernel_update(Update update) {
  switch (update) {
    case Update::additive: return Delta::none;
    case Update::delta: return Delta::beta;
    case Update::erase_write: return Delta::erase_write;
  }
  return Delta::none;
}

void check_absent(const std::string& name, const Tensor& t, Variant variant, const char* what) {
  if (t.present())
    fail(name, "variant " + std::string(variant_name(variant)) + " takes no " + what + ", got a tensor of shape " +
                   shape_string(t));
}

// A state [B, N, K, V] after the inputs: one row per sequence, or a pool where indices address it.
void check_state(const std::string& name, const Tensor& t, const Params& p, const Sequences& s, bool pool = false) {
  check_tensor(name, t, {validate::state_axis(s, p.B, pool), {"N", p.N}, {"K", p.K}, {"V", p.V}});
  check_dtype(name, t, DType::f32, " (states are fp32)");
}

void check_gradient(const std::string& name, const Tensor& grad, const std::string& input_name,
                    const Tensor& input) {
  std::vector<Axis> axes;
  static const char* kAxisNames[4] = {"d0", "d1", "d2", "d3"};
  for (int d = 0; d < input.rank; ++d) axes.push_back({kAxisNames[d], input.shape[size_t(d)]});
  check_tensor(name, grad, axes);
  check_dtype(name, grad, input.dtype, " (the dtype of " + input_name + ")");
}

}  // namespace

Params describe_inputs(Variant variant, const Inputs& in, const Options& options, bool final_states) {
  const Tensor &q = in.q, &k = in.k, &v = in.v, &g = in.g, &h0 = in.h0;
  Params p;
  check_tensor("q", q, {{"B", validate::kAnyOrEmpty}, {"S", validate::kAnyOrEmpty}, {"Nq", -1}, {"K", -1}});
  const int64_t B = q.shape[0], S = q.shape[1], K = q.shape[3];
  check_head_dim("q", "K", K);
  check_tensor("k", k, {{"B", B}, {"S", S}, {"Nk", -1}, {"K", K}});
  check_tensor("v", v, {{"B", B}, {"S", S}, {"Nv", -1}, {"V", -1}});
  const int64_t V = v.shape[3];
  check_head_dim("v", "V", V);
  validate::check_sequences(in.sequences, "q", B, S, final_states);

  const VariantInfo& vi = info(variant);
  p.gate = kernel_gate(vi.gate);
  p.gate_per_sequence = vi.gate == Gate::per_sequence;
  p.delta = kernel_update(vi.update);
  int64_t Ng = 0;
  switch (vi.gate) {
    case Gate::none: check_absent("g", g, variant, "gate"); break;
    case Gate::per_sequence:
      check_tensor("g", g, {{"Ng", -1}});
      Ng = g.shape[0];
      break;
    case Gate::per_token:
      check_tensor("g", g, {{"B", B}, {"S", S}, {"Ng", -1}});
      Ng = g.shape[2];
      break;
    case Gate::per_channel:
      check_tensor("g", g, {{"B", B}, {"S", S}, {"Ng", -1}, {"K", K}});
      Ng = g.shape[2];
      break;
    case Gate::grouped: {
      // One value per group of G channels: from the option, or the variant's default, or g's
      // last axis.
      const int64_t group = options.gate_group > 0 ? options.gate_group : vi.default_gate_group;
      if (group > 0 && K % group != 0)
        fail("options.gate_group", "G = " + std::to_string(group) + " does not divide K = " + std::to_string(K));
      check_tensor("g", g, {{"B", B}, {"S", S}, {"Ng", -1}, {"K/G", group > 0 ? K / group : -1}});
      if (K % g.shape[3] != 0)
        fail("g", "the last axis (K/G = " + std::to_string(g.shape[3]) + ") must divide K = " + std::to_string(K));
      p.gate_group = int(K / g.shape[3]);
      Ng = g.shape[2];
      break;
    }
  }

  int64_t Nb = 0, Nw = 0;
  if (vi.has_beta()) {
    check_tensor("beta", in.beta, {{"B", B}, {"S", S}, {"Nb", -1}});
    Nb = in.beta.shape[2];
  } else {
    check_absent("beta", in.beta, variant, "beta");
  }
  if (vi.has_erase_write()) {
    check_tensor("b", in.b, {{"B", B}, {"S", S}, {"Nb", -1}, {"K", K}});
    check_tensor("w", in.w, {{"B", B}, {"S", S}, {"Nw", -1}, {"V", V}});
    Nb = in.b.shape[2];
    Nw = in.w.shape[2];
  } else {
    check_absent("b", in.b, variant, "erase gate b");
    check_absent("w", in.w, variant, "write gate w");
  }

  const int64_t N = validate::head_count({{"q", "Nq", q.shape[2]},
                                          {"k", "Nk", k.shape[2]},
                                          {"v", "Nv", v.shape[2]},
                                          {"g", "Ng", Ng},
                                          {vi.has_beta() ? "beta" : "b", "Nb", Nb},
                                          {"w", "Nw", Nw}});
  const auto group = [N](int64_t heads) { return heads > 0 ? int(N / heads) : 1; };
  p.group_q = group(q.shape[2]);
  p.group_k = group(k.shape[2]);
  p.group_v = group(v.shape[2]);
  p.group_g = group(Ng);
  p.group_b = group(Nb);
  p.group_w = group(Nw);
  p.pack = std::gcd(p.group_q, p.group_k);
  if (Ng > 0) p.pack = std::gcd(p.pack, p.group_g);
  if (Nb > 0) p.pack = std::gcd(p.pack, p.group_b);

  const std::span<const int64_t> h0_indices = in.sequences.initial_state_indices;
  if (h0.present()) {
    check_tensor("h0", h0, {validate::state_axis(in.sequences, B, !h0_indices.empty()), {"N", N}, {"K", K}, {"V", V}});
    check_dtype("h0", h0, DType::f32, " (states are fp32)");
  }
  validate::check_indices("initial_state_indices", h0_indices, {"h0", &h0});
  if (options.chunk < 16 || options.chunk > 256 || options.chunk % 16 != 0)
    fail("options.chunk", "expected a multiple of 16 from 16 to 256, got " + std::to_string(options.chunk));
  const float scale = options.scale.value_or(1.0f / std::sqrt(float(K)));
  if (!std::isfinite(scale)) fail("options.scale", "expected a finite number, got " + std::to_string(scale));

  p.B = int(B);
  p.S = int(S);
  p.N = int(N);
  p.K = int(K);
  p.V = int(V);
  p.scale = scale;
  p.chunk = options.chunk;
  p.l2norm_qk = options.l2norm_qk;
  p.streamed_outputs = B * S * N * std::max(K, V) * 2 >= kStreamedOutputBytes;
  p.q = rows_of(q);
  p.k = rows_of(k);
  p.v = rows_of(v);
  p.g = rows_of(g);
  p.h0 = rows_of(h0);
  p.beta = rows_of(in.beta);
  p.b = rows_of(in.b);
  p.w = rows_of(in.w);
  p.solve = options.solve == Solve::automatic ? Solve::doubling : options.solve;
  p.precision = options.precision;
  p.sequences = SequenceLayout(in.sequences);
  return p;
}

Params describe_forward(Variant variant, const ForwardArgs& a, const Options& options) {
  Params p = describe_inputs(variant, a, options, true);
  check_tensor("y", a.y, {{"B", p.B}, {"S", p.S}, {"N", p.N}, {"V", p.V}});
  if (a.ht.present()) check_state("ht", a.ht, p, a.sequences, validate::writes_pool(a.sequences));
  validate::check_pool_writes(a.sequences, p.B, p.S, {"h0", &a.h0}, {"ht", &a.ht});
  validate::check_no_overlap(named_tensors(a, Tensors::outputs), named_tensors(a, Tensors::inputs), {{"ht", "h0"}});
  p.y = rows_of(a.y);
  p.ht = rows_of(a.ht);
  return p;
}

Params describe_backward(Variant variant, const BackwardArgs& a, const Options& options) {
  Params p = describe_inputs(variant, a, options, false);
  check_tensor("dy", a.dy, {{"B", p.B}, {"S", p.S}, {"N", p.N}, {"V", p.V}});
  if (a.dht.present()) check_state("dht", a.dht, p, a.sequences);
  // The gradient of each input (q, k, v, and the optional g, beta, b, w): shaped as it, required
  // with it, refused without it.
  for (const TensorField<BackwardArgs>& field : TensorTable<BackwardArgs>::fields) {
    if (!field.output || field.shape != OutputShape::input) continue;
    const char* input_name = field_name(field.input);
    if ((a.*field.input).present()) {
      check_gradient(field.name, a.*field.member, input_name, a.*field.input);
    } else if ((a.*field.member).present()) {
      fail(field.name, std::string("given, but there is no ") + input_name);
    }
  }
  if (a.dh0.present()) check_state("dh0", a.dh0, p, a.sequences);
  validate::check_no_overlap(named_tensors(a, Tensors::outputs), named_tensors(a, Tensors::inputs),
                             {{"dh0", "dht"}});
  p.dy = rows_of(a.dy);
  p.dht = rows_of(a.dht);
  p.dq = rows_of(a.dq);
  p.dk = rows_of(a.dk);
  p.dv = rows_of(a.dv);
  p.dg = rows_of(a.dg);
  p.dh0 = rows_of(a.dh0);
  p.dbeta = rows_of(a.dbeta);
  p.db = rows_of(a.db);
  p.dw = rows_of(a.dw);
  return p;
}

namespace {

// Values, once every shape is known to fit, on the tensors' device: a gate above 0 would grow the
// state without bound, and a non-finite gate, strength or initial state would end in NaN
// everywhere it reaches, so these are refused. Activations (q, k, v, dy, dht) are not scanned:
// their NaN and infinities propagate, as in any training framework (README, "Errors").
// Options::check_values skips the scan.
// The inputs whose values are checked, and how, are their table's (TensorField::values).
template <class Args>
void check_input_values(const Backend& backend, const Args& args, const Options& options,
                        const ExecutionContext& context) {
  if (!options.check_values) return;
  const std::span<const int64_t> indices = args.sequences.initial_state_indices;
  for (const TensorField<Args>& field : TensorTable<Args>::fields) {
    if (!field.values) continue;
    const Tensor& t = args.*field.member;
    if (field.member != &Args::h0 || indices.empty()) {
      backend.check_values(field.name, t, *field.values, context);
      continue;
    }
    // A pool: only the rows the call reads, each once, as "h0[row]" (the free rows of a serving
    // pool may hold anything).
    std::vector<bool> scanned(size_t(t.shape[0]));
    for (const int64_t row : indices) {
      if (row < 0 || scanned[size_t(row)]) continue;
      scanned[size_t(row)] = true;
      Tensor state = t;
      state.data = static_cast<char*>(t.data) + row * t.stride[0] * int64_t(sizeof(float));
      state.rank = 3;
      std::copy(t.shape.begin() + 1, t.shape.end(), state.shape.begin());
      std::copy(t.stride.begin() + 1, t.stride.end(), state.stride.begin());
      state.shape[3] = state.stride[3] = 0;
      backend.check_values((std::string(field.name) + "[" + std::to_string(row) + "]").c_str(), state, *field.values,
                           context);
    }
  }
}

}  // namespace

void forward(Variant variant, const ForwardArgs& args, const Options& options, const ExecutionContext& context) {
  const Params p = describe_forward(variant, args, options);
  const Backend& backend = backend_for_call(named_tensors(args, Tensors::all), context);
  check_input_values(backend, args, options, context);
  backend.forward(p, context);
}

void backward(Variant variant, const BackwardArgs& args, const Options& options, const ExecutionContext& context) {
  const Params p = describe_backward(variant, args, options);
  const Backend& backend = backend_for_call(named_tensors(args, Tensors::all), context);
  check_input_values(backend, args, options, context);
  backend.backward(p, context);
}

}  // namespace flat
