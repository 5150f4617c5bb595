"""The operations' signatures, shared by flat.torch and flat.jax: one function per variant, named as
``flat run`` names it, with FLA's argument names where the meaning is the same.

Common keyword arguments: scale (default K^-1/2), initial_state [B, H, K, V] float32,
output_final_state, chunk_size (a multiple of 16 from 16 to 256), use_qk_l2norm_in_kernel,
check_values (refuse gates above 0 and non-finite gates, strengths and states). The delta rule also
takes solve ("auto", "subst", "blocked", "doubling"); grouped gates gate_group (channels per gate
value); cu_seqlens ([num_seqs + 1] offsets of sequences packed along T of one batch row, FLA's
variable-length batches: each sequence its own state, initial_state and final_state
[num_seqs, H, K, V]). Each returns (o, final_state), final_state None unless output_final_state.
"""


def variant_functions(_run):
    """The functions of every variant on a framework's _run(variant, q, k, v, g, beta, b, w, **options)."""

    def la(q, k, v, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
           use_qk_l2norm_in_kernel=False, check_values=True, cu_seqlens=None):
        """Linear attention: H_t = H_{t-1} + k_t v_t^T, o_t = scale H_t^T q_t."""
        return _run("la", q, k, v, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                    chunk_size=chunk_size, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve="auto",
                    gate_group=None, check_values=check_values, cu_seqlens=cu_seqlens)

    def retnet(q, k, v, g, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
               use_qk_l2norm_in_kernel=False, check_values=True, cu_seqlens=None):
        """RetNet: H_t = exp(g) H_{t-1} + k_t v_t^T with g [H] one log-decay per head."""
        return _run("retnet", q, k, v, g, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve="auto",
                    gate_group=None, check_values=check_values, cu_seqlens=cu_seqlens)

    def mamba2(q, k, v, g, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
               use_qk_l2norm_in_kernel=False, check_values=True, cu_seqlens=None):
        """Mamba-2 (SSD), FLA's simple GLA: H_t = exp(g_t) H_{t-1} + k_t v_t^T with g [B, T, H]."""
        return _run("mamba2", q, k, v, g, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve="auto",
                    gate_group=None, check_values=check_values, cu_seqlens=cu_seqlens)

    def gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
            use_qk_l2norm_in_kernel=False, check_values=True, cu_seqlens=None):
        """Gated linear attention: H_t = Diag(exp(g_t)) H_{t-1} + k_t v_t^T with g [B, T, H, K]."""
        return _run("gla", q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                    chunk_size=chunk_size, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve="auto",
                    gate_group=None, check_values=check_values, cu_seqlens=cu_seqlens)

    def deltanet(q, k, v, beta, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
                 use_qk_l2norm_in_kernel=False, solve="auto", check_values=True, cu_seqlens=None):
        """DeltaNet: H_t = (I - beta_t k_t k_t^T) H_{t-1} + beta_t k_t v_t^T with beta [B, T, H]."""
        return _run("deltanet", q, k, v, beta=beta, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=None,
                    check_values=check_values, cu_seqlens=cu_seqlens)

    def gated_deltanet(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
                       use_qk_l2norm_in_kernel=False, solve="auto", check_values=True, cu_seqlens=None):
        """Gated DeltaNet (FLA's chunk_gated_delta_rule): H_t = exp(g_t) (I - beta_t k_t k_t^T) H_{t-1} +
        beta_t k_t v_t^T with g, beta [B, T, H]."""
        return _run("gated_deltanet", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=None,
                    check_values=check_values, cu_seqlens=cu_seqlens)

    def kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
            use_qk_l2norm_in_kernel=False, solve="auto", gate_group=None, check_values=True, cu_seqlens=None):
        """Kimi Delta Attention: H_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) H_{t-1} + beta_t k_t v_t^T with
        g [B, T, H, K] (or [B, T, H, K/G] per group of G channels), beta [B, T, H]."""
        return _run("kda", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=gate_group,
                    check_values=check_values, cu_seqlens=cu_seqlens)

    def gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
             use_qk_l2norm_in_kernel=False, solve="auto", gate_group=None, check_values=True, cu_seqlens=None):
        """Gated DeltaNet-2: kda with an erase gate b [B, T, H, K] and a write gate w [B, T, H, V] in place of
        beta."""
        return _run("gdn2", q, k, v, g, b=b, w=w, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=gate_group,
                    check_values=check_values, cu_seqlens=cu_seqlens)

    def sla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
            use_qk_l2norm_in_kernel=False, solve="auto", gate_group=None, check_values=True, cu_seqlens=None):
        """Systolic linear attention: kda with one gate value per 64 channels (g [B, T, Hk, K/64]), keys
        shared by value heads (v [B, T, R Hk, V])."""
        return _run("sla", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                    output_final_state=output_final_state, chunk_size=chunk_size,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, solve=solve, gate_group=gate_group,
                    check_values=check_values, cu_seqlens=cu_seqlens)

    return {f.__name__: f for f in (la, retnet, mamba2, gla, deltanet, gated_deltanet, kda, gdn2, sla)}
