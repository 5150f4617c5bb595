"""Layer-level forwards: what takes the place of a whole layer's ``forward`` (transformers marks these
layers ``@use_kernel_forward_from_hub``) while flat.transformers is enabled.

The Gated DeltaNet layers: Qwen3.5's and Qwen3.5-MoE's (``gated_deltanet_forward``), Qwen3-Next's
(``qwen3_next_gated_deltanet_forward``) and OLMo-hybrid's (``olmo_hybrid_gated_deltanet_forward``),
one forward with each class's layout (``_Layout``: its projections, norm and output modules). On
CPU tensors in float32 or bfloat16 it runs the layer's own modules and parameters (the input
projections and the output projection as its nn.Linear modules, conv1d's weight, A_log, dt_bias,
the norm's weight and eps), so the state dict is the layer's, with

- the short convolution on flat's ``conv`` straight on the ``[B, T, C]`` projection (no transposes
  or copies; Qwen3-Next's grouped ``in_proj_qkvz`` and OLMo-hybrid's separate q, k, v projections
  are gathered into it first, as their originals do), q, k, v strided views of its output (flat
  reads them in place);
- the gate ``-exp(A_log) * softplus(a + dt_bias)``, ``sigmoid(b)`` (``2 sigmoid(b)`` with
  OLMo-hybrid's allow_neg_eigval) and the q/k L2 norm formed by flat.torch.gated_deltanet's options
  (``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval``,
  ``use_qk_l2norm_in_kernel``), in float32, value heads sharing key heads without copies;
- the gated RMSNorm on flat's fused ``rms_norm_gated`` (norm before gate, SiLU), which rounds once
  where transformers' rounds the normed value to the input dtype before the weight.

The cache is used exactly as the layer's own forward uses it (get_conv_state, get_recurrent_state,
update_conv_state with the ``[B, C, T]`` view of the projection, is_recording_past,
update_recurrent_state; transformers 5.25's increase_count after a state updated in place, and
get_recurrent_states_to_keep, the last tokens' states a cache recording the past keeps), so its
states keep transformers' layout and dtype (conv state ``[B, C, kernel]`` in the model's dtype,
recurrent state ``[B, HV, K, V]`` float32) and enable() / disable() may be switched
mid-generation. A single cached token's convolution is
causal_conv1d_update's (flat.compat's, which updates the state in place), and its delta rule
updates a float32 recurrent state in place (_delta_rule_step). Anything else (another
device, float16, packed sequences with a cache, an activation flat's convolution lacks, the
deprecated ``cache_params``) goes to the layer's original forward, which reaches flat through the
function-level swap where it can.

The kernels each forward calls are looked up in its ``flat_kernels`` dict, keyed by the module
globals of the function-level swap they stand in for (tests count the calls through it).

FalconH1's Mamba-2 mixer (``falcon_h1_mixer_forward``) runs its original forward: with its gated
norm on (``mamba_rms_norm``), the fused call its training mode makes
(``mamba2_split_conv1d_scan_combined``, to which transformers passes ``norm_before_gate=False``)
takes the norm's own ``norm_before_gate`` (the config's ``mamba_norm_before_gate``), which its
unfused path, in eval mode or with a cache, applies: the mixer computes one function in both modes.
"""

import functools
import sys
from typing import Callable, Dict, NamedTuple, Optional

import torch

from .. import torch as _ft
from ..compat.causal_conv1d import causal_conv1d_update as _compat_conv_update
from ._dispatch import _check_seq_idx, _offsets, _offsets_from, fixed_arguments

_DTYPES = (torch.float32, torch.bfloat16)
_ACTIVATIONS = ("silu", "swish")


def _conv(x, weight, bias, initial_state, activation, cu_seqlens):
    """flat's convolution over x [B, T, C]: returns y [B, T, C] in x's dtype."""
    y, _ = _ft.conv(x, weight.float(), None if bias is None else bias.float(), initial_state=initial_state,
                    activation=activation, cu_seqlens=cu_seqlens)
    return y


