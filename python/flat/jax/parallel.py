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

How: as flat.torch.context_parallel for a dense batch, whose module (python/flat/torch/parallel.py)
gives the method: one run over each shard's share with the values widened by K zero columns (gdn2's
write gate by K ones), the first shard's from ``[h0, 0]``, every other's from ``[0, I]``, gives its
``[S, M]`` and its output's two parts; one ``jax.lax.all_gather`` of ``[S, M]`` (``B H K (V + K)``
floats whatever T is) and of which argument values the shard refuses; each shard folds its
predecessors' into its true initial state, and its output is the run's first V columns plus its last
K times that state: no second pass. The backward is JAX's transpose of those steps: the all-gather's
is one reduce-scatter of the gathered size. The convolution gathers each shard's last W-1 inputs
(and the initial state) the same way.

Call it under ``check_vma=False``: flat.jax's custom calls carry no varying-axes type, which
shard_map's check needs for a backward (a forward passes it), and the final state, equal on every
shard, is the all-gather's result, which the check types as varying: under ``check_vma=False``,
``out_specs=P()`` takes it and its cotangent counts once. The initial state is read from the first
shard (the others' is ignored; pass it replicated, ``P()``). A replicated argument's gradient (the
initial state's, retnet's per-head ``g``, the convolution's weight and bias) is summed over the
shards by shard_map's transpose: it arrives whole.

Shapes are static under shard_map, so every shard traces the same call: a refused argument raises
its error at trace time, the same on every shard, before any collective. Values (``check_values``:
a gate above 0, a non-finite gate, strength or initial state) are not refused by the run, which
would stop its shard before the all-gather and leave the others waiting there: each shard gathers
one flag per scanned argument, and after the all-gather every shard raises the same error naming
the argument and the shard holding it (``_after_checking``), forward or backward, under ``jax.jit``
or op by op. Not yet: ``cu_seqlens`` and state pools (refused), la's ``normalize`` (refused).
"""

from functools import partial
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from .. import _api
from . import ops

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


def _checked_values(g, beta, b, w, initial_state):
    """The arguments whose values the library scans (check_values, src/api.cpp check_input_values),
    each (name, array, whether it must also be <= 0), the absent ones left out."""
    named = (("g", g, True), ("beta", beta, False), ("b", b, False), ("w", w, False),
             ("initial_state", initial_state, False))
    return [(name, x, nonpositive) for name, x, nonpositive in named if x is not None]


def _refusals(checked) -> jax.Array:
    """[len(checked)] float32: 1 where this shard's argument holds a value the library refuses (a
    non-finite value, or a gate above 0), else 0."""
    return jnp.stack([jnp.any(~jnp.isfinite(x) | (x > 0 if nonpositive else False)).astype(jnp.float32)
                      for _, x, nonpositive in checked])


def _raise_refused(checked, refused) -> None:
    """On the host, on every shard: the first refused argument's error, naming the shard holding it."""
    shard, which = (int(i) for i in np.argwhere(np.asarray(refused) > 0)[0])
    name, _, nonpositive = checked[which]
    raise ValueError(f"{_NAME}: {name}: expected finite values{' <= 0 (log-space gates)' if nonpositive else ''}, "
                     f"got another on shard {shard} of {len(refused)}")


def _after_checking(checked, gathered, size: int):
    """gathered [N, size + len(checked)] (every shard's states, then which of its values it refuses),
    made to follow a check of the refusals: where any shard refused a value, every shard raises the
    same error. Everything after, the backward's residuals and collective too, reads the result, so no
    shard goes on to wait in a collective (a pure callback whose result nothing read would be dropped)."""
    stop = jax.lax.cond(jnp.any(gathered[:, size:] > 0),
                        lambda r: jax.pure_callback(lambda r: _raise_refused(checked, r) or np.float32(0),
                                                    jax.ShapeDtypeStruct((), jnp.float32), r),
                        lambda r: jnp.zeros((), jnp.float32), jax.lax.stop_gradient(gathered[:, size:]))
    return gathered + stop


def _context_parallel_run(run, axis_name):
    """flat.jax's _run with the sequence split across the shards of `axis_name` (the module's docstring)."""

    def cp_run(variant, q, k, v, g=None, beta=None, b=None, w=None, *, initial_state, output_final_state, sequences,
               options):
        _refuse_sequences(sequences, "")
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check_rank(name, x, 4, "[B, T, H, D]")
        # The state's heads: the most of any input's (one with fewer is shared, python/flat/_api.py).
        H = max(x.shape[2] for x in (q, k, v, g, beta, b, w) if x is not None and x.ndim >= 3)
        B, K, V = v.shape[0], k.shape[3], v.shape[3]
        leading = jax.lax.axis_index(axis_name) == 0
        first = _initial_state(initial_state, (B, H, K, V), "[B, H, K, V]")
        # [B, H, K, V + K]: the first shard from [h0, 0], every other from [0, I].
        start = jnp.where(leading, jnp.concatenate([first, jnp.zeros((B, H, K, K))], axis=-1),
                          jnp.concatenate([jnp.zeros((B, H, K, V)), jnp.broadcast_to(jnp.eye(K), (B, H, K, K))],
                                          axis=-1))
        # One run V + K wide: o_wide [B, T, H, V + K], local [S, M] [B, H, K, V + K]. The run does not
        # check the values: they are checked after the all-gather, where every shard raises alike (the
        # module's docstring).
        o_wide, local = run(variant, q, k, _widened(v, K, 0.0), g, beta, b, _widened(w, K, 1.0),
                            initial_state=start, output_final_state=True, sequences=sequences,
                            options=options._replace(check_values=False))
        checked = _checked_values(g, beta, b, w, None if initial_state is None else jnp.where(leading, first, 0.0))
        refusals = _refusals(checked) if options.check_values and checked else jnp.zeros((0,))
        # [N, B H K (V + K) + refusals]: every shard's S, M and which of its values it refuses.
        gathered = jax.lax.all_gather(jnp.concatenate([local.reshape(-1), refusals]), axis_name)
        if refusals.size:
            gathered = _after_checking(checked, gathered, local.size)
        states = [jnp.zeros((B, H, K, V))]  # states[i]: the state before shard i's share
        for part in gathered:
            part = part[:local.size].reshape(local.shape)
            states.append(part[..., V:] @ states[-1] + part[..., :V])
        # o_t = scale H_t^T q_t is affine in the entering state: the run's first V columns plus its
        # last K (scale q_t^T A_t, A_t the product of the share's A_s through t; zero on the first
        # shard) times the entering state.
        entering = _this_shards(states[:-1], axis_name)
        o = (o_wide[..., :V].astype(jnp.float32) +
             jnp.einsum("bthk,bhkv->bthv", o_wide[..., V:].astype(jnp.float32), entering)).astype(o_wide.dtype)
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


def context_parallel(axis_name, backend=None) -> SimpleNamespace:
    """flat.jax's variant functions, each running one sequence split along T across the shards of
    the mesh axis `axis_name`, to be called inside jax.shard_map with T sharded over it. See the
    module's docstring (python/flat/jax/parallel.py) and docs/python.md, "Context
    parallelism". backend: each shard's run (the convolution's too), as flat.jax's backend=
    (ops.BACKENDS; None: the platform's, TPU kernels on a TPU)."""
    if not (backend is None or isinstance(backend, str)) or backend not in ops.BACKENDS:
        ops._backend(backend, None)
    functions = _api.variant_functions(_context_parallel_run(partial(ops._run, backend=backend), axis_name), ops._XP)
    functions["la"] = _api.without_normalize(functions["la"], _NAME)
    functions["conv"] = _context_parallel_conv(partial(ops.conv, backend=backend), axis_name)
    functions["conv"].__doc__ = ops.conv.__doc__
    return SimpleNamespace(**functions)
