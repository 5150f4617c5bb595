// flat: fused chunkwise kernels for linear attention.
//
// The public API: non-owning tensor views, the variants, and forward/backward entry points.
// What each variant computes is stated in docs/variants.md; docs/algorithm.md explains how the
// CPU kernels compute it, docs/architecture.md where the code for each part lives.
//
// Errors: every entry point validates all of its arguments before it writes anything and throws
// flat::Error (a std::invalid_argument) whose message names the tensor, what was expected and
// what came. On an error no output is touched. Validated besides shapes, dtypes and strides:
// gates g finite and <= 0, beta, b, w and h0 finite (Options::check_values); outputs sharing no
// memory with each other, with an input or with themselves, except a state updated in place (ht
// the very same view as h0, dh0 as dht; the convolution's state as state0). NaN and infinities
// in q, k, v, dy, dht propagate: every output that depends on one is non-finite.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace flat {

class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class DType { f32, bf16 };

std::string_view dtype_name(DType dtype);

// Where a tensor's memory is. Every tensor of a call is on one device, whose backend runs it
// (this build: the CPU).
enum class Device { cpu, cuda };

std::string_view device_name(Device device);

// A strided view of up to 4 dimensions. Strides count elements, not bytes. The last axis must
// be contiguous (stride 1) unless it has one element; the other strides are free (an axis of one
// element may have any stride, as it is never stepped), so q, k and v can be column blocks of
// one fused projection [B, S, 3*N*K] without a copy. A default-constructed Tensor (rank 0)
// stands for an absent optional tensor.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int rank = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> stride{};

  bool present() const { return rank > 0; }

  // Row-major contiguous view.
  static Tensor contiguous(void* data, DType dtype, std::span<const int64_t> shape);
  static Tensor contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape) {
    return contiguous(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()));
  }
  static Tensor strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                        std::initializer_list<int64_t> stride);
};

// Every variant reads the state after its update: y_t = scale * H_t^T q_t.
//
// The additive family: H_t = Diag(exp(g_t)) H_{t-1} + k_t v_t^T.
//   la      no gate
//   retnet  g: [Ng], log gamma per head, constant over batch and time
//   mamba2  g: [B, S, Ng], one log-decay per head and token
//   gla     g: [B, S, Ng, K], one log-decay per channel
//
// The delta-rule family: H' = Diag(exp(g_t)) H_{t-1}; H_t = H' + k_t (w_t * v_t - H'^T (b_t * k_t))^T
// with write strength beta [B, S, Nb] (b = w = beta) except for gdn2.
//   deltanet        no gate
//   gated_deltanet  g: [B, S, Ng], one log-decay per head and token
//   kda             g: [B, S, Ng, K / G], per channel (G = 1) or per group of G channels
//   gdn2            g as kda; erase gate b [B, S, Nb, K] and write gate w [B, S, Nw, V] instead of beta
//   sla             kda with the gate per group of G = 64 channels by default, built for K = 256
//                   with value heads sharing one key head (Nv = R * Nk)
enum class Variant { la, retnet, mamba2, gla, deltanet, gated_deltanet, kda, gdn2, sla };

std::string_view variant_name(Variant variant);
// Throws flat::Error for an unknown name.
Variant parse_variant(std::string_view name);

// A variant as the library's table of variants describes it, for front ends that build their
// functions from it: its name, its gate's shape ("none", "per_sequence", "per_token",
// "per_channel", "grouped"), its state update ("additive", "delta", "erase_write") and, for a
// grouped gate, the channels per gate value when Options::gate_group is 0 (0: from g's last axis).
struct VariantSummary {
  Variant variant;
  std::string_view name, gate, update;
  int default_gate_group;
};
// Every variant's, in the order of flat::Variant.
std::vector<VariantSummary> variant_summaries();

// The CPU target this process's calls run on: FLAT_ISA's, or the best this CPU runs (the
// targets: docs/algorithm.md). Throws flat::Error naming FLAT_ISA for a target this build or this
// CPU does not have.
std::string_view cpu_target();

