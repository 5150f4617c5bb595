"""The ``causal-conv1d`` package's functions on flat's short convolution (``flat.torch.conv``), for CPU
tensors, with the package's signatures, layouts and returns:

    causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None)
        x [B, D, T]; weight [D, W]; bias [D]; seq_idx [B, T] (sequences packed along T);
        initial_states, final_states_out [B, D, W-1]. Returns out [B, D, T], or
        (out, final_states) with return_final_states. Differentiable in x, weight, bias,
        initial_states (and through the final states).

    causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None)
        x [B, D] or [B, D, T]; conv_state [B, D, state_len] (state_len >= W-1), updated in place;
        cache_seqlens [B] (conv_state a circular buffer); conv_state_indices [B] (conv_state a pool
        of rows). Returns out shaped like x. Not differentiable (as in the package).

x is read in place where its channel axis is contiguous (the [B, D, T] view of a [B, T, D] tensor,
as transformers passes it); out is a [B, D, T] view of flat's [B, T, D] output. The weight and bias
are used in float32 (any float dtype, widened); float32 and bfloat16 x are computed in their dtype,
other float dtypes in float32; out, the final states and conv_state keep their dtypes.

Differences from the package:

- activation: None, "silu" or "swish"; anything else raises ValueError (the package raises
  NotImplementedError).
- seq_idx must be nondecreasing along T in each row; each run of equal values is one sequence
  (the package compares the values inside each window, which is the same for sorted seq_idx).
  Negative values are sequence ids like any other (no padding convention). With seq_idx,
  initial_states and return_final_states are refused, as in the package.
- return_final_states does not need a channel-last x, and any width flat's convolution takes is
  accepted (the package's CUDA kernels take 2 to 4); with W = 1 the final states are [B, D, 0],
  and so may initial_states be (they hold no input).
- causal_conv1d_update: conv_state_indices must address rows of conv_state (0 <= index < rows,
  no repeats); the package has no checks (and newer versions skip negative indices).
- Bad input raises ValueError naming the argument ("flat: <arg>: expected ..., got ...").
"""

from typing import Optional

import torch
from torch import Tensor

import flat.torch as _ft
from flat._args import conv_activation

from ._checks import bad as _bad, cpu_tensor as _tensor, describe as _describe, pool_rows

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]


def _compute_dtype(t: Tensor) -> Tensor:
    """float32 and bfloat16 as they are (flat's dtypes), other floats as float32."""
    return t if t.dtype in (torch.float32, torch.bfloat16) else t.float()


def _bias(bias, D: int) -> Optional[Tensor]:
    if bias is None:
        return None
    return _tensor("bias", bias, (D,), f"[D={D}]").float()


