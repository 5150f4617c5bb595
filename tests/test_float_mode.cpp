// Subnormals are flushed inside the library's work and the caller's floating-point mode is left
// as it was (src/cpu/float_mode.h). Inside is seen through the results: every input below is
// built so that an output is exactly zero when subnormals are flushed (a subnormal operand read
// as zero) and not zero when they are kept, the control that shows the test can tell.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cpu/float_mode.h"
#include "cpu/recurrence.h"
#include "cpu/targets.h"
#include "flat/flat.h"
#include "params.h"
#include "tested_targets.h"

namespace flat::test {
namespace {

using cpu::FlushSubnormals;

constexpr float kSubnormal = 1e-39f;  // below FLT_MIN = 1.18e-38
constexpr float kPoison = -7.f;       // what an output holds before the call writes it

#if defined(__x86_64__) || defined(__i386__)
// A caller's mode off its defaults: rounding upward, the sticky precision flag raised (every
// exception still masked). The library must hand every bit of it back.
constexpr uint64_t kOddCallerMode = 0x4000 | 0x1f80 | 0x20;
#else
constexpr uint64_t kOddCallerMode = 0;
#endif

#define SKIP_WITHOUT_FLUSH_MODE() \
  if (FlushSubnormals::kFlushBits == 0) GTEST_SKIP() << "no flush-to-zero mode on this architecture"

// Sets the calling thread's mode for the lifetime of the object, the old one restored after.
class CallerMode {
 public:
  explicit CallerMode(uint64_t mode) : saved_(FlushSubnormals::read()) { FlushSubnormals::write(mode); }
  ~CallerMode() { FlushSubnormals::write(saved_); }

 private:
  uint64_t saved_;
};

TEST(FlushSubnormals, SetsBothModesAndRestoresEveryBit) {
  SKIP_WITHOUT_FLUSH_MODE();
  const CallerMode caller(kOddCallerMode);
  const uint64_t before = FlushSubnormals::read();
  EXPECT_FALSE(FlushSubnormals::active());
  {
    const FlushSubnormals outer(true);
    EXPECT_TRUE(FlushSubnormals::active());
    EXPECT_EQ(FlushSubnormals::read(), before | FlushSubnormals::kFlushBits);
    {
      const FlushSubnormals inner(true);
      EXPECT_TRUE(FlushSubnormals::active());
    }
    EXPECT_TRUE(FlushSubnormals::active());
  }
  EXPECT_EQ(FlushSubnormals::read(), before);
  {
    const FlushSubnormals kept(false);
    EXPECT_EQ(FlushSubnormals::read(), before);
  }
  EXPECT_EQ(FlushSubnormals::read(), before);
}

// A tensor's storage, fp32, filled with one value.
struct Array {
  std::vector<float> data;
  std::vector<int64_t> shape;
  Array(std::vector<int64_t> shape_, float value) : shape(std::move(shape_)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data.assign(size_t(n), value);
  }
  Tensor view() { return Tensor::contiguous(data.data(), DType::f32, std::span<const int64_t>(shape)); }
  bool all_zero() const {
    return std::all_of(data.begin(), data.end(), [](float x) { return x == 0.f; });
  }
};

// One operation of the library on inputs holding a subnormal, and the outputs it writes.
struct Operation {
  std::string name;
  std::function<void(const ExecutionContext&)> run;
  std::vector<Array*> outputs;
};

// The recurrence of `variant` (la or gated_deltanet: the additive and the delta family) over S
// tokens, q = 1, k = 1/4 (|k| = 1: the delta rule's I - k k^T a projection), gates 0 and beta 1,
// v (forward) or dy (backward) subnormal: S = 1 runs the decode path, longer S the chunked one.
struct Recurrence {
  static constexpr int64_t B = 2, N = 3, K = 16, V = 8;
  Variant variant;
  int64_t S;
  Array q, k, v, g, beta, y, dy, dq, dk, dv, dg, dbeta;

  Recurrence(Variant variant_, int64_t S_, float v_value, float dy_value)
      : variant(variant_),
        S(S_),
        q({B, S, N, K}, 1.f),
        k({B, S, N, K}, 0.25f),
        v({B, S, N, V}, v_value),
        g({B, S, N}, 0.f),
        beta({B, S, N}, 1.f),
        y({B, S, N, V}, kPoison),
        dy({B, S, N, V}, dy_value),
        dq({B, S, N, K}, kPoison),
        dk({B, S, N, K}, kPoison),
        dv({B, S, N, V}, kPoison),
        dg({B, S, N}, kPoison),
        dbeta({B, S, N}, kPoison) {}

