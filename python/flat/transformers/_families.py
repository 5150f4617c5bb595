"""What flat.transformers swaps, one explicit table per family: the modeling module, and for each
of its kernel functions (a module global the layers call by name) the flat.compat function that
serves it on CPU tensors.

A family lists every function its layers reach through transformers' kernel fallback
(``use_kernel_func_from_hub_with_fallback``): the short convolution's prefill and decode, and the
recurrence's prefill (chunked) and decode (one token). tests/python/test_transformers.py checks
that every listed global exists in the installed transformers, so a rename shows up there, not as
a function silently left on the torch path.

A family may also list layers (``"layers"``: class name -> the function in
flat.transformers._layers that makes the replacement of the class's ``forward`` from the original):
whole layers transformers marks ``@use_kernel_forward_from_hub`` whose forward flat runs itself,
where that pays (docs/transformers.md), and FalconH1's mixer, whose original forward runs with its
fused call's norm_before_gate taken from the config. Their kernel functions stay swapped too: the
original forward, which a layer's replacement calls for what it does not serve, reaches flat
through them.
"""

# The compat functions, by the package whose calling convention they take.
_FLA = "flat.compat.fla"
_CONV = "flat.compat.causal_conv1d"
_SSM = "flat.compat.mamba_ssm"

# The short convolution, in every family's layers (LFM2's alone).
_CONVOLUTION = {
    "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
    "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
}

# Gated DeltaNet layers (Qwen3.5, Qwen3.5-MoE, Qwen3-Next, OLMo-hybrid).
_GATED_DELTANET = {
    **_CONVOLUTION,
    "torch_chunk_gated_delta_rule": (_FLA, "chunk_gated_delta_rule"),
    "torch_recurrent_gated_delta_rule": (_FLA, "fused_recurrent_gated_delta_rule"),
}

# Kimi Delta Attention layers (Kimi Linear).
_KDA = {
    **_CONVOLUTION,
    "chunk_kimi_delta_attention": (_FLA, "chunk_kda"),
    "recurrent_kimi_delta_attention": (_FLA, "fused_recurrent_kda"),
}

# Mamba-2 mixers (Mamba2, NemotronH, GraniteMoeHybrid, FalconH1, Bamba).
_MAMBA2 = {
    **_CONVOLUTION,
    "mamba2_chunk_scan": (_SSM, "mamba_chunk_scan_combined"),
    "mamba2_split_conv1d_scan_combined": (_SSM, "mamba_split_conv1d_scan_combined"),
    "mamba2_selective_state_update": (_SSM, "selective_state_update"),
}


_LAYERS = "flat.transformers._layers"


def _family(model: str, functions: dict, layers: dict = None) -> dict:
    return {"module": f"transformers.models.{model}.modeling_{model}", "functions": dict(functions),
            "layers": dict(layers or {})}


FAMILIES = {
    "qwen3_5": _family("qwen3_5", _GATED_DELTANET, {"Qwen3_5GatedDeltaNet": (_LAYERS, "gated_deltanet_forward")}),
    "qwen3_5_moe": _family("qwen3_5_moe", _GATED_DELTANET,
                           {"Qwen3_5MoeGatedDeltaNet": (_LAYERS, "gated_deltanet_forward")}),
    "qwen3_next": _family("qwen3_next", _GATED_DELTANET,
                          {"Qwen3NextGatedDeltaNet": (_LAYERS, "qwen3_next_gated_deltanet_forward")}),
    "olmo_hybrid": _family("olmo_hybrid", _GATED_DELTANET,
                           {"OlmoHybridGatedDeltaNet": (_LAYERS, "olmo_hybrid_gated_deltanet_forward")}),
    "kimi_linear": _family("kimi_linear", _KDA),
    "mamba2": _family("mamba2", _MAMBA2),
    "nemotron_h": _family("nemotron_h", _MAMBA2),
    "granitemoehybrid": _family("granitemoehybrid", _MAMBA2),
    "falcon_h1": _family("falcon_h1", _MAMBA2, {"FalconH1Mixer": (_LAYERS, "falcon_h1_mixer_forward")}),
    "bamba": _family("bamba", _MAMBA2),
    "lfm2": _family("lfm2", _CONVOLUTION),
    "lfm2_moe": _family("lfm2_moe", _CONVOLUTION),
}

# Which of the compat functions run over whole sequences (prefill, training): these must keep
# packed sequences apart, so they must take cu_seqlens or seq_idx; and the axis of their first
# argument that runs along the tokens. The decode functions (one token per batch row) are absent.
SEQUENCE_FUNCTIONS = {
    "causal_conv1d_fn": -1,  # x [B, C, T]
    "chunk_gated_delta_rule": 1,  # q [B, T, H, K]
    "chunk_kda": 1,
    "mamba_chunk_scan_combined": 1,  # x [B, T, H, P]
    "mamba_split_conv1d_scan_combined": 1,  # zxbcdt [B, T, D]
}