def _conv_update(x, conv_state, weight, bias, activation):
    """One cached token x [B, 1, C]: causal_conv1d_update on the cache's conv_state [B, C, kernel], in
    place. Returns y [B, 1, C]."""
    return _compat_conv_update(x.transpose(1, 2), conv_state, weight, bias, activation).transpose(1, 2)


def _delta_rule(q, k, v, a, b, A_log, dt_bias, initial_state, output_final_state, cu_seqlens, allow_neg_eigval=False):
    return _ft.gated_deltanet(q, k, v, a, b, initial_state=initial_state, output_final_state=output_final_state,
                              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                              use_beta_sigmoid_in_kernel=True, allow_neg_eigval=allow_neg_eigval,
                              cu_seqlens=cu_seqlens)


def _wants_grad(*tensors) -> bool:
    """Whether a gradient would flow through a call on these tensors (None among them allowed): a
    pool call, which writes states in place, is for inference only."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _delta_rule_step(q, k, v, a, b, A_log, dt_bias, state, output_final_state, cu_seqlens, allow_neg_eigval=False):
    """One cached token per sequence, as _delta_rule, with the cache's state [B, HV, K, V] updated in
    place where flat can do that (a float32 state whose last axis is contiguous, no gradient wanted,
    no packing): its rows are then read and written as a pool, and the returned final state is the
    cache's tensor itself, so that the cache's update_recurrent_state copies it onto itself, which
    PyTorch skips. A decode step at batch 16 otherwise writes 16 MB of fresh state and copies it
    into the cache."""
    if (state is None or state.dtype != torch.float32 or state.stride(-1) != 1 or cu_seqlens is not None or
            _wants_grad(q, k, v, a, b, A_log, dt_bias, state)):
        return _delta_rule(q, k, v, a, b, A_log, dt_bias, state, output_final_state, cu_seqlens, allow_neg_eigval)
    rows = torch.arange(state.shape[0])
    return _ft.gated_deltanet(q, k, v, a, b, initial_state=state, output_final_state=True,
                              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                              use_beta_sigmoid_in_kernel=True, allow_neg_eigval=allow_neg_eigval,
                              initial_state_indices=rows, final_state_indices=rows)


def _delta_rule_kept(q, k, v, a, b, A_log, dt_bias, state, allow_neg_eigval=False):
    """The tokens [B, T, ...] from `state` (None: zeros), keeping the state after each, as a cache
    recording the past for speculative decoding wants them: (out, [the state after token t,
    [B, HV, K, V] float32, for each t]). One call writes every token's state into a fresh pool of
    B (T + 1) rows through token_state_indices (rows 0..B-1 the starting states; token t of batch
    row b at B (t + 1) + b, so each token's states are one contiguous block); where a gradient would
    flow (such a call is for inference) each token runs as a call of its own, as the original runs
    them."""
    if _wants_grad(q, k, v, a, b, A_log, dt_bias, state):
        outs, states = [], []
        for t in range(q.shape[1]):
            out, state = _delta_rule(*(x[:, t:t + 1] for x in (q, k, v, a, b)), A_log, dt_bias, state, True, None,
                                     allow_neg_eigval)
            outs.append(out)
            states.append(state)
        return torch.cat(outs, dim=1), states
    B, T = q.shape[:2]
    pool = torch.empty(B * (T + 1), v.shape[2], q.shape[3], v.shape[3], dtype=torch.float32)
    starts = None
    if state is not None:
        pool[:B] = state
        starts = torch.arange(B)
    token_rows = B + torch.arange(T * B).view(T, B).t().reshape(-1)
    out, pool = _ft.gated_deltanet(q, k, v, a, b, initial_state=pool, use_qk_l2norm_in_kernel=True,
                                   use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                                   use_beta_sigmoid_in_kernel=True, allow_neg_eigval=allow_neg_eigval,
                                   initial_state_indices=starts, token_state_indices=token_rows)
    return out, list(pool[B:].unflatten(0, (T, B)).unbind(0))


def _norm(x, gate, weight, eps):
    return _ft.rms_norm_gated(x, gate, weight, activation="silu", eps=eps, norm_before_gate=True)


# name -> kernel: the prefill and decode halves under the module globals they stand in for, and
# the tokens whose states a cache keeps (the original's loop of torch_recurrent_gated_delta_rule).
KERNELS: Dict[str, Callable] = {
    "causal_conv1d_fn": _conv,
    "causal_conv1d_update": _conv_update,
    "torch_chunk_gated_delta_rule": _delta_rule,
    "torch_recurrent_gated_delta_rule": _delta_rule_step,
    "kept_states_gated_delta_rule": _delta_rule_kept,
    "rms_norm_gated": _norm,
}


def _packing(kwargs, batch: int, tokens: int) -> Optional[torch.Tensor]:
    """The packed sequences' offsets from cu_seq_lens_q or seq_idx (checked as the function-level
    dispatcher checks them, with its messages), or None."""
    cu, seq_idx = kwargs.get("cu_seq_lens_q"), kwargs.get("seq_idx")
    if seq_idx is not None:
        _check_seq_idx(seq_idx, batch, tokens)
    if cu is not None:
        return _offsets(cu, "cu_seq_lens_q", batch, tokens)
    if seq_idx is not None:
        return _offsets_from(seq_idx, batch, tokens)
    return None


def _plain(module: torch.nn.Module) -> bool:
    """Whether calling module's forward can be skipped: no hooks on it."""
    return not (module._forward_hooks or module._forward_pre_hooks)