  bool delta() const { return variant == Variant::gated_deltanet; }
  Inputs inputs() {
    Inputs in;
    in.q = q.view();
    in.k = k.view();
    in.v = v.view();
    if (delta()) {
      in.g = g.view();
      in.beta = beta.view();
    }
    return in;
  }
  ForwardArgs forward_args() {
    ForwardArgs a(inputs());
    a.y = y.view();
    return a;
  }
  BackwardArgs backward_args() {
    BackwardArgs a(inputs());
    a.dy = dy.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    if (delta()) {
      a.dg = dg.view();
      a.dbeta = dbeta.view();
    }
    return a;
  }
  std::vector<Array*> gradients() {
    std::vector<Array*> out{&dq, &dk, &dv};
    if (delta()) out.insert(out.end(), {&dg, &dbeta});
    return out;
  }
};

// Every path of the library: the recurrence's chunked forward and backward and its decode path
// for both families, the convolution's and the output norm's forward and backward.
class EveryPath {
 public:
  EveryPath() {
    for (Variant variant : {Variant::la, Variant::gated_deltanet}) {
      const std::string name(variant_name(variant));
      for (int64_t S : {int64_t{1}, int64_t{70}}) {
        Recurrence& fwd = recurrences_.emplace_back(variant, S, kSubnormal, 1.f);
        ops_.push_back({name + " forward, S = " + std::to_string(S),
                        [&fwd](const ExecutionContext& c) { forward(fwd.variant, fwd.forward_args(), {}, c); },
                        {&fwd.y}});
      }
      Recurrence& bwd = recurrences_.emplace_back(variant, 70, 1.f, kSubnormal);
      ops_.push_back({name + " backward",
                      [&bwd](const ExecutionContext& c) { backward(bwd.variant, bwd.backward_args(), {}, c); },
                      bwd.gradients()});
    }
    // The convolution without activation: y = sum of 4 taps of x, subnormal unless flushed.
    ops_.push_back({"conv forward",
                    [this](const ExecutionContext& c) {
                      ConvArgs a;
                      a.x = conv_x_.view();
                      a.weight = conv_weight_.view();
                      a.y = conv_y_.view();
                      conv_forward(a, {Activation::none}, c);
                    },
                    {&conv_y_}});
    ops_.push_back({"conv backward",
                    [this](const ExecutionContext& c) {
                      ConvBackwardArgs a;
                      a.x = conv_weight_like_x_.view();
                      a.weight = conv_weight_.view();
                      a.dy = conv_dy_.view();
                      a.dx = conv_dx_.view();
                      a.dweight = conv_dweight_.view();
                      conv_backward(a, {Activation::none}, c);
                    },
                    {&conv_dx_, &conv_dweight_}});
    // The norm: x / sqrt(mean x^2 + eps) is about 3e-37 for a subnormal x, 0 when x reads as 0.
    ops_.push_back({"norm forward",
                    [this](const ExecutionContext& c) {
                      NormGateArgs a;
                      a.x = norm_x_.view();
                      a.weight = norm_weight_.view();
                      a.y = norm_y_.view();
                      norm_gate_forward(a, {}, c);
                    },
                    {&norm_y_}});
    ops_.push_back({"norm backward",
                    [this](const ExecutionContext& c) {
                      NormGateBackwardArgs a;
                      a.x = norm_ones_.view();
                      a.weight = norm_weight_.view();
                      a.dy = norm_dy_.view();
                      a.dx = norm_dx_.view();
                      a.dweight = norm_dweight_.view();
                      norm_gate_backward(a, {}, c);
                    },
                    {&norm_dx_, &norm_dweight_}});
  }

  std::vector<Operation>& operations() { return ops_; }

  struct Outcome {
    bool flushed;          // every output exactly zero
    uint64_t caller_mode;  // the calling thread's mode as the call left it
  };
  // Runs op in `context`, its outputs poisoned first. The mode is read at once: looking at a
  // subnormal output afterwards raises the denormal flag.
  static Outcome run(Operation& op, const ExecutionContext& context) {
    for (Array* out : op.outputs) std::fill(out->data.begin(), out->data.end(), kPoison);
    op.run(context);
    const uint64_t mode = FlushSubnormals::read();
    bool flushed = true;
    for (Array* out : op.outputs) {
      EXPECT_TRUE(std::none_of(out->data.begin(), out->data.end(), [](float x) { return x == kPoison; }))
          << op.name << ": an output element was not written";
      flushed = flushed && out->all_zero();
    }
    return {flushed, mode};
  }

