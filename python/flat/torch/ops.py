"""flat.torch's operations (the package's docstring says what they are): the custom ops
``flat::*``, their fake implementations and autograd formulas, and the functions users call, which
flat.torch re-exports."""

import atexit
import functools
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .. import _api, _args
from .. import _core  # after torch: the extension then shares torch's OpenMP runtime

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}

# When a list, the data pointers of q, k, v each forward call hands to the kernels (tests check
# that strided inputs are read in place).
_trace: Optional[List[Tuple[int, int, int]]] = None


def _dtype(name: str, t: Tensor) -> str:
    """The library's name of t's dtype, once t is known to be a tensor the library can take."""
    if not 1 <= t.dim() <= 4:
        raise ValueError(f"flat: {name}: expected a tensor of rank 1 to 4, got rank {t.dim()} {list(t.shape)}")
    if t.device.type != "cpu":
        raise ValueError(f"flat: {name}: expected a tensor on the CPU, got one on {t.device}")
    if t.dtype not in _DTYPES:
        raise ValueError(f"flat: {name}: expected dtype float32 or bfloat16, got {t.dtype}")
    return _DTYPES[t.dtype]


def _view(name: str, t: Optional[Tensor]):
    """The library's view of a tensor: (data pointer, dtype, shape, strides). The tensor must
    outlive the call that reads the view (see _dense)."""
    if t is None:
        return None
    # As PyTorch has it: the library takes any stride on an axis of one element (which it never
    # reads), e.g. the last one of the transpose of a [.., 1, K] state.
    return (t.data_ptr(), _dtype(name, t), tuple(t.shape), t.stride())


_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}


def _outputs(operation: str, variant: str, inputs: dict, cu_seqlens: Optional[Tensor], pool: bool, options) -> dict:
    """The outputs the library writes for a call, {name: (shape, dtype)} (flat::output_shapes), from
    its inputs by the library's names, each (user's name, tensor or None), and its checked options
    (_args.checked_options); pool: the initial state is a pool read through initial_state_indices.
    Works on fake tensors (torch.compile)."""
    described = []
    for name, (user_name, t) in inputs.items():
        if t is not None:
            if t.dtype not in _DTYPES or not 1 <= t.dim() <= 4:
                _dtype(user_name, t)  # raises
            described.append((name, t.dtype, t.shape))
    key = (operation, variant, tuple(described), 0 if cu_seqlens is None else int(cu_seqlens.shape[0]), pool, options)
    try:
        return _described_outputs(*key)
    except TypeError:  # symbolic shapes (torch.compile's dynamic ones) are not hashable
        return _described_outputs.__wrapped__(*key)


@functools.lru_cache(maxsize=1024)
def _described_outputs(operation: str, variant: str, described: tuple, cu_seqlens: int, pool: bool,
                       options) -> dict:
    """_outputs' answer, kept per description: a decode step asks the same question each token.
    Refusals are not kept (lru_cache keeps what returns)."""
    inputs = {name: (_DTYPES[dtype], [int(d) for d in shape]) for name, dtype, shape in described}
    shapes = _core.output_shapes(operation, variant, inputs, cu_seqlens, pool, options)
    return {name: (tuple(shape), _TORCH_DTYPES[dtype]) for name, dtype, shape in shapes}


atexit.register(_described_outputs.cache_clear)  # its keys hold checked options (_args.py says why)


def _empty(described) -> Tensor:
    shape, dtype = described
    return torch.empty(shape, dtype=dtype)


def _dense(*tensors: Optional[Tensor]):
    """The tensors with a contiguous last axis, as the kernels read them: strided slices as they are,
    the others copied. Hold the results until the call returns."""
    return tuple(t if t is None or t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()
                 for t in tensors)


def _threads() -> int:
    return torch.get_num_threads()


_NO_SEQUENCES = ([], [], [], [])


