"""flat as flash-linear-attention 0.6's CPU backend.

``import flat.fla`` (FLA 0.6 must be installed) adds a backend named ``flat`` to FLA's own
registry, ``fla.backends``, for every dispatched entry flat serves, and routes the few names FLA's
layers call that its registry does not dispatch. After it, FLA's functions, layers and models run on
CPU tensors; calls on any other device go to FLA's kernels exactly as before (each verifier declines
them, and each routed name hands them to FLA's own function). FLA 0.6 has no entry point through
which a package registers itself, so the import is needed. ``FLA_FLAT=0`` in the environment turns
flat off, read at each call (FLA's switch for a backend, ``env_var``; the routed names below follow
it too); FLA's ``FLA_DISABLE_BACKEND_DISPATCH=1``, read when FLA is imported, bypasses every
registry backend, this one too, but not the routed names.

Through FLA's registry (``fla.backends.register``), each with a verifier that takes CPU tensors and
the options flat implements and declines the rest:

- ``chunk_gated_delta_rule`` (operation ``gated_delta_rule``) and ``chunk_kda`` on
  ``flat.compat.fla``'s functions of the same names; the verifiers decline ``cp_context``,
  ``use_graph`` and ``return_intermediate_states`` (CUDA-only), which FLA then handles as before.
- FLA's short convolution, ``causal_conv1d_fwd``, ``causal_conv1d_bwd`` and ``causal_conv1d_update``
  (what ``ShortConvolution`` and ``causal_conv1d`` call with the default ``backend="triton"``), on
  ``flat.compat.fla.causal_conv1d`` and ``causal_conv1d_update``.
- FLA's RMS norms, ``layer_norm_fwd``/``layer_norm_bwd`` and ``layer_norm_gated_fwd``/
  ``layer_norm_gated_bwd`` with ``is_rms_norm=True`` (``RMSNorm``, ``FusedRMSNormGated``, the
  models' fused norms with a residual), on ``flat.torch.rms_norm_gated``. FLA's LayerNorm
  (``is_rms_norm=False``) and grouped norms (``num_groups > 1``) are declined.
- ``l2norm_fwd``/``l2norm_bwd`` (``fla.modules.l2norm``, which layers call outside the recurrence),
  ``swiglu_fwd``/``swiglu_fwdbwd`` (the models' ``GatedMLP``, ``silu(x) * y``), ``swish_fwd``/
  ``swish_bwd`` and ``rotary_embedding_fwdbwd`` (``RotaryEmbedding``, MultiScaleRetention's; dense
  batches with the halves rotated, ``cu_seqlens`` and ``interleaved`` declined): flat has no kernel
  for these, so the backend computes FLA's formulas in PyTorch (float32), so that FLA's layers and
  models run on a CPU.

The backward entries of the convolution and the gated norm recompute their forward through flat's
differentiable functions and take its gradients with ``torch.autograd.grad``; FLA saves its Triton
kernels' statistics (mean, rstd) for them, where flat's forward entries return None. FLA's plain
RMS norm passes no eps to its backward, so ``layer_norm_fwd`` returns the rstd and
``layer_norm_bwd`` is the RMS norm's gradient formula in PyTorch.

Names FLA does not dispatch (no selection to plug into), routed instead where FLA's modules hold
them: CPU calls go to flat, any other to FLA's function. Each name is replaced in every loaded
``fla`` module that holds it (``fla.ops``, ``fla.layers``, ``fla.modules``), so
``fla.ops.chunk_gla is not`` FLA's function after the import:

- ``fused_recurrent_gated_delta_rule``, ``fused_recurrent_kda`` (what GatedDeltaNet and
  KimiDeltaAttention call without gradients for up to 64 tokens, i.e. in generation), ``chunk_gdn2``
  and ``fused_recurrent_gdn2`` (GatedDeltaNet2): ``flat.compat.fla``'s;
- ``chunk_gla`` and ``fused_recurrent_gla`` (GatedLinearAttention): ``flat.torch.gla``
  (``fused_recurrent_gla`` with ``gk`` only: ``gv`` and ``reverse=True`` raise ValueError naming
  them);
- ``chunk_linear_attn``, ``fused_chunk_linear_attn``, ``fused_recurrent_linear_attn``
  (LinearAttention): ``flat.torch.la``, which takes FLA's ``normalize`` and its state pair;
- ``chunk_retention``, ``fused_chunk_retention``, ``fused_recurrent_retention``
  (MultiScaleRetention): ``flat.torch.retnet`` with FLA's decay ``log(1 - 2^(-5 - h))`` per head
  (``parallel_retention``, which returns attention scores, is not routed);
- ``rmsnorm_fn`` (``fla.modules.norm.layernorm_gated``, the gated norm of FLA's Mamba2):
  ``flat.torch.rms_norm_gated``, each group of ``group_size`` channels as one head. FLA's Mamba2
  takes its fast path only on CUDA; on a CPU its own PyTorch convolution and scan run, and only this
  norm runs on flat.

Not served, so still failing on a CPU with FLA's "0 active drivers": FLA's other operations and the
layers built on them (simple GLA, DeltaNet, DPLR, RWKV, HGRN, ...), its LayerNorm (non-RMS) norms,
its MLP fused with the down projection (``fuse_swiglu``'s ``swiglu_linear``) and its fused
cross-entropy (``fuse_cross_entropy``); docs/ecosystem.md lists what runs. FLA 0.6's ``generate()``
under transformers 5.25 passes the cache as ``cache``, which FLA's layers do not read, so each
decode step starts from an empty state (on any device, flat or not); decoding by calling the model
with ``past_key_values`` keeps the state.
"""

