"""flat's kernels as PyTorch operations, on CPU tensors in float32 or bfloat16.

One function per variant, named as ``flat run`` names it, with FLA's argument names where the
meaning is the same; layout ``[B, T, H, K]``; returns ``(o, final_state)``::

    o, final_state = flat.torch.gla(q, k, v, g, scale=None, initial_state=None,
                                    output_final_state=False)

The short convolution is ``flat.torch.conv`` and the output norm and gate
``flat.torch.rms_norm_gated``. Every function is a ``torch.library`` custom op (``flat::forward``,
``flat::backward``, ``flat::conv_*``, ``flat::norm_gate_*``) with its autograd formula and a fake
implementation, so it runs eagerly, under ``torch.compile`` without graph breaks, and under
``torch.autograd``. Gradients reach every differentiable input, ``initial_state`` included. An eager
forward none of whose inputs needs a gradient (inference, a decode step) runs the op's
implementation without the dispatcher, unless it is traced (torch.compile, torch.jit.trace) or a
dispatch or function mode, a functorch transform or the profiler is active (_direct): the same
results, less per-call cost.

Serving (python/flat/_api.py): ``cu_seqlens`` packs sequences along T; ``initial_state_indices``,
``final_state_indices``, ``token_state_indices`` address a pool of states. A call that writes the
pool (``flat::forward_pool``, ``flat::conv_forward_pool``, which declare the pool mutated) updates
``initial_state`` in place, bumping its version counter as PyTorch's in-place operations do (a
backward that saved the pool before the write is refused), and returns it;
``accepted_state_indices`` gives the rows to resume from after a speculative step.

Context parallelism: ``flat.torch.context_parallel(group)`` (python/flat/torch/parallel.py) gives
the same functions with a batch's sequences split along T across a process group's ranks.

Inputs are read in place: ``q``, ``k``, ``v`` may be column slices of one fused projection (only
their last axis must be contiguous; otherwise it is made so). The kernels run without the GIL on
PyTorch's intra-op threads (``torch.get_num_threads()``: the OpenMP runtime torch loaded, which
flat.torch.ops shares by importing the extension after torch). A bad argument raises ``ValueError`` with the
library's message (its tensor named as here: ``initial_state``, the library's ``h0`` and ``state0``);
nothing is written then.
"""

from . import ops
from .ops import *  # noqa: F401,F403  ops.__all__: a function per variant, conv, rms_norm_gated, accepted_state_indices
from .parallel import context_parallel

__all__ = [*ops.__all__, "context_parallel"]
