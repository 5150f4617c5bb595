"""What the flat.compat tests share: transformers' torch fallbacks unwrapped, flat's float32 bounds
and the relative error they are held to."""

import torch

# flat's float32 bounds (docs/variants.md): outputs and states, gradients; relative L2 per tensor.
OUT, GRAD = 1e-5, 1e-4


def plain(f):
    """A transformers torch fallback itself (a hub-kernel decorator may wrap it)."""
    return getattr(f, "__wrapped__", f)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """The relative L2 error of a against b (the absolute one where b is zero), in float64."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.norm()
    return float((a - b).norm() / (scale if scale > 0 else 1.0))
