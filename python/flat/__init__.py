"""flat: fused chunkwise kernels for linear attention on the CPU.

The operations live in the framework modules, imported on their own::

    import flat.torch   # flat.torch.gla(q, k, v, g, ...) -> (o, final_state), differentiable
    import flat.jax     # the same names, for jax.grad and jax.jit

What each variant computes: docs/variants.md in the repository.
"""

from ._core import precisions as _precisions
from ._core import target as _target
from ._core import variants as _variants

__version__ = "0.1.0"

# The variants, in the library's order: (name, gate, update, default gate group).
VARIANTS = tuple(_variants())

# The names precision= takes (flat::Precision), the default first.
PRECISIONS = tuple(_precisions())


def target() -> str:
    """The CPU target the kernels run on (FLAT_ISA in the environment picks one)."""
    return _target()