def sequence_offsets(seq_idx: Tensor, B: int, T: int, name: str = "seq_idx") -> Tensor:
    """cu_seqlens [num_seqs + 1] (int64) of the B rows of T tokens flattened into one row of B * T,
    a sequence starting at each row's start and wherever seq_idx changes; seq_idx [B, T] must be
    nondecreasing along T."""
    seq_idx = _tensor(name, seq_idx, (B, T), f"[B={B}, T={T}]", kind="integer")
    if T > 1 and bool((seq_idx[:, 1:] < seq_idx[:, :-1]).any()):
        raise _bad(name, "sequence ids nondecreasing along T in each row", "a decreasing step")
    starts = torch.ones((B, T), dtype=torch.bool)
    if T > 1:
        starts[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    positions = torch.nonzero(starts.reshape(-1)).reshape(-1)
    return torch.cat([positions, torch.tensor([B * T])]).to(torch.int64)


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    """The causal depthwise convolution of x [B, D, T] by weight [D, W] (plus bias, then the
    activation), positions before 0 reading initial_states [B, D, W-1] (zeros without).
    Returns out [B, D, T] in x's dtype, or (out, final_states [B, D, W-1]) with
    return_final_states, the final states the last W-1 inputs (written to final_states_out
    when given, which is returned)."""
    x = _tensor("x", x, (None, None, None), "[B, D, T]")
    Bn, D, T = (int(n) for n in x.shape)
    weight = _tensor("weight", weight, (D, None), f"[D={D}, W]")
    W = int(weight.shape[1])
    if W < 1:
        raise _bad("weight", "a width W >= 1", list(weight.shape))
    act = conv_activation(activation)
    bias = _bias(bias, D)
    cu_seqlens = None
    if seq_idx is not None:
        if initial_states is not None:
            raise _bad("initial_states", "None when seq_idx is given (as in causal-conv1d)", _describe(initial_states))
        if return_final_states:
            raise _bad("return_final_states", "False when seq_idx is given (as in causal-conv1d)", True)
        cu_seqlens = sequence_offsets(seq_idx, Bn, T)
    state0 = None
    if initial_states is not None:
        state0 = _tensor("initial_states", initial_states, (Bn, D, W - 1), f"[B={Bn}, D={D}, W-1={W - 1}]").float()
        if W == 1:  # [B, D, 0], as this function returns the final states: no past input to read
            state0 = None
    if final_states_out is not None and return_final_states:
        _tensor("final_states_out", final_states_out, (Bn, D, W - 1), f"[B={Bn}, D={D}, W-1={W - 1}]")

    xt = _compute_dtype(x).transpose(1, 2)  # [B, T, D], read in place when x is channel-last
    if cu_seqlens is not None:
        xt = xt.reshape(1, Bn * T, D)
    y, final = _ft.conv(x=xt, weight=weight.float(), bias=bias, initial_state=state0,
                        output_final_state=bool(return_final_states) and W > 1, activation=act, cu_seqlens=cu_seqlens,
                        initial_state_indices=None, final_state_indices=None, token_state_indices=None)
    out = y.reshape(Bn, T, D).transpose(1, 2)
    if out.dtype != x.dtype:
        out = out.to(x.dtype)
    if not return_final_states:
        return out
    if final is None:  # W = 1: no past inputs to keep
        final = x.new_zeros((Bn, D, 0))
    final = final.to(x.dtype)
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return out, final


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """One decoding step (or a few tokens) of the convolution: x [B, D] or [B, D, T] continues the
    inputs held in conv_state [B, D, state_len] (the last state_len inputs; with cache_seqlens
    [B] a circular buffer whose next write position is cache_seqlens % state_len; with
    conv_state_indices [B] row conv_state_indices[b] of a larger conv_state serves batch row b).
    conv_state is updated in place; returns out shaped like x, in x's dtype."""
    with torch.no_grad():
        return _update(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices)


def _update(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices):
    if isinstance(x, Tensor) and x.dim() == 2:
        out = _update(x.unsqueeze(-1), conv_state, weight, bias, activation, cache_seqlens, conv_state_indices)
        return out.squeeze(-1)
    x = _tensor("x", x, (None, None, None), "[B, D] or [B, D, T]")
    Bn, D, T = (int(n) for n in x.shape)
    conv_state = _tensor("conv_state", conv_state, (None, D, None), f"[B, D={D}, state_len]")
    weight = _tensor("weight", weight, (D, None), f"[D={D}, W]")
    W, state_len = int(weight.shape[1]), int(conv_state.shape[2])
    if W < 1:
        raise _bad("weight", "a width W >= 1", list(weight.shape))
    if state_len < W - 1:
        raise _bad("conv_state", f"state_len >= W-1 = {W - 1}", list(conv_state.shape))
    act = conv_activation(activation)
    bias = _bias(bias, D)
    rows = None
    if conv_state_indices is not None:
        rows = pool_rows("conv_state_indices", conv_state_indices, Bn, "conv_state", int(conv_state.shape[0]),
                         f"[B={Bn}]", kind="integer")
    elif int(conv_state.shape[0]) != Bn:
        raise _bad("conv_state", f"[B={Bn}, D={D}, state_len]", list(conv_state.shape))
    state = conv_state if rows is None else conv_state.index_select(0, rows)  # [B, D, state_len]

    # The W-1 inputs before x, oldest first.
    if cache_seqlens is None:
        tail = state[:, :, state_len - (W - 1):]
    else:
        cache_seqlens = _tensor("cache_seqlens", cache_seqlens, (Bn,), f"[B={Bn}]", kind="integer").long()
        past = torch.remainder(cache_seqlens[:, None] + torch.arange(-(W - 1), 0), max(state_len, 1))
        tail = state.gather(2, past[:, None, :].expand(Bn, D, W - 1))
    # tail as it lies when float32 (flat reads a state's rows in place: its last axis is contiguous).
    y, _ = _ft.conv(x=_compute_dtype(x).transpose(1, 2), weight=weight.float(), bias=bias,
                    initial_state=tail.float() if W > 1 else None, output_final_state=False,
                    activation=act, cu_seqlens=None, initial_state_indices=None, final_state_indices=None,
                    token_state_indices=None)
    out = y.transpose(1, 2)
    if out.dtype != x.dtype:
        out = out.to(x.dtype)

    # The state after x: its last state_len inputs.
    if state_len > 0:
        if cache_seqlens is None:  # the state's inputs after the first T, then x's (its last state_len)
            new = (torch.cat([state[:, :, T:], x.to(state.dtype)], dim=2) if T < state_len
                   else x[:, :, T - state_len:].to(state.dtype))
        else:  # written into the buffer (conv_state itself, or the copy of its rows)
            kept = min(T, state_len)  # only the last state_len tokens survive
            at = torch.remainder(cache_seqlens[:, None] + (T - kept) + torch.arange(kept), state_len)
            new = state.scatter_(2, at[:, None, :].expand(Bn, D, kept), x[:, :, T - kept:].to(state.dtype))
        if rows is not None:
            conv_state.index_copy_(0, rows, new)
        elif new is not conv_state:
            conv_state.copy_(new)
    return out