def _call(operation: str, tensors: dict, options, sequences=_NO_SEQUENCES, variant: str = "") -> None:
    """flat::call on PyTorch's intra-op threads: the tensors' views by the library's names (None:
    absent), the options checked (_args.checked_options)."""
    _core.call(operation, variant, tensors, sequences, options, _threads(), "openmp")


def _direct(*tensors: Optional[Tensor]) -> bool:
    """Whether a forward may run its custom op's implementation directly instead of through the
    dispatcher: in eager mode (not traced by torch.compile or torch.jit.trace, no dispatch or function mode, no
    functorch transform, no profiler, whose records name the op), on plain tensors, none of which
    needs a gradient. The results are the same; a decode step saves the dispatcher's and the
    autograd wrapper's per-call cost, a good share of a one-token call."""
    if (torch.compiler.is_compiling() or torch.jit.is_tracing() or torch._C._len_torch_dispatch_stack() or
            torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active() or
            torch.autograd.profiler._is_profiler_enabled):
        return False
    grad = torch.is_grad_enabled()
    return all(t is None or (type(t) is Tensor and not (grad and t.requires_grad)) for t in tensors)


def _absent(t: Tensor) -> Optional[Tensor]:
    """An output the call does not have comes back as an empty tensor (custom ops return tensors)."""
    return None if t.numel() == 0 and t.dim() == 1 else t


def _none() -> Tensor:
    return torch.empty(0, dtype=torch.float32)


def _problem(t) -> Optional[str]:
    """What keeps t from being an array of flat::Sequences (a 1-D int32 or int64 CPU tensor), or None."""
    if not isinstance(t, Tensor):
        return type(t).__name__
    if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64) or t.device.type != "cpu":
        return f"{t.dtype} {list(t.shape)} on {t.device}"
    return None


def _check_sequences(sequences: _args.Sequences, pool: Optional[Tensor], inputs) -> bool:
    """Checks what the library cannot see of the sequences' arrays (it checks their values); returns
    whether the call writes states into the pool, in place: then no input may need a gradient."""
    _args.check_sequences(sequences, "a CPU tensor", _problem)
    _args.check_pool(sequences, pool)
    if sequences.writes_pool and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (*inputs, pool)):
        raise _args.pool_error("call it under torch.no_grad() or torch.inference_mode(), or on inputs that do not "
                               "require grad")
    return sequences.writes_pool


def _lists(cu_seqlens: Optional[Tensor], reads: Optional[Tensor] = None, writes: Optional[Tensor] = None,
           tokens: Optional[Tensor] = None) -> Tuple[List[int], ...]:
    """flat::Sequences as the library reads it: cu_seqlens, initial_state_indices, final_state_indices,
    token_state_indices as lists of host integers, [] where not given."""
    return tuple([] if t is None else t.tolist() for t in (cu_seqlens, reads, writes, tokens))


def _pool_lists(count: int, cu_seqlens: Optional[Tensor], reads: Optional[Tensor], writes: Optional[Tensor],
                tokens: Optional[Tensor]) -> Tuple[List[int], ...]:
    """The lists of a call that updates the pool in place (h0 and ht the pool): without
    initial_state_indices its `count` sequences start from zero (-1), not from the pool's rows."""
    cu, reads, writes, tokens = _lists(cu_seqlens, reads, writes, tokens)
    return cu, reads or [-1] * count, writes, tokens


def _written(pool: Tensor, direct: bool) -> Tensor:
    """The pool a call has just written in place, its version counter bumped where the call ran
    directly: through the dispatcher the op's declared mutation bumps it (its ADInplaceOrView
    kernel), as PyTorch's own in-place operations do, and so must the direct path, or autograd would
    run the backward of a graph that saved the pool before the write (a forward that read it through
    initial_state_indices) on the rows written since, silently wrong, instead of refusing it."""
    if direct:
        torch.autograd.graph.increment_version(pool)
    return pool


def _pool_gradient(state: Optional[Tensor], grads: Tensor, reads: Optional[Tensor]) -> Tensor:
    """The gradient of an initial state from the library's (a row per sequence): with
    initial_state_indices, the pool's, each sequence's row added to the row it read (none for -1)."""
    if state is None or reads is None:
        return grads
    read = reads >= 0
    return torch.zeros_like(state).index_add_(0, reads[read].long(), grads[read])


