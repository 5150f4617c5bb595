// The backend boundary (src/backend.h), seen from a second backend: this test's recorder, for
// Device::cuda, built with the API's sources as a backend is added (CMakeLists.txt:
// flat_backend_tests, its list of backends `recorder`). It writes nothing and reads no tensor: it
// records the Params-level calls the API hands it, which are all a backend ever gets, the empty
// calls among them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend.h"
#include "flat/flat.h"

namespace flat {
namespace recorder {
namespace {

// What the recorder was handed, call by call.
struct Received {
  std::vector<std::string> calls;  // "check_values g", "forward", ...
  Params params;
  ConvParams conv;
  NormGateParams norm;
};
Received received;

void check_values(const char* name, const Tensor&, validate::Values, const ExecutionContext&) {
  received.calls.push_back("check_values " + std::string(name));
}
void forward(const Params& p, const ExecutionContext&) {
  received.calls.push_back("forward");
  received.params = p;
}
void backward(const Params& p, const ExecutionContext&) {
  received.calls.push_back("backward");
  received.params = p;
}
void conv_forward(const ConvParams& p, const ExecutionContext&) {
  received.calls.push_back("conv_forward");
  received.conv = p;
}
void conv_backward(const ConvParams& p, const ExecutionContext&) {
  received.calls.push_back("conv_backward");
  received.conv = p;
}
void norm_gate_forward(const NormGateParams& p, const ExecutionContext&) {
  received.calls.push_back("norm_gate_forward");
  received.norm = p;
}
void norm_gate_backward(const NormGateParams& p, const ExecutionContext&) {
  received.calls.push_back("norm_gate_backward");
  received.norm = p;
}

}  // namespace

const Backend& backend() {
  static const Backend recorder{.device = Device::cuda,
                                .check_values = check_values,
                                .forward = forward,
                                .backward = backward,
                                .conv_forward = conv_forward,
                                .conv_backward = conv_backward,
                                .norm_gate_forward = norm_gate_forward,
                                .norm_gate_backward = norm_gate_backward};
  return recorder;
}

}  // namespace recorder

namespace {

using recorder::received;

// Memory for the views to point at (never read): the device a tensor says it is on is what the
// API goes by.
struct Memory {
  std::vector<std::vector<float>> blocks;
  Tensor on(Device device, DType dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    blocks.emplace_back(size_t(n > 0 ? n : 1));
    Tensor t = Tensor::contiguous(blocks.back().data(), dtype, shape);
    t.device = device;
    return t;
  }
};

// gla on one device: B = 2, N = 3, K = 16, V = 8, S tokens.
ForwardArgs gla_forward(Memory& m, Device device, int64_t S) {
  ForwardArgs f;
  f.q = m.on(device, DType::bf16, {2, S, 3, 16});
  f.k = m.on(device, DType::bf16, {2, S, 3, 16});
  f.v = m.on(device, DType::bf16, {2, S, 3, 8});
  f.g = m.on(device, DType::f32, {2, S, 3, 16});
  f.h0 = m.on(device, DType::f32, {2, 3, 16, 8});
  f.y = m.on(device, DType::bf16, {2, S, 3, 8});
  f.ht = m.on(device, DType::f32, {2, 3, 16, 8});
  return f;
}

TEST(BackendBoundary, ForwardReachesTheDevicesBackendAsParams) {
  Memory m;
  const ForwardArgs f = gla_forward(m, Device::cuda, 5);
  received = {};
  forward(Variant::gla, f);
  // The value checks the variant's inputs ask for (an absent one is the backend's to pass over).
  EXPECT_EQ(received.calls, (std::vector<std::string>{"check_values g", "check_values beta", "check_values b",
                                                      "check_values w", "check_values h0", "forward"}));
  const Params& p = received.params;
  EXPECT_EQ(std::vector<int>({p.B, p.S, p.N, p.K, p.V}), std::vector<int>({2, 5, 3, 16, 8}));
  EXPECT_EQ(p.gate, GateKind::channel);
  EXPECT_EQ(p.q.base, f.q.data);
  EXPECT_EQ(p.ht.base, f.ht.data);
}

// An empty call is the backend's as any other: the API writes nothing on the host.
TEST(BackendBoundary, EmptyCallsReachTheBackend) {
  Memory m;
  const ForwardArgs f = gla_forward(m, Device::cuda, 0);
  received = {};
  forward(Variant::gla, f);
  ASSERT_EQ(received.calls.back(), "forward");
  EXPECT_EQ(received.params.S, 0);
  EXPECT_EQ(received.params.h0.base, f.h0.data);

  BackwardArgs b(f);
  b.dy = m.on(Device::cuda, DType::bf16, {2, 0, 3, 8});
  b.dht = m.on(Device::cuda, DType::f32, {2, 3, 16, 8});
  b.dq = m.on(Device::cuda, DType::bf16, {2, 0, 3, 16});
  b.dk = m.on(Device::cuda, DType::bf16, {2, 0, 3, 16});
  b.dv = m.on(Device::cuda, DType::bf16, {2, 0, 3, 8});
  b.dg = m.on(Device::cuda, DType::f32, {2, 0, 3, 16});
  b.dh0 = m.on(Device::cuda, DType::f32, {2, 3, 16, 8});
  received = {};
  backward(Variant::gla, b);
  ASSERT_EQ(received.calls.back(), "backward");
  EXPECT_EQ(received.params.S, 0);
  EXPECT_EQ(received.params.dh0.base, b.dh0.data);

  NormGateArgs n;
  n.x = m.on(Device::cuda, DType::bf16, {0, 4, 3, 8});
  n.weight = m.on(Device::cuda, DType::f32, {8});
  n.y = m.on(Device::cuda, DType::bf16, {0, 4, 3, 8});
  received = {};
  norm_gate_forward(n);
  EXPECT_EQ(received.calls, std::vector<std::string>{"norm_gate_forward"});
  EXPECT_EQ(received.norm.rows(), 0);
}

TEST(BackendBoundary, ConvAndNormReachTheirEntries) {
  Memory m;
  ConvArgs c;
  c.x = m.on(Device::cuda, DType::bf16, {2, 7, 32});
  c.weight = m.on(Device::cuda, DType::f32, {32, 4});
  c.y = m.on(Device::cuda, DType::bf16, {2, 7, 32});
  received = {};
  conv_forward(c);
  EXPECT_EQ(received.calls, std::vector<std::string>{"conv_forward"});
  EXPECT_EQ(std::vector<int>({received.conv.B, received.conv.S, received.conv.C, received.conv.W}),
            std::vector<int>({2, 7, 32, 4}));

  NormGateArgs n;
  n.x = m.on(Device::cuda, DType::bf16, {2, 4, 3, 8});
  n.weight = m.on(Device::cuda, DType::f32, {3, 8});
  n.y = m.on(Device::cuda, DType::bf16, {2, 4, 3, 8});
  NormGateBackwardArgs nb(n);
  nb.dy = m.on(Device::cuda, DType::bf16, {2, 4, 3, 8});
  nb.dx = m.on(Device::cuda, DType::bf16, {2, 4, 3, 8});
  nb.dweight = m.on(Device::cuda, DType::f32, {3, 8});
  received = {};
  norm_gate_backward(nb);
  EXPECT_EQ(received.calls, std::vector<std::string>{"norm_gate_backward"});
  EXPECT_EQ(received.norm.weight_rows, 3);
  EXPECT_EQ(received.norm.rows(), 24);
}

// A device this build has no backend for, or tensors on two devices: refused before any backend
// is called.
TEST(BackendBoundary, RefusesADeviceWithoutABackend) {
  Memory m;
  received = {};
  try {
    forward(Variant::gla, gla_forward(m, Device::cpu, 5));
    ADD_FAILURE() << "a call on the CPU ran without a CPU backend";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "flat: no backend for device cpu in this build");
  }
  ForwardArgs mixed = gla_forward(m, Device::cuda, 5);
  mixed.y.device = Device::cpu;
  EXPECT_THROW(forward(Variant::gla, mixed), Error);
  EXPECT_TRUE(received.calls.empty());
}

}  // namespace
}  // namespace flat
