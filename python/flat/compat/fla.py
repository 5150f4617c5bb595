"""flash-linear-attention 0.6's delta-rule functions and short convolution on flat's kernels, for CPU
tensors.

Same names, signatures, defaults, layouts ``[B, T, H, K]`` and return values as FLA 0.6::

    chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                           allow_neg_eigval=False, state_v_first=False, cu_seqlens=None,
                           cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, **kwargs)
    fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None,
                           initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                           use_gate_in_kernel=False, A_log=None, dt_bias=None,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, **kwargs)
    chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None,
              cu_seqlens_cpu=None, cp_context=None, use_graph=False, max_num_seqs=None, **kwargs)
    fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, **kwargs)
    chunk_gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None,
               safe_gate=False, lower_bound=None, disable_recompute=False, return_intermediate_states=False,
               state_v_first=False, cp_context=None, **kwargs)
    fused_recurrent_gdn2(q, k, v, g, b, w, A_log=None, dt_bias=None, scale=None, initial_state=None,
                         output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                         lower_bound=None, state_v_first=False, cu_seqlens=None, **kwargs)

(aliases ``chunk_gdn``, ``fused_recurrent_gdn``). Each returns ``(o, final_state)``: ``o [B, T, HV, V]``
in q's dtype (the chunk functions) or v's (the recurrent ones), as FLA casts it; ``final_state``
``[N, HV, K, V]`` float32 (``[N, HV, V, K]`` with ``state_v_first``), None unless
``output_final_state``. q and k have H heads, v, g, beta HV (a multiple of H): value head i reads
key head ``i // (HV // H)``, as FLA's kernels and transformers' ``repeat_interleave`` do, which is
flat's head sharing, so nothing is expanded. ``scale`` defaults to ``K^-1/2``; ``cu_seqlens``
packs ``N`` sequences along T of one batch row (B = 1). In the chunk functions, ``A_log``,
``dt_bias`` and (chunk_gated_delta_rule) ``use_gate_in_kernel`` come through ``**kwargs``, as in
FLA, and so does ``chunk_size`` (FLA's choices: 16, 32, 64 for the gated delta rule, 32, 64 for
KDA, 64 for GDN-2). Other keyword arguments are taken and ignored, as FLA's ``**kwargs`` does.

Gates made in the call (``use_gate_in_kernel``, in float32, differentiable; then ``g`` is raw):
the gated delta rule ``-exp(A_log) * softplus(g + dt_bias)`` with ``A_log``, ``dt_bias`` ``[HV]``;
KDA the same per channel with ``dt_bias`` ``[HV * K]``, or with ``lower_bound``
``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (``lower_bound * sigmoid(g + dt_bias)``
without ``A_log``). ``use_beta_sigmoid_in_kernel``: beta is a logit, the strength
``sigmoid(beta)``, ``2 sigmoid(beta)`` with ``allow_neg_eigval``. These options, a bfloat16
``initial_state`` (widened to float32) and ``state_v_first`` are flat.torch's own
(``flat.torch.gated_deltanet`` and ``flat.torch.kda`` take them by FLA's names), so this module
only checks FLA's arguments and passes them on. What it adds: float16 inputs run in float32 (o
comes back in float16), and the recurrent gated delta rule's key-side gate ``gk``, V-side gate
``gv`` and per-channel ``beta [B, T, HV, V]`` (also ``fused_recurrent_kda``'s) are composed from
flat's variants, ``gv`` and a per-channel beta by running each value channel as its own head of
width 1, which makes them exact but V times as costly. Every input gets a gradient, the recurrent
functions' too. GDN-2's erase gate ``b`` and write gate ``w`` (``[B, T, HV, K]``, ``[B, T, HV, V]``)
go to ``flat.torch.gdn2`` as they are; its gate is formed as KDA's.

FLA's short convolution, ``fla.modules.convolution``, with FLA's state ``[N, D, W]`` (the last W
inputs, in x's dtype), on ``flat.torch.conv`` (whose own state is ``[N, D, W-1]`` float32)::

    causal_conv1d(x, weight=None, bias=None, residual=None, initial_state=None, output_final_state=False,
                  activation=None, backend="triton", cu_seqlens=None, cu_seqlens_cpu=None,
                  chunk_indices=None, cp_context=None, **kwargs)
    causal_conv1d_update(x, cache, residual=None, weight=None, bias=None, activation=None)

``causal_conv1d`` returns ``(y, final_state)``, a new final state as FLA's does;
``causal_conv1d_update`` (one token per sequence) updates ``cache`` in place and returns
``(y, cache)``.

Differences from FLA 0.6 (a call FLA refuses with an AssertionError is refused here with a
ValueError, ``flat: <argument>: expected ..., got ...``):

- CPU tensors only; the CUDA-only options are refused: ``cp_context`` (context parallelism),
  ``use_graph`` (graph capture), ``return_intermediate_states`` (chunk states for vLLM).
- ``fused_recurrent_*`` are differentiable (FLA's have no backward, or raise in it).
- ``chunk_kda`` and ``chunk_gdn2`` take a bfloat16 ``initial_state`` (FLA asserts float32).
- ``chunk_gdn2`` takes value heads sharing key heads (HV a multiple of H) as ``fused_recurrent_gdn2``
  does; FLA's chunk form asserts one head count.
- ``causal_conv1d`` and ``causal_conv1d_update`` take ``x`` with its channels on one axis (FLA
  flattens trailing axes that together match the weight's channels) and a ``weight`` (FLA's
  kernels fail without one).
- Gates must be finite and <= 0 and strengths finite (flat checks values; FLA does not): a
  positive log-decay raises ``ValueError`` naming ``g``.
- ``fused_recurrent_kda`` with ``use_gate_in_kernel`` needs ``A_log`` or ``lower_bound``, as
  ``chunk_kda`` does (FLA's recurrent kernel reads a missing ``A_log`` as 1.0).
- ``fused_recurrent_gated_delta_rule`` without beta takes beta = 1 for every value head (FLA
  makes it ``[B, T, H]``, which its kernel reads out of bounds under GVA).
- ``head_first`` in ``chunk_gated_delta_rule``'s kwargs raises, as in FLA, an exception that is
  both FLA's ``DeprecationWarning`` and a ``ValueError``; the deprecated ``transpose_state_layout``
  is taken for ``state_v_first`` with FLA's warning.
"""