// How the delta family inverts (I + L) per chunk (all exact; see docs/algorithm.md).
enum class Solve {
  automatic,     // the fastest accurate one, measured: doubling
  substitution,  // forward substitution, row by row
  blocked,       // 16 x 16 diagonal blocks by substitution, merged with matrix products
  doubling,      // block doubling: each 2b-block inverse from its b-blocks' with matrix products
};

// "auto", "subst", "blocked", "doubling": the names every front end takes (flat.torch, flat.jax,
// flat run, flat bench).
std::string_view solve_name(Solve solve);
// Throws flat::Error for an unknown name.
Solve parse_solve(std::string_view name);

// How exactly the chunk products treat operands that are not bf16 values (decayed rows, scores,
// states, gradients, fp32 inputs), as XLA states matmul precision on a bf16 matrix unit
// (docs/algorithm.md, "Precision"):
enum class Precision {
  exact,  // as fp32 products (within 2^-14 of them for bf16 outputs, far below their rounding): a
          // bf16 unit takes each such operand as a sum of bf16 parts
  fast,   // one bf16 rounding of each operand, fp32 sums, as GPU kernels do, where a target has a
          // bf16 unit (amx, avx512_bf16); the others compute exactly
};

inline constexpr Precision kPrecisions[] = {Precision::exact, Precision::fast};

// "exact", "fast": the names every front end takes.
std::string_view precision_name(Precision precision);
// Throws flat::Error for an unknown name.
Precision parse_precision(std::string_view name);

// What a call computes, beside its tensors.
struct Options {
  std::optional<float> scale;  // default K^-1/2
  int chunk = 64;              // chunk length C: a multiple of 16 in [16, 256]
  bool l2norm_qk = false;      // L2-normalise q and k inside the kernel (eps 1e-6, as FLA)
  Solve solve = Solve::automatic;
  Precision precision = Precision::exact;
  // Channels per gate value G for kda, gdn2, sla: 0 takes it from g's last axis (K / G values);
  // otherwise g's last axis must be K / gate_group.
  int gate_group = 0;
  // Scan g (finite, <= 0), beta, b, w and h0 (finite) before running and refuse a value outside
  // that contract. A caller that guarantees them (a serving loop passing back the states the
  // library wrote, gates from a log-sigmoid) may skip the scan: it reads h0 once more, about 15%
  // of a one-token decode step. Unchecked bad values propagate into NaN and Inf outputs.
  bool check_values = true;
};

// How a call runs, beside what it computes: the threads it may use and, for a host framework that
// has a thread pool of its own (PyTorch's intra-op threads, a JAX runtime), the parallel-for to run
// them on, so that the two do not oversubscribe the cores. Results do not depend on either.
struct ExecutionContext {
  int threads = 0;  // 0: all hardware threads; at most 4 per hardware thread are used
  // Runs run_part(0) .. run_part(parts - 1), each once, on the host's threads (at once or not),
  // and returns when all have returned; parts is at most `threads`. Empty: flat's own worker
  // threads.
  std::function<void(int parts, const std::function<void(int part)>& run_part)> parallel_for;
  // Subnormal numbers flushed to zero, as inputs and as results (the CPU's DAZ and FTZ modes),
  // on every thread for the span of the call's work, each thread's own mode restored after: on
  // Intel cores every operation on a subnormal costs a microcode assist, and gates as strong as
  // real models' make a chunk's decays underflow through the subnormal range (the chunked passes
  // ran 8-18x slower). What it means for the results: docs/algorithm.md, "Subnormal numbers".
  // false: the threads' own mode, to measure that cost (as FLAT_SUBNORMALS=keep in the
  // environment does for every call).
  bool flush_subnormals = true;
};

