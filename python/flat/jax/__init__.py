"""flat's kernels as JAX operations on the CPU, with the names and arguments of flat.torch::

    o, final_state = flat.jax.gla(q, k, v, g, scale=None, initial_state=None,
                                  output_final_state=False)

Each is an XLA custom call through JAX's typed FFI (the handlers in flat._core, run on XLA's
intra-op threads) wrapped in ``jax.custom_vjp``, so ``jax.grad``, ``jax.jit``, ``jax.eval_shape``
and ``jax.vmap`` (over a leading axis, one call per element) work. Inputs are float32 or bfloat16
arrays; states float32. A bad argument raises an error carrying the library's message (its tensor
named as here: ``initial_state``, the library's ``h0`` and ``state0``).

Serving (python/flat/_api.py): ``cu_seqlens`` and the index arrays (int32 or int64) are traced
arrays, not static. A call with ``final_state_indices`` or ``token_state_indices`` returns the pool
``initial_state`` updated as its second value, the pool an input aliased to that output
(``input_output_aliases``): in place when the caller donates it (``jax.jit(...,
donate_argnums=...)``), a copy otherwise. It is for inference: differentiating it raises.

Context parallelism: ``flat.jax.context_parallel(axis_name)`` (python/flat/jax/parallel.py) gives
the same functions with one sequence split along T across the shards of a mesh axis, under
``jax.shard_map``.
"""

from . import ops
from .ops import *  # noqa: F401,F403  ops.__all__: a function per variant, conv, rms_norm_gated, accepted_state_indices
from .parallel import context_parallel

__all__ = [*ops.__all__, "context_parallel"]
