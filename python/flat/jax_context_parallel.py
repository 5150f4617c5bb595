"""Context parallelism in flat.jax: one sequence cut along T across the shards of a mesh axis, under
``jax.shard_map``, only states crossing between them (flat.jax.context_parallel).

    cp = flat.jax.context_parallel("seq")

    def step(q, k, v, g, beta, h0):                  # each shard's [B, T / N, H, K]
        return cp.gated_deltanet(q, k, v, g, beta, initial_state=h0, output_final_state=True)

    tokens = P(None, "seq")                          # T sharded over the mesh axis "seq"
    o, final_state = jax.shard_map(step, mesh=mesh, in_specs=(tokens,) * 5 + (P(),),
                                   out_specs=(tokens, P()), check_vma=False)(q, k, v, g, beta, h0)

The functions are flat.jax's (la, retnet, mamba2, gla, deltanet, gated_deltanet, kda, gdn2, sla, and
the short convolution conv), with the same arguments, called inside ``jax.shard_map`` with the
sequence axis T sharded over ``axis_name``: each shard passes its share of the tokens, the first
shard (axis index 0) the first, and gets its share of ``o`` and the final state of the whole
sequence. Forward and backward equal one process's on the whole sequence within rounding, under
``jax.jit`` too. shard_map cuts T into equal shares (T a multiple of the axis size); a share may be
shorter than a chunk.

How: as flat.torch.context_parallel, whose module (python/flat/context_parallel.py) gives the
method: each shard's ``[S, M]`` from one run over its share with the values widened by K zero
columns (gdn2's write gate by K ones) from the initial state ``[0, I]``, one ``jax.lax.all_gather``
of ``[S, M]`` and the initial state (``[N, B, H, K, 2V + K]`` whatever T is), each shard folding its
predecessors' into its true initial state and running its share from it. The backward is JAX's
transpose of those steps: the all-gather's is one reduce-scatter of the gathered size. The
convolution gathers each shard's last W-1 inputs (and the initial state) the same way.

Call it under ``check_vma=False``: flat.jax's custom calls carry no varying-axes type, which
shard_map's check needs for a backward (a forward passes it), and the final state, equal on every
shard, is the all-gather's result, which the check types as varying: under ``check_vma=False``,
``out_specs=P()`` takes it and its cotangent counts once. The initial state is read from the first
shard (the others' is ignored; pass it replicated, ``P()``). A replicated argument's gradient (the
initial state's, retnet's per-head ``g``, the convolution's weight and bias) is summed over the
shards by shard_map's transpose: it arrives whole.

Shapes are static under shard_map, so every shard traces the same call: a refused argument raises
its error at trace time, the same on every shard, before any collective. A value refused at run
time (``check_values``) is found in the run after the all-gather (the first run skips the check), so
a forward raises the error of the shard holding it; where a collective follows in the same program
(a backward compiled with its forward, or shard_map outside ``jax.jit``, which runs op by op), the
other shards wait for that shard until XLA's rendezvous timeout ends the process: check values
before, or pass ``check_values=False``. Not yet: ``cu_seqlens`` and state pools (refused), la's
``normalize`` (refused).
"""

from types import SimpleNamespace

import jax
import jax.numpy as jnp

_NAME = "flat.jax.context_parallel"


def _widened(x, columns: int, fill: float):
    """x [.., V] with `columns` more columns of `fill` (values, gdn2's write gate)."""
    if x is None:
        return None
    return jnp.concatenate([x, jnp.full((*x.shape[:-1], columns), fill, x.dtype)], axis=-1)


def _check_rank(name: str, x, rank: int, layout: str) -> None:
    if x.ndim != rank:
        raise ValueError(f"{_NAME}: {name}: expected {layout}, got rank {x.ndim} {list(x.shape)}")


def _refuse_sequences(sequences, what: str) -> None:
    if any(x is not None for x in sequences):
        raise ValueError(f"{_NAME}: {what}cu_seqlens and state pools are not supported yet: shard one dense batch "
                         "along T")


def _initial_state(initial_state, shape: tuple, layout: str):
    """The first shard's initial state in float32, zeros without one, checked against `shape`."""
    if initial_state is None:
        return jnp.zeros(shape, jnp.float32)
    if tuple(initial_state.shape) != shape:
        raise ValueError(f"{_NAME}: initial_state: expected {layout} = {list(shape)}, got "
                         f"{list(initial_state.shape)}")
    return initial_state.astype(jnp.float32)


def _this_shards(states: list, axis_name):
    """states[i] for this shard's axis index i."""
    return jnp.stack(states)[jax.lax.axis_index(axis_name)]


