#include "ref/conv_reference.h"

#include <cmath>

namespace flat::ref {
namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

double activate(Activation a, double z) { return a == Activation::silu ? z * sigmoid(z) : z; }

// d act / dz.
double activation_slope(Activation a, double z) {
  if (a != Activation::silu) return 1.0;
  const double s = sigmoid(z);
  return s * (1.0 + z * (1.0 - s));
}

// One step of channel c: the window u = (x_{t-W+1}, ..., x_t), the state before the step being
// u[0 .. W-2] and after it u[1 .. W-1].
double pre_activation(const ConvProblem& pr, const ConvInputs& in, int c, const std::vector<double>& u) {
  double z = in.bias.empty() ? 0.0 : in.bias[size_t(c)];
  for (int w = 0; w < pr.W; ++w) z += in.weight[size_t(c) * pr.W + w] * u[size_t(w)];
  return z;
}

// The state (W-1 inputs) of (b, c) before position 0.
std::vector<double> initial_window(const ConvProblem& pr, const ConvInputs& in, int b, int c) {
  const int K = pr.W - 1;
  std::vector<double> state(size_t(K), 0.0);
  if (!in.state0.empty())
    for (int j = 0; j < K; ++j) state[size_t(j)] = in.state0[(size_t(b) * pr.C + c) * K + j];
  return state;
}

}  // namespace

ConvOutputs conv_forward(const ConvProblem& pr, const ConvInputs& in) {
  const int K = pr.W - 1;
  ConvOutputs out;
  out.y.assign(size_t(pr.B) * pr.S * pr.C, 0.0);
  out.state.assign(size_t(pr.B) * pr.C * K, 0.0);
  for (int b = 0; b < pr.B; ++b)
    for (int c = 0; c < pr.C; ++c) {
      std::vector<double> state = initial_window(pr, in, b, c);
      for (int t = 0; t < pr.S; ++t) {
        const size_t at = (size_t(b) * pr.S + t) * pr.C + c;
        std::vector<double> u = state;
        u.push_back(in.x[at]);
        out.y[at] = activate(pr.activation, pre_activation(pr, in, c, u));
        state.assign(u.begin() + 1, u.end());
      }
      for (int j = 0; j < K; ++j) out.state[(size_t(b) * pr.C + c) * K + j] = state[size_t(j)];
    }
  return out;
}

ConvGradients conv_backward(const ConvProblem& pr, const ConvInputs& in, const std::vector<double>& dy,
                            const std::vector<double>& dstate) {
  const int K = pr.W - 1;
  ConvGradients g;
  g.dx.assign(size_t(pr.B) * pr.S * pr.C, 0.0);
  g.dweight.assign(size_t(pr.C) * pr.W, 0.0);
  g.dbias.assign(size_t(pr.C), 0.0);
  g.dstate0.assign(size_t(pr.B) * pr.C * K, 0.0);
  for (int b = 0; b < pr.B; ++b)
    for (int c = 0; c < pr.C; ++c) {
      // Replay the forward to keep every step's window.
      std::vector<std::vector<double>> windows;
      std::vector<double> state = initial_window(pr, in, b, c);
      for (int t = 0; t < pr.S; ++t) {
        std::vector<double> u = state;
        u.push_back(in.x[(size_t(b) * pr.S + t) * pr.C + c]);
        windows.push_back(u);
        state.assign(u.begin() + 1, u.end());
      }
      // Walk back, carrying the gradient with respect to the state after step t.
      std::vector<double> dstate_after(size_t(K), 0.0);
      if (!dstate.empty())
        for (int j = 0; j < K; ++j) dstate_after[size_t(j)] = dstate[(size_t(b) * pr.C + c) * K + j];
      for (int t = pr.S - 1; t >= 0; --t) {
        const std::vector<double>& u = windows[size_t(t)];
        const size_t at = (size_t(b) * pr.S + t) * pr.C + c;
        const double dz = dy[at] * activation_slope(pr.activation, pre_activation(pr, in, c, u));
        // du: through z, and through the state after the step, which is u[1 .. W-1].
        std::vector<double> du(size_t(pr.W), 0.0);
        for (int w = 0; w < pr.W; ++w) {
          du[size_t(w)] = in.weight[size_t(c) * pr.W + w] * dz;
          g.dweight[size_t(c) * pr.W + w] += u[size_t(w)] * dz;
        }
        for (int j = 0; j < K; ++j) du[size_t(j) + 1] += dstate_after[size_t(j)];
        g.dbias[size_t(c)] += dz;
        g.dx[at] = du[size_t(K)];
        for (int j = 0; j < K; ++j) dstate_after[size_t(j)] = du[size_t(j)];
      }
      for (int j = 0; j < K; ++j) g.dstate0[(size_t(b) * pr.C + c) * K + j] = dstate_after[size_t(j)];
    }
  return g;
}

}  // namespace flat::ref