import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import _api
from .. import torch as _flat
from ..torch.ops import _XP
from ._checks import bad, cpu_tensor

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda", "fused_recurrent_kda",
           "chunk_gdn2", "fused_recurrent_gdn2", "causal_conv1d", "causal_conv1d_update", "chunk_gdn",
           "fused_recurrent_gdn"]


class HeadFirstRemoved(ValueError, DeprecationWarning):
    """``head_first`` was removed from FLA: FLA raises a DeprecationWarning, flat one that is also a
    ValueError."""


def _tensor(name: str, t, shape, axes: str) -> None:
    """Checks that t is a tensor of the shape (None: any size on that axis)."""
    if not isinstance(t, Tensor):
        raise bad(name, f"a tensor [{axes}]", type(t).__name__)
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        want = ", ".join(f"{a}={s}" if s is not None else a for a, s in zip(axes.split(", "), shape))
        raise bad(name, f"a tensor of rank {len(shape)} [{want}]", f"rank {t.dim()} {list(t.shape)}")
    if not t.is_floating_point():
        raise bad(name, "a floating-point tensor", t.dtype)
    if t.device.type != "cpu":
        raise bad(name, "a tensor on the CPU (flat's kernels run there)", f"one on {t.device}")


def _beta(beta, B: int, T: int, HV: int, V: int, per_channel: bool) -> None:
    """beta [B, T, HV], or with per_channel (the recurrent functions) also [B, T, HV, V]."""
    if per_channel and isinstance(beta, Tensor) and beta.dim() == 4:
        _tensor("beta", beta, (B, T, HV, V), "B, T, HV, V")
    else:
        _tensor("beta", beta, (B, T, HV), "B, T, HV")


def _wide(t: Optional[Tensor]) -> Optional[Tensor]:
    """float16 (which flat's kernels do not take) as float32."""
    return t.float() if t is not None and t.dtype == torch.float16 else t


def _chunk_size(kwargs, allowed: Tuple[int, ...], what: str) -> int:
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in allowed:
        raise bad("chunk_size", f"one of {', '.join(map(str, allowed))} for {what}", chunk_size)
    return int(chunk_size)


def _state_layout(state_v_first: bool, kwargs) -> bool:
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("flat: transpose_state_layout: expected it alone (it is the deprecated name of "
                             "state_v_first), got both transpose_state_layout and state_v_first")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning,
                      stacklevel=3)
        state_v_first = kwargs.pop("transpose_state_layout")
    return bool(state_v_first)