def _context_parallel_run(run, axis_name):
    """flat.jax's _run with the sequence split across the shards of `axis_name` (the module's docstring)."""

    def cp_run(variant, q, k, v, g=None, beta=None, b=None, w=None, *, initial_state, output_final_state, sequences,
               **options):
        _refuse_sequences(sequences, "")
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check_rank(name, x, 4, "[B, T, H, D]")
        # The state's heads: the most of any input's (one with fewer is shared, python/flat/_api.py).
        H = max(x.shape[2] for x in (q, k, v, g, beta, b, w) if x is not None and x.ndim >= 3)
        B, K, V = v.shape[0], k.shape[3], v.shape[3]
        # [S, M] [B, H, K, V + K]: the share's final state from zero and its transition, in one run V + K wide.
        start = jnp.concatenate([jnp.zeros((B, H, K, V)), jnp.broadcast_to(jnp.eye(K), (B, H, K, K))], axis=-1)
        # Its values unchecked: a refused one stops its shard in the second run, after the all-gather,
        # which every shard reaches then (the module's docstring).
        _, local = run(variant, q, k, _widened(v, K, 0.0), g, beta, b, _widened(w, K, 1.0), initial_state=start,
                       output_final_state=True, sequences=sequences, **{**options, "check_values": False})
        first = _initial_state(initial_state, (B, H, K, V), "[B, H, K, V]")
        # [N, B, H, K, 2V + K]: every shard's S, M and (the first shard's) initial state.
        gathered = jax.lax.all_gather(jnp.concatenate([local, first], axis=-1), axis_name)
        states = [gathered[0, ..., V + K:]]  # states[i]: the state before shard i's share
        for part in gathered:
            states.append(part[..., V:V + K] @ states[-1] + part[..., :V])
        o, _ = run(variant, q, k, v, g, beta, b, w, initial_state=_this_shards(states[:-1], axis_name),
                   output_final_state=False, sequences=sequences, **options)
        return o, (states[-1] if output_final_state else None)

    return cp_run


def _context_parallel_conv(conv, axis_name):
    """flat.jax.conv with the sequence split across the shards of `axis_name`: each shard's last W-1
    inputs (and the first shard's initial state) in one all-gather, folded into each shard's initial
    state."""

    def cp_conv(x, weight, bias=None, initial_state=None, output_final_state=False, activation=None,
                cu_seqlens=None, *, initial_state_indices=None, final_state_indices=None, token_state_indices=None):
        sequences = (cu_seqlens, initial_state_indices, final_state_indices, token_state_indices)
        _check_rank("weight", weight, 2, "[C, W]")
        if weight.shape[1] == 1:  # no window reaches back: nothing to exchange
            return conv(x, weight, bias, initial_state, output_final_state, activation, cu_seqlens,
                        initial_state_indices=initial_state_indices, final_state_indices=final_state_indices,
                        token_state_indices=token_state_indices)
        _refuse_sequences(sequences, "conv: ")
        _check_rank("x", x, 3, "[B, T, C]")
        B, T, C = x.shape
        width = weight.shape[1] - 1  # the state's inputs
        kept = min(T, width)  # the share's inputs a successor's window reaches, the same on every shard
        first = _initial_state(initial_state, (B, C, width), "[B, C, W-1]")
        tail = jnp.swapaxes(x[:, T - kept:].astype(jnp.float32), 1, 2)  # [B, C, kept]
        # [N, B, C, kept + W-1]: every shard's last inputs and (the first shard's) initial state.
        gathered = jax.lax.all_gather(jnp.concatenate([tail, first], axis=-1), axis_name)
        states = [gathered[0, ..., kept:]]  # states[i]: the W-1 inputs before shard i's share
        for part in gathered:
            states.append(jnp.concatenate([states[-1], part[..., :kept]], axis=-1)[..., kept:])
        y, _ = conv(x, weight, bias, initial_state=_this_shards(states[:-1], axis_name), activation=activation)
        return y, (states[-1] if output_final_state else None)

    return cp_conv


def context_parallel(axis_name) -> SimpleNamespace:
    """flat.jax's variant functions, each running one sequence split along T across the shards of
    the mesh axis `axis_name`, to be called inside jax.shard_map with T sharded over it. See the
    module's docstring (python/flat/jax_context_parallel.py) and docs/python.md, "Context
    parallelism"."""
    from . import _api
    from . import jax as flat_jax

    functions = _api.variant_functions(_context_parallel_run(flat_jax._run, axis_name), flat_jax._XP)
    functions["la"] = _api.without_normalize(functions["la"], _NAME)
    functions["conv"] = _context_parallel_conv(flat_jax.conv, axis_name)
    functions["conv"].__doc__ = flat_jax.conv.__doc__
    return SimpleNamespace(**functions)