def _conv_tail(conv_state: torch.Tensor, width: int) -> torch.Tensor:
    """The last width - 1 inputs a cached conv state [B, C, n] holds, float32 [B, C, width - 1] (a copy:
    the cache overwrites its state in place next); zeros before the first input where n is shorter
    (a state recording the past holds what it has seen)."""
    tail = conv_state[..., max(conv_state.shape[-1] - (width - 1), 0):].to(torch.float32, copy=True)
    if tail.shape[-1] < width - 1:
        tail = torch.nn.functional.pad(tail, (width - 1 - tail.shape[-1], 0))
    return tail.contiguous()


def _serves(layer, hidden_states, cache, kwargs) -> bool:
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.device.type != "cpu":
        return False
    if hidden_states.dtype not in _DTYPES or hidden_states.dim() != 3:
        return False
    if layer.activation not in _ACTIVATIONS or "cache_params" in kwargs:
        return False
    if cache is not None and (kwargs.get("cu_seq_lens_q") is not None or kwargs.get("seq_idx") is not None):
        return False  # the original's handling (a cache over packed sequences), as it is
    return True


def _project_qwen3_5(layer, hidden_states):
    """Qwen3.5's projections: mixed_qkv [B, T, C] (q, k, v side by side, as the convolution takes
    them), z [B, T, HV, V], b and a [B, T, HV], each its own nn.Linear's output (no copies)."""
    z = layer.in_proj_z(hidden_states).unflatten(-1, (-1, layer.head_v_dim))
    return layer.in_proj_qkv(hidden_states), z, layer.in_proj_b(hidden_states), layer.in_proj_a(hidden_states)


def _project_qwen3_next(layer, hidden_states):
    """Qwen3-Next's projections, in_proj_qkvz and in_proj_ba grouped by key head ([q k v z] and
    [b a] per key head), taken apart as the layer's fix_query_key_value_ordering does: q, k, v
    gathered side by side for the convolution (the one copy the layout needs, which the original
    makes too), z, b, a in value-head order."""
    Hk, Kd, Vd = layer.num_k_heads, layer.head_k_dim, layer.head_v_dim
    r = layer.num_v_heads // Hk
    qkvz = layer.in_proj_qkvz(hidden_states).unflatten(-1, (Hk, -1))
    ba = layer.in_proj_ba(hidden_states).unflatten(-1, (Hk, -1))
    q, k = qkvz[..., :Kd], qkvz[..., Kd:2 * Kd]
    v, z = qkvz[..., 2 * Kd:2 * Kd + r * Vd], qkvz[..., 2 * Kd + r * Vd:]
    mixed_qkv = torch.cat((q.flatten(2), k.flatten(2), v.flatten(2)), dim=-1)
    z = z.reshape(*z.shape[:2], -1, Vd)
    return mixed_qkv, z, ba[..., :r].flatten(2), ba[..., r:].flatten(2)


