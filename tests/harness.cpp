#include "harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "checks.h"
#include "cpu/recurrence.h"
#include "cpu/targets.h"
#include "tested_targets.h"

namespace flat::test {

std::vector<Variant> variants_where(bool (*keep)(const VariantInfo&)) {
  std::vector<Variant> out;
  for (const VariantInfo& v : all_variants())
    if (keep(v)) out.push_back(v.variant);
  return out;
}

void fit_gate_group(Case& c) {
  if (c.K % c.gate_group() != 0) c.G = std::gcd(c.K, 64);
}

bool Case::is_delta() const { return info(variant).is_delta(); }

int Case::gate_group() const {
  if (G > 0) return G;
  return info(variant).default_gate_group > 0 ? info(variant).default_gate_group : 1;
}

std::string Case::name() const {
  std::ostringstream s;
  s << variant_name(variant) << "_" << dtype_name(dtype) << "_B" << B << "_S" << S << "_Nq" << Nq << "_Nk"
    << Nk << "_Nv" << Nv << "_Ng" << Ng;
  if (is_delta()) s << "_Nb" << Nb;
  if (info(variant).has_erase_write()) s << "_Nw" << Nw;
  s << "_K" << K << "_V" << V;
  if (info(variant).gate == Gate::grouped) s << "_G" << gate_group();
  s << "_C" << chunk << (h0 ? "_h0" : "") << (dht ? "_dht" : "") << (strided ? "_strided" : "")
    << (l2norm ? "_l2" : "") << (y_f32 ? "_yf32" : "") << "_" << (decay == Decay::mild ? "mild" : decay == Decay::medium ? "medium" : "strong");
  if (is_delta() && beta_max != 1.0) s << "_beta" << beta_max;
  if (solve != Solve::automatic) s << "_" << solve_name(solve);
  if (precision != Precision::exact) s << "_" << precision_name(precision);
  return s.str();
}

std::vector<Case> build_sweep(const std::vector<Variant>& variants,
                              const std::function<void(Case& base, const std::function<void(const CaseEdit&)>& add)>& cases,
                              const CaseEdit& finish) {
  std::vector<Case> out;
  for (Variant variant : variants)
    for (DType dtype : {DType::f32, DType::bf16}) {
      Case base;
      base.variant = variant;
      base.dtype = dtype;
      base.K = base.V = 64;
      cases(base, [&](const CaseEdit& edit) {
        Case c = base;
        edit(c);
        if (finish) finish(c);
        c.seed = out.size() + 1;
        out.push_back(c);
      });
    }
  return out;
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

void expect_within_bounds(const ErrorsByTarget& errors, DType dtype, Precision precision) {
  for (const auto& [target, e] : errors) {
    SCOPED_TRACE("target " + target);
    expect_within_bounds(e, dtype, precision);
  }
}

void expect_within_bounds(const Errors& e, DType dtype, Precision precision) {
  const bool bf16 = dtype == DType::bf16, fast = precision == Precision::fast;
  const double out_tol = fast ? 6e-3 : bf16 ? 5e-3 : 1e-5;
  const double grad_tol = fast ? 8e-3 : bf16 ? 1e-2 : 1e-4;
  const double gate_tol = fast ? 2e-2 : grad_tol;
  // `<=` so that a NaN error fails.
  EXPECT_TRUE(e.y <= out_tol) << "y " << e.y;
  EXPECT_TRUE(e.ht <= out_tol) << "ht " << e.ht;
  const std::pair<const char*, double> gradients[] = {{"dq", e.dq}, {"dk", e.dk}, {"dv", e.dv}, {"dh0", e.dh0}};
  for (const auto& [name, error] : gradients) EXPECT_TRUE(error <= grad_tol) << name << " " << error;
  const std::pair<const char*, double> gates[] = {{"dg", e.dg}, {"dbeta", e.dbeta}, {"db", e.db}, {"dw", e.dw}};
  for (const auto& [name, error] : gates) EXPECT_TRUE(error <= gate_tol) << name << " " << error;
  EXPECT_TRUE(e.padding_intact) << "an element outside the strided views was written";
}

std::vector<int64_t> gate_shape(const Case& c) { return info(c.variant).gate_shape(c.B, c.S, c.Ng, c.K, c.gate_group()); }

namespace {

std::vector<double> rounded(DType dtype, std::vector<double> x) {
  for (auto& e : x) e = round_to(dtype, e);
  return x;
}

std::vector<double> normal(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<double> dist;
  std::vector<double> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

std::vector<double> uniform(std::mt19937_64& rng, size_t n, double max) {
  std::uniform_real_distribution<double> dist(0.0, max);
  std::vector<double> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

// Keys of the delta family without the in-kernel L2 norm are drawn short: N(0, 1) / sqrt(K) per
// entry, rows longer than 0.99 shortened to it. The erase I - beta k k^T has the eigenvalue
// 1 - beta |k|^2 along k and 1 elsewhere, so with |k|^2 <= 1 and beta < 2 it never expands the
// state, as with normalised keys; longer keys would make the state grow exponentially, which
// no model trains into and no error bound could follow. The margin absorbs bf16 rounding.
void shorten_keys(std::vector<double>& k, int K) {
  constexpr double kMaxNorm = 0.99;
  for (size_t row = 0; row < k.size(); row += size_t(K)) {
    double norm2 = 0;
    for (int c = 0; c < K; ++c) {
      double& x = k[row + size_t(c)];
      x /= std::sqrt(double(K));
      norm2 += x * x;
    }
    const double shrink = std::min(1.0, kMaxNorm / std::sqrt(norm2));
    for (int c = 0; c < K; ++c) k[row + size_t(c)] *= shrink;
  }
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

// A [B, S, H, D] tensor placed at column `offset` of rows `row` elements wide ([B, S, row]);
// rank 3 views it as [B, S, H] (D = 1), the layout of beta.
struct Placement {
  int64_t B, S, H, D, row, offset;
  int rank = 4;

  size_t index(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return size_t((b * S + s) * row + offset + h * D + d);
  }
  Tensor view(Buffer& buf) const {
    char* base = static_cast<char*>(buf.data()) + offset * (buf.dtype == DType::bf16 ? 2 : 4);
    if (rank == 3) return Tensor::strided(base, buf.dtype, {B, S, H}, {S * row, row, 1});
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

// The parts of a projection in their order: q, k, v, then the delta family's beta, or gdn2's
// b and w; for any kind of per-part item (shapes, tensors, values).
template <class T>
std::vector<T*> parts(Variant variant, T& q, T& k, T& v, T& beta, T& b, T& w) {
  std::vector<T*> out{&q, &k, &v};
  if (info(variant).has_erase_write()) out.insert(out.end(), {&b, &w});
  if (info(variant).has_beta()) out.push_back(&beta);
  return out;
}

// Lays out the parts (or their gradients) either in separate contiguous buffers or as column
// blocks of one fused [B, S, width + pad] buffer, like a fused projection.
struct Projection {
  std::vector<Placement> places;
  std::vector<Buffer> buffers;  // 1 fused or one per part
  bool fused;

  Projection(const Case& c, DType dtype) : fused(c.strided) {
    struct Shape {
      int64_t H, D;
      int rank;
    };
    Shape q{c.Nq, c.K, 4}, k{c.Nk, c.K, 4}, v{c.Nv, c.V, 4}, beta{c.Nb, 1, 3}, b{c.Nb, c.K, 4}, w{c.Nw, c.V, 4};
    const std::vector<Shape*> shapes = parts(c.variant, q, k, v, beta, b, w);
    int64_t width = 0;
    for (const Shape* s : shapes) width += s->H * s->D;
    const int64_t row = width + 3;  // padding that must stay untouched
    int64_t offset = 0;
    for (const Shape* s : shapes) {
      if (fused) {
        places.push_back({c.B, c.S, s->H, s->D, row, offset, s->rank});
        offset += s->H * s->D;
      } else {
        places.push_back({c.B, c.S, s->H, s->D, s->H * s->D, 0, s->rank});
        buffers.emplace_back(dtype, size_t(c.B * c.S * s->H * s->D));
      }
    }
    if (fused) buffers.emplace_back(dtype, size_t(c.B * c.S * row));
  }
  Buffer& of(size_t i) { return buffers[fused ? 0 : i]; }
  const Buffer& of(size_t i) const { return buffers[fused ? 0 : i]; }

  // Views of the parts into the given tensor fields, in order.
  void view(const std::vector<Tensor*>& fields) {
    for (size_t i = 0; i < places.size(); ++i) *fields[i] = places[i].view(of(i));
  }
  void fill(const std::vector<const std::vector<double>*>& values) {
    for (size_t i = 0; i < places.size(); ++i) places[i].fill(of(i), *values[i]);
  }
  void read(const std::vector<std::vector<double>*>& values) const {
    for (size_t i = 0; i < places.size(); ++i) *values[i] = places[i].read(of(i));
  }
  // Every element outside the views still holds its NaN poison.
  bool padding_intact() const {
    if (!fused) return true;
    const Buffer& buf = buffers[0];
    std::vector<bool> inside(buf.size(), false);
    for (const Placement& p : places)
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t s = 0; s < p.S; ++s)
          for (int64_t h = 0; h < p.H; ++h)
            for (int64_t d = 0; d < p.D; ++d) inside[p.index(b, s, h, d)] = true;
    for (size_t i = 0; i < inside.size(); ++i)
      if (!inside[i] && !buf.is_nan(i)) return false;
    return true;
  }
};

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// The oracle's values against which an fp32 or bf16 output is measured: below the normal range
// (the same for both) the kernel may give the value or zero. Behind a very strong gate a gradient
// can truly be 1e-63 (dh0 behind a first gate of -145), which no float holds: measured against
// that, the correct answer 0 would be an error of 100%. A subnormal such as 1e-39 (dh0 behind a
// gate of -84) a float holds, and a kernel computing with subnormals flushed to zero
// (src/cpu/float_mode.h) gives 0: so where the kernel gave zero, a subnormal oracle value counts
// as zero, and so does one within two bf16 roundings (2^-7) above the smallest normal number,
// which a kernel within its bounds may compute just below it and flush (dh0 of 1.1765e-38 from
// the tile unit's bf16 products at fast precision, where a kernel without flushing would give
// the subnormal 1.1749e-38); anywhere else the kernel's value is measured against the oracle's as
// it is.
constexpr double kFlushedBelow = double(std::numeric_limits<float>::min()) * (1.0 + 0x1p-7);

std::vector<double> representable(std::vector<double> want, const std::vector<double>& got) {
  for (size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (std::abs(want[i]) < kFlushedBelow && got[i] == 0.0) want[i] = 0.0;
  return want;
}

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
  ref.Nb = c.Nb;
  ref.Nw = c.Nw;
  ref.G = c.gate_group();
  ref.K = c.K;
  ref.V = c.V;
  ref.scale = double(float(1.0 / std::sqrt(double(c.K))));
  ref.l2norm = c.l2norm;
  N = ref.N();
  const size_t tokens = size_t(c.B) * c.S;
  in.q = rounded(c.dtype, normal(rng, tokens * c.Nq * c.K));
  std::vector<double> k = normal(rng, tokens * c.Nk * c.K);
  if (c.is_delta() && !c.l2norm) shorten_keys(k, c.K);
  in.k = rounded(c.dtype, std::move(k));
  in.v = rounded(c.dtype, normal(rng, tokens * c.Nv * c.V));
  in.g = gates(rng, ref.gate_size(), c.decay);
  const size_t state = size_t(c.B) * N * c.K * c.V;
  if (c.h0) in.h0 = rounded(DType::f32, normal(rng, state));
  dy = rounded(c.dtype, normal(rng, tokens * N * c.V));
  if (c.dht) dht = rounded(DType::f32, normal(rng, state));
  // Drawn last, so that the additive family's problems are what they were before.
  if (ref.has_beta()) in.beta = rounded(c.dtype, uniform(rng, tokens * c.Nb, c.beta_max));
  if (ref.has_erase_write()) {
    in.b = rounded(c.dtype, uniform(rng, tokens * c.Nb * c.K, c.beta_max));
    in.w = rounded(c.dtype, uniform(rng, tokens * c.Nw * c.V, c.beta_max));
  }
}

Implementation library() { return {"fused", cpu::recurrence_forward, cpu::recurrence_backward}; }

namespace {

// The library's forward with every token's state kept nowhere (token_state_indices all -1), which
// sends each sequence down the decode path, and the final states to their own rows.
void token_by_token_forward(const Params& p, const cpu::Run& run) {
  const std::vector<int64_t> nowhere(size_t(p.B) * p.S, -1);
  std::vector<int64_t> own_rows(size_t(p.B));
  std::iota(own_rows.begin(), own_rows.end(), 0);
  Params decode = p;
  decode.sequences.token_state_rows = nowhere;
  decode.sequences.write_rows = own_rows;
  cpu::recurrence_forward(decode, run);
}

}  // namespace

Implementation decode_path() { return {"decode path", token_by_token_forward, cpu::recurrence_backward}; }

namespace {

// The library's drivers with the token outputs streamed past the caches whatever their size
// (Params::streamed_outputs).
Params streaming(Params p) {
  p.streamed_outputs = true;
  return p;
}
void streamed_forward(const Params& p, const cpu::Run& run) { cpu::recurrence_forward(streaming(p), run); }
void streamed_backward(const Params& p, const cpu::Run& run) { cpu::recurrence_backward(streaming(p), run); }

}  // namespace

Implementation streamed_outputs() { return {"streamed outputs", streamed_forward, streamed_backward}; }

void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

KernelOutputs run_kernel(const Problem& pr, bool backward, int threads, const cpu::Target& target,
                         const Implementation& implementation) {
  const cpu::Run run{target, {threads}};
  const Case& c = pr.c;
  const int64_t N = pr.N;
  Options options;
  options.scale = float(pr.ref.scale);
  options.chunk = c.chunk;
  options.l2norm_qk = c.l2norm;
  options.solve = c.solve;
  options.precision = c.precision;
  options.gate_group = c.G;

  const ref::Inputs& in = pr.in;
  Projection inputs(c, c.dtype);
  inputs.fill(parts(c.variant, in.q, in.k, in.v, in.beta, in.b, in.w));
  std::vector<float> g(in.g.begin(), in.g.end());
  std::vector<float> h0(in.h0.begin(), in.h0.end());
  const Tensor g_view = Tensor::contiguous(g.data(), DType::f32, gate_shape(c));
  const size_t state = size_t(c.B) * N * c.K * c.V;
  Tensor h0_view = c.h0 ? Tensor::contiguous(h0.data(), DType::f32, {c.B, N, c.K, c.V}) : Tensor{};

  // y: strided with padding when the case is strided.
  const int64_t y_row = N * c.V + (c.strided ? 5 : 0);
  const Placement y_place{c.B, c.S, N, c.V, y_row, c.strided ? 2 : 0};
  Buffer y(c.y_f32 ? DType::f32 : c.dtype, size_t(c.B * c.S * y_row));
  std::vector<float> ht(state, std::numeric_limits<float>::quiet_NaN());

  ForwardArgs fa;
  inputs.view(parts(c.variant, fa.q, fa.k, fa.v, fa.beta, fa.b, fa.w));
  fa.g = g_view;
  fa.h0 = h0_view;
  fa.y = y_place.view(y);
  fa.ht = Tensor::contiguous(ht.data(), DType::f32, {c.B, N, c.K, c.V});
  implementation.forward(describe_forward(c.variant, fa, options), run);

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
  Projection grads(c, c.dtype);
  LineAlignedVector<float> dg(g.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> dh0(state, std::numeric_limits<float>::quiet_NaN());

  BackwardArgs ba{fa};
  ba.dy = dy_place.view(dy);
  ba.dht = c.dht ? Tensor::contiguous(dht.data(), DType::f32, {c.B, N, c.K, c.V}) : Tensor{};
  grads.view(parts(c.variant, ba.dq, ba.dk, ba.dv, ba.dbeta, ba.db, ba.dw));
  if (g_view.present()) {
    ba.dg = g_view;
    ba.dg.data = dg.data();
  }
  ba.dh0 = Tensor::contiguous(dh0.data(), DType::f32, {c.B, N, c.K, c.V});
  implementation.backward(describe_backward(c.variant, ba, options), run);

  grads.read(parts(c.variant, out.dq, out.dk, out.dv, out.dbeta, out.db, out.dw));
  out.dg.assign(dg.begin(), dg.end());
  out.dh0 = to_double(dh0);
  out.padding_intact = out.padding_intact && grads.padding_intact();
  return out;
}

ErrorsByTarget compare(const Case& c) { return compare(Problem(c)); }

ErrorsByTarget compare(const Problem& pr, const Implementation& implementation,
                       const std::vector<const cpu::Target*>& targets) {
  const ref::Outputs want = ref::forward(pr.ref, pr.in);
  const ref::Gradients dwant = ref::backward(pr.ref, pr.in, pr.dy, pr.dht);
  const auto error = [](const std::vector<double>& got, const std::vector<double>& want) {
    return relative_error(got, representable(want, got));
  };
  ErrorsByTarget out;
  for (const cpu::Target* target : targets) {
    if (!pr.c.on_models && test::software_model(*target)) continue;
    const KernelOutputs got = run_kernel(pr, true, pr.c.threads, *target, implementation);
    Errors e;
    e.y = error(got.y, want.y);
    e.ht = error(got.ht, want.ht);
    e.dq = error(got.dq, dwant.dq);
    e.dk = error(got.dk, dwant.dk);
    e.dv = error(got.dv, dwant.dv);
    e.dg = error(got.dg, dwant.dg);
    e.dh0 = error(got.dh0, dwant.dh0);
    e.dbeta = error(got.dbeta, dwant.dbeta);
    e.db = error(got.db, dwant.db);
    e.dw = error(got.dw, dwant.dw);
    e.padding_intact = got.padding_intact;
    out.emplace_back(target->name, e);
  }
  return out;
}

}  // namespace flat::test
