"""flat.jax's operations (the package's docstring says what they are): the FFI calls wrapped in
``jax.custom_vjp`` and the functions users call, which flat.jax re-exports. The variant functions
take ``backend=`` (BACKENDS): the recurrence runs the C++ library (the FFI call, on the CPU) or the
Pallas TPU kernels of flat.jax.tpu, after the same checks of every argument."""

import functools
import inspect
import math
from functools import partial
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import _api, _args
from .. import _core
from . import tpu

_TARGETS = _core.jax_ffi_targets()
if not _TARGETS:
    raise ImportError("flat was built without jaxlib's FFI headers: reinstall it with jax installed")
for _name, _capsule in _TARGETS:
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")


def _attribute(value):
    """An option as an FFI attribute of its kind (flat/call.h's OptionValue)."""
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, int):
        return np.int64(value)
    if isinstance(value, float):
        return np.float64(value)
    return value


def _call(operation: str, results, *operands, aliases=None, **options):
    """flat::call through the one FFI handler: operands in the order of _core.tensor_slots(operation)
    (then flat::Sequences' four arrays), the options by the library's names (None: the default)."""
    attributes = {name: _attribute(value) for name, value in options.items() if value is not None}
    return jax.ffi.ffi_call("flat_call", results, vmap_method="sequential", input_output_aliases=aliases or {})(
        *operands, operation=operation, **attributes)


def _absent():
    """A tensor the call does not have: an array of no elements."""
    return jnp.zeros((0,), jnp.float32)


def _given(x):
    return _absent() if x is None else x


def _ints(x):
    """An array of flat::Sequences as the handlers take it, an integer buffer: none has no elements."""
    return jnp.zeros((0,), jnp.int32) if x is None else x


def _problem(x) -> Optional[str]:
    """What keeps x from being an array of flat::Sequences (1-D, int32 or int64), or None."""
    if x.ndim != 1 or x.dtype not in (jnp.int32, jnp.int64):
        return f"{x.dtype} {list(x.shape)}"
    return None


_INT32 = np.iinfo(np.int32)


def _check_narrowing(name: str, x) -> None:
    """With jax_enable_x64 off (JAX's default) JAX narrows int64 to int32, wrapping what does not
    fit: a concrete array's values are checked before, so that 2**32 + 1 is refused rather than read
    as 1. A traced array is int32 already (narrowed where it entered the trace)."""
    if x is None or isinstance(x, jax.core.Tracer) or jax.dtypes.canonicalize_dtype(np.int64) == np.int64:
        return
    values = np.asarray(x)
    if values.dtype.kind not in "iu" or values.size == 0:
        return
    out = (values < _INT32.min) | (values > _INT32.max)
    if out.any():
        at = tuple(int(i) for i in np.argwhere(out)[0])
        raise ValueError(f"flat: {name}: expected values that fit int32 (jax_enable_x64 is off, so JAX would narrow "
                         f"them), got {values[at]} at {list(at)}")


def _sequences(sequences: _args.Sequences, pool) -> _args.Sequences:
    """The arrays as JAX arrays (int32 unless x64 is enabled; the handlers read either), checked for
    what the library cannot see (it checks their values)."""
    for name, x in sequences._asdict().items():
        _check_narrowing(name, x)
    sequences = _args.Sequences(*(None if x is None else jnp.asarray(x) for x in sequences))
    _args.check_sequences(sequences, "an array", _problem)
    _args.check_pool(sequences, pool)
    return sequences


def _pool_reads(count: int, reads):
    """initial_state_indices of a call that updates the pool in place: without them its sequences
    start from zero (-1), not from the pool's rows."""
    return jnp.full((count,), -1, jnp.int32) if reads is None else reads


def _pool_gradient(state, grads, reads):
    """The gradient of an initial state from the library's (a row per sequence): with
    initial_state_indices, the pool's, each sequence's row added to the row it read (none for -1)."""
    if reads is None:
        return grads
    return jnp.zeros_like(state).at[jnp.where(reads >= 0, reads, state.shape[0])].add(grads, mode="drop")


