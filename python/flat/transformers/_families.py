"""What flat.transformers swaps, one explicit table per family: the modeling module, and for each
of its kernel functions (a module global the layers call by name) the flat.compat function that
serves it on CPU tensors.

A family lists every function its layers reach through transformers' kernel fallback
(``use_kernel_func_from_hub_with_fallback``): the short convolution's prefill and decode, and the
recurrence's prefill (chunked) and decode (one token). tests/python/test_transformers.py checks
that every listed global exists in the installed transformers, so a rename shows up there, not as
a function silently left on the torch path.
"""

# The compat functions, by the package whose calling convention they take.
_FLA = "flat.compat.fla"
_CONV = "flat.compat.causal_conv1d"
_SSM = "flat.compat.mamba_ssm"

# Gated DeltaNet layers (Qwen3.5, Qwen3.5-MoE, Qwen3-Next, OLMo-hybrid).
_GATED_DELTANET = {
    "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
    "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
    "torch_chunk_gated_delta_rule": (_FLA, "chunk_gated_delta_rule"),
    "torch_recurrent_gated_delta_rule": (_FLA, "fused_recurrent_gated_delta_rule"),
}

FAMILIES = {
    "qwen3_5": {
        "module": "transformers.models.qwen3_5.modeling_qwen3_5",
        "functions": dict(_GATED_DELTANET),
    },
    "qwen3_5_moe": {
        "module": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
        "functions": dict(_GATED_DELTANET),
    },
    "qwen3_next": {
        "module": "transformers.models.qwen3_next.modeling_qwen3_next",
        "functions": dict(_GATED_DELTANET),
    },
    "olmo_hybrid": {
        "module": "transformers.models.olmo_hybrid.modeling_olmo_hybrid",
        "functions": dict(_GATED_DELTANET),
    },
    "kimi_linear": {
        "module": "transformers.models.kimi_linear.modeling_kimi_linear",
        "functions": {
            "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
            "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
            "chunk_kimi_delta_attention": (_FLA, "chunk_kda"),
            "recurrent_kimi_delta_attention": (_FLA, "fused_recurrent_kda"),
        },
    },
    "mamba2": {
        "module": "transformers.models.mamba2.modeling_mamba2",
        "functions": {
            "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
            "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
            "mamba2_chunk_scan": (_SSM, "mamba_chunk_scan_combined"),
            "mamba2_split_conv1d_scan_combined": (_SSM, "mamba_split_conv1d_scan_combined"),
            "mamba2_selective_state_update": (_SSM, "selective_state_update"),
        },
    },
    "nemotron_h": {
        "module": "transformers.models.nemotron_h.modeling_nemotron_h",
        "functions": {
            "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
            "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
            "mamba2_chunk_scan": (_SSM, "mamba_chunk_scan_combined"),
            "mamba2_split_conv1d_scan_combined": (_SSM, "mamba_split_conv1d_scan_combined"),
            "mamba2_selective_state_update": (_SSM, "selective_state_update"),
        },
    },
    "granitemoehybrid": {
        "module": "transformers.models.granitemoehybrid.modeling_granitemoehybrid",
        "functions": {
            "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
            "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
            "mamba2_chunk_scan": (_SSM, "mamba_chunk_scan_combined"),
            "mamba2_split_conv1d_scan_combined": (_SSM, "mamba_split_conv1d_scan_combined"),
            "mamba2_selective_state_update": (_SSM, "selective_state_update"),
        },
    },
    "falcon_h1": {
        "module": "transformers.models.falcon_h1.modeling_falcon_h1",
        "functions": {
            "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
            "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
            "mamba2_chunk_scan": (_SSM, "mamba_chunk_scan_combined"),
            "mamba2_split_conv1d_scan_combined": (_SSM, "mamba_split_conv1d_scan_combined"),
            "mamba2_selective_state_update": (_SSM, "selective_state_update"),
        },
    },
    "bamba": {
        "module": "transformers.models.bamba.modeling_bamba",
        "functions": {
            "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
            "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
            "mamba2_chunk_scan": (_SSM, "mamba_chunk_scan_combined"),
            "mamba2_split_conv1d_scan_combined": (_SSM, "mamba_split_conv1d_scan_combined"),
            "mamba2_selective_state_update": (_SSM, "selective_state_update"),
        },
    },
    "lfm2": {
        "module": "transformers.models.lfm2.modeling_lfm2",
        "functions": {
            "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
            "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
        },
    },
    "lfm2_moe": {
        "module": "transformers.models.lfm2_moe.modeling_lfm2_moe",
        "functions": {
            "causal_conv1d_fn": (_CONV, "causal_conv1d_fn"),
            "causal_conv1d_update": (_CONV, "causal_conv1d_update"),
        },
    },
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
