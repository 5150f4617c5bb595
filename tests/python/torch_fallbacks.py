"""What the flat.compat tests share: transformers' torch fallbacks unwrapped, flat's float32 bounds
and the relative error they are held to."""

import inspect

import torch

# flat's float32 bounds (docs/variants.md): outputs and states, gradients; relative L2 per tensor.
OUT, GRAD = 1e-5, 1e-4


def plain(f):
    """A transformers torch fallback itself, as its module global holds it: transformers 5.24's
    hub-kernel decorator wraps it in a function (``__wrapped__``); 5.25's, through the kernels
    library, also makes that function a module of its own (an ``nn.Module`` whose forward calls it)."""
    if isinstance(f, torch.nn.Module):
        f = inspect.getclosurevars(type(f).forward).nonlocals["func"]
    return getattr(f, "__wrapped__", f)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """The relative L2 error of a against b (the absolute one where b is zero), in float64."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.norm()
    return float((a - b).norm() / (scale if scale > 0 else 1.0))