def _no_gradient(*args):
    raise _args.pool_error("take no gradient through the call (jax.lax.stop_gradient its inputs)")


def _result(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


_DTYPE_NAMES = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.bfloat16): "bf16"}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}


def _outputs(operation: str, variant: str, inputs: dict, cu_seqlens, pool: bool, options: dict) -> dict:
    """The outputs the library writes for a call, {name: ShapeDtypeStruct} (flat::output_shapes),
    from its inputs by the library's names, each (user's name, array or None), and its options by
    theirs; pool: the initial state is a pool read through initial_state_indices. Shapes only: works
    on traced arrays."""
    described = {}
    for name, (user_name, x) in inputs.items():
        if x is None:
            continue
        if not 1 <= x.ndim <= 4:
            raise ValueError(f"flat: {user_name}: expected an array of rank 1 to 4, got rank {x.ndim}")
        if jnp.dtype(x.dtype) not in _DTYPE_NAMES:
            raise ValueError(f"flat: {user_name}: expected dtype float32 or bfloat16, got {x.dtype}")
        described[name] = (_DTYPE_NAMES[jnp.dtype(x.dtype)], tuple(int(d) for d in x.shape))
    shapes = _core.output_shapes(operation, variant, described, 0 if cu_seqlens is None else int(cu_seqlens.shape[0]),
                                 pool, _args.checked_options(operation, options))
    return {name: _result(tuple(shape), _DTYPES[dtype]) for name, dtype, shape in shapes}


def _results(outputs: dict, names) -> tuple:
    """The handler's results in tensor_slots' order: an output the call does not write as (0,)."""
    return tuple(outputs.get(name, _result((0,), jnp.float32)) for name in names)


def _recurrence_inputs(q, k, v, g, beta, b, w, h0) -> dict:
    return dict(q=("q", q), k=("k", k), v=("v", v), g=("g", g), beta=("beta", beta), b=("b", b), w=("w", w),
                h0=("initial_state", h0))


# The index of h0 among the forward's operands (q, k, v, g, beta, b, w, h0) and of ht among its
# results (y, ht): a pool updated in place is both.
_H0, _HT = 7, 1


def _forward(variant, c, final_state, q, k, v, g, beta, b, w, h0, cu_seqlens, reads):
    outputs = _outputs("forward", variant, _recurrence_inputs(q, k, v, g, beta, b, w, h0), cu_seqlens,
                       reads is not None, c._asdict())
    if not final_state:
        del outputs["ht"]
    results = _results(outputs, ("y", "ht"))
    return _call("forward", results, q, k, v, *(_given(x) for x in (g, beta, b, w, h0)), _ints(cu_seqlens),
                 _ints(reads), _ints(None), _ints(None), variant=variant, **c._asdict())


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _recurrence(variant, c, final_state, q, k, v, g, beta, b, w, h0, cu_seqlens, reads):
    return _forward(variant, c, final_state, q, k, v, g, beta, b, w, h0, cu_seqlens, reads)


def _recurrence_forward(variant, c, final_state, q, k, v, g, beta, b, w, h0, cu_seqlens, reads):
    return (_forward(variant, c, final_state, q, k, v, g, beta, b, w, h0, cu_seqlens, reads),
            (q, k, v, g, beta, b, w, h0, cu_seqlens, reads))


def _recurrence_backward(variant, c, final_state, saved, cotangents):
    q, k, v, g, beta, b, w, h0, cu_seqlens, reads = saved
    dy, dht = cotangents
    outputs = _outputs("backward", variant, _recurrence_inputs(q, k, v, g, beta, b, w, h0), cu_seqlens,
                       reads is not None, c._asdict())
    results = _results(outputs, ("dq", "dk", "dv", "dg", "dbeta", "db", "dw", "dh0"))
    grads = _call("backward", results, q, k, v, *(_given(x) for x in (g, beta, b, w, h0)), dy,
                  dht if final_state else _absent(), _ints(cu_seqlens), _ints(reads), _ints(None), _ints(None),
                  variant=variant, **c._replace(check_values=False)._asdict())
    inputs = (q, k, v, g, beta, b, w)
    dh0 = None if h0 is None else _pool_gradient(h0, grads[-1], reads)
    return tuple(None if x is None else grad for x, grad in zip(inputs, grads)) + (dh0, None, None)