def _refuse_cuda_only(cp_context=None, use_graph=False, return_intermediate_states=False) -> None:
    if cp_context is not None:
        raise bad("cp_context", "None (context parallelism across CUDA devices has no CPU form)",
                  type(cp_context).__name__)
    if use_graph:
        raise bad("use_graph", "False (CUDA/NPU graph capture has no CPU form)", use_graph)
    if return_intermediate_states:
        raise bad("return_intermediate_states", "False (the per-chunk states of FLA's chunk kernel, for vLLM on "
                  "CUDA, are not computed on the CPU)", return_intermediate_states)


def _check_common(q, k, v, initial_state, state_v_first: bool, cu_seqlens) -> Tuple[int, int, int, int, int, int]:
    """Checks q, k, v, cu_seqlens, initial_state; returns B, T, H, HV, K, V."""
    _tensor("q", q, (None, None, None, None), "B, T, H, K")
    B, T, H, K = q.shape
    _tensor("k", k, (B, T, H, K), "B, T, H, K")
    _tensor("v", v, (B, T, None, None), "B, T, HV, V")
    HV, V = v.shape[2], v.shape[3]
    if H == 0 or HV % H != 0:
        raise bad("v", f"a head count HV that is a multiple of q's and k's H={H} (grouped value attention)",
                  f"HV={HV} {list(v.shape)}")
    N = B
    if cu_seqlens is not None:
        cpu_tensor("cu_seqlens", cu_seqlens, (None,), "[N + 1]", kind="index")
        if B != 1:
            raise bad("cu_seqlens", "a batch of one row (B = 1, the sequences packed along T) with cu_seqlens",
                      f"B={B} in q {list(q.shape)}")
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        shape, axes = ((N, HV, V, K), "N, HV, V, K") if state_v_first else ((N, HV, K, V), "N, HV, K, V")
        _tensor("initial_state", initial_state, shape, axes)
    return B, T, H, HV, K, V