import functools
import sys
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    import fla  # noqa: F401  (FLA's package; this module is flat's backend for it)
    import fla.layers  # noqa: F401  (imports every op and module whose names are routed below)
    from fla.backends import BaseBackend, register
    from fla.modules.activations import ops as _fla_activations
    from fla.modules.causal_conv1d import ops as _fla_conv
    from fla.modules.norm import fused_norm_gate as _fla_norm_gate
    from fla.modules.norm import l2norm as _fla_l2norm
    from fla.modules.norm import layernorm as _fla_layernorm
    from fla.modules.norm import layernorm_gated as _fla_layernorm_gated
    from fla.modules.rotary import ops as _fla_rotary
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as _fla_recurrent_gdr
    from fla.ops.gdn2 import chunk_gdn2 as _fla_chunk_gdn2
    from fla.ops.gdn2 import fused_recurrent_gdn2 as _fla_recurrent_gdn2
    from fla.ops.gla import chunk_gla as _fla_chunk_gla
    from fla.ops.gla import fused_recurrent_gla as _fla_recurrent_gla
    from fla.ops.kda import chunk_kda as _fla_chunk_kda
    from fla.ops.kda import fused_recurrent_kda as _fla_recurrent_kda
    from fla.ops.linear_attn import chunk_linear_attn as _fla_chunk_la
    from fla.ops.linear_attn import fused_chunk_linear_attn as _fla_fused_chunk_la
    from fla.ops.linear_attn import fused_recurrent_linear_attn as _fla_recurrent_la
    from fla.ops.retention import chunk_retention as _fla_chunk_retention
    from fla.ops.retention import fused_chunk_retention as _fla_fused_chunk_retention
    from fla.ops.retention import fused_recurrent_retention as _fla_recurrent_retention
except ImportError as error:
    raise ImportError("flat.fla: expected flash-linear-attention 0.6 installed (pip install --no-deps "
                      f"flash-linear-attention==0.6.0 fla-core==0.6.0 einops), got: {error}") from error

from . import torch as _flat
from .compat import fla as _compat

__all__ = ["FlatBackend", "on_cpu"]


def on_cpu(*args, **kwargs) -> bool:
    """Whether every tensor among the arguments is on the CPU (and there is one)."""
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, Tensor)]
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


