"""The gates the benches draw as the models do (flat.bench's sections and --context-parallel)."""

import math

import torch


def model_gates(B, T, H, K, per_channel):
    """g [B, T, H] (Gated DeltaNet) or [B, T, H, K] (Kimi Linear's KDA) as the models compute it at
    initialisation: -exp(A_log) * softplus(a + dt_bias), A = exp(A_log) ~ U(1, 16) per head,
    dt_bias = softplus^-1(dt) with dt log-uniform in [0.001, 0.1] per head or channel, a ~ N(0, 1)
    per token (the projection of a normalised hidden state)."""
    columns = (H, K) if per_channel else (H,)
    A = torch.empty(H).uniform_(1, 16).reshape((H, 1) if per_channel else (H,))
    dt = torch.exp(torch.empty(columns).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    return -A * torch.nn.functional.softplus(torch.randn(B, T, *columns) + dt_bias)