def _project_olmo_hybrid(layer, hidden_states):
    """OLMo-hybrid's separate projections (q, k, v gathered for the convolution, as the original
    does; the output gate from g_proj)."""
    mixed_qkv = torch.cat([layer.q_proj(hidden_states), layer.k_proj(hidden_states), layer.v_proj(hidden_states)],
                          dim=-1)
    z = layer.g_proj(hidden_states).unflatten(-1, (-1, layer.head_v_dim))
    return mixed_qkv, z, layer.b_proj(hidden_states), layer.a_proj(hidden_states)


class _Layout(NamedTuple):
    """Where a Gated DeltaNet layer class keeps what the flat forward reads."""

    project: Callable  # (layer, hidden_states) -> mixed_qkv [B, T, C], z [B, T, HV, V], b, a [B, T, HV]
    norm: str = "norm"  # the gated RMSNorm module
    out: str = "out_proj"  # the output projection


_QWEN3_5 = _Layout(_project_qwen3_5)
_QWEN3_NEXT = _Layout(_project_qwen3_next)
_OLMO_HYBRID = _Layout(_project_olmo_hybrid, norm="o_norm", out="o_proj")


def _prefill(rule, inputs, state, cache, layer_idx, cu_seqlens):
    """The delta rule over the call's tokens (inputs: q, k, v, a, b, [B, T, ...]) from `state`:
    (out, final state). A cache recording the past for speculative decoding in transformers 5.25
    (get_recurrent_states_to_keep: N) also wants the states after each of the last N tokens, as a
    list that ends with the final state: the chunked rest first, then those tokens in one call
    that keeps them. (A cache is never given with packed sequences: _serves.)"""
    keep = 0
    if cache is not None and hasattr(cache, "get_recurrent_states_to_keep"):
        keep = min(cache.get_recurrent_states_to_keep(layer_idx) or 0, inputs[0].shape[1])
    if not keep:
        return rule("torch_chunk_gated_delta_rule", inputs, state, cache is not None, cu_seqlens)
    head = inputs[0].shape[1] - keep
    if not head:
        return rule("kept_states_gated_delta_rule", inputs, state)
    out, state = rule("torch_chunk_gated_delta_rule", [x[:, :head] for x in inputs], state, True, None)
    tail, states = rule("kept_states_gated_delta_rule", [x[:, head:] for x in inputs], state)
    return torch.cat((out, tail), dim=1), states


def _gated_deltanet(layer, layout, kernels, hidden_states, cache, attention_mask, kwargs):
    """A Gated DeltaNet layer on flat (the module docstring), its modules where layout says."""
    modeling = sys.modules[type(layer).__module__]
    hidden_states = modeling.apply_mask_to_padding_states(hidden_states, attention_mask)
    batch, tokens, _ = hidden_states.shape
    cu_seqlens = _packing(kwargs, batch, tokens)
    if cache is not None:
        conv_state = cache.get_conv_state(layer.layer_idx, state_idx=0)
        recurrent_state = cache.get_recurrent_state(layer.layer_idx, state_idx=0)
    else:
        conv_state, recurrent_state = None, None

    mixed_qkv, z, b, a = layout.project(layer, hidden_states)

    width = layer.conv_kernel_size
    weight, bias = layer.conv1d.weight.squeeze(1), layer.conv1d.bias
    if conv_state is not None and tokens == 1 and not cache.is_recording_past(layer.layer_idx):
        if hasattr(cache, "increase_count"):  # 5.25: the cache counts the tokens its state saw in place
            cache.increase_count(layer.layer_idx, 0)
        mixed_qkv = kernels["causal_conv1d_update"](mixed_qkv, conv_state, weight, bias, layer.activation)
    else:
        initial = _conv_tail(conv_state, width) if conv_state is not None and width > 1 else None
        if cache is not None:  # what the original caches (it returns the state and the new inputs, unused here)
            cache.update_conv_state(mixed_qkv.transpose(1, 2), layer.layer_idx, conv_kernel_size=width)
        mixed_qkv = kernels["causal_conv1d_fn"](mixed_qkv, weight, bias, initial, layer.activation, cu_seqlens)

    kd = layer.key_dim
    query = mixed_qkv[..., :kd].unflatten(-1, (-1, layer.head_k_dim))
    key = mixed_qkv[..., kd:2 * kd].unflatten(-1, (-1, layer.head_k_dim))
    value = mixed_qkv[..., 2 * kd:].unflatten(-1, (-1, layer.head_v_dim))

    allow_neg_eigval = bool(getattr(layer, "allow_neg_eigval", False))

    def rule(name, inputs, state, *options):
        """The delta rule kernel under `name` on inputs (q, k, v, a, b) from `state`."""
        return kernels[name](*inputs, layer.A_log, layer.dt_bias, state, *options, allow_neg_eigval=allow_neg_eigval)

    if recurrent_state is not None and tokens == 1:
        out, final_state = rule("torch_recurrent_gated_delta_rule", (query, key, value, a, b), recurrent_state,
                                cache is not None, cu_seqlens)
    else:
        out, final_state = _prefill(rule, (query, key, value, a, b), recurrent_state, cache, layer.layer_idx,
                                    cu_seqlens)
    if cache is not None:
        cache.update_recurrent_state(final_state, layer.layer_idx)

    norm = getattr(layer, layout.norm)
    if _plain(norm) and getattr(norm, "activation", "silu") in _ACTIVATIONS:
        out = kernels["rms_norm_gated"](out, z, norm.weight, norm.variance_epsilon)
    else:
        out = norm(out, z)
    return getattr(layer, layout.out)(out.flatten(2))