def _cpu_verdict(*args, **kwargs):
    if on_cpu(*args, **kwargs):
        return True, None
    devices = sorted({str(t.device) for t in (*args, *kwargs.values()) if isinstance(t, Tensor)})
    return False, f"flat runs CPU tensors, got tensors on {', '.join(devices) or 'no device'}"


def _refused_options(cp_context=None, use_graph=False, return_intermediate_states=False):
    """FLA's CUDA-only options flat does not implement, as a verifier's verdict."""
    named = [name for name, on in (("cp_context", cp_context is not None), ("use_graph", use_graph),
                                   ("return_intermediate_states", return_intermediate_states)) if on]
    return (False, f"flat does not implement {', '.join(named)} (CUDA only)") if named else (True, None)


def _rms_only(is_rms_norm: bool, num_groups: int = 1):
    if not is_rms_norm:
        return False, "flat implements the RMS norm (is_rms_norm=True), not LayerNorm"
    if num_groups != 1:
        return False, f"flat implements one norm group, got num_groups={num_groups}"
    return True, None


def _both(*verdicts):
    return next((v for v in verdicts if not v[0]), (True, None))


def _gradients(forward: Callable, inputs: dict, grads) -> dict:
    """Recomputes forward(**inputs) with gradients and returns, by name, the gradient of each input
    that is a tensor against the output gradients grads (None entries skipped)."""
    leaves = {name: t.detach().requires_grad_() for name, t in inputs.items() if isinstance(t, Tensor)}
    with torch.enable_grad():
        outputs = forward(**{**inputs, **leaves})
    pairs = [(o, g) for o, g in zip(outputs, grads) if o is not None and g is not None]
    found = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()), [g for _, g in pairs],
                                allow_unused=True)
    return {name: (torch.zeros_like(t) if d is None else d) for (name, t), d in zip(leaves.items(), found)}


def _rms_norm(x, g, weight, bias, activation, eps, residual, residual_dtype):
    """FLA's fused (gated) RMS norm on flat's kernel: (y, residual_out), residual_out the normed
    input x + residual in residual_dtype (x itself when neither is given)."""
    if weight is None:
        weight = torch.ones(x.shape[-1], dtype=torch.float32)
    y, residual_out = _flat.rms_norm_gated(x, g, weight, bias, activation=activation if g is not None else None,
                                           residual=residual, prenorm=True,
                                           residual_in_fp32=residual_dtype == torch.float32, eps=eps)
    return y, (residual_out if residual_dtype is None else residual_out.to(residual_dtype))


