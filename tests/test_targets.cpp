// The target list and the backend boundary: which targets are compiled and supported, which one a
// call runs on (the same for the recurrence and the convolution), the per-thread scope, and the
// execution context (threads; a host framework's parallel-for running the ranges instead of
// flat's own workers, with the same results).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "checks.h"
#include "cpu/recurrence.h"
#include "cpu/targets.h"
#include "cpu/tile_support.h"
#include "harness.h"
#include "test_conv_harness.h"
#include "tested_targets.h"

namespace flat::test {
namespace {

TEST(Targets, ListStartsPortableAndNamesAreUnique) {
  const auto targets = cpu::compiled_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_STREQ(targets.front()->name, "generic");
  std::set<std::string> names;
  for (const cpu::Target* t : targets) {
    EXPECT_TRUE(names.insert(t->name).second) << t->name;
    EXPECT_EQ(cpu::find_target(t->name), t);
  }
  EXPECT_EQ(cpu::find_target("no such target"), nullptr);
  EXPECT_TRUE(cpu::supported(*targets.front()));
}

// With FLAT_ISA unset the choice is supported and never a target that runs only on request; a
// name the CPU runs is that target; any other name, a target this CPU lacks, one this build lacks
// or a name in the wrong case, is refused, naming FLAT_ISA and the name, never run as the default.
TEST(Targets, FlatIsaNamesATargetThisCpuRunsOrIsRefused) {
  const cpu::Target& best = cpu::choose_target("");
  EXPECT_TRUE(cpu::supported(best));
  EXPECT_EQ(best.only_on_request, nullptr) << best.name << " is the default: " << best.only_on_request;
  const auto expect_refused = [](std::string_view name) {
    try {
      cpu::choose_target(name);
      ADD_FAILURE() << "FLAT_ISA=" << name << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FLAT_ISA"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'" + std::string(name) + "'"), std::string::npos) << e.what();
    }
  };
  for (const cpu::Target* t : cpu::compiled_targets()) {
    SCOPED_TRACE(t->name);
    if (cpu::supported(*t)) {
      EXPECT_EQ(&cpu::choose_target(t->name), t);
    } else {
      expect_refused(t->name);
    }
  }
  for (std::string_view name : {"avx1024", "AVX2", "Generic", "amx ", "generic,avx2"}) expect_refused(name);
  const cpu::Target* asked = cpu::find_target(cpu::requested_target());
  if (cpu::requested_target().empty() || (asked && cpu::supported(*asked))) {
    EXPECT_EQ(&cpu::default_target(), &cpu::choose_target(cpu::requested_target()));
  }
}

// The tests' model of the tile unit is a target of their own on x86 (the amx target's code on the
// model), never the library's, and needs what the amx target needs but the tiles; its stand-in for
// CPUs without AVX-512, amx_model_avx2 (the tile products on the model, avx2's vector code around
// them), runs exactly where amx_model does not and AVX2 does, so each such CPU tests the tile paths
// once; the models run only on request, amx by default where it runs. On x86, in
// every build but the sanitized one, which builds the portable target alone (CMakeLists.txt).
TEST(Targets, TheTileModelIsATargetForTheTests) {
  const cpu::Target* model = test::find_target("amx_model");
  const cpu::Target* stand_in = test::find_target("amx_model_avx2");
  const cpu::Target* amx = cpu::find_target("amx");
  const cpu::Target* avx2 = cpu::find_target("avx2");
  for (const cpu::Target* t : cpu::compiled_targets()) EXPECT_FALSE(test::software_model(*t)) << t->name;
  EXPECT_EQ(cpu::find_target("amx_model"), nullptr) << "a model in the library";
  EXPECT_EQ(cpu::find_target("amx_model_avx2"), nullptr) << "a model in the library";
#if defined(FLAT_X86_TARGETS)
  ASSERT_NE(model, nullptr);
  ASSERT_NE(stand_in, nullptr);
  ASSERT_NE(amx, nullptr);
  ASSERT_NE(avx2, nullptr);
  EXPECT_NE(model->only_on_request, nullptr);
  EXPECT_NE(stand_in->only_on_request, nullptr);
  EXPECT_EQ(amx->only_on_request, nullptr);
  EXPECT_EQ(amx->needs, model->needs | cpu::kCpuAmxBf16);
  EXPECT_EQ(stand_in->needs, avx2->needs);
  EXPECT_EQ(stand_in->replaced_where, model->needs);
  EXPECT_TRUE(model->tile_products && test::software_model(*model));
  EXPECT_TRUE(stand_in->tile_products && test::software_model(*stand_in));
  EXPECT_NE(cpu::supported(*model), cpu::supported(*stand_in) || !cpu::supported(*avx2))
      << "one model of the tile unit on a CPU with AVX2";
#else
  EXPECT_EQ(model, nullptr);
  EXPECT_EQ(stand_in, nullptr);
  EXPECT_EQ(amx, nullptr);
  EXPECT_EQ(avx2, nullptr);
#endif
}