def _options(HV: int, *, per_channel: bool, use_gate_in_kernel: bool, A_log, dt_bias, lower_bound=None,
             safe_gate: bool = False, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool):
    """FLA's gate and beta options as flat.torch's gated_deltanet (per_channel False) or kda takes
    them: (gate, strength) keyword dicts. FLA's own refusals are made here with FLA's argument
    names; the formulas and the shapes of A_log and dt_bias are flat.torch's (python/flat/_api.py).
    FLA ignores A_log, dt_bias and lower_bound without use_gate_in_kernel, so they are not passed
    on then (flat.torch refuses them)."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise bad("allow_neg_eigval", "use_beta_sigmoid_in_kernel=True with it (FLA scales the sigmoid of beta)",
                  "use_beta_sigmoid_in_kernel=False")
    if use_gate_in_kernel and A_log is None and (lower_bound is None or not per_channel):
        raise bad("A_log", f"a tensor of {HV} elements with use_gate_in_kernel=True"
                  f"{' and no lower_bound' if per_channel else ''}", None)
    gate = dict(use_gate_in_kernel=bool(use_gate_in_kernel), A_log=A_log if use_gate_in_kernel else None,
                dt_bias=dt_bias if use_gate_in_kernel else None)
    if per_channel:
        gate.update(lower_bound=lower_bound if use_gate_in_kernel else None, safe_gate=bool(safe_gate))
    return gate, dict(use_beta_sigmoid_in_kernel=bool(use_beta_sigmoid_in_kernel),
                      allow_neg_eigval=bool(allow_neg_eigval))


def _formed(g: Tensor, gate: dict) -> Tensor:
    """The gate from the raw g as gate says, by flat.torch's own formula, for a call that combines it
    with other gates (flat.torch forms one gate alone)."""
    return _api.gate_in_kernel(_XP, g, **{"lower_bound": None, **gate})


def _call(variant: str, q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], *, gate: dict, strength: dict,
          **options) -> Tuple[Tensor, Optional[Tensor]]:
    """flat.torch's deltanet, gated_deltanet, kda or gdn2 (kda and gdn2 with one gate per channel) with
    every argument by keyword; float16 inputs widened. strength: beta and its options, or gdn2's b and
    w. options: scale, initial_state, output_final_state, chunk_size, use_qk_l2norm_in_kernel,
    state_v_first, cu_seqlens."""
    args = dict(q=_wide(q), k=_wide(k), v=_wide(v), solve="auto", check_values=True, initial_state_indices=None,
                final_state_indices=None, token_state_indices=None, **options,
                **{name: _wide(x) if isinstance(x, Tensor) else x for name, x in strength.items()})
    if variant != "deltanet":
        args.update(g=_wide(g), **gate)
    if variant in ("kda", "gdn2"):
        args.update(gate_group=1)
    o, ht = getattr(_flat, variant)(**args)
    return o, (None if ht is None else ht.contiguous())


def _delta_rule(q: Tensor, k: Tensor, v: Tensor, *, g: Optional[Tensor], gk: Optional[Tensor],
                gv: Optional[Tensor], beta: Tensor, gate: dict, strength: dict, initial_state: Optional[Tensor],
                state_v_first: bool, **options) -> Tuple[Tensor, Optional[Tensor]]:
    """The delta rule H_t = Diag(exp(gk + g)) H_{t-1} Diag(exp(gv)), then the delta step with beta
    [B, T, HV] or [B, T, HV, V], on flat.torch's variants. gate: flat.torch's options forming g (or gk,
    when it is the only gate); empty when the gates are combined. Returns o (float16 widened) and the
    final state in the caller's layout."""
    g, gk, gv = _wide(g), _wide(gk), _wide(gv)
    if gate["use_gate_in_kernel"] and (gv is not None or beta.dim() == 4 or (g is not None and gk is not None)):
        if g is not None:
            g = _formed(g, gate)
        else:
            gk = _formed(gk, gate)
        gate = {}
    if gv is None and beta.dim() == 3:
        if gk is not None and g is not None:
            gk, g = gk + g.unsqueeze(-1), None
        variant = "kda" if gk is not None else "gated_deltanet" if g is not None else "deltanet"
        return _call(variant, q, k, v, gk if gk is not None else g, gate=gate, strength=dict(strength, beta=beta),
                     initial_state=initial_state, state_v_first=state_v_first, **options)
    # Every value channel j of head i is its own head i * V + j of width 1: the V-side gate becomes
    # that head's scalar gate, a per-channel beta its strength. Head i * V + j reads key head
    # (i * V + j) // (HV * V / H) = i // (HV / H), as value head i does. Its state [K, 1] is row j of
    # the V-first state [V, K]: [N, HV, V, K] is [N, HV * V, K, 1].
    B, T, HV, V = v.shape
    K, NS = q.shape[3], HV * V
    if beta.dim() == 3:
        beta = beta.unsqueeze(-1).expand(B, T, HV, V)
    if g is not None:
        gv = g.unsqueeze(-1).expand(B, T, HV, V) if gv is None else gv + g.unsqueeze(-1)
    if gk is not None:
        gk = gk.unsqueeze(3).expand(B, T, HV, V, K).reshape(B, T, NS, K)
        if gv is not None:
            gk = gk + gv.reshape(B, T, NS, 1)
    gate_ns = gk if gk is not None else None if gv is None else gv.reshape(B, T, NS)
    variant = "kda" if gk is not None else "gated_deltanet" if gv is not None else "deltanet"
    if initial_state is not None:
        h0 = initial_state if state_v_first else initial_state.transpose(-1, -2)
        initial_state = h0.reshape(h0.shape[0], NS, K, 1)
    o, ht = _call(variant, q, k, v.reshape(B, T, NS, 1), gate_ns, gate=gate,
                  strength=dict(strength, beta=beta.reshape(B, T, NS)), initial_state=initial_state,
                  state_v_first=False, **options)
    if ht is not None:
        ht = ht.reshape(ht.shape[0], HV, V, K)
        ht = ht if state_v_first else ht.transpose(-1, -2).contiguous()
    return o.reshape(B, T, HV, V), ht