class FlatBackend(BaseBackend):
    """The ``flat`` backend: one method per FLA function it serves, each with its verifier
    (``<name>_verifier``, FLA's naming). Lowest priority number among FLA's CPU-capable backends: FLA's
    own backends (Ascend, TileLang, FlashQLA, Gluon) are not available on a CPU."""

    backend_type = "flat"
    env_var = "FLA_FLAT"
    priority = 1

    # ---- the recurrences --------------------------------------------------------------------

    def chunk_gated_delta_rule_verifier(self, *args, cp_context=None, **kwargs):
        return _both(_cpu_verdict(*args, **kwargs), _refused_options(cp_context=cp_context))

    def chunk_gated_delta_rule(self, *args, **kwargs):
        return _compat.chunk_gated_delta_rule(*args, **kwargs)

    def chunk_kda_verifier(self, *args, cp_context=None, use_graph=False, return_intermediate_states=False,
                           **kwargs):
        return _both(_cpu_verdict(*args, **kwargs), _refused_options(cp_context, use_graph,
                                                                      return_intermediate_states))

    def chunk_kda(self, *args, **kwargs):
        return _compat.chunk_kda(*args, **kwargs)

    # ---- the short convolution --------------------------------------------------------------

    def causal_conv1d_fwd_verifier(self, *args, **kwargs):
        return _cpu_verdict(*args, **kwargs)

    causal_conv1d_bwd_verifier = causal_conv1d_update_verifier = causal_conv1d_fwd_verifier

    @staticmethod
    def _conv(x, weight, bias, residual, initial_state, output_final_state, activation, cu_seqlens):
        """FLA's convolution on x [B, T, ...] (trailing axes flattened to the weight's channels, as
        FLA does); y in x's shape."""
        rows = (x.shape[0], x.shape[1], -1)
        y, final_state = _compat.causal_conv1d(x.reshape(rows), weight, bias,
                                               None if residual is None else residual.reshape(rows), initial_state,
                                               output_final_state, activation, cu_seqlens=cu_seqlens)
        return y.reshape(x.shape), final_state

    def causal_conv1d_fwd(self, x, weight, bias, residual, initial_state=None, output_final_state=False,
                          activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, chunk_size=64,
                          layout_fallback=False):
        return self._conv(x, weight, bias, residual, initial_state, output_final_state, activation, cu_seqlens)

    def causal_conv1d_bwd(self, x, dy, dht, weight=None, bias=None, residual=None, initial_state=None,
                          activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, chunk_size=64,
                          layout_fallback=False):
        def forward(x, weight, bias, residual, initial_state):
            return self._conv(x, weight, bias, residual, initial_state, dht is not None, activation, cu_seqlens)

        d = _gradients(forward, dict(x=x, weight=weight, bias=bias, residual=residual, initial_state=initial_state),
                       (dy, dht))
        return d["x"], d.get("weight"), d.get("bias"), d.get("residual"), d.get("initial_state")

    def causal_conv1d_update(self, x, cache, residual=None, weight=None, bias=None, activation=None):
        return _compat.causal_conv1d_update(x, cache, residual, weight, bias, activation)

    # ---- the RMS norms ----------------------------------------------------------------------

    def layer_norm_fwd_verifier(self, x, weight, bias, eps=1e-5, residual=None, out_dtype=None,
                                residual_dtype=None, is_rms_norm=False, num_groups=1):
        return _both(_cpu_verdict(x, weight, bias, residual), _rms_only(is_rms_norm, num_groups))

    def layer_norm_fwd(self, x, weight, bias, eps=1e-5, residual=None, out_dtype=None, residual_dtype=None,
                       is_rms_norm=True, num_groups=1):
        y, residual_out = _rms_norm(x, None, weight, bias, None, eps, residual,
                                    residual.dtype if residual is not None else residual_dtype)
        rstd = torch.rsqrt(residual_out.float().square().mean(-1) + eps)
        return y.to(out_dtype or x.dtype), None, rstd, residual_out

    def layer_norm_bwd_verifier(self, dy, x, weight, bias, mean=None, rstd=None, dres=None, has_residual=False,
                                is_rms_norm=False, x_dtype=None, recompute_output=False, num_groups=1):
        if recompute_output:
            return False, "flat does not implement recompute_output"
        return _both(_cpu_verdict(dy, x, weight, bias, dres), _rms_only(is_rms_norm, num_groups))

    def layer_norm_bwd(self, dy, x, weight, bias, mean=None, rstd=None, dres=None, has_residual=False,
                       is_rms_norm=True, x_dtype=None, recompute_output=False, num_groups=1):
        """FLA passes no eps to its norm's backward, only the rstd its forward saved (here computed
        with the forward's eps), so this backward is the RMS norm's formula in PyTorch."""
        x32, dy32, r = x.float(), dy.float(), rstd[:, None]
        normed = x32 * r
        dnormed = dy32 if weight is None else dy32 * weight.float()
        dx = r * (dnormed - normed * (dnormed * normed).mean(-1, keepdim=True))
        if dres is not None:
            dx = dx + dres.float()
        dx = dx.to(x_dtype or x.dtype)
        dw = None if weight is None else (dy32 * normed).sum(0).to(weight.dtype)
        db = None if bias is None else dy32.sum(0).to(bias.dtype)
        return dx, dw, db, dx if has_residual else None

    def layer_norm_gated_fwd_verifier(self, x, g, weight, bias, activation="swish", eps=1e-5, residual=None,
                                      out_dtype=None, residual_dtype=None, is_rms_norm=False):
        return _both(_cpu_verdict(x, g, weight, bias, residual), _rms_only(is_rms_norm))

    def layer_norm_gated_fwd(self, x, g, weight, bias, activation="swish", eps=1e-5, residual=None,
                             out_dtype=None, residual_dtype=None, is_rms_norm=True):
        y, residual_out = _rms_norm(x, g, weight, bias, activation, eps, residual,
                                    residual.dtype if residual is not None else residual_dtype)
        return y.to(out_dtype or x.dtype), None, None, residual_out

    def layer_norm_gated_bwd_verifier(self, dy, x, g, weight, bias, activation="swish", eps=1e-5, mean=None,
                                      rstd=None, dresidual=None, has_residual=False, is_rms_norm=False, x_dtype=None,
                                      recompute_output=False):
        if recompute_output:
            return False, "flat does not implement recompute_output"
        return _both(_cpu_verdict(dy, x, g, weight, bias, dresidual), _rms_only(is_rms_norm))

    def layer_norm_gated_bwd(self, dy, x, g, weight, bias, activation="swish", eps=1e-5, mean=None, rstd=None,
                             dresidual=None, has_residual=False, is_rms_norm=True, x_dtype=None,
                             recompute_output=False):
        def forward(x, g, weight, bias):
            return _rms_norm(x, g, weight, bias, activation, eps, None, None)[:1]

        d = _gradients(forward, dict(x=x, g=g, weight=weight, bias=bias), (dy,))
        dx = d["x"] if dresidual is None else d["x"] + dresidual
        dx = dx.to(x_dtype or x.dtype)
        return dx, d["g"].to(x_dtype or g.dtype), d.get("weight"), d.get("bias"), dx if has_residual else None

    # ---- the MLP's activation ---------------------------------------------------------------

    def swiglu_fwd_verifier(self, x, y, output_contiguous=False):
        return _cpu_verdict(x, y)

    def swiglu_fwd(self, x, y, output_contiguous=False):
        return (F.silu(x.float()) * y.float()).to(x.dtype)

    def swiglu_fwdbwd_verifier(self, x, y, g, use_weight=False, output_contiguous=False):
        return _cpu_verdict(x, y, g)

    def swiglu_fwdbwd(self, x, y, g, use_weight=False, output_contiguous=False):
        x32, y32, g32 = x.float(), y.float(), g.float()
        sigmoid = torch.sigmoid(x32)
        silu = x32 * sigmoid
        dx = g32 * y32 * sigmoid * (1 + x32 * (1 - sigmoid))
        grads = (dx.to(x.dtype), (g32 * silu).to(y.dtype))
        return (*grads, (silu * y32).to(x.dtype)) if use_weight else grads

    def swish_fwd_verifier(self, x, output_contiguous=False):
        return _cpu_verdict(x)

    def swish_fwd(self, x, output_contiguous=False):
        return F.silu(x.float()).to(x.dtype)

    def swish_bwd_verifier(self, x, dy, output_contiguous=False):
        return _cpu_verdict(x, dy)

    def swish_bwd(self, x, dy, output_contiguous=False):
        x32 = x.float()
        sigmoid = torch.sigmoid(x32)
        return (dy.float() * sigmoid * (1 + x32 * (1 - sigmoid))).to(x.dtype)

    # ---- rotary embedding -------------------------------------------------------------------

    def rotary_embedding_fwdbwd_verifier(self, x, cos, sin, seqlen_offsets=0, cu_seqlens=None, interleaved=False,
                                         inplace=False, conjugate=False, chunk_indices=None):
        if cu_seqlens is not None or interleaved:
            return False, "flat serves the rotary embedding of dense batches with halves rotated (not cu_seqlens, " \
                          "not interleaved)"
        return _cpu_verdict(x, cos, sin)

    def rotary_embedding_fwdbwd(self, x, cos, sin, seqlen_offsets=0, cu_seqlens=None, interleaved=False,
                                inplace=False, conjugate=False, chunk_indices=None):
        """FLA's rotary embedding in PyTorch (flat has no kernel for it): the first 2R channels of
        each head of x [B, T, H, D] rotated in halves by position t + offset, cos, sin [TR, R]."""
        B, T, _, _ = x.shape
        R = cos.shape[1]
        offsets = seqlen_offsets if isinstance(seqlen_offsets, Tensor) else torch.full((B,), int(seqlen_offsets))
        positions = offsets.long()[:, None] + torch.arange(T)  # [B, T]
        c, s = cos[positions][:, :, None].float(), sin[positions][:, :, None].float()  # [B, T, 1, R]
        if conjugate:
            s = -s
        x1, x2 = x[..., :R].float(), x[..., R:2 * R].float()
        y = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, x[..., 2 * R:].float()], dim=-1).to(x.dtype)
        return x.copy_(y) if inplace else y

    # ---- l2norm -----------------------------------------------------------------------------

    def l2norm_fwd_verifier(self, x, eps=1e-6, output_dtype=None):
        return _cpu_verdict(x)

    def l2norm_fwd(self, x, eps=1e-6, output_dtype=None):
        rstd = torch.rsqrt(x.float().square().sum(-1) + eps)
        return (x.float() * rstd[..., None]).to(output_dtype or x.dtype), rstd

    def l2norm_bwd_verifier(self, y, rstd, dy, eps=1e-6):
        return _cpu_verdict(y, rstd, dy)

    def l2norm_bwd(self, y, rstd, dy, eps=1e-6):
        y32, dy32, r = y.float(), dy.float(), rstd.float()[..., None]
        return (dy32 * r - (dy32 * y32).sum(-1, keepdim=True) * y32 * r).to(y.dtype)


