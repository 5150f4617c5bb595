"""The three operations a layer is built from, in two implementations with one signature:

- ``KERNELS``: flat's kernels (flat.torch), float32 or bfloat16;
- ``REFERENCE``: the same operations in plain PyTorch, any dtype (the layer tests run it in
  float64): the recurrence token by token exactly as docs/variants.md writes it, the convolution
  as ``F.conv1d`` over the state and the input, the norm as its formula. Autograd differentiates
  it, so it checks the kernels' gradients independently of their derivation.

A layer takes ``ops=`` (``"kernels"``, the default, or ``"reference"``), so one module can be
checked against itself; ``context_parallel(group)`` gives the kernels with every layer's sequence
split along T across a process group.
"""

import inspect
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _api
from .. import torch as ft
from .._args import DEFAULT_GATE_GROUP, GATE, UPDATE, Sequences, conv_activation, norm_activation

# The recurrence's options a layer takes as keywords and passes to every call: every keyword of the
# library's options (_api.OPTIONS) but those a layer sets from its own hyperparameters (the scale, the
# L2 norm of q and k, the gate's group), so a new option of the library reaches the layers too.
KERNEL_OPTIONS = tuple(keyword for keyword, _ in _api.OPTIONS.values()
                       if keyword not in ("scale", "use_qk_l2norm_in_kernel", "gate_group"))


def kernel_options_of(variant: str) -> tuple:
    """The KERNEL_OPTIONS the variant's function takes (solve: the delta rule's only)."""
    return tuple(name for name in KERNEL_OPTIONS if name in inspect.signature(getattr(ft, variant)).parameters)


class Ops(NamedTuple):
    # recurrence(variant, q, k, v, g=, beta=, b=, w=, scale=, initial_state=, output_final_state=,
    #            use_qk_l2norm_in_kernel=, gate_group=, cu_seqlens=, initial_state_indices=,
    #            final_state_indices=, token_state_indices=, and any of KERNEL_OPTIONS)
    #   -> (o [B, T, N, V], final_state or None)
    recurrence: object
    # conv(x [B, T, C], weight [C, W], bias, initial_state [B, C, W-1], output_final_state, activation (None, the
    #      default, "silu" or "swish"),
    #      cu_seqlens=, initial_state_indices=, final_state_indices=, token_state_indices=)
    #   -> (y, final_state or None)
    # The sequences' arguments as flat.torch takes them (python/flat/_api.py): with cu_seqlens (B = 1,
    # sequences packed along T) states have a row per sequence; with final_state_indices or
    # token_state_indices, initial_state is a pool updated in place and returned as final_state.
    conv: object
    # norm(x [..., D], g or None, weight [D] or [N, D], *, activation, eps, norm_before_gate) -> y (flat.torch's
    #      rms_norm_gated, whose fourth positional argument is FLA's bias: pass these by name)
    norm: object


def _kernel_ops(functions) -> Ops:
    """The operations on flat's kernels, as `functions` (flat.torch, or flat.torch.context_parallel's)
    runs them."""

    def recurrence(variant, q, k, v, g=None, beta=None, b=None, w=None, *, gate_group=None, **keywords):
        """The variant's function on the tensors it takes (those given) and the other keywords as they
        are (the options, the states, the sequences): a kernel option flat.torch takes passes through."""
        inputs = {name: t for name, t in dict(g=g, beta=beta, b=b, w=w).items() if t is not None}
        if gate_group is not None:  # only the variants with grouped gates take it
            inputs["gate_group"] = gate_group
        return getattr(functions, variant)(q, k, v, **inputs, **keywords)

    def conv(x, weight, bias=None, initial_state=None, output_final_state=False, activation=None, **sequences):
        # The kernel's taps, bias and state are float32 whatever the model's dtype; a pool it writes in
        # place is passed as it is (the kernel refuses one that is not float32).
        if initial_state is not None and not Sequences(**sequences).writes_pool:
            initial_state = initial_state.float()
        return functions.conv(x, weight.float(), None if bias is None else bias.float(), initial_state,
                              output_final_state, activation, **sequences)

    return Ops(recurrence=recurrence, conv=conv, norm=ft.rms_norm_gated)


KERNELS = _kernel_ops(ft)


def context_parallel(group=None) -> Ops:
    """flat's kernels with every layer's sequence split along T across the ranks of `group`
    (flat.torch.context_parallel; None: the default group), for a layer's ``ops=``: each rank passes
    its share of the tokens, and gets its share of the output."""
    return _kernel_ops(ft.context_parallel(group))