def _accelerate_hooks(fn: Callable) -> Callable:
    """fn with the conv1d's accelerate hooks fired around it, as the original forward has them."""
    try:
        from transformers.integrations.accelerate import force_accelerate_hooks
    except ImportError:  # pragma: no cover - transformers without it has no such hooks either
        return fn
    return force_accelerate_hooks("conv1d")(fn)


def _forward(original: Callable, layout: _Layout, maker: str) -> Callable:
    kernels = dict(KERNELS)
    run = _accelerate_hooks(lambda layer, *args: _gated_deltanet(layer, layout, kernels, *args))

    @functools.wraps(original)
    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        if not _serves(self, hidden_states, cache, kwargs):
            return original(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        try:
            return run(self, hidden_states, cache, attention_mask, kwargs)
        except Exception as e:
            e.add_note(f"(flat.transformers: {type(self).__name__}.forward on CPU tensors runs "
                       f"{__name__}.{maker})")
            raise

    forward.flat_original = original
    forward.flat_kernels = kernels
    return forward


def gated_deltanet_forward(original: Callable) -> Callable:
    """The forward that takes the place of `original` (Qwen3_5GatedDeltaNet.forward or
    Qwen3_5MoeGatedDeltaNet.forward): flat's layer on CPU float32 / bfloat16 tensors, `original`
    otherwise."""
    return _forward(original, _QWEN3_5, "gated_deltanet_forward")


def qwen3_next_gated_deltanet_forward(original: Callable) -> Callable:
    """The same for Qwen3NextGatedDeltaNet.forward (its grouped projections)."""
    return _forward(original, _QWEN3_NEXT, "qwen3_next_gated_deltanet_forward")


def olmo_hybrid_gated_deltanet_forward(original: Callable) -> Callable:
    """The same for OlmoHybridGatedDeltaNet.forward (separate projections, o_norm, o_proj,
    allow_neg_eigval: beta = 2 sigmoid(b))."""
    return _forward(original, _OLMO_HYBRID, "olmo_hybrid_gated_deltanet_forward")


def falcon_h1_mixer_forward(original: Callable) -> Callable:
    """The forward that takes the place of `original` (FalconH1Mixer.forward): `original`, its fused
    call taking the config's norm_before_gate where the mixer has its gated norm."""

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if not self.mamba_rms_norm:
            return original(self, *args, **kwargs)
        with fixed_arguments("mamba_split_conv1d_scan_combined", norm_before_gate=self.norm.norm_before_gate):
            return original(self, *args, **kwargs)

    forward.flat_original = original
    return forward
