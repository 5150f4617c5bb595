#include "bench_serve.h"

#include <numeric>

#include "bench_pass.h"
#include "bench_workload.h"

namespace flat::tool {
namespace {

// A [1, S, ...] input's tokens [first, first + count); a per-head gate (rank 1) whole.
Tensor tokens(Tensor t, int64_t first, int64_t count) {
  if (!t.present() || t.rank == 1) return t;
  const int64_t element = t.dtype == DType::bf16 ? 2 : 4;
  t.data = static_cast<char*>(t.data) + first * t.stride[1] * element;
  t.shape[1] = count;
  return t;
}

// One call: its sequences' lengths, the pool rows they start from and end in (or, with kept
// tokens, the rows of each token's state), where their tokens start in the workload.
struct Call {
  std::string part;
  std::vector<int64_t> lengths, reads, finals, kept;
  int64_t first_token = 0;

  int64_t tokens() const { return std::accumulate(lengths.begin(), lengths.end(), int64_t{0}); }
  std::vector<int64_t> offsets() const {
    std::vector<int64_t> cu{0};
    for (int64_t n : lengths) cu.push_back(cu.back() + n);
    return cu;
  }
};

}  // namespace

std::vector<ServeResult> bench_serving(Variant variant, const BenchOptions& bench, const ServeBenchOptions& o,
                                       int threads, int repeats, std::ostream* progress) {
  // The prefills' lengths and pool rows: longest, longest / 2, ... (at least 1), rows after the
  // decoding sequences'; every speculative token's row after those.
  Call decode{"decode", {}, {}, {}, {}, 0}, prefill{"prefill", {}, {}, {}, {}, o.decodes};
  for (int64_t i = 0; i < o.decodes; ++i) {
    decode.lengths.push_back(1);
    decode.reads.push_back(i);
  }
  decode.finals = decode.reads;
  for (int64_t i = 0; i < o.prefills; ++i) {
    prefill.lengths.push_back(std::max<int64_t>(1, o.longest >> i));
    prefill.reads.push_back(o.decodes + i);
  }
  prefill.finals = prefill.reads;
  Call speculative{"speculative", std::vector<int64_t>(size_t(o.decodes), o.draft), decode.reads, {}, {}, 0};
  const int64_t first_kept = o.decodes + o.prefills;
  for (int64_t t = 0; t < o.decodes * o.draft; ++t) speculative.kept.push_back(first_kept + t);
  Call mixed{"mixed", prefill.lengths, prefill.reads, prefill.finals, {}, 0};
  mixed.lengths.insert(mixed.lengths.end(), decode.lengths.begin(), decode.lengths.end());
  mixed.reads.insert(mixed.reads.end(), decode.reads.begin(), decode.reads.end());
  mixed.finals = mixed.reads;
  mixed.first_token = o.decodes;  // the prefills' tokens, then the decodes' again

  // One workload of every token the calls read: the decodes' (and the speculative tokens'), the
  // prefills', then the decodes' once more for the mixed call.
  BenchOptions packed = bench;
  packed.B = 1;
  packed.S = std::max(o.decodes * o.draft, o.decodes + prefill.tokens() + o.decodes);
  Workload w(packed, variant);
  const Shape& sh = w.sh;
  // The pool: kPoolSets sets of every call's rows (tools/bench_pass.h; 4 x 64 MiB of decoding
  // states at the default shape, 8 times a 32 MiB last level cache), filled with one random state
  // repeated.
  const int64_t state_floats = sh.N * sh.K * sh.V, rows_per_set = first_kept + o.decodes * o.draft;
  std::vector<float> pool(size_t(kPoolSets * rows_per_set * state_floats));
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
  for (int64_t e = 0; e < state_floats; ++e) pool[size_t(e)] = dist(rng);
  for (int64_t row = 1; row < kPoolSets * rows_per_set; ++row)
    std::copy_n(pool.begin(), state_floats, pool.begin() + row * state_floats);
  const Tensor pool_tensor =
      Tensor::contiguous(pool.data(), DType::f32, {kPoolSets * rows_per_set, sh.N, sh.K, sh.V});
  Options options = w.options(bench);
  options.check_values = false;
  ExecutionContext context;
  context.threads = threads;

  std::vector<ServeResult> results;
  for (const Call* call : {&decode, &speculative, &prefill, &mixed}) {
    const std::vector<int64_t> cu = call->offsets();
    const int64_t T = call->tokens();
    const Inputs all = w.inputs();
    ForwardArgs a;
    for (const auto& [field, from] : {std::pair{&Inputs::q, all.q}, std::pair{&Inputs::k, all.k},
                                      std::pair{&Inputs::v, all.v}, std::pair{&Inputs::g, all.g},
                                      std::pair{&Inputs::beta, all.beta}, std::pair{&Inputs::b, all.b},
                                      std::pair{&Inputs::w, all.w}})
      a.*field = tokens(from, call->first_token, T);
    a.y = tokens(w.forward_args().y, call->first_token, T);
    a.h0 = a.ht = pool_tensor;
    // The call's rows in each set of the pool.
    std::vector<Call> sets(kPoolSets, *call);
    for (int64_t set = 0; set < kPoolSets; ++set)
      for (std::vector<int64_t> Call::*rows : {&Call::reads, &Call::finals, &Call::kept})
        sets[size_t(set)].*rows = rows_of_set(call->*rows, set, rows_per_set);
    int turn = 0;
    const auto run = [&] {
      const Call& set = sets[size_t(turn++ % kPoolSets)];
      a.sequences = {cu, set.reads, set.finals, set.kept};
      forward(variant, a, options, context);
    };

    // The work: each sequence on its path (recurrent for the decoding ones, of at most `draft`
    // tokens), its states read once and written once per final or kept row.
    Timing work;
    for (int64_t n : call->lengths) {
      ProblemSize size = sh;
      size.B = 1;
      size.S = n;
      const bool decoding = call != &prefill && n <= o.draft;
      work.flops += decoding ? recurrent_flops(sh.variant, size, false) : chunk_flops(sh.variant, size, false);
      work.bytes += io_bytes(sh.variant, size, false);
    }
    const double writes = double(call->finals.size() + call->kept.size());
    work.bytes += (double(call->reads.size()) + writes) * double(state_floats) * 4;

    work.seconds = timed_pass(progress, sh.label() + " serving " + call->part, repeats, run);
    results.push_back({sh.label(), call->part, int64_t(call->lengths.size()), T, work});
  }
  return results;
}

}  // namespace flat::tool