# ---- Plain PyTorch ----------------------------------------------------------------------------


def _heads(x: Optional[Tensor], N: int, axis: int = 2) -> Optional[Tensor]:
    """x with its head axis widened to N heads: head n reads input head n // (N / Nx)."""
    if x is None:
        return None
    return x.repeat_interleave(N // x.shape[axis], dim=axis)


def _l2norm(x: Tensor) -> Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _by_sequence(run, along_t: dict, initial_state, output_final_state, sequences: Sequences, **options):
    """A call with sequences (cu_seqlens; without it each batch row is one) or a pool, as run() on
    each sequence alone, token by token with token_state_indices: the outputs joined along T; the
    final states along the batch axis, or written into the pool initial_state, which is returned."""
    B, T = next(t for t in along_t.values() if t is not None).shape[:2]
    cu_seqlens = sequences.cu_seqlens
    if cu_seqlens is None:  # the batch rows packed along T
        along_t = {name: None if t is None else t.reshape(1, B * T, *t.shape[2:]) for name, t in along_t.items()}
        cu_seqlens = torch.arange(B + 1) * T
    bounds = cu_seqlens.tolist()
    reads, writes, tokens = (None if t is None else t.tolist() for t in sequences[1:])
    outputs, finals, written = [], [], []
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if reads is not None:
            state = None if reads[i] < 0 else initial_state[reads[i]:reads[i] + 1]
        else:
            state = None if initial_state is None or sequences.writes_pool else initial_state[i:i + 1]
        steps = [(t, t + 1) for t in range(start, end)] if tokens is not None and end > start else [(start, end)]
        for a, b in steps:
            sliced = {name: None if t is None else t[:, a:b] for name, t in along_t.items()}
            y, state = run(**sliced, **options, initial_state=state, output_final_state=True)
            outputs.append(y)
            if tokens is not None and b > a and tokens[a] >= 0:
                written.append((tokens[a], state))
        finals.append(state)
        if writes is not None and writes[i] >= 0:
            written.append((writes[i], state))
    o = torch.cat(outputs, dim=1)
    o = o.reshape(B, T, *o.shape[2:])
    if sequences.writes_pool:  # every read done: the library refuses a row one sequence reads and another writes
        for row, state in written:
            initial_state[row] = state[0]
        return o, initial_state
    return o, (torch.cat(finals) if output_final_state else None)


def reference_recurrence(variant, q, k, v, g=None, beta=None, b=None, w=None, *, scale=None, initial_state=None,
                         output_final_state=False, use_qk_l2norm_in_kernel=False, gate_group=None, cu_seqlens=None,
                         initial_state_indices=None, final_state_indices=None, token_state_indices=None,
                         **kernel_options):
    """The recurrence one token at a time (docs/variants.md), in q's dtype; with sequences, one
    sequence at a time. It computes exactly whatever the kernels' options (KERNEL_OPTIONS)."""
    unknown = sorted(set(kernel_options) - set(KERNEL_OPTIONS))
    if unknown:
        raise TypeError(f"flat.nn: the reference recurrence takes no {', '.join(unknown)}")
    sequences = Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices)
    if any(t is not None for t in sequences):
        along_t = dict(q=q, k=k, v=v, beta=beta, b=b, w=w)
        fixed = dict(variant=variant, scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     gate_group=gate_group)
        (fixed if g is not None and g.dim() == 1 else along_t)["g"] = g  # retnet's per-head gate: every token's
        return _by_sequence(reference_recurrence, along_t, initial_state, output_final_state, sequences, **fixed)
    B, T, _, K = q.shape
    V = v.shape[-1]
    heads = [q.shape[2], k.shape[2], v.shape[2]]
    heads += [x.shape[2] for x in (g, beta, b, w) if x is not None and x.dim() >= 3]
    if g is not None and g.dim() == 1:
        heads.append(g.shape[0])
    N = max(heads)
    dtype = q.dtype
    q, k, v = (_heads(x.to(dtype), N) for x in (q, k, v))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    scale = K ** -0.5 if scale is None else scale
    gate = GATE[variant]
    if gate == "per_sequence":  # [Ng]: the same decay at every batch and token
        g = _heads(g.to(dtype), N, axis=0).view(1, 1, N, 1).expand(B, T, N, 1)
    elif gate == "per_token":  # [B, T, Ng]
        g = _heads(g.to(dtype), N).unsqueeze(-1)
    elif gate in ("per_channel", "grouped"):  # [B, T, Ng, K / G]
        group = gate_group or (K // g.shape[-1]) or DEFAULT_GATE_GROUP[variant]
        g = _heads(g.to(dtype), N).repeat_interleave(group, dim=-1)
    update = UPDATE[variant]
    if update == "delta":
        b = w = _heads(beta.to(dtype), N).unsqueeze(-1)
    elif update == "erase_write":
        b, w = _heads(b.to(dtype), N), _heads(w.to(dtype), N)
    h = torch.zeros(B, N, K, V, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    outputs = []
    for t in range(T):
        if g is not None:
            h = torch.exp(g[:, t]).unsqueeze(-1) * h  # Diag(exp g) H: the rows of H
        kt, vt = k[:, t], v[:, t]
        if update == "additive":
            h = h + kt.unsqueeze(-1) * vt.unsqueeze(-2)
        else:
            r = w[:, t] * vt - torch.einsum("bnkv,bnk->bnv", h, b[:, t] * kt)
            h = h + kt.unsqueeze(-1) * r.unsqueeze(-2)
        outputs.append(scale * torch.einsum("bnkv,bnk->bnv", h, q[:, t]))
    o = (torch.stack(outputs, dim=1) if outputs else v.new_zeros(B, 0, N, V, dtype=dtype)).to(v.dtype)
    return o, (h.float() if dtype == torch.float32 else h) if output_final_state else None


def reference_conv(x, weight, bias=None, initial_state=None, output_final_state=False, activation=None,
                   cu_seqlens=None, initial_state_indices=None, final_state_indices=None, token_state_indices=None):
    """The short causal depthwise convolution as F.conv1d over [state, x] (positions before 0 read
    initial_state, or zeros); with sequences, one sequence at a time."""
    sequences = Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices)
    if any(t is not None for t in sequences):
        return _by_sequence(reference_conv, dict(x=x), initial_state, output_final_state, sequences, weight=weight,
                            bias=bias, activation=activation)
    B, T, C = x.shape
    W = weight.shape[1]
    dtype = x.dtype
    state = torch.zeros(B, C, W - 1, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    window = torch.cat([state, x.transpose(1, 2)], dim=2)  # [B, C, W - 1 + T]
    if T == 0:  # an empty sequence: no output, the state passes through
        y = x.new_zeros(B, 0, C, dtype=dtype)
    else:
        z = F.conv1d(window, weight.to(dtype).unsqueeze(1), None if bias is None else bias.to(dtype), groups=C)
        y = (F.silu(z) if conv_activation(activation) == "silu" else z).transpose(1, 2)
    final = window[:, :, window.shape[2] - (W - 1):] if output_final_state and W > 1 else None
    return y, final


def reference_norm(x, g, weight, bias=None, activation="swish", eps=1e-6, norm_before_gate=True):
    """(x / rms(x) * weight + bias) * act(g), or gate first (u = x * act(g), u / rms(u) * weight + bias)."""
    activation = norm_activation(activation)
    act = {"silu": F.silu, "sigmoid": torch.sigmoid, "none": lambda z: z}[activation]
    weight = weight.to(x.dtype)
    if g is not None and not norm_before_gate:
        x = x * act(g.to(x.dtype))
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    y = y * (weight if weight.dim() == 1 else weight.view(*([1] * (y.dim() - 2)), *weight.shape))
    if bias is not None:
        y = y + (bias.to(x.dtype) if bias.dim() == 1 else bias.to(x.dtype).view(*([1] * (y.dim() - 2)), *bias.shape))
    if g is not None and norm_before_gate:
        y = y * act(g.to(x.dtype))
    return y


REFERENCE = Ops(recurrence=reference_recurrence, conv=reference_conv, norm=reference_norm)


def ops_named(name) -> Ops:
    """The operations a layer's ``ops`` names ("kernels" or "reference"), or the Ops it holds."""
    if isinstance(name, Ops):
        return name
    if name == "kernels":
        return KERNELS
    if name == "reference":
        return REFERENCE
    raise ValueError(f"flat.nn: ops: expected 'kernels' or 'reference', got '{name}'")


class State(NamedTuple):
    """A layer's state between calls (chunked prefill, decoding): the recurrent state
    [B, N, K, V] float32 and the convolution's last inputs [B, C, W-1] (None without a
    convolution). For serving, the same with P rows each is a pool of states, a row of each per
    slot, addressed by initial_state_indices, final_state_indices, token_state_indices (a layer's
    state_pool)."""

    recurrent: Tensor
    conv: Optional[Tensor]