# ---- names FLA does not dispatch ------------------------------------------------------------


def _chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
               cu_seqlens=None, cu_seqlens_cpu=None):
    """FLA 0.6's ``chunk_gla`` (g per key channel, log space) on ``flat.torch.gla``."""
    return _flat.gla(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                     state_v_first=state_v_first, cu_seqlens=cu_seqlens)


def _fused_recurrent_gla(q, k, v, gk=None, gv=None, scale=None, initial_state=None, output_final_state=False,
                         reverse=False, state_v_first=False, cu_seqlens=None, **kwargs):
    """FLA 0.6's ``fused_recurrent_gla`` with the key-side gate gk (zeros, i.e. no decay, when None)
    on ``flat.torch.gla``, the same recurrence."""
    if gv is not None:
        raise ValueError(f"flat: gv: expected None (flat's GLA gates the key side only), got a tensor {list(gv.shape)}")
    if reverse:
        raise ValueError("flat: reverse: expected False (flat runs the recurrence forward in time), got True")
    return _chunk_gla(q, k, v, torch.zeros_like(k) if gk is None else gk, scale, initial_state, output_final_state,
                      state_v_first, cu_seqlens)


def _linear_attention(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=True,
                      cu_seqlens=None):
    """FLA 0.6's ``chunk_linear_attn`` and ``fused_chunk_linear_attn`` (normalize by default; the state
    the pair (kv, z) then) on ``flat.torch.la``, which takes FLA's normalize."""
    return _flat.la(q, k, v, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                    normalize=normalize, cu_seqlens=cu_seqlens)