// Variable-length batches and a pool of states, for serving (the recurrence's and the
// convolution's inputs carry one). All three empty: every batch row is one sequence, its states
// at the same row of h0 / ht (state0 / state).
//   cu_seqlens [num_seqs + 1] (FLA's name): sequences packed along S of one batch row (B = 1);
//     sequence i is tokens [cu_seqlens[i], cu_seqlens[i+1]). cu_seqlens[0] = 0, non-decreasing
//     (a sequence may be empty), cu_seqlens[num_seqs] = S. Each sequence has its own state,
//     chunks restart at its start, the convolution's window never reads across its boundary:
//     the results are bitwise those of each sequence run alone. Without cu_seqlens, num_seqs = B.
//   initial_state_indices [num_seqs]: h0 (state0) is a pool [P, ...] of any P, and sequence i
//     starts from its row initial_state_indices[i], or from zero where that is -1.
//   final_state_indices [num_seqs]: ht (state) is a pool [P, ...], and sequence i's final state
//     goes to its row final_state_indices[i] (nowhere where -1); other rows are left as they are.
//   token_state_indices [B * S], one per token of the packed batch (token t of batch row b at
//     b * S + t): ht (state) is a pool [P, ...], and the state after each token goes to its row
//     token_state_indices[...] (nowhere where -1), for speculative decoding: a step verifies a
//     few draft tokens per sequence, keeping the state after each, and the next step starts
//     sequence i from the row of its last accepted token (num_accepted[i] tokens in: the index at
//     cu_seqlens[i] + num_accepted[i] - 1), which rolls back the rejected ones with no copy. With
//     it the recurrence runs token by token (the decode path), whatever the sequence's length.
//     final_state_indices may come with it (their rows written once in all) or not (no final
//     state beside the tokens').
// Without indices, h0 and ht have one row per sequence, [num_seqs, ...]. The pool is read and
// written in place, no copies: h0 and ht may be the very same view, provided no sequence reads a
// row another one writes. Refused (flat::Error naming the argument, nothing written): offsets
// that do not run from 0 to S without decreasing, B != 1 with cu_seqlens, an index array whose
// size is not num_seqs (B * S for token_state_indices), an index below -1 or past the pool,
// indices without their pool tensor, one row written twice (by two sequences, two tokens, or a
// token and a final state), and in place, a row one sequence reads and another writes.
// An empty sequence's final state is its initial one (and its dh0 its dht).
// The backward takes the same cu_seqlens and initial_state_indices (h0 read through them) and no
// final_state_indices or token_state_indices: the gradients of the states, dht and dh0 (dstate, dstate0), have one row
// per sequence, [num_seqs, ...]. A gradient summed over the tokens of a batch (retnet's per-head
// dg, the convolution's dweight and dbias) is summed over every sequence: the parameter is one.
// The arrays are host memory, read during the call only.
struct Sequences {
  std::span<const int64_t> cu_seqlens;
  std::span<const int64_t> initial_state_indices;
  std::span<const int64_t> final_state_indices;
  std::span<const int64_t> token_state_indices;
};

// Shapes (N = max of the head counts; every head count divides N; head n reads input head
// n / (N / Nx)):
//   q [B, S, Nq, K]   k [B, S, Nk, K]   v [B, S, Nv, V]   g: see Variant
//   beta [B, S, Nb] (delta family but gdn2)   b [B, S, Nb, K], w [B, S, Nw, V] (gdn2)
//   h0, ht [B, N, K, V] fp32, optional      y [B, S, N, V]
//   (with `sequences`, h0 and ht are [num_seqs, N, K, V] or pools [P, N, K, V]: see Sequences)
// K and V may be 1 to 256. q, k, v, g, beta, b, w, y may each be bf16 or fp32.
// B or S may be 0 (an empty call: checked as any, no kernel run; a tensor of no elements may have
// a null data pointer): each sequence's final state is its initial one (zero without one), dh0 is
// dht (zero without one), and a gradient summed over the tokens (retnet's dg; the convolution's
// dweight, dbias) is zero.
struct Inputs {
  Tensor q, k, v, g, h0;
  Tensor beta, b, w;
  Sequences sequences;
};

struct ForwardArgs : Inputs {
  ForwardArgs() = default;
  explicit ForwardArgs(const Inputs& inputs) : Inputs(inputs) {}
  Tensor y, ht;  // outputs; ht optional
};

