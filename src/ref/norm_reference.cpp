#include "ref/norm_reference.h"

#include <cmath>

namespace flat::ref {
namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

double act(Activation a, double z) {
  switch (a) {
    case Activation::silu: return z * sigmoid(z);
    case Activation::sigmoid: return sigmoid(z);
    case Activation::none: break;
  }
  return z;
}

double act_slope(Activation a, double z) {
  const double s = sigmoid(z);
  switch (a) {
    case Activation::silu: return s + z * s * (1.0 - s);
    case Activation::sigmoid: return s * (1.0 - s);
    case Activation::none: break;
  }
  return 1.0;
}

// One row: the gate a_d = act(g_d) (1 without g), what is normalised u, r = 1 / rms(u), and the
// offset of the row's weights.
struct Row {
  std::vector<double> a, u;
  double r = 0;
  bool gate_first = false;
  size_t w = 0;
};

Row row_of(const NormGateProblem& p, const NormGateInputs& in, size_t row) {
  Row out;
  const size_t weight_rows = in.weight.size() / size_t(p.D);
  out.w = (row % size_t(p.N)) % weight_rows * size_t(p.D);
  out.a.assign(size_t(p.D), 1.0);
  out.u.resize(size_t(p.D));
  out.gate_first = !in.g.empty() && !p.norm_before_gate;
  double squares = 0;
  for (size_t d = 0; d < size_t(p.D); ++d) {
    const size_t i = row * size_t(p.D) + d;
    if (!in.g.empty()) out.a[d] = act(p.activation, in.g[i]);
    out.u[d] = out.gate_first ? in.x[i] * out.a[d] : in.x[i];
    squares += out.u[d] * out.u[d];
  }
  out.r = 1.0 / std::sqrt(squares / p.D + p.eps);
  return out;
}

}  // namespace

std::vector<double> norm_gate_forward(const NormGateProblem& p, const NormGateInputs& in) {
  std::vector<double> y(size_t(p.rows) * size_t(p.D));
  for (size_t row = 0; row < size_t(p.rows); ++row) {
    const Row r = row_of(p, in, row);
    for (size_t d = 0; d < size_t(p.D); ++d)
      y[row * size_t(p.D) + d] = r.u[d] * r.r * in.weight[r.w + d] * (r.gate_first ? 1.0 : r.a[d]);
  }
  return y;
}

NormGateGradients norm_gate_backward(const NormGateProblem& p, const NormGateInputs& in,
                                     const std::vector<double>& dy) {
  NormGateGradients out;
  const size_t D = size_t(p.D);
  out.dx.resize(size_t(p.rows) * D);
  if (!in.g.empty()) out.dg.resize(size_t(p.rows) * D);
  out.dweight.assign(in.weight.size(), 0.0);
  for (size_t row = 0; row < size_t(p.rows); ++row) {
    const Row r = row_of(p, in, row);
    const double* dyr = &dy[row * D];
    // y_d = u_d r w_d c_d with c = a (norm first) or 1. dL/du_j = dy_j w_j c_j r + (dL/dr) dr/du_j,
    // dL/dr = sum_d dy_d u_d w_d c_d, dr/du_j = -r^3 u_j / D.
    double dl_dr = 0;
    for (size_t d = 0; d < D; ++d) {
      const double c = r.gate_first ? 1.0 : r.a[d];
      dl_dr += dyr[d] * r.u[d] * in.weight[r.w + d] * c;
      out.dweight[r.w + d] += dyr[d] * r.u[d] * r.r * c;
    }
    for (size_t j = 0; j < D; ++j) {
      const size_t i = row * D + j;
      const double c = r.gate_first ? 1.0 : r.a[j];
      const double du = dyr[j] * in.weight[r.w + j] * c * r.r - dl_dr * r.r * r.r * r.r * r.u[j] / p.D;
      // u = x a (gate first) or x; the gate's own term when the norm comes first: dy w u r act'(g).
      if (r.gate_first) {
        out.dx[i] = du * r.a[j];
        out.dg[i] = du * in.x[i] * act_slope(p.activation, in.g[i]);
      } else {
        out.dx[i] = du;
        if (!in.g.empty()) out.dg[i] = dyr[j] * in.weight[r.w + j] * r.u[j] * r.r * act_slope(p.activation, in.g[i]);
      }
    }
  }
  return out;
}

}  // namespace flat::ref