def _forward(a: dict, *, g: Optional[Tensor], gk: Optional[Tensor], gv: Optional[Tensor], beta: Tensor,
             per_channel: bool, chunk_size: int, out: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
    """One of the functions below after its checks: a holds its arguments by name (its locals(), FLA's
    kwargs merged in), g, gk, gv and beta the gates and strength as checked, per_channel whether the
    gate use_gate_in_kernel forms is KDA's. Returns o in out's dtype, as FLA casts it."""
    gate, strength = _options(a["v"].shape[2], per_channel=per_channel,
                              use_gate_in_kernel=a.get("use_gate_in_kernel", False), A_log=a.get("A_log"),
                              dt_bias=a.get("dt_bias"), lower_bound=a.get("lower_bound"),
                              safe_gate=a.get("safe_gate", False),
                              use_beta_sigmoid_in_kernel=a["use_beta_sigmoid_in_kernel"],
                              allow_neg_eigval=a["allow_neg_eigval"])
    o, ht = _delta_rule(a["q"], a["k"], a["v"], g=g, gk=gk, gv=gv, beta=beta, gate=gate, strength=strength,
                        scale=a["scale"], initial_state=a["initial_state"], output_final_state=a["output_final_state"],
                        chunk_size=chunk_size, use_qk_l2norm_in_kernel=a["use_qk_l2norm_in_kernel"],
                        state_v_first=a["state_v_first"], cu_seqlens=a["cu_seqlens"])
    return o.to(out.dtype), ht


# ---- The gated delta rule --------------------------------------------------------------------


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    chunk_indices: Optional[Tensor] = None,
    cp_context=None,
    **kwargs,
) -> Tuple[Tensor, Optional[Tensor]]:
    """FLA 0.6's ``chunk_gated_delta_rule``: ``H_t = exp(g_t) (I - beta_t k_t k_t^T) H_{t-1} +
    beta_t k_t v_t^T``, ``o_t = scale H_t^T q_t``.

    q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g (log space) and beta ``[B, T, HV]``;
    initial_state ``[N, HV, K, V]`` (float32 or bfloat16; ``[N, HV, V, K]`` with state_v_first).
    kwargs: ``use_gate_in_kernel`` (g raw, the gate ``-exp(A_log) * softplus(g + dt_bias)``),
    ``A_log``, ``dt_bias`` ``[HV]``, ``chunk_size`` (16, 32, 64). ``cu_seqlens_cpu`` and
    ``chunk_indices`` (GPU index helpers) are taken and not needed; ``cp_context`` is refused.
    Returns ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None)``."""
    state_v_first = _state_layout(state_v_first, kwargs)
    if "head_first" in kwargs:
        raise HeadFirstRemoved("flat: head_first: expected it absent (it was removed from FLA: inputs are "
                               f"[B, T, H, ...]), got head_first={kwargs['head_first']}")
    chunk_size = _chunk_size(kwargs, (16, 32, 64), "the gated delta rule")
    _refuse_cuda_only(cp_context=cp_context)
    B, T, H, HV, K, V = _check_common(q, k, v, initial_state, state_v_first, cu_seqlens)
    _tensor("g", g, (B, T, HV), "B, T, HV")
    _beta(beta, B, T, HV, V, per_channel=False)
    return _forward({**kwargs, **locals()}, g=g, gk=None, gv=None, beta=beta, per_channel=False,
                    chunk_size=chunk_size, out=q)


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Optional[Tensor] = None,
    gk: Optional[Tensor] = None,
    gv: Optional[Tensor] = None,
    beta: Optional[Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    **kwargs,
) -> Tuple[Tensor, Optional[Tensor]]:
    """FLA 0.6's ``fused_recurrent_gated_delta_rule``: per token ``H = exp(g) H``, ``H = Diag(exp(gk)) H``,
    ``H = H Diag(exp(gv))``, then ``H += k (beta * (v - H^T k))^T``, ``o = scale H^T q``.

    g ``[B, T, HV]`` (raw with use_gate_in_kernel: ``-exp(A_log) * softplus(g + dt_bias)``, A_log and
    dt_bias ``[HV]``), gk ``[B, T, HV, K]``, gv ``[B, T, HV, V]``, all optional and log-space; beta
    ``[B, T, HV]`` or per channel ``[B, T, HV, V]``, 1 when None. The same computation as the chunk
    form (flat has one; the result does not depend on it), differentiable. Returns
    ``(o [B, T, HV, V] in v's dtype, final_state or None)``."""
    state_v_first = _state_layout(state_v_first, kwargs)
    B, T, H, HV, K, V = _check_common(q, k, v, initial_state, state_v_first, cu_seqlens)
    if g is not None:
        _tensor("g", g, (B, T, HV), "B, T, HV")
    elif use_gate_in_kernel:
        raise bad("g", "the raw gate [B, T, HV] with use_gate_in_kernel=True", None)
    if gk is not None:
        _tensor("gk", gk, (B, T, HV, K), "B, T, HV, K")
    if gv is not None:
        _tensor("gv", gv, (B, T, HV, V), "B, T, HV, V")
    if beta is None:
        beta = v.new_ones((B, T, HV), dtype=torch.float32)
    _beta(beta, B, T, HV, V, per_channel=True)
    return _forward(locals(), g=g, gk=gk, gv=gv, beta=beta, per_channel=False, chunk_size=64, out=v)