_recurrence.defvjp(_recurrence_forward, _recurrence_backward)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _pool_recurrence(variant, c, q, k, v, g, beta, b, w, pool, cu_seqlens, reads, writes, tokens):
    """The recurrence with h0 and ht one pool [P, N, K, V], updated in place where the caller donates it."""
    outputs = _outputs("forward", variant, _recurrence_inputs(q, k, v, g, beta, b, w, pool), cu_seqlens, True,
                       c._asdict())
    results = (outputs["y"], _result(pool.shape, pool.dtype))
    return _call("forward", results, q, k, v, *(_given(x) for x in (g, beta, b, w)), pool, _ints(cu_seqlens),
                 _pool_reads(_args.sequence_count(q.shape[0], cu_seqlens), reads), _ints(writes), _ints(tokens),
                 aliases={_H0: _HT}, variant=variant, **c._asdict())


_pool_recurrence.defvjp(_no_gradient, _no_gradient)


def _run(variant, q, k, v, g=None, beta=None, b=None, w=None, *, initial_state, output_final_state, sequences,
         options: _api.Options, backend=None):
    backend = _backend(backend, q)
    sequences, pool = _sequences(sequences, initial_state), initial_state
    if backend != "cpu":
        return _run_tpu(variant, q, k, v, g, beta, b, w, initial_state=initial_state,
                        output_final_state=output_final_state, sequences=sequences, options=options,
                        interpret=backend == "interpret")
    writes = sequences.writes_pool
    if _args.rowless(sequences, pool, q.shape[0]):  # no sequence: the call on the pool's first 0 rows
        initial_state, sequences, output_final_state = pool[:0], _args.Sequences(), output_final_state and not writes
    elif writes:
        return _pool_recurrence(variant, options, q, k, v, g, beta, b, w, pool, *sequences)
    o, final_state = _recurrence(variant, options, bool(output_final_state), q, k, v, g, beta, b, w, initial_state,
                                 sequences.cu_seqlens, sequences.initial_state_indices)
    return o, (pool if writes else final_state if output_final_state else None)


def _refuse_values(checks: tuple, *found) -> None:
    """Raises the library's refusal of a value (src/validate.cpp's refuse_value) for the first bad
    element of the first array refused, in the library's order: checks ((name, gate, shape), ..),
    found (bad, flat index, value) for each."""
    for (name, gate, shape), bad, at, value in zip(checks, found[0::3], found[1::3], found[2::3]):
        if bool(bad):
            index = ", ".join(str(int(i)) for i in np.unravel_index(int(at), shape))
            raise ValueError(f"flat: {name}: expected finite values{' <= 0 (log-space gates)' if gate else ''}, got "
                             f"{float(value):g} at [{index}]")


def _check_values(arrays) -> None:
    """check_values on the TPU path, as the library checks it on the CPU: for each (name, array,
    whether a log-space gate) given, in the library's order, the first gate above 0 or non-finite
    value found on the device, one element of each going to the host in one callback, which raises
    where the call runs."""
    checks, found = [], []
    for name, x, gate in arrays:
        if x is None or x.size == 0:
            continue
        flat = x.reshape(-1).astype(jnp.float32)
        bad = ~jnp.isfinite(flat) | (flat > 0) if gate else ~jnp.isfinite(flat)
        at = jnp.argmax(bad)
        checks.append((name, gate, tuple(x.shape)))
        found += [bad[at], at, flat[at]]
    if checks:
        jax.debug.callback(partial(_refuse_values, tuple(checks)), *found)


