// Runs a gla forward through the installed flat and checks every output element was written with
// a finite value; exit status 0 when it was.
#include <flat/flat.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

int main() {
  const int64_t B = 1, S = 70, N = 2, K = 16, V = 8;
  std::vector<float> q(B * S * N * K, 0.25f), k = q, v(B * S * N * V, 0.5f), g(B * S * N * K, -0.1f);
  std::vector<float> y(B * S * N * V, std::numeric_limits<float>::quiet_NaN());
  flat::ForwardArgs a;
  a.q = flat::Tensor::contiguous(q.data(), flat::DType::f32, {B, S, N, K});
  a.k = flat::Tensor::contiguous(k.data(), flat::DType::f32, {B, S, N, K});
  a.v = flat::Tensor::contiguous(v.data(), flat::DType::f32, {B, S, N, V});
  a.g = flat::Tensor::contiguous(g.data(), flat::DType::f32, {B, S, N, K});
  a.y = flat::Tensor::contiguous(y.data(), flat::DType::f32, {B, S, N, V});
  flat::forward(flat::parse_variant("gla"), a, {}, {.threads = 2});
  for (float x : y)
    if (!std::isfinite(x)) {
      std::fprintf(stderr, "consumer: an output element is %f\n", x);
      return 1;
    }
  std::printf("consumer: gla forward through find_package(flat), %zu outputs\n", y.size());
  return 0;
}