# ---- The recurrences -------------------------------------------------------------------------

# The custom ops' schemas: the tensors, then the recurrence's options keyword-only, one per option the
# library lists (_api.OPTION_NAMES, of the kinds _api.OPTIONS gives), None for the library's default.
_KINDS = {float: "float", int: "int", bool: "bool", str: "str"}
_OPTIONS = ", ".join(f"{_KINDS[_api.OPTIONS[name][1]]}? {name}=None" for name in _api.OPTION_NAMES)
_INPUTS = "str variant, Tensor q, Tensor k, Tensor v, Tensor? g, Tensor? beta, Tensor? b, Tensor? w"


def _recurrence_outputs(operation: str, variant: str, q, k, v, g, beta, b, w, h0, cu_seqlens, pool: bool,
                        options) -> dict:
    """The forward's y and ht, or the backward's gradients, (shape, dtype) as the library describes
    them."""
    inputs = dict(q=("q", q), k=("k", k), v=("v", v), g=("g", g), beta=("beta", beta), b=("b", b), w=("w", w),
                  h0=("initial_state", h0))
    return _outputs(operation, variant, inputs, cu_seqlens, pool, options)


def _call_forward(variant: str, q, k, v, g, beta, b, w, h0, y, ht, sequences, options) -> None:
    if _trace is not None:
        _trace.append((q.data_ptr(), k.data_ptr(), v.data_ptr()))
    _call("forward", dict(q=_view("q", q), k=_view("k", k), v=_view("v", v), g=_view("g", g), beta=_view("beta", beta),
                          b=_view("b", b), w=_view("w", w), h0=_view("initial_state", h0), y=_view("o", y),
                          ht=_view("final_state", ht)), options, sequences, variant)


def _forward_impl(variant: str, q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Optional[Tensor],
                  b: Optional[Tensor], w: Optional[Tensor], h0: Optional[Tensor], cu_seqlens: Optional[Tensor],
                  initial_state_indices: Optional[Tensor], *, final_state: bool, **options) -> Tuple[Tensor, Tensor]:
    q, k, v, g, beta, b, w, h0 = _dense(q, k, v, g, beta, b, w, h0)
    checked = _args.checked_options("forward", options)
    outputs = _recurrence_outputs("forward", variant, q, k, v, g, beta, b, w, h0, cu_seqlens,
                                  initial_state_indices is not None, checked)
    y, ht = _empty(outputs["y"]), _empty(outputs["ht"]) if final_state else None
    _call_forward(variant, q, k, v, g, beta, b, w, h0, y, ht, _lists(cu_seqlens, initial_state_indices), checked)
    return y, _none() if ht is None else ht


_forward = torch.library.custom_op(
    "flat::forward", _forward_impl, mutates_args=(),
    schema=f"({_INPUTS}, Tensor? h0, Tensor? cu_seqlens, Tensor? initial_state_indices, *, bool final_state, "
           f"{_OPTIONS}) -> (Tensor, Tensor)")


@_forward.register_fake
def _(variant, q, k, v, g, beta, b, w, h0, cu_seqlens, initial_state_indices, *, final_state, **options):
    outputs = _recurrence_outputs("forward", variant, q, k, v, g, beta, b, w, h0, cu_seqlens,
                                  initial_state_indices is not None, _args.checked_options("forward", options))
    return _empty(outputs["y"]), _empty(outputs["ht"]) if final_state else q.new_empty(0, dtype=torch.float32)


