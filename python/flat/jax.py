"""flat's kernels as JAX operations on the CPU, with the names and arguments of flat.torch::

    o, final_state = flat.jax.gla(q, k, v, g, scale=None, initial_state=None,
                                  output_final_state=False)

Each is an XLA custom call through JAX's typed FFI (the handlers in flat._core, run on XLA's
intra-op threads) wrapped in ``jax.custom_vjp``, so ``jax.grad``, ``jax.jit``, ``jax.eval_shape``
and ``jax.vmap`` (over a leading axis, one call per element) work. Inputs are float32 or bfloat16
arrays; states float32. A bad argument raises an error carrying the library's message.
"""

from functools import partial
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import _api, _args
from . import _core

_TARGETS = _core.jax_ffi_targets()
if not _TARGETS:
    raise ImportError("flat was built without jaxlib's FFI headers: reinstall it with jax installed")
for _name, _capsule in _TARGETS:
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")


def _absent():
    """A tensor the call does not have: an array of no elements."""
    return jnp.zeros((0,), jnp.float32)


def _given(x):
    return _absent() if x is None else x


def _no_offsets(cu_seqlens):
    if cu_seqlens is not None:
        raise NotImplementedError("flat.jax: cu_seqlens (variable-length batches) is not available in flat.jax yet; "
                                  "flat.torch and the C++ library (flat::Sequences) have it")


