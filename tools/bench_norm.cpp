// `flat bench` for the output norm and gate: the fused kernels (flat::norm_gate_forward /
// norm_gate_backward) and the naive unfused baseline, timed in the same process on the same
// inputs.
#include "bench_norm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <thread>

#include "bench_buffers.h"
#include "cpu/parallel.h"

namespace flat::tool {
namespace {

// The naive baseline: fp32 [B, S, N, D] tensors as rows of D, every op a pass of its own over
// all rows, split over threads, its result materialised as a framework's eager ops do.
struct Naive {
  Naive(const NormGateBenchOptions& o_, int threads_, float eps_, const std::vector<float>& x_,
        const std::vector<float>& g_, const std::vector<float>& weight_, const std::vector<float>& dy_)
      : o(o_), threads(threads_), eps(eps_), x(x_), g(g_), weight(weight_), dy(dy_), rstd(size_t(rows())),
        mid(elements()), y(elements()), dmid(elements()), dx(elements()), dg(g.size()) {}

  const NormGateBenchOptions& o;
  int threads;
  float eps;
  const std::vector<float>&x, &g, &weight, &dy;  // g empty: no gate
  // Saved by the forward for the backward, as autograd keeps them: the rms' reciprocal per row,
  // the gate's product (gate first: u = x * act(g), the norm's input) or the normalised rows
  // before the gate (norm first).
  std::vector<float> rstd, mid, y;
  std::vector<float> dmid, dx, dg, dweight;

  int64_t rows() const { return o.B * o.S * o.N; }
  size_t elements() const { return size_t(rows() * o.D); }
  bool gate() const { return !g.empty(); }
  bool gate_first() const { return gate() && !o.norm_before_gate; }
  const float* weight_of(int64_t row) const { return weight.data() + (o.weight_per_head ? row % o.N : 0) * o.D; }

  // act(z) and act'(z), computed inside the passes that use them: a framework runs the
  // activation as a pass of its own, so the baseline is if anything kind to itself.
  float act(float z) const {
    switch (o.activation) {
      case Activation::silu: return z / (1.0f + std::exp(-z));
      case Activation::sigmoid: return 1.0f / (1.0f + std::exp(-z));
      case Activation::none: break;
    }
    return z;
  }
  float slope(float z) const {
    const float s = 1.0f / (1.0f + std::exp(-z));
    switch (o.activation) {
      case Activation::silu: return s * (1.0f + z * (1.0f - s));
      case Activation::sigmoid: return s * (1.0f - s);
      case Activation::none: break;
    }
    return 1.0f;
  }

  template <class Body>
  void each_element(Body body) const {
    cpu::parallel_ranges(int64_t(elements()), {threads}, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) body(size_t(i));
    });
  }
  template <class Body>
  void each_row(Body body) const {
    cpu::parallel_ranges(rows(), {threads}, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) body(r, size_t(r * o.D));
    });
  }

  // out = in * act(g).
  void gate_forward(const std::vector<float>& in, std::vector<float>& out) const {
    each_element([&](size_t i) { out[i] = in[i] * act(g[i]); });
  }
  // From dout: din = dout * act(g), dg = dout * in * act'(g).
  void gate_backward(const std::vector<float>& dout, const std::vector<float>& in, std::vector<float>& din) {
    each_element([&](size_t i) {
      din[i] = dout[i] * act(g[i]);
      dg[i] = dout[i] * in[i] * slope(g[i]);
    });
  }
  void rms(const std::vector<float>& in) {
    each_row([&](int64_t r, size_t at) {
      float sum = 0.0f;
      for (int64_t d = 0; d < o.D; ++d) sum += in[at + size_t(d)] * in[at + size_t(d)];
      rstd[size_t(r)] = 1.0f / std::sqrt(sum / float(o.D) + eps);
    });
  }
  // out = in * rstd * weight.
  void normalise(const std::vector<float>& in, std::vector<float>& out) const {
    each_row([&](int64_t r, size_t at) {
      const float* w = weight_of(r);
      for (int64_t d = 0; d < o.D; ++d) out[at + size_t(d)] = in[at + size_t(d)] * rstd[size_t(r)] * w[d];
    });
  }
  // dweight = sum over the rows of dout * in * rstd.
  void weight_gradient(const std::vector<float>& dout, const std::vector<float>& in) {
    dweight = sum_over_rows(rows(), threads, weight.size(), [&](int64_t begin, int64_t end, float* acc) {
      for (int64_t r = begin; r < end; ++r) {
        float* a = acc + (o.weight_per_head ? r % o.N : 0) * o.D;
        const size_t at = size_t(r * o.D);
        for (int64_t d = 0; d < o.D; ++d) a[d] += dout[at + size_t(d)] * in[at + size_t(d)] * rstd[size_t(r)];
      }
    });
  }
  // From dout (the gradient of in * rstd * weight): din = rstd (t - uhat mean(t uhat)) with
  // t = dout * weight and uhat = in * rstd.
  void norm_backward(const std::vector<float>& dout, const std::vector<float>& in, std::vector<float>& din) const {
    each_row([&](int64_t r, size_t at) {
      const float* w = weight_of(r);
      const float rs = rstd[size_t(r)];
      float dot = 0.0f;
      for (int64_t d = 0; d < o.D; ++d) dot += dout[at + size_t(d)] * w[d] * in[at + size_t(d)] * rs;
      const float mean = dot / float(o.D);
      for (int64_t d = 0; d < o.D; ++d)
        din[at + size_t(d)] = rs * (dout[at + size_t(d)] * w[d] - in[at + size_t(d)] * rs * mean);
    });
  }

  // The norm's input: x, or u = x * act(g) saved in mid when the gate comes first.
  const std::vector<float>& normed() const { return gate_first() ? mid : x; }

  void forward() {
    if (gate_first()) gate_forward(x, mid);
    rms(normed());
    if (gate() && !gate_first()) {
      normalise(x, mid);
      gate_forward(mid, y);
    } else {
      normalise(normed(), y);
    }
  }

  void backward() {
    const std::vector<float>* dnormed = &dy;  // the gradient reaching the normalise's output
    if (gate() && !gate_first()) {
      gate_backward(dy, mid, dmid);
      dnormed = &dmid;
    }
    weight_gradient(*dnormed, normed());
    if (gate_first()) {
      norm_backward(*dnormed, mid, dmid);
      gate_backward(dmid, x, dx);
    } else {
      norm_backward(*dnormed, x, dx);
    }
  }
};

}  // namespace