def _forward_pool_impl(variant: str, q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Optional[Tensor],
                       b: Optional[Tensor], w: Optional[Tensor], pool: Tensor, cu_seqlens: Optional[Tensor],
                       initial_state_indices: Optional[Tensor], final_state_indices: Optional[Tensor],
                       token_state_indices: Optional[Tensor], **options) -> Tensor:
    """The recurrence with h0 and ht one pool [P, N, K, V], read and written in place (never copied:
    the library refuses a pool whose last axis is not contiguous)."""
    q, k, v, g, beta, b, w = _dense(q, k, v, g, beta, b, w)
    checked = _args.checked_options("forward", options)
    y = _empty(_recurrence_outputs("forward", variant, q, k, v, g, beta, b, w, pool, cu_seqlens, True, checked)["y"])
    sequences = _pool_lists(_args.sequence_count(q.shape[0], cu_seqlens), cu_seqlens, initial_state_indices,
                            final_state_indices, token_state_indices)
    _call_forward(variant, q, k, v, g, beta, b, w, pool, y, pool, sequences, checked)
    return y


_forward_pool = torch.library.custom_op(
    "flat::forward_pool", _forward_pool_impl, mutates_args=("pool",),
    schema=f"({_INPUTS}, Tensor(a!) pool, Tensor? cu_seqlens, Tensor? initial_state_indices, "
           f"Tensor? final_state_indices, Tensor? token_state_indices, *, {_OPTIONS}) -> Tensor")


@_forward_pool.register_fake
def _(variant, q, k, v, g, beta, b, w, pool, cu_seqlens, initial_state_indices, final_state_indices,
      token_state_indices, **options):
    return _empty(_recurrence_outputs("forward", variant, q, k, v, g, beta, b, w, pool, cu_seqlens, True,
                                      _args.checked_options("forward", options))["y"])


def _backward_impl(variant: str, q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], beta: Optional[Tensor],
                   b: Optional[Tensor], w: Optional[Tensor], h0: Optional[Tensor], cu_seqlens: Optional[Tensor],
                   initial_state_indices: Optional[Tensor], dy: Tensor, dht: Optional[Tensor],
                   **options) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    q, k, v, g, beta, b, w, h0, dy, dht = _dense(q, k, v, g, beta, b, w, h0, dy, dht)
    checked = _args.checked_options("backward", options)
    grads = {name: _empty(described) for name, described in _recurrence_outputs(
        "backward", variant, q, k, v, g, beta, b, w, h0, cu_seqlens, initial_state_indices is not None,
        checked).items()}
    _call("backward", dict(q=_view("q", q), k=_view("k", k), v=_view("v", v), g=_view("g", g),
                           beta=_view("beta", beta), b=_view("b", b), w=_view("w", w), h0=_view("initial_state", h0),
                           dy=_view("do", dy), dht=_view("dht", dht), **{name: _view(name, t) for name, t in grads.items()}),
          checked, _lists(cu_seqlens, initial_state_indices), variant)
    dq, dk, dv, dg, dbeta, db, dw, dh0 = (grads.get(name, _none())
                                          for name in ("dq", "dk", "dv", "dg", "dbeta", "db", "dw", "dh0"))
    return dq, dk, dv, dg, dbeta, db, dw, _pool_gradient(h0, dh0, initial_state_indices)


_backward = torch.library.custom_op(
    "flat::backward", _backward_impl, mutates_args=(),
    schema=f"({_INPUTS}, Tensor? h0, Tensor? cu_seqlens, Tensor? initial_state_indices, Tensor dy, Tensor? dht, *, "
           f"{_OPTIONS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")


@_backward.register_fake
def _(variant, q, k, v, g, beta, b, w, h0, cu_seqlens, initial_state_indices, dy, dht, **options):
    def like(t):
        return q.new_empty(0, dtype=torch.float32) if t is None else t.new_empty(t.shape)

    return like(q), like(k), like(v), like(g), like(beta), like(b), like(w), like(h0)


def _setup_forward(ctx, inputs, keyword_only_inputs, output):
    ctx.variant = inputs[0]
    ctx.options = {name: keyword_only_inputs[name] for name in _api.OPTION_NAMES}
    ctx.save_for_backward(*inputs[1:])  # q to h0, cu_seqlens, initial_state_indices