# ---- Kimi Delta Attention --------------------------------------------------------------------


def chunk_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: Optional[float] = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    cp_context=None,
    use_graph: bool = False,
    max_num_seqs: Optional[int] = None,
    **kwargs,
) -> Tuple[Tensor, Optional[Tensor]]:
    """FLA 0.6's ``chunk_kda``: ``H_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) H_{t-1} + beta_t k_t v_t^T``,
    ``o_t = scale H_t^T q_t``.

    g ``[B, T, HV, K]`` (log space; raw with use_gate_in_kernel: ``-exp(A_log) * softplus(g + dt_bias)``,
    or with lower_bound ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``; A_log ``[HV]`` and
    dt_bias ``[HV * K]`` through kwargs), beta ``[B, T, HV]``. safe_gate (a GPU fast path) checks
    lower_bound in ``[-5, 0)`` as FLA does; disable_recompute, cu_seqlens_cpu and max_num_seqs are
    taken and not needed; cp_context, use_graph and return_intermediate_states are refused.
    kwargs ``chunk_size``: 32 or 64. Returns ``(o [B, T, HV, V] in q's dtype, final_state or None)``."""
    state_v_first = _state_layout(state_v_first, kwargs)
    _refuse_cuda_only(cp_context=cp_context, use_graph=use_graph,
                      return_intermediate_states=return_intermediate_states)
    B, T, H, HV, K, V = _check_common(q, k, v, initial_state, state_v_first, cu_seqlens)
    chunk_size = _chunk_size(kwargs, (32, 64), "KDA")
    _tensor("g", g, (B, T, HV, K), "B, T, HV, K")
    _beta(beta, B, T, HV, V, per_channel=False)
    return _forward({**kwargs, **locals()}, g=None, gk=g, gv=None, beta=beta, per_channel=True,
                    chunk_size=chunk_size, out=q)


def fused_recurrent_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: Optional[float] = None,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    **kwargs,
) -> Tuple[Tensor, Optional[Tensor]]:
    """FLA 0.6's ``fused_recurrent_kda``: chunk_kda's recurrence with A_log ``[HV]`` and dt_bias
    ``[HV * K]`` as arguments, beta ``[B, T, HV]`` or per channel ``[B, T, HV, V]``; differentiable.
    Returns ``(o [B, T, HV, V] in v's dtype, final_state or None)``."""
    state_v_first = _state_layout(state_v_first, kwargs)
    B, T, H, HV, K, V = _check_common(q, k, v, initial_state, state_v_first, cu_seqlens)
    _tensor("g", g, (B, T, HV, K), "B, T, HV, K")
    _beta(beta, B, T, HV, V, per_channel=True)
    return _forward(locals(), g=None, gk=g, gv=None, beta=beta, per_channel=True, chunk_size=64, out=v)


# ---- Gated DeltaNet-2 ------------------------------------------------------------------------