std::vector<PassResult> bench_norm_gate(const NormGateBenchOptions& o, std::ostream* progress) {
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const size_t elements = size_t(o.B * o.S * o.N * o.D);
  // x in [-2, 2), dy in [-1, 1), the gate's inputs in [-4, 4): over the activation's curved range.
  Sequence x(o.dtype, values(elements, 1, 2.0f)), dy(o.dtype, values(elements, 2, 1.0f)),
      g(o.dtype, o.gate ? values(elements, 3, 4.0f) : std::vector<float>{});
  Sequence y(o.dtype, std::vector<float>(elements)), dx(o.dtype, std::vector<float>(elements)),
      dg(o.dtype, std::vector<float>(o.gate ? elements : 0));
  std::vector<float> weight = values(size_t(o.weight_elements()), 4, 0.5f);
  for (float& w : weight) w += 1.0f;  // around 1, as a trained norm's weights are
  std::vector<float> dweight(weight.size());
  const auto weight_view = [&](std::vector<float>& w) {
    return o.weight_per_head ? Tensor::contiguous(w.data(), DType::f32, {o.N, o.D})
                             : Tensor::contiguous(w.data(), DType::f32, {o.D});
  };

  NormGateInputs in;
  in.x = x.view({o.B, o.S, o.N, o.D});
  if (o.gate) in.g = g.view({o.B, o.S, o.N, o.D});
  in.weight = weight_view(weight);
  NormGateArgs fa(in);
  fa.y = y.view({o.B, o.S, o.N, o.D});
  NormGateBackwardArgs ba(in);
  ba.dy = dy.view({o.B, o.S, o.N, o.D});
  ba.dx = dx.view({o.B, o.S, o.N, o.D});
  if (o.gate) ba.dg = dg.view({o.B, o.S, o.N, o.D});
  ba.dweight = weight_view(dweight);
  NormGateOptions options;
  options.activation = o.activation;
  options.norm_before_gate = o.norm_before_gate;
  ExecutionContext context;
  context.threads = threads;

  const double n = double(elements), e = o.dtype == DType::bf16 ? 2 : 4, w = double(weight.size()) * 4;
  const double sequences = o.gate ? 1 : 0;  // g, and dg in the backward
  double act = 0, act_slope = 0;
  if (o.gate && o.activation == Activation::silu) act = 5, act_slope = 9;
  if (o.gate && o.activation == Activation::sigmoid) act = 4, act_slope = 6;
  PassResult forward{"forward", 0, (2 + sequences) * n * e + w, n * (4 + (o.gate ? 1 + act : 0)), std::nullopt};
  PassResult backward{"backward", 0, (3 + 2 * sequences) * n * e + 2 * w, n * ((o.gate ? 15 : 11) + act_slope),
                      std::nullopt};

  forward.seconds =
      timed_pass(progress, "norm_gate forward, fused", o.repeats, [&] { norm_gate_forward(fa, options, context); });
  backward.seconds =
      timed_pass(progress, "norm_gate backward, fused", o.repeats, [&] { norm_gate_backward(ba, options, context); });

  if (o.baseline_repeats > 0) {
    const std::vector<float> xf = x.widened(), gf = g.widened(), dyf = dy.widened();
    Naive naive(o, threads, options.eps, xf, gf, weight, dyf);
    forward.baseline_seconds =
        timed_pass(progress, "norm_gate forward, naive", o.baseline_repeats, [&] { naive.forward(); });
    backward.baseline_seconds =
        timed_pass(progress, "norm_gate backward, naive", o.baseline_repeats, [&] { naive.backward(); });
  }
  return {forward, backward};
}

void write_norm_gate_markdown(const NormGateBenchOptions& o, const std::vector<PassResult>& results,
                              std::optional<double> copy_gbs, std::ostream& out) {
  const std::string gate = !o.gate ? "no gate"
                                   : std::string(activation_name(o.activation)) + " gate" +
                                         (o.norm_before_gate ? ", norm first" : ", gate first");
  char line[256];
  std::snprintf(line, sizeof line, "Output norm and gate: B=%lld S=%lld N=%lld D=%lld, %s, weight %s, %s\n\n",
                (long long)o.B, (long long)o.S, (long long)o.N, (long long)o.D, gate.c_str(),
                o.weight_per_head ? "[N, D]" : "[D]", std::string(dtype_name(o.dtype)).c_str());
  out << line;
  write_pass_table(results, copy_gbs, out);
}

}  // namespace flat::tool