// Gradients have their input's shape and dtype. dg is required when the variant has a gate and
// must be absent otherwise; likewise dbeta, db and dw. dh0 is optional (the gradient of the
// initial state, zero or given); dht is optional. Both are [B, N, K, V], or [num_seqs, N, K, V]
// with sequences (never a pool).
struct BackwardArgs : Inputs {
  BackwardArgs() = default;
  explicit BackwardArgs(const Inputs& inputs) : Inputs(inputs) {}
  Tensor dy, dht;
  Tensor dq, dk, dv, dg, dh0;  // outputs
  Tensor dbeta, db, dw;        // outputs of the delta family, for the inputs it takes
};

void forward(Variant variant, const ForwardArgs& args, const Options& options = {},
             const ExecutionContext& context = {});
void backward(Variant variant, const BackwardArgs& args, const Options& options = {},
              const ExecutionContext& context = {});

// ---------------------------------------------------------------------------------------------
// Short causal depthwise convolution with an optional SiLU, the layer that runs q, k and v
// before the recurrence in almost every linear-attention block. Per batch b, position t and
// channel c, with W taps (1 to 8; 4 is usual):
//
//   z[b, t, c] = bias[c] + sum_{w < W} weight[c, w] * x[b, t - W + 1 + w, c]
//   y[b, t, c] = act(z[b, t, c])          act: silu (z * sigmoid(z)) or none (z)
//
// Positions before 0 read the initial state: state0[b, c, W - 1 + p] is x at position p for
// p = -(W-1) .. -1 (so state0[b, c, W-2] is x_{-1}); without state0 they are zero.
// The final state is the last W-1 inputs, state[b, c, j] = x at position S - (W-1) + j, where
// positions before 0 again read state0 (or zero): flat's own layout, float32 with W-1 columns
// (FLA's causal_conv1d keeps [N, C, W] in x's dtype), so a chunked prefill passes one call's
// state as the next call's state0. `state` may be the same
// memory as `state0` (updated in place). With W = 1 there is no state: state0, state and their
// gradients must be absent.
//
// The pre-activation z never goes to memory: the forward applies the SiLU in the kernel, the
// backward recomputes z from x.
//
// Shapes and dtypes (C at least 1; B or S may be 0, an empty call: see Inputs):
//   x  [B, S, C]        bf16 or fp32; only the channel axis must be contiguous, so x can be a
//                       column block of a fused projection [B, S, 3C]
//   weight [C, W]       fp32        bias [C] fp32, optional
//   state0 [B, C, W-1]  fp32, optional
//   y  [B, S, C]        bf16 or fp32 (any strides with a contiguous last axis)
//   state [B, C, W-1]   fp32, optional output
// With `sequences` (flat::Sequences: cu_seqlens and a pool, as for the recurrence), state0 and
// state are [num_seqs, C, W-1] or pools [P, C, W-1], dstate and dstate0 [num_seqs, C, W-1]; a
// window never reads across a sequence's start (positions before it read its state0 row).
// Backward, from dy [B, S, C] (bf16 or fp32) and optionally dstate [B, C, W-1] (fp32, the
// gradient with respect to the returned final state; absent means zero):
//   dx [B, S, C]        the dtype of x
//   dweight [C, W]      fp32, summed over batch and sequence
//   dbias [C]           fp32, summed over batch and sequence; required when bias is given, and
//                       only then
//   dstate0 [B, C, W-1] fp32, optional: the gradient with respect to the initial state (state0,
//                       or the zero state when state0 is absent)
// Every output is written in full. dweight and dbias are reduced in a fixed order (fp32 partial
// sums per block of 256 positions, float64 across blocks), so results are bitwise identical
// for any thread count. Precision: fp32 accumulation; the SiLU is evaluated to within 2e-6
// relative, or 6.1e-5 when the call's inputs and outputs are all bf16 (30 times below bf16's own
// rounding).
//
// Activations (the convolution takes none or silu; the output gate below any of them):
//   none     act(z) = z
//   silu     act(z) = z * sigmoid(z)   (FLA's "swish")
//   sigmoid  act(z) = 1 / (1 + exp(-z))
enum class Activation { none, silu, sigmoid };