 private:
  std::deque<Recurrence> recurrences_;  // the operations keep references into it
  std::vector<Operation> ops_;
  Array conv_x_{{2, 40, 24}, kSubnormal}, conv_weight_like_x_{{2, 40, 24}, 1.f}, conv_weight_{{24, 4}, 1.f},
      conv_y_{{2, 40, 24}, kPoison}, conv_dy_{{2, 40, 24}, kSubnormal}, conv_dx_{{2, 40, 24}, kPoison},
      conv_dweight_{{24, 4}, kPoison};
  Array norm_x_{{2, 5, 3, 32}, kSubnormal}, norm_ones_{{2, 5, 3, 32}, 1.f}, norm_weight_{{32}, 1.f},
      norm_y_{{2, 5, 3, 32}, kPoison}, norm_dy_{{2, 5, 3, 32}, kSubnormal}, norm_dx_{{2, 5, 3, 32}, kPoison},
      norm_dweight_{{32}, kPoison};
};

// flat's own worker threads and the calling thread: every output flushed, the caller's mode
// (odd in every bit) the same after; with flush_subnormals = false the caller's mode is what
// the work runs in, and the outputs are not zero.
TEST(FlushSubnormals, EveryPathFlushesInsideAndRestoresTheCaller) {
  SKIP_WITHOUT_FLUSH_MODE();
  EveryPath paths;
  const CallerMode caller(kOddCallerMode & ~FlushSubnormals::kFlushBits);
  const uint64_t before = FlushSubnormals::read();
  for (Operation& op : paths.operations()) {
    for (int threads : {1, 2}) {
      ExecutionContext context;
      context.threads = threads;
      const EveryPath::Outcome flushed = EveryPath::run(op, context);
      EXPECT_TRUE(flushed.flushed) << op.name << ", " << threads << " threads";
      EXPECT_EQ(flushed.caller_mode, before) << op.name << ": the caller's mode changed";
      context.flush_subnormals = false;
      FlushSubnormals::write(before);  // the flags the look at the last outputs raised
      const EveryPath::Outcome kept = EveryPath::run(op, context);
      EXPECT_FALSE(kept.flushed) << op.name << " with subnormals kept";
      EXPECT_EQ(kept.caller_mode & ~uint64_t{0x3f}, before & ~uint64_t{0x3f})
          << op.name << ": the caller's mode changed";
      FlushSubnormals::write(before);
    }
  }
}

// A caller that flushes already keeps doing so after the call.
TEST(FlushSubnormals, ACallerThatFlushesKeepsItsMode) {
  SKIP_WITHOUT_FLUSH_MODE();
  EveryPath paths;
  const CallerMode caller(FlushSubnormals::read() | FlushSubnormals::kFlushBits);
  const uint64_t before = FlushSubnormals::read();
  for (Operation& op : paths.operations()) {
    const EveryPath::Outcome outcome = EveryPath::run(op, {});
    EXPECT_TRUE(outcome.flushed) << op.name;
    EXPECT_EQ(outcome.caller_mode, before) << op.name;
  }
}

// A host framework's threads (ExecutionContext::parallel_for) run the parts: each part flushes
// and hands its thread's mode back as it found it.
TEST(FlushSubnormals, HostThreadsGetTheirModeBack) {
  SKIP_WITHOUT_FLUSH_MODE();
  EveryPath paths;
  int restored = 0, parts_run = 0;
  ExecutionContext context;
  context.threads = 3;
  context.parallel_for = [&](int parts, const std::function<void(int)>& run_part) {
    std::vector<std::thread> threads;
    std::vector<int> same(size_t(parts), 0);
    for (int part = 0; part < parts; ++part)
      threads.emplace_back([&, part] {
        FlushSubnormals::write(kOddCallerMode & ~FlushSubnormals::kFlushBits);
        const uint64_t before = FlushSubnormals::read();
        run_part(part);
        same[size_t(part)] = FlushSubnormals::read() == before;
      });
    for (std::thread& t : threads) t.join();
    for (int s : same) restored += s;
    parts_run += parts;
  };
  for (Operation& op : paths.operations()) EXPECT_TRUE(EveryPath::run(op, context).flushed) << op.name;
  EXPECT_GT(parts_run, 0);
  EXPECT_EQ(restored, parts_run);
}

// Each target's kernels compute in the mode (the tests above run the default target).
TEST(FlushSubnormals, EveryTargetFlushes) {
  SKIP_WITHOUT_FLUSH_MODE();
  for (const cpu::Target* target : test::supported_targets()) {
    for (Variant variant : {Variant::la, Variant::gated_deltanet}) {
      for (int64_t S : {int64_t{1}, int64_t{70}}) {
        Recurrence r(variant, S, kSubnormal, 1.f);
        const Params p = describe_forward(variant, r.forward_args(), {});
        cpu::recurrence_forward(p, cpu::Run{*target, {1}});
        EXPECT_TRUE(r.y.all_zero()) << target->name << " " << variant_name(variant) << " S = " << S;
        std::fill(r.y.data.begin(), r.y.data.end(), kPoison);
        cpu::recurrence_forward(p, cpu::Run{*target, {1}, false});
        // The tile unit flushes whatever the mode: on it, keeping subnormals keeps them out of
        // the elementwise steps only, and a product of subnormals is zero either way.
        if (target->tile_products) continue;
        EXPECT_FALSE(r.y.all_zero()) << target->name << " " << variant_name(variant) << " S = " << S << ", kept";
      }
    }
  }
}

}  // namespace
}  // namespace flat::test
