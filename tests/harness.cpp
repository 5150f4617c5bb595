#include "harness.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

namespace flat::test {

std::string Case::name() const {
  std::ostringstream s;
  s << variant_name(variant) << "_" << dtype_name(dtype) << "_B" << B << "_S" << S << "_Nq" << Nq << "_Nk"
    << Nk << "_Nv" << Nv << "_Ng" << Ng << "_K" << K << "_V" << V << "_C" << chunk
    << (h0 ? "_h0" : "") << (dht ? "_dht" : "") << (strided ? "_strided" : "")
    << (l2norm ? "_l2" : "") << "_" << (decay == Decay::mild ? "mild" : decay == Decay::medium ? "medium" : "strong");
  return s.str();
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::quiet_NaN();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::quiet_NaN();
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

namespace {

double round_to(DType dtype, double x) {
  return dtype == DType::bf16 ? double(from_bf16(to_bf16(float(x)))) : double(float(x));
}

std::vector<double> normal(std::mt19937_64& rng, size_t n, DType dtype) {
  std::normal_distribution<double> dist;
  std::vector<double> out(n);
  for (auto& x : out) x = round_to(dtype, dist(rng));
  return out;
}

std::vector<double> gates(std::mt19937_64& rng, size_t n, Decay decay) {
  std::uniform_real_distribution<double> unit;
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    double& x = out[i];
    switch (decay) {
      case Decay::mild: x = -0.1 * unit(rng); break;
      case Decay::medium: x = -2.0 * unit(rng); break;
      case Decay::strong: x = i % 2 == 0 ? -1.0 - 999.0 * unit(rng) : -unit(rng); break;
    }
    x = double(float(x));
  }
  return out;
}

// A tensor stored as float or bf16 in a buffer that may hold several views side by side.
struct Buffer {
  DType dtype;
  std::vector<uint16_t> half;
  std::vector<float> full;

  Buffer(DType d, size_t n) : dtype(d) {
    if (d == DType::bf16) half.assign(n, 0x7fc0);  // NaN poison
    else full.assign(n, std::numeric_limits<float>::quiet_NaN());
  }
  void* data() { return dtype == DType::bf16 ? static_cast<void*>(half.data()) : full.data(); }
  void set(size_t i, double x) {
    if (dtype == DType::bf16) half[i] = to_bf16(float(x));
    else full[i] = float(x);
  }
  double get(size_t i) const { return dtype == DType::bf16 ? from_bf16(half[i]) : full[i]; }
  bool is_nan(size_t i) const { return std::isnan(get(i)); }
};

// A [B, S, H, D] tensor placed at column `offset` of rows `row` elements wide ([B, S, row]).
struct Placement {
  int64_t B, S, H, D, row, offset;
  size_t index(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return size_t((b * S + s) * row + offset + h * D + d);
  }
  Tensor view(Buffer& buf) const {
    char* base = static_cast<char*>(buf.data()) + offset * (buf.dtype == DType::bf16 ? 2 : 4);
    return Tensor::strided(base, buf.dtype, {B, S, H, D}, {S * row, row, D, 1});
  }
  void fill(Buffer& buf, const std::vector<double>& dense) const {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) buf.set(index(b, s, h, d), dense[size_t(((b * S + s) * H + h) * D + d)]);
  }
  std::vector<double> read(const Buffer& buf) const {
    std::vector<double> out(size_t(B * S * H * D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) out[size_t(((b * S + s) * H + h) * D + d)] = buf.get(index(b, s, h, d));
    return out;
  }
};

// Lays out q, k, v (or dq, dk, dv) either in separate contiguous buffers or as column blocks of
// one fused [B, S, Nq*K + Nk*K + Nv*V + pad] buffer, like a fused projection.
struct QKV {
  Placement q, k, v;
  std::vector<Buffer> buffers;  // 1 fused or 3 separate
  bool fused;

  QKV(const Case& c, DType dtype) : fused(c.strided) {
    const int64_t qw = int64_t(c.Nq) * c.K, kw = int64_t(c.Nk) * c.K, vw = int64_t(c.Nv) * c.V;
    if (fused) {
      const int64_t row = qw + kw + vw + 3;  // padding that must stay untouched
      q = {c.B, c.S, c.Nq, c.K, row, 0};
      k = {c.B, c.S, c.Nk, c.K, row, qw};
      v = {c.B, c.S, c.Nv, c.V, row, qw + kw};
      buffers.emplace_back(dtype, size_t(c.B * c.S * row));
    } else {
      q = {c.B, c.S, c.Nq, c.K, qw, 0};
      k = {c.B, c.S, c.Nk, c.K, kw, 0};
      v = {c.B, c.S, c.Nv, c.V, vw, 0};
      for (int64_t w : {qw, kw, vw}) buffers.emplace_back(dtype, size_t(c.B * c.S * w));
    }
  }
  Buffer& of(int i) { return buffers[fused ? 0 : size_t(i)]; }
  const Buffer& of(int i) const { return buffers[fused ? 0 : size_t(i)]; }
  // Every element outside the three views still holds its NaN poison.
  bool padding_intact() const {
    if (!fused) return true;
    const Buffer& buf = buffers[0];
    std::vector<bool> inside(buf.dtype == DType::bf16 ? buf.half.size() : buf.full.size(), false);
    for (const Placement* p : {&q, &k, &v})
      for (int64_t b = 0; b < p->B; ++b)
        for (int64_t s = 0; s < p->S; ++s)
          for (int64_t h = 0; h < p->H; ++h)
            for (int64_t d = 0; d < p->D; ++d) inside[p->index(b, s, h, d)] = true;
    for (size_t i = 0; i < inside.size(); ++i)
      if (!inside[i] && !buf.is_nan(i)) return false;
    return true;
  }
};

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

}  // namespace

Problem::Problem(const Case& c_) : c(c_) {
  std::mt19937_64 rng(c.seed * 7919 + uint64_t(c.S) * 131 + uint64_t(c.K) * 17 + uint64_t(c.V));
  ref.variant = c.variant;
  ref.B = c.B;
  ref.S = c.S;
  ref.Nq = c.Nq;
  ref.Nk = c.Nk;
  ref.Nv = c.Nv;
  ref.Ng = c.Ng;
  ref.K = c.K;
  ref.V = c.V;
  ref.scale = double(float(1.0 / std::sqrt(double(c.K))));
  ref.l2norm = c.l2norm;
  N = ref.N();
  in.q = normal(rng, size_t(c.B) * c.S * c.Nq * c.K, c.dtype);
  in.k = normal(rng, size_t(c.B) * c.S * c.Nk * c.K, c.dtype);
  in.v = normal(rng, size_t(c.B) * c.S * c.Nv * c.V, c.dtype);
  in.g = gates(rng, ref.gate_size(), c.decay);
  const size_t state = size_t(c.B) * N * c.K * c.V;
  if (c.h0) in.h0 = normal(rng, state, DType::f32);
  dy = normal(rng, size_t(c.B) * c.S * N * c.V, c.dtype);
  if (c.dht) dht = normal(rng, state, DType::f32);
}

KernelOutputs run_kernel(const Problem& pr, bool backward, int threads) {
  const Case& c = pr.c;
  const int64_t N = pr.N;
  Options options;
  options.scale = float(pr.ref.scale);
  options.chunk = c.chunk;
  options.l2norm_qk = c.l2norm;
  options.threads = threads;

  QKV inputs(c, c.dtype);
  inputs.q.fill(inputs.of(0), pr.in.q);
  inputs.k.fill(inputs.of(1), pr.in.k);
  inputs.v.fill(inputs.of(2), pr.in.v);
  std::vector<float> g(pr.in.g.begin(), pr.in.g.end());
  std::vector<float> h0(pr.in.h0.begin(), pr.in.h0.end());
  Tensor g_view;
  switch (c.variant) {
    case Variant::la: break;
    case Variant::retnet: g_view = Tensor::contiguous(g.data(), DType::f32, {c.Ng}); break;
    case Variant::mamba2: g_view = Tensor::contiguous(g.data(), DType::f32, {c.B, c.S, c.Ng}); break;
    case Variant::gla: g_view = Tensor::contiguous(g.data(), DType::f32, {c.B, c.S, c.Ng, c.K}); break;
  }
  const size_t state = size_t(c.B) * N * c.K * c.V;
  Tensor h0_view = c.h0 ? Tensor::contiguous(h0.data(), DType::f32, {c.B, N, c.K, c.V}) : Tensor{};

  // y: strided with padding when the case is strided.
  const int64_t y_row = N * c.V + (c.strided ? 5 : 0);
  const Placement y_place{c.B, c.S, N, c.V, y_row, c.strided ? 2 : 0};
  Buffer y(c.dtype, size_t(c.B * c.S * y_row));
  std::vector<float> ht(state, std::numeric_limits<float>::quiet_NaN());

  ForwardArgs fa;
  fa.q = inputs.q.view(inputs.of(0));
  fa.k = inputs.k.view(inputs.of(1));
  fa.v = inputs.v.view(inputs.of(2));
  fa.g = g_view;
  fa.h0 = h0_view;
  fa.y = y_place.view(y);
  fa.ht = Tensor::contiguous(ht.data(), DType::f32, {c.B, N, c.K, c.V});
  forward(c.variant, fa, options);

  KernelOutputs out;
  out.y = y_place.read(y);
  out.ht = to_double(ht);
  out.padding_intact = inputs.padding_intact();
  if (c.strided) {
    for (int64_t i = 0; i < c.B * c.S; ++i)
      for (int64_t j : {int64_t{0}, int64_t{1}, y_row - 3, y_row - 2, y_row - 1})
        if (!y.is_nan(size_t(i * y_row + j))) out.padding_intact = false;
  }
  if (!backward) return out;

  const Placement dy_place{c.B, c.S, N, c.V, N * c.V, 0};
  Buffer dy(c.dtype, pr.dy.size());
  dy_place.fill(dy, pr.dy);
  std::vector<float> dht(pr.dht.begin(), pr.dht.end());
  QKV grads(c, c.dtype);
  std::vector<float> dg(g.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> dh0(state, std::numeric_limits<float>::quiet_NaN());

  BackwardArgs ba{fa};
  ba.dy = dy_place.view(dy);
  ba.dht = c.dht ? Tensor::contiguous(dht.data(), DType::f32, {c.B, N, c.K, c.V}) : Tensor{};
  ba.dq = grads.q.view(grads.of(0));
  ba.dk = grads.k.view(grads.of(1));
  ba.dv = grads.v.view(grads.of(2));
  if (g_view.present()) {
    ba.dg = g_view;
    ba.dg.data = dg.data();
  }
  ba.dh0 = Tensor::contiguous(dh0.data(), DType::f32, {c.B, N, c.K, c.V});
  flat::backward(c.variant, ba, options);

  out.dq = grads.q.read(grads.of(0));
  out.dk = grads.k.read(grads.of(1));
  out.dv = grads.v.read(grads.of(2));
  out.dg = to_double(dg);
  out.dh0 = to_double(dh0);
  out.padding_intact = out.padding_intact && grads.padding_intact();
  return out;
}

Errors compare(const Case& c) { return compare(Problem(c)); }

Errors compare(const Problem& pr) {
  const KernelOutputs got = run_kernel(pr, true, pr.c.threads);
  const ref::Outputs want = ref::forward(pr.ref, pr.in);
  const ref::Gradients dwant = ref::backward(pr.ref, pr.in, pr.dy, pr.dht);
  Errors e;
  e.y = relative_error(got.y, want.y);
  e.ht = relative_error(got.ht, want.ht);
  e.dq = relative_error(got.dq, dwant.dq);
  e.dk = relative_error(got.dk, dwant.dk);
  e.dv = relative_error(got.dv, dwant.dv);
  e.dg = relative_error(got.dg, dwant.dg);
  e.dh0 = relative_error(got.dh0, dwant.dh0);
  e.padding_intact = got.padding_intact;
  return e;
}

}  // namespace flat::test
