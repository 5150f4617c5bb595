"""flat.nn: PyTorch layers on flat's kernels, one per variant, with FLA's names::

    from flat.nn import GatedDeltaNet
    layer = GatedDeltaNet(hidden_size=512, num_heads=4, head_dim=64)
    o, state = layer(x, output_final_state=True)        # x [B, T, 512]
    o2, state = layer(x2, initial_state=state, output_final_state=True)   # the next chunk
    pool = layer.state_pool(64)                 # serving: 64 states, updated in place (no gradient)
    o3, pool = layer(x3, initial_state=pool, cu_seqlens=cu_seqlens,        # sequences packed along T
                     initial_state_indices=rows, final_state_indices=rows)

``LAYERS`` maps each variant's name (as flat.torch names it) to its layer.
"""

from .layers import (DeltaNet, FusedRMSNormGated, GatedDeltaNet, GatedDeltaNet2, GatedLinearAttention,
                     KimiDeltaAttention, LinearAttention, Mamba2, MultiScaleRetention, ShortConvolution,
                     SystolicLinearAttention)
from .ops import KERNELS, REFERENCE, State, context_parallel

LAYERS = {
    "la": LinearAttention,
    "retnet": MultiScaleRetention,
    "mamba2": Mamba2,
    "gla": GatedLinearAttention,
    "deltanet": DeltaNet,
    "gated_deltanet": GatedDeltaNet,
    "kda": KimiDeltaAttention,
    "gdn2": GatedDeltaNet2,
    "sla": SystolicLinearAttention,
}

__all__ = ["LAYERS", "State", "KERNELS", "REFERENCE", "ShortConvolution", "FusedRMSNormGated"] + [
    cls.__name__ for cls in LAYERS.values()]
