// flat: fused chunkwise kernels for linear attention.
//
// The public API: non-owning tensor views, the variants, and forward/backward entry points.
// What each variant computes is fixed in the project's spec (shared/spec/variants.md);
// docs/algorithm.md explains how the CPU kernels compute it.
//
// Errors: every entry point validates all of its arguments before it writes anything and throws
// flat::Error (a std::invalid_argument) whose message names the tensor, what was expected and
// what came. On an error no output is touched.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace flat {

class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class DType { f32, bf16 };

std::string_view dtype_name(DType dtype);

// A strided view of up to 4 dimensions. Strides count elements, not bytes. The last axis must
// be contiguous (stride 1); the other strides are free, so q, k and v can be column blocks of
// one fused projection [B, S, 3*N*K] without a copy. A default-constructed Tensor (rank 0)
// stands for an absent optional tensor.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
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

// The additive family: H_t = Diag(exp(g_t)) H_{t-1} + k_t v_t^T, y_t = scale * H_t^T q_t.
//   la      no gate
//   retnet  g: [Ng], log gamma per head, constant over batch and time
//   mamba2  g: [B, S, Ng], one log-decay per head and token
//   gla     g: [B, S, Ng, K], one log-decay per channel
enum class Variant { la, retnet, mamba2, gla };

std::string_view variant_name(Variant variant);
// Throws flat::Error for an unknown name.
Variant parse_variant(std::string_view name);

struct Options {
  std::optional<float> scale;  // default K^-1/2
  int chunk = 64;              // chunk length C: a multiple of 16 in [16, 256]
  bool l2norm_qk = false;      // L2-normalise q and k inside the kernel (eps 1e-6, as FLA)
  int threads = 0;             // 0: all hardware threads
};

// Shapes (N = max of the head counts; every head count divides N; head n reads input head
// n / (N / Nx)):
//   q [B, S, Nq, K]   k [B, S, Nk, K]   v [B, S, Nv, V]   g: see Variant
//   h0, ht [B, N, K, V] fp32, optional      y [B, S, N, V]
// K and V may be 1 to 256. q, k, v, g, y may each be bf16 or fp32.
struct Inputs {
  Tensor q, k, v, g, h0;
};

struct ForwardArgs : Inputs {
  ForwardArgs() = default;
  explicit ForwardArgs(const Inputs& inputs) : Inputs(inputs) {}
  Tensor y, ht;  // outputs; ht optional
};

// Gradients have their input's shape and dtype. dg is required when the variant has a gate and
// must be absent for la; dh0 is optional (the gradient of the initial state, zero or given).
// dht is optional.
struct BackwardArgs : Inputs {
  BackwardArgs() = default;
  explicit BackwardArgs(const Inputs& inputs) : Inputs(inputs) {}
  Tensor dy, dht;
  Tensor dq, dk, dv, dg, dh0;  // outputs
};

void forward(Variant variant, const ForwardArgs& args, const Options& options = {});
void backward(Variant variant, const BackwardArgs& args, const Options& options = {});

// bf16 storage helpers (round to nearest even).
uint16_t to_bf16(float x);
float from_bf16(uint16_t x);

}  // namespace flat
