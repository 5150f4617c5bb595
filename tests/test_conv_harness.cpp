#include "test_conv_harness.h"

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "checks.h"
#include "cpu/conv.h"
#include "conv_params.h"

namespace flat::test {

std::string ConvCase::name() const {
  std::ostringstream s;
  s << "x" << dtype_name(x_dtype) << "_y" << dtype_name(y_dtype) << "_B" << B << "_S" << S << "_C" << C << "_W" << W
    << "_" << activation_name(activation) << (bias ? "_bias" : "") << (state0 ? "_state0" : "")
    << (state ? "_state" : "") << (dstate ? "_dstate" : "") << (dstate0 ? "_dstate0" : "")
    << (strided ? "_strided" : "") << "_T" << threads << (x_scale != 1.0 ? "_scaled" : "");
  return s.str();
}

namespace {

std::vector<double> normal(std::mt19937_64& rng, size_t n, DType dtype, double sigma) {
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> out(n);
  for (auto& x : out) x = round_to(dtype, dist(rng));
  return out;
}

// A [d0, d1, d2] tensor in a buffer: contiguous, or (strided) at column offset `offset` of rows
// `row` wide, with `pad` more elements between the d0 slices.
struct Layout {
  int64_t d0, d1, d2, row, offset, slice;

  static Layout dense(int64_t d0, int64_t d1, int64_t d2) { return {d0, d1, d2, d2, 0, d1 * d2}; }
  static Layout wide(int64_t d0, int64_t d1, int64_t d2) {
    const int64_t row = 3 * d2 + 5;
    return {d0, d1, d2, row, d2 + 2, d1 * row + 7};
  }
  size_t elements() const { return size_t(d0 * slice); }
  size_t index(int64_t i, int64_t j, int64_t k) const { return size_t(i * slice + j * row + offset + k); }
  Tensor view(Buffer& s) const {
    char* base = static_cast<char*>(s.data()) + offset * (s.dtype == DType::bf16 ? 2 : 4);
    return Tensor::strided(base, s.dtype, {d0, d1, d2}, {slice, row, 1});
  }
  void fill(Buffer& s, const std::vector<double>& dense_values) const {
    for (int64_t i = 0; i < d0; ++i)
      for (int64_t j = 0; j < d1; ++j)
        for (int64_t k = 0; k < d2; ++k) s.set(index(i, j, k), dense_values[size_t((i * d1 + j) * d2 + k)]);
  }
  std::vector<double> read(const Buffer& s) const {
    std::vector<double> out(size_t(d0 * d1 * d2));
    for (int64_t i = 0; i < d0; ++i)
      for (int64_t j = 0; j < d1; ++j)
        for (int64_t k = 0; k < d2; ++k) out[size_t((i * d1 + j) * d2 + k)] = s.get(index(i, j, k));
    return out;
  }
  // Everything outside the view still holds its NaN poison.
  bool outside_intact(const Buffer& s) const {
    std::vector<bool> inside(s.size(), false);
    for (int64_t i = 0; i < d0; ++i)
      for (int64_t j = 0; j < d1; ++j)
        for (int64_t k = 0; k < d2; ++k) inside[index(i, j, k)] = true;
    for (size_t i = 0; i < inside.size(); ++i)
      if (!inside[i] && !std::isnan(s.get(i))) return false;
    return true;
  }
};

// A tensor with its storage and layout.
struct Held {
  Layout layout;
  Buffer storage;
  Held(const Layout& l, DType dtype) : layout(l), storage(dtype, l.elements()) {}
  Tensor view() { return layout.view(storage); }
  std::vector<double> read() const { return layout.read(storage); }
};

std::vector<double> flat_read(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

ConvData::ConvData(const ConvCase& c_) : c(c_) {
  problem.B = c.B;
  problem.S = c.S;
  problem.C = c.C;
  problem.W = c.W;
  problem.activation = c.activation;
  std::mt19937_64 rng(c.seed * 7919 + uint64_t(c.W) * 131 + uint64_t(c.S));
  const size_t BSC = size_t(c.B) * c.S * c.C, state = size_t(c.B) * c.C * (c.W - 1);
  in.x = normal(rng, BSC, c.x_dtype, c.x_scale);
  in.weight = normal(rng, size_t(c.C) * c.W, DType::f32, 0.6);
  if (c.bias) in.bias = normal(rng, size_t(c.C), DType::f32, 0.5);
  if (c.state0) in.state0 = normal(rng, state, DType::f32, 1.0);
  dy = normal(rng, BSC, c.y_dtype, 1.0);
  if (c.dstate) dstate = normal(rng, state, DType::f32, 1.0);
}

ConvResults run_conv(const ConvData& d, bool backward, int threads, const cpu::Target* target) {
  const ConvCase& c = d.c;
  const auto seq = [&] { return c.strided ? Layout::wide(c.B, c.S, c.C) : Layout::dense(c.B, c.S, c.C); };
  const int K = c.W - 1;
  Held x(seq(), c.x_dtype), y(seq(), c.y_dtype), dy(seq(), c.y_dtype), dx(seq(), c.x_dtype);
  x.layout.fill(x.storage, d.in.x);
  dy.layout.fill(dy.storage, d.dy);
  std::vector<float> weight(d.in.weight.begin(), d.in.weight.end()), bias(d.in.bias.begin(), d.in.bias.end()),
      state0(d.in.state0.begin(), d.in.state0.end()), dstate(d.dstate.begin(), d.dstate.end());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> state(size_t(c.B) * c.C * std::max(K, 0), nan), dstate0 = state, dweight(size_t(c.C) * c.W, nan),
                                                                     dbias(size_t(c.C), nan);

  ConvInputs in;
  in.x = x.view();
  in.weight = Tensor::contiguous(weight.data(), DType::f32, {c.C, c.W});
  if (c.bias) in.bias = Tensor::contiguous(bias.data(), DType::f32, {c.C});
  if (c.state0) in.state0 = Tensor::contiguous(state0.data(), DType::f32, {c.B, c.C, K});
  ConvOptions options;
  options.activation = c.activation;
  ExecutionContext context;
  context.threads = threads;

  ConvResults out;
  ConvArgs fa(in);
  fa.y = y.view();
  if (c.state) fa.state = Tensor::contiguous(state.data(), DType::f32, {c.B, c.C, K});
  if (target) cpu::conv_forward(describe_conv_forward(fa, options), {*target, {threads}});
  else conv_forward(fa, options, context);
  out.y = y.read();
  out.padding_intact = !c.strided || y.layout.outside_intact(y.storage);
  if (c.state) out.state = flat_read(state);
  if (!backward) return out;

  ConvBackwardArgs ba(in);
  ba.dy = dy.view();
  if (c.dstate) ba.dstate = Tensor::contiguous(dstate.data(), DType::f32, {c.B, c.C, K});
  ba.dx = dx.view();
  ba.dweight = Tensor::contiguous(dweight.data(), DType::f32, {c.C, c.W});
  if (c.bias) ba.dbias = Tensor::contiguous(dbias.data(), DType::f32, {c.C});
  if (c.dstate0) ba.dstate0 = Tensor::contiguous(dstate0.data(), DType::f32, {c.B, c.C, K});
  if (target) cpu::conv_backward(describe_conv_backward(ba, options), {*target, {threads}});
  else conv_backward(ba, options, context);
  out.dx = dx.read();
  out.padding_intact = out.padding_intact && (!c.strided || dx.layout.outside_intact(dx.storage));
  out.dweight = flat_read(dweight);
  if (c.bias) out.dbias = flat_read(dbias);
  if (c.dstate0) out.dstate0 = flat_read(dstate0);
  return out;
}

}  // namespace flat::test