std::string_view activation_name(Activation activation);
// Throws flat::Error for an unknown name ("none", "silu" or "sigmoid").
Activation parse_activation(std::string_view name);

struct ConvOptions {
  Activation activation = Activation::silu;
};

struct ConvInputs {
  Tensor x, weight, bias, state0;
  Sequences sequences;
};

struct ConvArgs : ConvInputs {
  ConvArgs() = default;
  explicit ConvArgs(const ConvInputs& inputs) : ConvInputs(inputs) {}
  Tensor y, state;  // outputs; state optional
};

struct ConvBackwardArgs : ConvInputs {
  ConvBackwardArgs() = default;
  explicit ConvBackwardArgs(const ConvInputs& inputs) : ConvInputs(inputs) {}
  Tensor dy, dstate;
  Tensor dx, dweight, dbias, dstate0;  // outputs
};

void conv_forward(const ConvArgs& args, const ConvOptions& options = {}, const ExecutionContext& context = {});
void conv_backward(const ConvBackwardArgs& args, const ConvOptions& options = {},
                   const ExecutionContext& context = {});

// ---------------------------------------------------------------------------------------------
// The output norm and gate of a linear-attention layer, fused (FLA's FusedRMSNormGated): per row
// of D channels (one head's values [B, S, N, D], or a group of heads viewed as one row), with
// rms(u) = sqrt(mean_d u_d^2 + eps),
//   norm_before_gate (FLA's layers):          y = x / rms(x) * weight * act(g)
//   gate before the norm (Mamba-2's block):   y = u / rms(u) * weight,   u = x * act(g)
// and without g (no output gate), y = x / rms(x) * weight.
//
// Shapes and dtypes (D at least 1; B, S or N may be 0: no row, y untouched, dweight zero):
//   x, g, y [B, S, N, D]   bf16 or fp32 each; only the last axis must be contiguous, so g can be a
//                          column block of a fused projection and x the recurrence's output
//   weight [D] or [N, D]   fp32: shared by the heads, or one row of weights per head (Mamba-2's
//                          norm over groups of heads, each group its own weights)
// Backward, from dy [B, S, N, D]:
//   dx, dg [B, S, N, D]    the dtypes of x and g (dg required when g is given, and only then)
//   dweight                weight's shape, fp32, summed over the rows in a fixed order (fp32
//                          partial sums per block of rows, float64 across blocks): bitwise the
//                          same for any thread count
// Nothing per row is saved between the passes: the backward recomputes rms from x (and g).
// Precision: fp32 arithmetic; relative L2 error per output within 1e-5 of the float64 oracle
// with fp32 tensors.
struct NormGateOptions {
  Activation activation = Activation::silu;
  bool norm_before_gate = true;
  float eps = 1e-5f;  // finite and > 0
};

struct NormGateInputs {
  Tensor x, g, weight;  // g optional
};

struct NormGateArgs : NormGateInputs {
  NormGateArgs() = default;
  explicit NormGateArgs(const NormGateInputs& inputs) : NormGateInputs(inputs) {}
  Tensor y;  // output
};

struct NormGateBackwardArgs : NormGateInputs {
  NormGateBackwardArgs() = default;
  explicit NormGateBackwardArgs(const NormGateInputs& inputs) : NormGateInputs(inputs) {}
  Tensor dy;
  Tensor dx, dg, dweight;  // outputs
};

void norm_gate_forward(const NormGateArgs& args, const NormGateOptions& options = {},
                       const ExecutionContext& context = {});
void norm_gate_backward(const NormGateBackwardArgs& args, const NormGateOptions& options = {},
                        const ExecutionContext& context = {});

// bf16 storage helpers (round to nearest even).
uint16_t to_bf16(float x);
float from_bf16(uint16_t x);

}  // namespace flat
