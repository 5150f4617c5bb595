"""The operations' signatures, shared by flat.torch and flat.jax: one function per variant, named as
``flat run`` names it, with FLA's argument names where the meaning is the same.

Common keyword arguments: scale (None: K^-1/2; else a finite number), initial_state [B, H, K, V] float32,
output_final_state, chunk_size (a multiple of 16 from 16 to 256), use_qk_l2norm_in_kernel,
check_values (refuse gates above 0 and non-finite gates, strengths and states). The delta rule also
takes solve ("auto", "subst", "blocked", "doubling"); grouped gates gate_group (channels per gate
value). Each returns (o, final_state), final_state None unless output_final_state.

Variable-length batches and a state pool (flat::Sequences; 1-D int32 or int64 arrays):

- cu_seqlens [num_seqs + 1]: offsets of sequences packed along T of one batch row, each with its
  own state: initial_state and final_state [num_seqs, H, K, V] (an empty array is refused);
- initial_state_indices [num_seqs]: initial_state is a pool [P, H, K, V] and sequence i starts from
  its row initial_state_indices[i] (from zero where -1); final_state stays [num_seqs, H, K, V];
- final_state_indices [num_seqs]: sequence i's final state goes to the pool's row
  final_state_indices[i] (nowhere where -1);
- token_state_indices [B * T]: the state after each token goes to the pool's row
  token_state_indices[t] (nowhere where -1), for speculative decoding.

With final_state_indices or token_state_indices the pool initial_state is updated in place (read
through initial_state_indices; without them every sequence starts from zero) and returned as the
second value: (o, initial_state). That call is for inference: no gradient flows through it.

An empty batch (B = 0 or T = 0) returns an empty o and the initial state as the final state (zeros
without one).
"""

from ._args import Sequences


def variant_functions(_run):
    """The functions of every variant on a framework's _run(variant, q, k, v, g, beta, b, w, **options)."""

    def la(q, k, v, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
           use_qk_l2norm_in_kernel=False, check_values=True, cu_seqlens=None,
           initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        """Linear attention: H_t = H_{t-1} + k_t v_t^T, o_t = scale H_t^T q_t."""
        return _run("la", q, k, v, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                    chunk_size=chunk_size, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve="auto",
                    gate_group=None, check_values=check_values,
                    sequences=Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices))

    def retnet(q, k, v, g, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
               use_qk_l2norm_in_kernel=False, check_values=True, cu_seqlens=None,
               initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        """RetNet: H_t = exp(g) H_{t-1} + k_t v_t^T with g [H] one log-decay per head."""
        return _run("retnet", q, k, v, g, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve="auto",
                    gate_group=None, check_values=check_values,
                    sequences=Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices))

    def mamba2(q, k, v, g, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
               use_qk_l2norm_in_kernel=False, check_values=True, cu_seqlens=None,
               initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        """Mamba-2 (SSD), FLA's simple GLA: H_t = exp(g_t) H_{t-1} + k_t v_t^T with g [B, T, H]."""
        return _run("mamba2", q, k, v, g, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve="auto",
                    gate_group=None, check_values=check_values,
                    sequences=Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices))

    def gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
            use_qk_l2norm_in_kernel=False, check_values=True, cu_seqlens=None,
            initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        """Gated linear attention: H_t = Diag(exp(g_t)) H_{t-1} + k_t v_t^T with g [B, T, H, K]."""
        return _run("gla", q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                    chunk_size=chunk_size, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve="auto",
                    gate_group=None, check_values=check_values,
                    sequences=Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices))

    def deltanet(q, k, v, beta, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
                 use_qk_l2norm_in_kernel=False, solve="auto", check_values=True, cu_seqlens=None,
                 initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        """DeltaNet: H_t = (I - beta_t k_t k_t^T) H_{t-1} + beta_t k_t v_t^T with beta [B, T, H]."""
        return _run("deltanet", q, k, v, beta=beta, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=None,
                    check_values=check_values,
                    sequences=Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices))

    def gated_deltanet(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
                       use_qk_l2norm_in_kernel=False, solve="auto", check_values=True, cu_seqlens=None,
                       initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        """Gated DeltaNet (FLA's chunk_gated_delta_rule): H_t = exp(g_t) (I - beta_t k_t k_t^T) H_{t-1} +
        beta_t k_t v_t^T with g, beta [B, T, H]."""
        return _run("gated_deltanet", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=None,
                    check_values=check_values,
                    sequences=Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices))

    def kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
            use_qk_l2norm_in_kernel=False, solve="auto", gate_group=None, check_values=True, cu_seqlens=None,
            initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        """Kimi Delta Attention: H_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) H_{t-1} + beta_t k_t v_t^T with
        g [B, T, H, K] (or [B, T, H, K/G] per group of G channels), beta [B, T, H]."""
        return _run("kda", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=gate_group,
                    check_values=check_values,
                    sequences=Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices))

    def gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
             use_qk_l2norm_in_kernel=False, solve="auto", gate_group=None, check_values=True, cu_seqlens=None,
             initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        """Gated DeltaNet-2: kda with an erase gate b [B, T, H, K] and a write gate w [B, T, H, V] in place of
        beta."""
        return _run("gdn2", q, k, v, g, b=b, w=w, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=gate_group,
                    check_values=check_values,
                    sequences=Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices))

    def sla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
            use_qk_l2norm_in_kernel=False, solve="auto", gate_group=None, check_values=True, cu_seqlens=None,
            initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        """Systolic linear attention: kda with one gate value per 64 channels (g [B, T, Hk, K/64]), keys
        shared by value heads (v [B, T, R Hk, V])."""
        return _run("sla", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=gate_group,
                    check_values=check_values,
                    sequences=Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices))

    return {f.__name__: f for f in (la, retnet, mamba2, gla, deltanet, gated_deltanet, kda, gdn2, sla)}