def _recurrent_linear_attention(q, k, v, scale=None, initial_state=None, output_final_state=False, reverse=False,
                                normalize=False, cu_seqlens=None):
    """FLA 0.6's ``fused_recurrent_linear_attn`` (no normalize by default) on ``flat.torch.la``."""
    if reverse:
        raise ValueError("flat: reverse: expected False (flat runs the recurrence forward in time), got True")
    return _linear_attention(q, k, v, scale, initial_state, output_final_state, normalize, cu_seqlens)


def _retention(q, k, v, scale=None, initial_state=None, output_final_state=False, reverse=False, state_v_first=False,
               cu_seqlens=None, **kwargs):
    """FLA 0.6's ``chunk_retention``, ``fused_chunk_retention`` and ``fused_recurrent_retention`` on
    ``flat.torch.retnet`` with FLA's per-head decay ``log(1 - 2^(-5 - h))``."""
    if reverse:
        raise ValueError("flat: reverse: expected False (flat runs the recurrence forward in time), got True")
    g_gamma = (1 - 2.0 ** (-5.0 - torch.arange(q.shape[2], dtype=torch.float))).log()
    return _flat.retnet(q, k, v, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                        g_gamma=g_gamma, state_v_first=state_v_first, cu_seqlens=cu_seqlens)