def _l2norm(x):
    """use_qk_l2norm_in_kernel: x [.., K] / sqrt(sum x^2 + 1e-6) in fp32 (the library's eps)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def _dense_only(sequences: _args.Sequences) -> None:
    """The TPU kernels take dense batches: cu_seqlens and the state pools' indices refused."""
    given = [name for name, array in sequences._asdict().items() if array is not None]
    if given:
        raise ValueError(f"flat: backend: the TPU kernels run dense batches, got {', '.join(given)}; backend='cpu' "
                         "runs it")


def _heads_to(x, N: int):
    """x [B, T, Nx, ...] with each head read by N / Nx heads (head n reads n / (N / Nx)): a copy whose
    gradient JAX sums over the heads sharing one."""
    return x if x.shape[2] == N else jnp.repeat(x, N // x.shape[2], axis=2)


# Each variant by flat.jax.tpu's kernels of: retnet is mamba2 with its per-head constant broadcast
# over S; sla's own (kda's kernels on its packed heads) once its grouped gate is widened to one value
# per channel.
_TPU_VARIANTS = {**{name: name for name in tpu.VARIANTS}, "retnet": "mamba2"}
if set(_TPU_VARIANTS) != set(_args.GATE):
    raise ImportError(f"flat.jax: the TPU path's variants {sorted(_TPU_VARIANTS)} are not the library's "
                      f"{sorted(_args.GATE)}")


def _run_tpu(variant, q, k, v, g, beta, b, w, *, initial_state, output_final_state, sequences, options, interpret):
    """The recurrence by flat.jax.tpu's kernels: the CPU path's checks of shapes, dtypes and options
    (the library's, without running it), then what the kernels do not take refused, then the
    kernels on arrays of one head count N."""
    outputs = _outputs("forward", variant, _recurrence_inputs(q, k, v, g, beta, b, w, initial_state),
                       sequences.cu_seqlens, sequences.initial_state_indices is not None, options._asdict())
    _dense_only(sequences)
    if options.check_values:
        _check_values((("g", g, True), ("beta", beta, False), ("b", b, False), ("w", w, False),
                       ("initial_state", initial_state, False)))
    y = outputs["y"]
    B, T, N, V = y.shape
    K = q.shape[3]
    if B == 0 or T == 0:
        state = jnp.zeros((B, N, K, V), jnp.float32) if initial_state is None else initial_state
        return jnp.zeros(y.shape, y.dtype), (state if output_final_state else None)
    if options.l2norm_qk:
        q, k = _l2norm(q), _l2norm(k)
    if variant == "retnet":  # the per-head constant as mamba2's gate, [H] -> [B, T, H]
        g = jnp.broadcast_to(g.astype(jnp.float32), (B, T, g.shape[0]))
    if g is not None and g.ndim == 4 and g.shape[3] != K:  # a gate per group of channels, to one per channel
        g = jnp.repeat(g, K // g.shape[3], axis=3)
    # sla's R value heads sharing q, k, g, beta (R: the most value heads each of the four is shared by,
    # the library's p.pack) are packed into one head of the kernel, so those are read at N / R heads.
    R = math.gcd(*(N // x.shape[2] for x in (q, k, g, beta))) if variant == "sla" else 1
    v, b, w = (None if x is None else _heads_to(x, N) for x in (v, b, w))
    q, k = (_heads_to(x, N // R) for x in (q, k))
    g, beta = (None if x is None else _heads_to(x.astype(jnp.float32), N // R) for x in (g, beta))
    scale = options.scale if options.scale is not None else K ** -0.5
    o, state = tpu.recurrence(_TPU_VARIANTS[variant], q, k, v, g, beta, b, w, initial_state,
                              scale=scale, chunk=options.chunk or 64, fast=options.precision == "fast",
                              final=output_final_state, interpret=interpret, out_dtype=y.dtype)
    return o, state


# One function per variant (python/flat/_api.py), as flat.torch's.
_XP = _api.Xp(float32=lambda x: jnp.asarray(x).astype(jnp.float32),
               narrow_float=lambda x: jnp.dtype(x.dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)),
               cast_like=lambda x, y: x.astype(y.dtype), sigmoid=jax.nn.sigmoid, softplus=jax.nn.softplus, exp=jnp.exp,
               swap=lambda x: jnp.swapaxes(x, -1, -2), ones=lambda shape: jnp.ones(shape, jnp.float32),
               activations={"silu": jax.nn.silu, "sigmoid": jax.nn.sigmoid, "none": lambda z: z})

# backend=: "cpu" (the C++ library, through the FFI call), "tpu" (the Pallas kernels compiled by
# Mosaic: a TPU runs them, jax.export lowers them for one anywhere), "interpret" (the same kernels
# run by Pallas's TPU interpreter, on any platform: slow, for tests); None picks "tpu" for arrays on
# a TPU and "cpu" otherwise.
BACKENDS = (None, "cpu", "tpu", "interpret")


def _platform(x) -> str:
    """The platform x lives on; a traced or host array's is JAX's default backend's."""
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        return next(iter(x.devices())).platform
    return jax.default_backend()


def _backend(backend, q) -> str:
    if not (backend is None or isinstance(backend, str)) or backend not in BACKENDS:
        raise ValueError(f"flat: backend: expected one of {', '.join(map(repr, BACKENDS))} (None: the arrays' "
                         f"platform's), got {backend!r}")
    platform = _platform(q)
    if backend is None:
        return "tpu" if platform == "tpu" else "cpu"
    if backend == "tpu" and platform != "tpu" and not isinstance(q, jax.core.Tracer):
        raise ValueError(f"flat: backend: 'tpu' runs the Pallas kernels compiled for a TPU, got arrays on {platform} "
                         "(backend='interpret' runs the same kernels in TPU interpret mode there)")
    return backend


def _with_backend(functions: dict, name: str):
    """The variant function `name` with the keyword backend= added, picking its table in
    functions ({backend: the variant functions running it})."""
    chosen = functions[None][name]

    @functools.wraps(chosen)
    def call(*args, backend=None, **kwargs):
        if not (backend is None or isinstance(backend, str)) or backend not in functions:
            _backend(backend, None)
        return functions[backend][name](*args, **kwargs)

    signature = inspect.signature(chosen)
    call.__signature__ = signature.replace(parameters=[
        *signature.parameters.values(), inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None)])
    return call


_FUNCTIONS = {backend: _api.variant_functions(partial(_run, backend=backend), _XP) for backend in BACKENDS}
globals().update({name: _with_backend(_FUNCTIONS, name) for name in _FUNCTIONS[None]})
# The package's exports: the variants' functions (one per row of flat.VARIANTS, their names written
# nowhere in flat.jax) and the rest.
__all__ = [*_FUNCTIONS[None], "conv", "rms_norm_gated", "accepted_state_indices"]


def accepted_state_indices(token_state_indices, cu_seqlens, num_accepted):
    """As flat.torch.accepted_state_indices: the pool row each sequence's next step starts from
    after a speculative step, token_state_indices[cu_seqlens[i] + num_accepted[i] - 1], -1 for an
    empty sequence (num_accepted 0). Concrete arrays are checked as flat.torch checks them; traced
    ones (under jax.jit) cannot be, only their shapes: there each count must be from 1 to its
    sequence's length (0 for an empty one), and a last accepted token's row -1 comes back as -1."""
    arrays = {"token_state_indices": token_state_indices, "cu_seqlens": cu_seqlens, "num_accepted": num_accepted}
    for name, x in arrays.items():
        _check_narrowing(name, x)
    tokens, cu, accepted = (jnp.asarray(x) for x in arrays.values())
    _args.check_sequences(_args.Sequences(cu, token_state_indices=tokens), "an array", _problem)
    if _problem(accepted) is not None:
        raise ValueError(f"flat: num_accepted: expected an array [num_seqs] of int32 or int64, got {_problem(accepted)}")
    if not any(isinstance(x, jax.core.Tracer) for x in (tokens, cu, accepted)):
        rows = _args.accepted_rows(np.asarray(tokens).tolist(), np.asarray(cu).tolist(), np.asarray(accepted).tolist())
        return jnp.asarray(rows, tokens.dtype)
    if tokens.shape[0] == 0:  # no token, every sequence empty (and nothing to gather from)
        return jnp.full(accepted.shape, -1, tokens.dtype)
    # An empty sequence's index points past the end, where the gather fills in -1.
    last = jnp.where(accepted > 0, cu[:-1] + accepted - 1, tokens.shape[0])
    return tokens.at[last].get(mode="fill", fill_value=-1)


# ---- The short convolution -------------------------------------------------------------------


def _conv_outputs(operation, activation, x, weight, bias, state0, cu_seqlens, pool: bool) -> dict:
    inputs = dict(x=("x", x), weight=("weight", weight), bias=("bias", bias), state0=("initial_state", state0))
    return _outputs(operation, "", inputs, cu_seqlens, pool, dict(activation=activation))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _conv(activation, final_state, x, weight, bias, state0, cu_seqlens, reads):
    outputs = _conv_outputs("conv_forward", activation, x, weight, bias, state0, cu_seqlens, reads is not None)
    if not final_state:
        outputs.pop("state", None)
    results = _results(outputs, ("y", "state"))
    return _call("conv_forward", results, x, weight, _given(bias), _given(state0), _ints(cu_seqlens), _ints(reads),
                 _ints(None), _ints(None), activation=activation)


def _conv_forward(activation, final_state, x, weight, bias, state0, cu_seqlens, reads):
    return (_conv(activation, final_state, x, weight, bias, state0, cu_seqlens, reads),
            (x, weight, bias, state0, cu_seqlens, reads))


def _conv_backward(activation, final_state, saved, cotangents):
    x, weight, bias, state0, cu_seqlens, reads = saved
    dy, dstate = cotangents
    W = weight.shape[1]
    outputs = _conv_outputs("conv_backward", activation, x, weight, bias, state0, cu_seqlens, reads is not None)
    results = _results(outputs, ("dx", "dweight", "dbias", "dstate0"))
    dx, dweight, dbias, dstate0 = _call("conv_backward", results, x, weight, _given(bias), _given(state0), dy,
                                        dstate if final_state and W > 1 else _absent(), _ints(cu_seqlens),
                                        _ints(reads), _ints(None), _ints(None), activation=activation)
    return (dx, dweight, (dbias if bias is not None else None),
            (_pool_gradient(state0, dstate0, reads) if state0 is not None else None), None, None)


_conv.defvjp(_conv_forward, _conv_backward)

# The index of state0 among the convolution's operands (x, weight, bias, state0) and of state
# among its results (y, state).
_STATE0, _STATE = 3, 1


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _pool_conv(activation, x, weight, bias, pool, cu_seqlens, reads, writes, tokens):
    """The convolution with state0 and state one pool [P, C, W-1], updated in place where the caller
    donates it."""
    outputs = _conv_outputs("conv_forward", activation, x, weight, bias, pool, cu_seqlens, True)
    results = (outputs["y"], _result(pool.shape, pool.dtype))
    return _call("conv_forward", results, x, weight, _given(bias), pool, _ints(cu_seqlens),
                 _pool_reads(_args.sequence_count(x.shape[0], cu_seqlens), reads), _ints(writes), _ints(tokens),
                 aliases={_STATE0: _STATE}, activation=activation)


_pool_conv.defvjp(_no_gradient, _no_gradient)


def conv(x, weight, bias=None, initial_state=None, output_final_state=False, activation=None, cu_seqlens=None, *,
         initial_state_indices=None, final_state_indices=None, token_state_indices=None, backend=None):
    """The short causal depthwise convolution, as flat.torch.conv (activation None, "silu" or "swish"):
    with final_state_indices or token_state_indices, (y, the pool initial_state updated). backend:
    as the variants' (BACKENDS)."""
    activation = _args.conv_activation(activation)
    backend = _backend(backend, x)
    sequences = _sequences(_args.Sequences(cu_seqlens, initial_state_indices, final_state_indices,
                                           token_state_indices), initial_state)
    if backend != "cpu":
        return _conv_tpu(activation, x, weight, bias, initial_state, output_final_state, sequences,
                         interpret=backend == "interpret")
    writes, pool = sequences.writes_pool, initial_state
    if _args.rowless(sequences, pool, x.shape[0]):  # no sequence: the call on the pool's first 0 rows
        initial_state, sequences, output_final_state = pool[:0], _args.Sequences(), output_final_state and not writes
    elif writes:
        return _pool_conv(activation, x, weight, bias, pool, *sequences)
    y, state = _conv(activation, bool(output_final_state), x, weight, bias, initial_state, sequences.cu_seqlens,
                     sequences.initial_state_indices)
    # Without a state (W = 1) the handler's is absent, shape (0,); an empty batch's has its rank.
    return y, (pool if writes else state if output_final_state and state.ndim > 1 else None)


def _conv_tpu(activation, x, weight, bias, initial_state, output_final_state, sequences, interpret):
    """The convolution by flat.jax.tpu's kernel, after the CPU path's checks (the library's, without
    running it)."""
    _conv_outputs("conv_forward", activation, x, weight, bias, initial_state, sequences.cu_seqlens,
                  sequences.initial_state_indices is not None)
    _dense_only(sequences)
    B, T, C = x.shape
    W = weight.shape[1]
    if B == 0 or T == 0:
        state = jnp.zeros((B, C, W - 1), jnp.float32) if initial_state is None else initial_state
        return jnp.zeros(x.shape, x.dtype), (state if output_final_state and W > 1 else None)
    return tpu.conv(x, weight, bias, initial_state, silu=activation == "silu", final=bool(output_final_state),
                    interpret=interpret)


# ---- The output norm and gate ----------------------------------------------------------------


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _norm_gate(activation, norm_before_gate, eps, x, g, weight):
    outputs = _outputs("norm_gate_forward", "", dict(x=("x", x), g=("g", g), weight=("weight", weight)), None, False,
                       dict(activation=activation, norm_before_gate=norm_before_gate, eps=eps))
    return _call("norm_gate_forward", outputs["y"], x, _given(g), weight, activation=activation,
                 norm_before_gate=norm_before_gate, eps=eps)


def _norm_gate_forward(activation, norm_before_gate, eps, x, g, weight):
    return _norm_gate(activation, norm_before_gate, eps, x, g, weight), (x, g, weight)


def _norm_gate_backward(activation, norm_before_gate, eps, saved, dy):
    x, g, weight = saved
    outputs = _outputs("norm_gate_backward", "", dict(x=("x", x), g=("g", g), weight=("weight", weight)), None, False,
                       dict(activation=activation, norm_before_gate=norm_before_gate, eps=eps))
    results = _results(outputs, ("dx", "dg", "dweight"))
    dx, dg, dweight = _call("norm_gate_backward", results, x, _given(g), weight, dy, activation=activation,
                            norm_before_gate=norm_before_gate, eps=eps)
    return dx, (dg if g is not None else None), dweight


_norm_gate.defvjp(_norm_gate_forward, _norm_gate_backward)


def rms_norm_gated(x, g, weight, bias=None, activation="swish", residual=None, prenorm=False, residual_in_fp32=False,
                   eps=1e-6, norm_before_gate=True):
    """The output norm and gate, as flat.torch.rms_norm_gated (FLA's arguments, order and defaults)."""
    return _api.norm_gate(_XP, jnp.asarray(x), None if g is None else jnp.asarray(g), weight, bias, activation,
                          None if residual is None else jnp.asarray(residual), prenorm, residual_in_fp32, eps,
                          norm_before_gate, _norm_kernel)


def _norm_kernel(x, g, weight, activation, norm_before_gate, eps):
    shape = _args.rows4(x.shape)
    y = _norm_gate(activation, norm_before_gate, eps, x.reshape(shape), None if g is None else g.reshape(shape),
                   jnp.asarray(weight).astype(jnp.float32))
    return y.reshape(x.shape)