def _backward_formula(ctx, dy, dht):
    dht = None if dht is None or dht.numel() == 0 else dht
    grads = _backward(ctx.variant, *ctx.saved_tensors, dy, dht, **{**ctx.options, "check_values": False})
    # No gradient for the variant's name and the sequences' arrays.
    return (None, *(_absent(t) for t in grads), None, None)


_forward.register_autograd(_backward_formula, setup_context=_setup_forward)


def _run(variant: str, q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor] = None, beta: Optional[Tensor] = None,
         b: Optional[Tensor] = None, w: Optional[Tensor] = None, *, initial_state: Optional[Tensor],
         output_final_state: bool, sequences: _args.Sequences,
         options: _api.Options) -> Tuple[Tensor, Optional[Tensor]]:
    values = options._asdict()
    direct = _direct(q, k, v, g, beta, b, w, initial_state)
    writes, pool = _check_sequences(sequences, initial_state, (q, k, v, g, beta, b, w)), initial_state
    if _args.rowless(sequences, pool, q.shape[0]):  # no sequence: the call on the pool's first 0 rows
        initial_state, sequences, output_final_state = pool[:0], _args.Sequences(), output_final_state and not writes
    elif writes:
        o = (_forward_pool_impl if direct else _forward_pool)(variant, q, k, v, g, beta, b, w, pool, *sequences,
                                                              **values)
        return o, _written(pool, direct)
    o, final_state = (_forward_impl if direct else _forward)(
        variant, q, k, v, g, beta, b, w, initial_state, sequences.cu_seqlens, sequences.initial_state_indices,
        final_state=output_final_state, **values)
    return o, (pool if writes else final_state if output_final_state else None)


# ---- One function per variant (python/flat/_api.py): la, retnet, mamba2, gla, deltanet,
# gated_deltanet, kda, gdn2, sla ---------------------------------------------------------------