// The tiles count only when every step says yes, the OS's grant asked last: a refused grant, a CPU
// without the tiles or an OS that does not save their state leaves kCpuAmxBf16 out (and the amx
// target unsupported: the next target runs, every result as without it).
TEST(Targets, TileSupportNeedsEveryStepAndAsksTheGrantLast) {
  static int asked = 0;
  const auto granted = [] { return ++asked, true; };
  const auto refused = [] { return ++asked, false; };
  const cpu::TileSupport all{.amx_tile = true, .amx_bf16 = true, .osxsave = true, .xcr0 = 0x60007};
  EXPECT_TRUE(cpu::amx_bf16_usable(all, granted));
  EXPECT_EQ(asked, 1);
  EXPECT_FALSE(cpu::amx_bf16_usable(all, refused)) << "the grant refused";
  EXPECT_EQ(asked, 2);
  cpu::TileSupport no_bf16 = all, no_state = all, no_xgetbv = all;
  no_bf16.amx_bf16 = false;
  no_state.xcr0 = 0x20007;  // XTILECFG without XTILEDATA
  no_xgetbv.osxsave = false;
  for (const cpu::TileSupport& s : {no_bf16, no_state, no_xgetbv}) EXPECT_FALSE(cpu::amx_bf16_usable(s, granted));
  EXPECT_EQ(asked, 2) << "the grant asked although the CPU or the OS had said no";
  const cpu::Target* amx = cpu::find_target("amx");
  if (amx && !(cpu::cpu_features() & cpu::kCpuAmxBf16)) {
    EXPECT_FALSE(cpu::supported(*amx));
  }
}

// What the targets declare: the portable one needs nothing, so every CPU has a target; a target
// preferred only with a feature also needs the instructions that feature is about (the bf16-dot
// preference, the bf16 dot product); and the bf16-dot preference is only read beside the
// instruction.
TEST(Targets, DeclaredNeedsAreConsistent) {
  const cpu::Target& portable = *cpu::compiled_targets().front();
  EXPECT_EQ(portable.needs, 0u) << portable.name;
  EXPECT_TRUE(cpu::supported(portable));
  for (const cpu::Target* t : test::targets()) {
    if (t->preferred_with & cpu::kCpuBf16DotOutrunsFma) {
      EXPECT_TRUE(t->needs & cpu::kCpuAvx512Bf16) << t->name;
    }
  }
  if (cpu::cpu_features() & cpu::kCpuBf16DotOutrunsFma) {
    EXPECT_TRUE(cpu::cpu_features() & cpu::kCpuAvx512Bf16);
  }
}