def _grouped_rms_norm(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """FLA 0.6's ``rmsnorm_fn`` (``fla.modules.norm.layernorm_gated``, Mamba-2's gated norm): an RMS
    norm over each group of ``group_size`` channels (all D when None), gated by ``silu(z)`` after the
    norm or, with ``norm_before_gate=False``, before it; on ``flat.torch.rms_norm_gated``, one group as
    one head."""
    D = x.shape[-1]
    group = D if group_size is None else group_size
    if D % group:
        raise ValueError(f"flat: group_size: expected a divisor of x's last axis D={D}, got {group_size}")
    groups = D // group
    grouped = (-1, 1, groups, group)  # [rows, 1, heads, channels]: flat's per-head weight wants four axes
    per_group = (groups, group) if groups > 1 else (group,)  # flat takes one group's weight as [D]
    y = _flat.rms_norm_gated(x.reshape(grouped), None if z is None else z.reshape(grouped), weight.reshape(per_group),
                             None if bias is None else bias.reshape(per_group), activation="swish", eps=eps,
                             norm_before_gate=norm_before_gate)
    return y.reshape(x.shape)


def _routed(fla_function: Callable, flat_function: Callable) -> Callable:
    """fla_function's name, running flat_function for CPU calls and fla_function for the rest (and
    for every call while ``FLA_FLAT=0``, as the registry's entries)."""
    backend = FlatBackend()

    @functools.wraps(fla_function)
    def call(*args, **kwargs):
        chosen = flat_function if on_cpu(*args, **kwargs) and backend.is_enabled() else fla_function
        return chosen(*args, **kwargs)

    return call


def _route(fla_function: Callable, flat_function: Callable) -> None:
    """Replaces fla_function by its routed form in every loaded fla module that holds it."""
    routed = _routed(fla_function, flat_function)
    for name, module in list(sys.modules.items()):
        if name == "fla" or name.startswith("fla."):
            for attribute, value in list(vars(module).items()):
                if value is fla_function:
                    setattr(module, attribute, routed)


for _entry in ("gated_delta_rule", _fla_chunk_kda, _fla_conv.causal_conv1d_fwd, _fla_conv.causal_conv1d_bwd,
               _fla_conv.causal_conv1d_update, _fla_layernorm.layer_norm_fwd, _fla_layernorm.layer_norm_bwd,
               _fla_norm_gate.layer_norm_gated_fwd, _fla_norm_gate.layer_norm_gated_bwd, _fla_l2norm.l2norm_fwd,
               _fla_l2norm.l2norm_bwd, _fla_activations.swiglu_fwd, _fla_activations.swiglu_fwdbwd,
               _fla_activations.swish_fwd, _fla_activations.swish_bwd, _fla_rotary.rotary_embedding_fwdbwd):
    register(_entry)(FlatBackend)

_route(_fla_recurrent_gdr, _compat.fused_recurrent_gated_delta_rule)
_route(_fla_recurrent_kda, _compat.fused_recurrent_kda)
_route(_fla_chunk_gla, _chunk_gla)
_route(_fla_recurrent_gla, _fused_recurrent_gla)
_route(_fla_layernorm_gated.rmsnorm_fn, _grouped_rms_norm)
_route(_fla_chunk_gdn2, _compat.chunk_gdn2)
_route(_fla_recurrent_gdn2, _compat.fused_recurrent_gdn2)
_route(_fla_chunk_la, _linear_attention)
_route(_fla_fused_chunk_la, _linear_attention)
_route(_fla_recurrent_la, _recurrent_linear_attention)
_route(_fla_chunk_retention, _retention)
_route(_fla_fused_chunk_retention, _retention)
_route(_fla_recurrent_retention, _retention)