def _result(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def _attributes(variant: str, c: _args.Call):
    return dict(variant=variant, scale=np.float32(c.scale), chunk=np.int64(c.chunk), l2norm=np.int64(c.l2norm),
                solve=c.solve, gate_group=np.int64(c.gate_group), check_values=np.int64(c.check_values))


def _forward(variant, c, final_state, q, k, v, g, beta, b, w, h0):
    s = _args.shapes(variant, q, v, g, beta, b, w)
    results = (_result((s.B, s.S, s.N, s.V), v.dtype),
               _result((s.B, s.N, s.K, s.V) if final_state else (0,), jnp.float32))
    return jax.ffi.ffi_call("flat_forward", results, vmap_method="sequential")(
        q, k, v, *(_given(x) for x in (g, beta, b, w, h0)), **_attributes(variant, c))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _recurrence(variant, c, final_state, q, k, v, g, beta, b, w, h0):
    return _forward(variant, c, final_state, q, k, v, g, beta, b, w, h0)


def _recurrence_forward(variant, c, final_state, q, k, v, g, beta, b, w, h0):
    return _forward(variant, c, final_state, q, k, v, g, beta, b, w, h0), (q, k, v, g, beta, b, w, h0)


def _recurrence_backward(variant, c, final_state, saved, cotangents):
    q, k, v, g, beta, b, w, h0 = saved
    dy, dht = cotangents
    s = _args.shapes(variant, q, v, g, beta, b, w)

    def like(x):
        return _result((0,) if x is None else x.shape, jnp.float32 if x is None else x.dtype)

    results = tuple(like(x) for x in (q, k, v, g, beta, b, w)) + (
        _result((s.B, s.N, s.K, s.V) if h0 is not None else (0,), jnp.float32),)
    grads = jax.ffi.ffi_call("flat_backward", results, vmap_method="sequential")(
        q, k, v, *(_given(x) for x in (g, beta, b, w, h0)), dy, dht if final_state else _absent(),
        **_attributes(variant, c._replace(check_values=False)))
    inputs = (q, k, v, g, beta, b, w, h0)
    return tuple(None if x is None else grad for x, grad in zip(inputs, grads))


_recurrence.defvjp(_recurrence_forward, _recurrence_backward)


def _run(variant, q, k, v, g=None, beta=None, b=None, w=None, *, scale, initial_state, output_final_state,
         chunk_size, use_qk_l2norm_in_kernel, solve, gate_group, check_values, cu_seqlens):
    _no_offsets(cu_seqlens)
    c = _args.call(scale, chunk_size, use_qk_l2norm_in_kernel, solve, gate_group, check_values)
    o, final_state = _recurrence(variant, c, bool(output_final_state), q, k, v, g, beta, b, w, initial_state)
    return o, (final_state if output_final_state else None)


# One function per variant (python/flat/_api.py), as flat.torch's.
globals().update(_api.variant_functions(_run))


# ---- The short convolution -------------------------------------------------------------------


def _conv_results(x, weight, final_state):
    B, C, W = x.shape[0], weight.shape[0], weight.shape[1]
    return (_result(x.shape, x.dtype), _result((B, C, W - 1) if final_state and W > 1 else (0,), jnp.float32))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _conv(activation, final_state, x, weight, bias, state0):
    return jax.ffi.ffi_call("flat_conv_forward", _conv_results(x, weight, final_state), vmap_method="sequential")(
        x, weight, _given(bias), _given(state0), activation=activation)


def _conv_forward(activation, final_state, x, weight, bias, state0):
    return _conv(activation, final_state, x, weight, bias, state0), (x, weight, bias, state0)


def _conv_backward(activation, final_state, saved, cotangents):
    x, weight, bias, state0 = saved
    dy, dstate = cotangents
    B, C, W = x.shape[0], weight.shape[0], weight.shape[1]
    results = (_result(x.shape, x.dtype), _result(weight.shape, jnp.float32),
               _result(bias.shape if bias is not None else (0,), jnp.float32),
               _result((B, C, W - 1) if state0 is not None else (0,), jnp.float32))
    dx, dweight, dbias, dstate0 = jax.ffi.ffi_call("flat_conv_backward", results, vmap_method="sequential")(
        x, weight, _given(bias), _given(state0), dy, dstate if final_state and W > 1 else _absent(),
        activation=activation)
    return dx, dweight, (dbias if bias is not None else None), (dstate0 if state0 is not None else None)


_conv.defvjp(_conv_forward, _conv_backward)


def conv(x, weight, bias=None, initial_state=None, output_final_state=False, activation="silu", cu_seqlens=None):
    """The short causal depthwise convolution, as flat.torch.conv (but cu_seqlens, not yet here)."""
    _no_offsets(cu_seqlens)
    y, state = _conv(activation, bool(output_final_state), x, weight, bias, initial_state)
    return y, (state if output_final_state and state.size else None)


# ---- The output norm and gate ----------------------------------------------------------------


def _norm_attributes(activation, norm_before_gate, eps):
    return dict(activation=activation, norm_before_gate=np.int64(norm_before_gate), eps=np.float32(eps))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _norm_gate(activation, norm_before_gate, eps, x, g, weight):
    return jax.ffi.ffi_call("flat_norm_gate_forward", _result(x.shape, x.dtype), vmap_method="sequential")(
        x, _given(g), weight, **_norm_attributes(activation, norm_before_gate, eps))


def _norm_gate_forward(activation, norm_before_gate, eps, x, g, weight):
    return _norm_gate(activation, norm_before_gate, eps, x, g, weight), (x, g, weight)


def _norm_gate_backward(activation, norm_before_gate, eps, saved, dy):
    x, g, weight = saved
    results = (_result(x.shape, x.dtype), _result(g.shape if g is not None else (0,), g.dtype if g is not None
                                                  else jnp.float32), _result(weight.shape, jnp.float32))
    dx, dg, dweight = jax.ffi.ffi_call("flat_norm_gate_backward", results, vmap_method="sequential")(
        x, _given(g), weight, dy, **_norm_attributes(activation, norm_before_gate, eps))
    return dx, (dg if g is not None else None), dweight


_norm_gate.defvjp(_norm_gate_forward, _norm_gate_backward)


def rms_norm_gated(x, g, weight, activation="silu", eps=1e-5, norm_before_gate=True):
    """The output norm and gate, as flat.torch.rms_norm_gated."""
    shape = _args.rows4(x.shape)
    y = _norm_gate(_args.norm_activation(activation), bool(norm_before_gate), float(eps), x.reshape(shape),
                   None if g is None else g.reshape(shape), weight.astype(jnp.float32))
    return y.reshape(x.shape)