// A small gla problem in fp32, its output to a buffer of the caller's.
struct Gla {
  static constexpr int64_t B = 2, S = 100, N = 4, K = 32, V = 16;
  std::vector<float> q = std::vector<float>(B * S * N * K), k = q, v = std::vector<float>(B * S * N * V), g = q;
  Gla() {
    for (size_t i = 0; i < q.size(); ++i) {
      q[i] = float((i * 7) % 13) / 13.0f - 0.5f;
      k[i] = float((i * 5) % 11) / 11.0f - 0.5f;
      g[i] = -float(i % 5) / 10.0f;
    }
    for (size_t i = 0; i < v.size(); ++i) v[i] = float((i * 3) % 7) / 7.0f;
  }
  ForwardArgs args(std::vector<float>& y) {
    y.assign(v.size(), std::numeric_limits<float>::quiet_NaN());
    ForwardArgs a;
    a.q = Tensor::contiguous(q.data(), DType::f32, {B, S, N, K});
    a.k = Tensor::contiguous(k.data(), DType::f32, {B, S, N, K});
    a.v = Tensor::contiguous(v.data(), DType::f32, {B, S, N, V});
    a.g = Tensor::contiguous(g.data(), DType::f32, {B, S, N, K});
    a.y = Tensor::contiguous(y.data(), DType::f32, {B, S, N, V});
    return a;
  }
};

// The public entry points run the default target, the recurrence and the convolution alike:
// their results are bitwise those of the drivers on that target.
TEST(Targets, PublicCallsRunTheDefaultTarget) {
  Gla gla;
  std::vector<float> through_api, on_default;
  ExecutionContext context;
  context.threads = 2;
  forward(Variant::gla, gla.args(through_api), {}, context);
  cpu::recurrence_forward(describe_forward(Variant::gla, gla.args(on_default), {}), {cpu::default_target(), {2}});
  EXPECT_EQ(through_api, on_default);

  ConvCase conv;
  conv.x_dtype = conv.y_dtype = DType::bf16;
  const ConvData data(conv);
  const ConvResults conv_api = run_conv(data, true, 2, nullptr);
  const ConvResults conv_default = run_conv(data, true, 2, &cpu::default_target());
  EXPECT_EQ(conv_api.y, conv_default.y);
  EXPECT_EQ(conv_api.dx, conv_default.dx);
  EXPECT_EQ(conv_api.dweight, conv_default.dweight);
}

// A host framework's parallel-for runs the ranges: it is called, with at most `threads` parts,
// every part runs once, and the results are bitwise those of flat's own workers.
TEST(ExecutionContext, HostParallelForRunsTheRanges) {
  Gla gla;
  std::vector<float> own, hosted;
  ExecutionContext context;
  context.threads = 3;
  forward(Variant::gla, gla.args(own), {}, context);

  int calls = 0, most_parts = 0, parts_run = 0;
  context.parallel_for = [&](int parts, const std::function<void(int)>& run_part) {
    ++calls;
    most_parts = std::max(most_parts, parts);
    for (int p = parts - 1; p >= 0; --p) {  // in any order, here on the calling thread
      run_part(p);
      ++parts_run;
    }
  };
  forward(Variant::gla, gla.args(hosted), {}, context);
  EXPECT_GT(calls, 0);
  EXPECT_EQ(most_parts, 3);
  EXPECT_GE(parts_run, calls);
  EXPECT_EQ(own, hosted);
}

// Each worker range runs inside the target's per-thread scope: entered before, left after, on the
// range's own thread.
int entered = 0, left = 0;
thread_local int depth = 0;

TEST(Targets, DriversEnterThePerThreadScope) {
  cpu::Target scoped = cpu::default_target();
  scoped.enter_thread = [] {
    ++depth;
    __atomic_add_fetch(&entered, 1, __ATOMIC_RELAXED);
  };
  scoped.leave_thread = [] {
    --depth;
    __atomic_add_fetch(&left, 1, __ATOMIC_RELAXED);
  };
  Case c;
  c.S = 40;
  c.Nq = c.Nk = c.Nv = c.Ng = 4;
  const Problem problem(c);
  entered = left = 0;
  run_kernel(problem, true, 2, scoped);
  EXPECT_GT(entered, 0);
  EXPECT_EQ(entered, left);
  EXPECT_EQ(depth, 0);
}

}  // namespace
}  // namespace flat::test