_XP = _api.Xp(float32=lambda x: x.float(), narrow_float=lambda x: x.dtype in (torch.bfloat16, torch.float16),
               cast_like=lambda x, y: x.to(y.dtype), sigmoid=torch.sigmoid, softplus=torch.nn.functional.softplus,
               exp=torch.exp, swap=lambda x: x.transpose(-1, -2),
               ones=lambda shape: torch.ones(shape, dtype=torch.float32),
               activations={"silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid, "none": lambda z: z})

# The variants' functions, one per row of the library's table (flat.VARIANTS), and the package's
# exports with them: a new variant is exported with its name written nowhere in flat.torch.
_VARIANT_FUNCTIONS = _api.variant_functions(_run, _XP)
globals().update(_VARIANT_FUNCTIONS)
__all__ = [*_VARIANT_FUNCTIONS, "conv", "rms_norm_gated", "accepted_state_indices"]


def accepted_state_indices(token_state_indices: Tensor, cu_seqlens: Tensor, num_accepted: Tensor) -> Tensor:
    """After a speculative step that wrote the state after each token to the pool's row
    token_state_indices[t], the row each sequence's next step starts from (its
    initial_state_indices): that of its last accepted token, token_state_indices[cu_seqlens[i] +
    num_accepted[i] - 1]. num_accepted [num_seqs] (FLA's num_accepted_tokens) counts sequence i's
    accepted tokens, from 1 to its length; an empty sequence takes 0 and gets -1 (it kept no state:
    its next step starts from the row it started this one from, which the caller holds). A last
    accepted token that kept no state (-1) is refused."""
    _args.check_sequences(_args.Sequences(cu_seqlens, token_state_indices=token_state_indices), "a CPU tensor",
                          _problem)
    wrong = _problem(num_accepted)
    if wrong is not None:
        raise ValueError(f"flat: num_accepted: expected a CPU tensor [num_seqs] of int32 or int64, got {wrong}")
    rows = _args.accepted_rows(token_state_indices.tolist(), cu_seqlens.tolist(), num_accepted.tolist())
    return torch.tensor(rows, dtype=token_state_indices.dtype)


# ---- The short convolution -------------------------------------------------------------------


def _conv_outputs(x, weight, bias, state0, cu_seqlens, pool: bool, activation, operation: str = "conv_forward") -> dict:
    """The forward's y and state (only with W > 1), or the backward's gradients, (shape, dtype) as
    the library describes them."""
    inputs = dict(x=("x", x), weight=("weight", weight), bias=("bias", bias), state0=("initial_state", state0))
    options = _args.checked_options(operation, dict(activation=activation))
    return _outputs(operation, "", inputs, cu_seqlens, pool, options)


def _call_conv(x, weight, bias, state0, y, state, sequences, activation) -> None:
    _call("conv_forward", dict(x=_view("x", x), weight=_view("weight", weight), bias=_view("bias", bias),
                               state0=_view("initial_state", state0), y=_view("y", y), state=_view("final_state", state)),
          _args.checked_options("conv_forward", dict(activation=activation)), sequences)


def _conv_forward_impl(x: Tensor, weight: Tensor, bias: Optional[Tensor], state0: Optional[Tensor],
                       cu_seqlens: Optional[Tensor], initial_state_indices: Optional[Tensor], activation: str,
                       final_state: bool) -> Tuple[Tensor, Tensor]:
    x, weight, bias, state0 = _dense(x, weight, bias, state0)
    outputs = _conv_outputs(x, weight, bias, state0, cu_seqlens, initial_state_indices is not None, activation)
    y = _empty(outputs["y"])
    state = _empty(outputs["state"]) if final_state and "state" in outputs else None
    _call_conv(x, weight, bias, state0, y, state, _lists(cu_seqlens, initial_state_indices), activation)
    return y, _none() if state is None else state


_conv_forward = torch.library.custom_op("flat::conv_forward", _conv_forward_impl, mutates_args=())


@_conv_forward.register_fake
def _(x, weight, bias, state0, cu_seqlens, initial_state_indices, activation, final_state):
    outputs = _conv_outputs(x, weight, bias, state0, cu_seqlens, initial_state_indices is not None, activation)
    state = _empty(outputs["state"]) if final_state and "state" in outputs else x.new_empty(0, dtype=torch.float32)
    return _empty(outputs["y"]), state


def _conv_forward_pool_impl(x: Tensor, weight: Tensor, bias: Optional[Tensor], pool: Tensor,
                            cu_seqlens: Optional[Tensor], initial_state_indices: Optional[Tensor],
                            final_state_indices: Optional[Tensor],
                            token_state_indices: Optional[Tensor], activation: str) -> Tensor:
    """The convolution with state0 and state one pool [P, C, W-1], read and written in place."""
    x, weight, bias = _dense(x, weight, bias)
    y = torch.empty(x.shape, dtype=x.dtype)
    sequences = _pool_lists(_args.sequence_count(x.shape[0], cu_seqlens), cu_seqlens, initial_state_indices,
                            final_state_indices, token_state_indices)
    _call_conv(x, weight, bias, pool, y, pool, sequences, activation)
    return y


_conv_forward_pool = torch.library.custom_op("flat::conv_forward_pool", _conv_forward_pool_impl,
                                             mutates_args=("pool",))


@_conv_forward_pool.register_fake
def _(x, weight, bias, pool, cu_seqlens, initial_state_indices, final_state_indices, token_state_indices, activation):
    return x.new_empty(x.shape)


@torch.library.custom_op("flat::conv_backward", mutates_args=())
def _conv_backward(x: Tensor, weight: Tensor, bias: Optional[Tensor], state0: Optional[Tensor],
                   cu_seqlens: Optional[Tensor], initial_state_indices: Optional[Tensor], dy: Tensor,
                   dstate: Optional[Tensor], activation: str) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    x, weight, bias, state0, dy, dstate = _dense(x, weight, bias, state0, dy, dstate)
    grads = {name: _empty(described) for name, described in _conv_outputs(
        x, weight, bias, state0, cu_seqlens, initial_state_indices is not None, activation, "conv_backward").items()}
    _call("conv_backward", dict(x=_view("x", x), weight=_view("weight", weight), bias=_view("bias", bias),
                                state0=_view("initial_state", state0), dy=_view("dy", dy), dstate=_view("dstate", dstate),
                                **{name: _view(name, t) for name, t in grads.items()}),
          _args.checked_options("conv_backward", dict(activation=activation)),
          _lists(cu_seqlens, initial_state_indices))
    dx, dweight, dbias, dstate0 = (grads.get(name, _none()) for name in ("dx", "dweight", "dbias", "dstate0"))
    return dx, dweight, dbias, _pool_gradient(state0, dstate0, initial_state_indices)


@_conv_backward.register_fake
def _(x, weight, bias, state0, cu_seqlens, initial_state_indices, dy, dstate, activation):
    def like(t):
        return x.new_empty(0, dtype=torch.float32) if t is None else t.new_empty(t.shape)

    return x.new_empty(x.shape), like(weight), like(bias), like(state0)


def _setup_conv(ctx, inputs, output):
    x, weight, bias, state0, cu_seqlens, initial_state_indices, ctx.activation, _ = inputs
    ctx.save_for_backward(x, weight, bias, state0, cu_seqlens, initial_state_indices)


def _conv_backward_formula(ctx, dy, dstate):
    x, weight, bias, state0, cu_seqlens, initial_state_indices = ctx.saved_tensors
    dstate = None if dstate is None or dstate.numel() == 0 else dstate
    dx, dweight, dbias, dstate0 = _conv_backward(x, weight, bias, state0, cu_seqlens, initial_state_indices, dy,
                                                 dstate, ctx.activation)
    return dx, dweight, _absent(dbias), _absent(dstate0), None, None, None, None


_conv_forward.register_autograd(_conv_backward_formula, setup_context=_setup_conv)


def conv(x, weight, bias=None, initial_state=None, output_final_state=False, activation=None, cu_seqlens=None, *,
         initial_state_indices=None, final_state_indices=None, token_state_indices=None):
    """The short causal depthwise convolution: x [B, T, C], weight [C, W] float32, bias [C]; positions
    before 0 read initial_state [B, C, W-1] float32 (flat's layout: the last W-1 inputs; FLA's
    causal_conv1d keeps [N, C, W] in x's dtype). activation: None (or "none", the default, as FLA's),
    "silu" or "swish". Returns (y, final_state), the final state the last W-1 inputs. With cu_seqlens
    ([num_seqs + 1] offsets of sequences packed along T, B = 1), no window reads across a sequence's
    start and the states are [num_seqs, C, W-1]. initial_state_indices, final_state_indices,
    token_state_indices address a pool initial_state [P, C, W-1] as the variants' functions do
    (python/flat/_api.py): with the last two it is updated in place and returned, (y, initial_state)."""
    activation = _args.conv_activation(activation)
    sequences = _args.Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices)
    direct = _direct(x, weight, bias, initial_state)
    writes, pool = _check_sequences(sequences, initial_state, (x, weight, bias)), initial_state
    if _args.rowless(sequences, pool, x.shape[0]):  # no sequence: the call on the pool's first 0 rows
        initial_state, sequences, output_final_state = pool[:0], _args.Sequences(), output_final_state and not writes
    elif writes:
        y = (_conv_forward_pool_impl if direct else _conv_forward_pool)(x, weight, bias, pool, *sequences, activation)
        return y, _written(pool, direct)
    y, state = (_conv_forward_impl if direct else _conv_forward)(
        x, weight, bias, initial_state, sequences.cu_seqlens, sequences.initial_state_indices, activation,
        output_final_state)
    return y, (pool if writes else _absent(state) if output_final_state else None)


# ---- The output norm and gate ----------------------------------------------------------------


@torch.library.custom_op("flat::norm_gate_forward", mutates_args=())
def _norm_gate_forward(x: Tensor, g: Optional[Tensor], weight: Tensor, activation: str, norm_before_gate: bool,
                       eps: float) -> Tensor:
    x, g, weight = _dense(x, g, weight)
    y = torch.empty(x.shape, dtype=x.dtype)
    _call("norm_gate_forward", dict(x=_view("x", x), g=_view("g", g), weight=_view("weight", weight), y=_view("y", y)),
          _args.checked_options("norm_gate_forward",
                                dict(activation=activation, norm_before_gate=norm_before_gate, eps=eps)))
    return y


@_norm_gate_forward.register_fake
def _(x, g, weight, activation, norm_before_gate, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("flat::norm_gate_backward", mutates_args=())
def _norm_gate_backward(x: Tensor, g: Optional[Tensor], weight: Tensor, dy: Tensor, activation: str,
                        norm_before_gate: bool, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    x, g, weight, dy = _dense(x, g, weight, dy)
    options = _args.checked_options("norm_gate_backward",
                                    dict(activation=activation, norm_before_gate=norm_before_gate, eps=eps))
    inputs = dict(x=("x", x), g=("g", g), weight=("weight", weight))
    grads = {name: _empty(described) for name, described in _outputs("norm_gate_backward", "", inputs, None, False,
                                                                      options).items()}
    _call("norm_gate_backward", dict(x=_view("x", x), g=_view("g", g), weight=_view("weight", weight), dy=_view("dy", dy),
                                     **{name: _view(name, t) for name, t in grads.items()}), options)
    return grads["dx"], grads.get("dg", _none()), grads["dweight"]


@_norm_gate_backward.register_fake
def _(x, g, weight, dy, activation, norm_before_gate, eps):
    dg = g.new_empty(g.shape) if g is not None else x.new_empty(0, dtype=torch.float32)
    return x.new_empty(x.shape), dg, weight.new_empty(weight.shape)


def _setup_norm_gate(ctx, inputs, output):
    x, g, weight, ctx.activation, ctx.norm_before_gate, ctx.eps = inputs
    ctx.save_for_backward(x, g, weight)


def _norm_gate_backward_formula(ctx, dy):
    x, g, weight = ctx.saved_tensors
    dx, dg, dweight = _norm_gate_backward(x, g, weight, dy, ctx.activation, ctx.norm_before_gate, ctx.eps)
    return dx, _absent(dg), dweight, None, None, None


_norm_gate_forward.register_autograd(_norm_gate_backward_formula, setup_context=_setup_norm_gate)


def rms_norm_gated(x: Tensor, g: Optional[Tensor], weight: Tensor, bias: Optional[Tensor] = None,
                   activation: Optional[str] = "swish", residual: Optional[Tensor] = None, prenorm: bool = False,
                   residual_in_fp32: bool = False, eps: float = 1e-6, norm_before_gate: bool = True):
    """The output norm and gate, FLA's ``rms_norm_gated`` (its arguments, order and defaults) over the
    last axis D of x [..., D]: ``(x / rms(x) * weight + bias) * act(g)``, or with
    ``norm_before_gate=False`` (Mamba-2's order) ``u / rms(u) * weight + bias`` with ``u = x * act(g)``;
    without g, ``x / rms(x) * weight + bias``. activation: "swish" (or "silu"), "sigmoid", or None
    ("none") for no activation. g has x's shape; weight [D] (or [N, D], one row per head of
    x [B, T, N, D]) is used in float32 (a bfloat16 weight is widened, its gradient comes back in its
    dtype); bias has weight's shape, added in float32 around the kernel. With residual, the norm reads
    x + residual (summed in float32) and with prenorm=True the call returns (y, x + residual), in
    residual's dtype (without a residual, x itself, float32 with residual_in_fp32). y has x's dtype."""
    return _api.norm_gate(_XP, x, g, weight, bias, activation, residual, prenorm, residual_in_fp32, eps,
                          norm_before_gate, _norm_kernel)


def _norm_kernel(x, g, weight, activation, norm_before_gate, eps):
    shape = _args.rows4(x.shape)
    y = _norm_gate_forward(x.reshape(shape), None if g is None else g.reshape(shape), weight.float(), activation,
                           norm_before_gate, eps)
    return y.reshape(x.shape)
