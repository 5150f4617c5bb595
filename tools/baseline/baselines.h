// The baselines `flat bench` measures the fused kernels against, on the same arguments and in
// the same process. Part of the tool, not of the library; each takes a problem already
// validated by describe_forward / describe_backward (src/params.h) and runs on the target and
// workers of `run` (the unfused one on the target's chunk stages).
#pragma once

#include "cpu/run.h"
#include "params.h"

namespace flat::baseline {

// The step-by-step recurrence in fp32, one token at a time, as CPU inference engines run it
// (llama.cpp's ggml ops): H <- Diag(a_t) H + k_t v_t^T, y_t = scale H^T q_t. The backward walks
// the tokens in reverse from fp32 checkpoints of the state.
void recurrent_forward(const Params& p, const cpu::Run& run);
void recurrent_backward(const Params& p, const cpu::Run& run);

// The same chunkwise algorithm as the fused kernels, left unfused the way a framework runs it:
// the state-passing pass writes every chunk-start state to memory, then a separate pass reads
// them back to compute the outputs (backward: the dH of every chunk likewise).
void unfused_forward(const Params& p, const cpu::Run& run);
void unfused_backward(const Params& p, const cpu::Run& run);

}  // namespace flat::baseline