def _gdn2(a: dict, *, chunk_size: int, out: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
    """chunk_gdn2 or fused_recurrent_gdn2 after FLA's own argument handling: a holds the call's
    arguments by name. Checks the tensors; returns o in out's dtype, as FLA casts it."""
    B, T, H, HV, K, V = _check_common(a["q"], a["k"], a["v"], a["initial_state"], a["state_v_first"],
                                      a["cu_seqlens"])
    _tensor("g", a["g"], (B, T, HV, K), "B, T, HV, K")
    _tensor("b", a["b"], (B, T, HV, K), "B, T, HV, K")
    _tensor("w", a["w"], (B, T, HV, V), "B, T, HV, V")
    gate, _ = _options(HV, per_channel=True, use_gate_in_kernel=a["use_gate_in_kernel"], A_log=a.get("A_log"),
                       dt_bias=a.get("dt_bias"), lower_bound=a["lower_bound"], safe_gate=a.get("safe_gate", False),
                       use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False)
    o, ht = _call("gdn2", a["q"], a["k"], a["v"], a["g"], gate=gate, strength=dict(b=a["b"], w=a["w"]),
                  scale=a["scale"], initial_state=a["initial_state"], output_final_state=a["output_final_state"],
                  chunk_size=chunk_size, use_qk_l2norm_in_kernel=a["use_qk_l2norm_in_kernel"],
                  state_v_first=a["state_v_first"], cu_seqlens=a["cu_seqlens"])
    return o.to(out.dtype), ht


def chunk_gdn2(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    b: Tensor,
    w: Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    safe_gate: bool = False,
    lower_bound: Optional[float] = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cp_context=None,
    **kwargs,
) -> Tuple[Tensor, Optional[Tensor]]:
    """FLA 0.6's ``chunk_gdn2``: ``H_t = (I - k_t (b_t * k_t)^T) Diag(exp(g_t)) H_{t-1} + k_t (w_t * v_t)^T``,
    ``o_t = scale H_t^T q_t``.

    g (log space; raw with use_gate_in_kernel, formed as chunk_kda's) and the erase gate b
    ``[B, T, HV, K]``, the write gate w ``[B, T, HV, V]``; A_log ``[HV]`` and dt_bias ``[HV * K]``
    through kwargs, as in FLA, and ``chunk_size`` (64, FLA's only one). disable_recompute and
    cu_seqlens_cpu are taken and not needed; cp_context and return_intermediate_states are refused.
    Returns ``(o [B, T, HV, V] in q's dtype, final_state or None)``."""
    state_v_first = _state_layout(state_v_first, kwargs)
    _refuse_cuda_only(cp_context=cp_context, return_intermediate_states=return_intermediate_states)
    chunk_size = _chunk_size(kwargs, (64,), "GDN-2")
    return _gdn2({**kwargs, **locals()}, chunk_size=chunk_size, out=q)


def fused_recurrent_gdn2(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    b: Tensor,
    w: Tensor,
    A_log: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    lower_bound: Optional[float] = None,
    state_v_first: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    **kwargs,
) -> Tuple[Tensor, Optional[Tensor]]:
    """FLA 0.6's ``fused_recurrent_gdn2``: chunk_gdn2's recurrence with A_log ``[HV]`` and dt_bias
    ``[HV * K]`` as arguments; differentiable (FLA's is inference-only). Returns
    ``(o [B, T, HV, V] in v's dtype, final_state or None)``."""
    state_v_first = _state_layout(state_v_first, kwargs)
    return _gdn2(locals(), chunk_size=64, out=v)


# ---- The short convolution (fla.modules.convolution) -----------------------------------------

_CONV_BACKENDS = ("triton", "cuda", "mix")


def _conv_weight(weight, D: int) -> Tensor:
    weight = cpu_tensor("weight", weight, (D, None), f"[D={D}, W]")
    if weight.shape[1] < 1:
        raise bad("weight", "a width W >= 1", list(weight.shape))
    return weight.float()


def _conv_bias(bias, D: int) -> Optional[Tensor]:
    return None if bias is None else cpu_tensor("bias", bias, (D,), f"[D={D}]").float()


def _last_inputs(x: Tensor, initial_state: Optional[Tensor], W: int, cu_seqlens: Optional[Tensor]) -> Tensor:
    """FLA's convolution state after x [B, T, D]: each sequence's last W inputs [N, D, W] in x's
    dtype, oldest first, those before its first token taken from initial_state [N, D, W] (zeros
    without). One gather from the state's columns and x's tokens, so differentiable in both."""
    B, T, D = x.shape
    if cu_seqlens is None:
        starts = torch.arange(B) * T
        ends = starts + T
    else:
        starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    N = starts.shape[0]
    history = x.new_zeros(N, D, W) if initial_state is None else initial_state.to(x.dtype)
    # rows [N * W + B * T, D]: sequence n's state columns at n * W, then x's tokens from N * W
    rows = torch.cat([history.transpose(1, 2).reshape(N * W, D), x.reshape(B * T, D)])
    at = ends[:, None] - W + torch.arange(W)  # the positions of each sequence's last W inputs [N, W]
    before = starts[:, None] - at  # how far a position lies before its sequence's first token
    index = torch.where(before > 0, torch.arange(N)[:, None] * W + W - before, N * W + at)
    return rows[index].transpose(1, 2).contiguous()


def causal_conv1d(
    x: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    residual: Optional[Tensor] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    activation: Optional[str] = None,
    backend: Optional[str] = "triton",
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_cpu: Optional[Tensor] = None,
    chunk_indices: Optional[Tensor] = None,
    cp_context=None,
    **kwargs,
) -> Tuple[Tensor, Optional[Tensor]]:
    """FLA 0.6's ``causal_conv1d`` (``fla.modules.convolution``) on flat's short convolution: x
    ``[B, T, D]`` by weight ``[D, W]`` (plus bias ``[D]``, then the activation: None, "silu" or
    "swish"), then ``+ residual [B, T, D]``; positions before a sequence's start read FLA's state
    initial_state ``[N, D, W]`` (its last W - 1 columns; any float dtype, FLA's is x's). Returns
    ``(y [B, T, D] in x's dtype, final_state [N, D, W] in x's dtype or None)``, the final state each
    sequence's last W inputs, a new tensor as in FLA. Differentiable in x, weight, bias, residual and
    initial_state. backend ("triton", "cuda", "mix") runs flat's kernel whichever is named;
    cu_seqlens_cpu and chunk_indices are taken and not needed; cp_context is refused."""
    _refuse_cuda_only(cp_context=cp_context)
    if backend not in _CONV_BACKENDS:
        raise bad("backend", "'triton', 'cuda' or 'mix' (each runs flat's kernel here)", repr(backend))
    x = cpu_tensor("x", x, (None, None, None), "[B, T, D]")
    B, T, D = x.shape
    weight = _conv_weight(weight, D)
    W = weight.shape[1]
    N = B
    if cu_seqlens is not None:
        cpu_tensor("cu_seqlens", cu_seqlens, (None,), "[N + 1]", kind="index")
        if B != 1:
            raise bad("cu_seqlens", "a batch of one row (B = 1, the sequences packed along T) with cu_seqlens",
                      f"B={B} in x {list(x.shape)}")
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        cpu_tensor("initial_state", initial_state, (N, D, W), f"[N={N}, D={D}, W={W}] (FLA's state)")
    if residual is not None:
        cpu_tensor("residual", residual, (B, T, D), f"x's shape [B={B}, T={T}, D={D}]")
    # With a residual the sum is made in float32 and rounded once, as FLA's kernel does.
    y, _ = _flat.conv(x.float() if residual is not None else _wide(x), weight, _conv_bias(bias, D),
                      initial_state=None if initial_state is None or W == 1 else initial_state[..., 1:].float(),
                      activation=activation, cu_seqlens=cu_seqlens)
    if residual is not None:
        y = y + residual.float()
    return y.to(x.dtype), (_last_inputs(x, initial_state, W, cu_seqlens) if output_final_state else None)


def causal_conv1d_update(x: Tensor, cache: Tensor, residual: Optional[Tensor] = None, weight: Optional[Tensor] = None,
                         bias: Optional[Tensor] = None, activation: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """FLA 0.6's ``causal_conv1d_update``: one token per sequence, x ``[N, D]``, ``[1, N, D]`` or
    ``[N, 1, D]``, continuing FLA's state cache ``[N, D, W]`` (the last W inputs, any float dtype),
    which is updated in place (shifted by one column, x written last, in cache's dtype). Returns
    ``(y shaped as x in x's dtype, cache)``; residual (x's shape) is added after the activation. Not
    differentiable, as FLA's."""
    with torch.no_grad():
        one_token = isinstance(x, Tensor) and (x.dim() == 2 or (x.dim() == 3 and 1 in x.shape[:2]))
        cpu_tensor("x", x, (None,) * (x.dim() if one_token else 2), "[N, D], [1, N, D] or [N, 1, D] (one token per "
                   "sequence)")
        tokens = x.reshape(-1, x.shape[-1])  # [N, D]
        N, D = tokens.shape
        weight = _conv_weight(weight, D)
        W = weight.shape[1]
        cache = cpu_tensor("cache", cache, (N, D, W), f"[N={N}, D={D}, W={W}] (FLA's state)")
        if residual is not None:
            cpu_tensor("residual", residual, tuple(x.shape), f"x's shape {list(x.shape)}")
        y, _ = _flat.conv((tokens.float() if residual is not None else _wide(tokens)).unsqueeze(1), weight,
                          _conv_bias(bias, D), initial_state=cache[..., 1:].float() if W > 1 else None,
                          activation=activation)
        y = y.reshape(x.shape)
        if residual is not None:
            y = y + residual.float()
        cache.copy_(torch.cat([cache[..., 1:], tokens.to(cache.dtype).unsqueeze(-1)], dim=-1))
        return y.to(x.dtype), cache


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
