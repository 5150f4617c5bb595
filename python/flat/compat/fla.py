"""flash-linear-attention 0.6's delta-rule functions on flat's kernels, for CPU tensors.

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

(aliases ``chunk_gdn``, ``fused_recurrent_gdn``). Each returns ``(o, final_state)``: ``o [B, T, HV, V]``
in q's dtype (the chunk functions) or v's (the recurrent ones), as FLA casts it; ``final_state``
``[N, HV, K, V]`` float32 (``[N, HV, V, K]`` with ``state_v_first``), None unless
``output_final_state``. q and k have H heads, v, g, beta HV (a multiple of H): value head i reads
key head ``i // (HV // H)``, as FLA's kernels and transformers' ``repeat_interleave`` do, which is
flat's head sharing, so nothing is expanded. ``scale`` defaults to ``K^-1/2``; ``cu_seqlens``
packs ``N`` sequences along T of one batch row (B = 1). In the chunk functions, ``A_log``,
``dt_bias`` and (chunk_gated_delta_rule) ``use_gate_in_kernel`` come through ``**kwargs``, as in
FLA, and so does ``chunk_size`` (FLA's choices: 16, 32, 64 for the gated delta rule, 32, 64 for
KDA). Other keyword arguments are taken and ignored, as FLA's ``**kwargs`` does.

Gates made in the call (``use_gate_in_kernel``, in float32, differentiable; then ``g`` is raw):
the gated delta rule ``-exp(A_log) * softplus(g + dt_bias)`` with ``A_log``, ``dt_bias`` ``[HV]``;
KDA the same per channel with ``dt_bias`` ``[HV * K]``, or with ``lower_bound``
``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (``lower_bound * sigmoid(g + dt_bias)``
without ``A_log``). ``use_beta_sigmoid_in_kernel``: beta is a logit, the strength
``sigmoid(beta)``, ``2 sigmoid(beta)`` with ``allow_neg_eigval``. What flat's kernels lack is
computed around them: a bfloat16 ``initial_state`` is widened to float32, float16 inputs run in
float32 (o comes back in float16), ``state_v_first`` transposes the states, and the recurrent
gated delta rule's V-side gate ``gv`` and per-channel ``beta [B, T, HV, V]`` (also
``fused_recurrent_kda``'s) run each value channel as its own head of width 1, which makes them
exact but V times as costly. Every input gets a gradient, the recurrent functions' too.

Differences from FLA 0.6 (a call FLA refuses with an AssertionError is refused here with a
ValueError, ``flat: <argument>: expected ..., got ...``):

- CPU tensors only; the CUDA-only options are refused: ``cp_context`` (context parallelism),
  ``use_graph`` (graph capture), ``return_intermediate_states`` (chunk states for vLLM).
- ``fused_recurrent_*`` are differentiable (FLA's have no backward, or raise in it).
- ``chunk_kda`` takes a bfloat16 ``initial_state`` (FLA asserts float32).
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
import torch.nn.functional as F
from torch import Tensor

from .. import torch as _flat

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_kda", "fused_recurrent_kda",
           "chunk_gdn", "fused_recurrent_gdn"]


class HeadFirstRemoved(ValueError, DeprecationWarning):
    """``head_first`` was removed from FLA: FLA raises a DeprecationWarning, flat one that is also a
    ValueError."""


def _fail(name: str, expected: str, got) -> None:
    raise ValueError(f"flat: {name}: expected {expected}, got {got}")


def _describe(t) -> str:
    if not isinstance(t, Tensor):
        return type(t).__name__
    return f"{t.dtype} {list(t.shape)} on {t.device}"


def _tensor(name: str, t, shape, axes: str) -> None:
    """Checks that t is a tensor of the shape (None: any size on that axis)."""
    if not isinstance(t, Tensor):
        _fail(name, f"a tensor [{axes}]", type(t).__name__)
    if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
        want = ", ".join(f"{a}={s}" if s is not None else a for a, s in zip(axes.split(", "), shape))
        _fail(name, f"a tensor of rank {len(shape)} [{want}]", f"rank {t.dim()} {list(t.shape)}")
    if not t.is_floating_point():
        _fail(name, "a floating-point tensor", t.dtype)
    if t.device.type != "cpu":
        _fail(name, "a tensor on the CPU (flat's kernels run there)", f"one on {t.device}")


def _count(name: str, t, count: int, what: str) -> None:
    if not isinstance(t, Tensor):
        _fail(name, f"a tensor of {count} elements ({what})", type(t).__name__)
    if t.numel() != count:
        _fail(name, f"a tensor of {count} elements ({what})", f"{t.numel()} elements {list(t.shape)}")


def _wide(t: Optional[Tensor]) -> Optional[Tensor]:
    """float16 (which flat's kernels do not take) as float32."""
    return t.float() if t is not None and t.dtype == torch.float16 else t


def _chunk_size(kwargs, allowed: Tuple[int, ...], what: str) -> int:
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in allowed:
        _fail("chunk_size", f"one of {', '.join(map(str, allowed))} for {what}", chunk_size)
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
        _fail("cp_context", "None (context parallelism across CUDA devices has no CPU form)",
              type(cp_context).__name__)
    if use_graph:
        _fail("use_graph", "False (CUDA/NPU graph capture has no CPU form)", use_graph)
    if return_intermediate_states:
        _fail("return_intermediate_states", "False (the per-chunk states of FLA's chunk kernel, for vLLM on "
              "CUDA, are not computed on the CPU)", return_intermediate_states)


def _check_common(q, k, v, initial_state, state_v_first: bool, cu_seqlens) -> Tuple[int, int, int, int, int, int]:
    """Checks q, k, v, cu_seqlens, initial_state; returns B, T, H, HV, K, V."""
    _tensor("q", q, (None, None, None, None), "B, T, H, K")
    B, T, H, K = q.shape
    _tensor("k", k, (B, T, H, K), "B, T, H, K")
    _tensor("v", v, (B, T, None, None), "B, T, HV, V")
    HV, V = v.shape[2], v.shape[3]
    if H == 0 or HV % H != 0:
        _fail("v", f"a head count HV that is a multiple of q's and k's H={H} (grouped value attention)",
              f"HV={HV} {list(v.shape)}")
    N = B
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32,
                                                                                                  torch.int64):
            _fail("cu_seqlens", "a 1-D int32 or int64 tensor [N + 1]", _describe(cu_seqlens))
        if B != 1:
            _fail("cu_seqlens", "a batch of one row (B = 1, the sequences packed along T) with cu_seqlens",
                  f"B={B} in q {list(q.shape)}")
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        shape, axes = ((N, HV, V, K), "N, HV, V, K") if state_v_first else ((N, HV, K, V), "N, HV, K, V")
        _tensor("initial_state", initial_state, shape, axes)
    return B, T, H, HV, K, V


def _strength(beta: Tensor, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool) -> Tensor:
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        _fail("allow_neg_eigval", "use_beta_sigmoid_in_kernel=True with it (FLA scales the sigmoid of beta)",
              "use_beta_sigmoid_in_kernel=False")
    if use_beta_sigmoid_in_kernel:
        return torch.sigmoid(beta.float()) * (2.0 if allow_neg_eigval else 1.0)
    return _wide(beta)


def _gdn_gate(g: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor], HV: int) -> Tensor:
    """FLA's gated delta rule gate, -exp(A_log) * softplus(g + dt_bias), in float32."""
    if A_log is None:
        _fail("A_log", f"a tensor of {HV} elements with use_gate_in_kernel=True", None)
    _count("A_log", A_log, HV, "one per value head")
    x = g.float()
    if dt_bias is not None:
        _count("dt_bias", dt_bias, HV, "one per value head")
        x = x + dt_bias.float().reshape(HV)
    return -A_log.float().reshape(HV).exp() * F.softplus(x)


def _kda_gate(g: Tensor, A_log: Optional[Tensor], dt_bias: Optional[Tensor], lower_bound: Optional[float], HV: int,
              K: int) -> Tensor:
    """FLA's KDA gate in float32: -exp(A_log) * softplus(g + dt_bias), or with lower_bound
    lower_bound * sigmoid(exp(A_log) * (g + dt_bias)) (A_log optional then)."""
    if A_log is None and lower_bound is None:
        _fail("A_log", f"a tensor of {HV} elements with use_gate_in_kernel=True and no lower_bound", None)
    x = g.float()
    if dt_bias is not None:
        _count("dt_bias", dt_bias, HV * K, "one per value head and key channel, [HV * K]")
        x = x + dt_bias.float().reshape(HV, K)
    decay = None
    if A_log is not None:
        _count("A_log", A_log, HV, "one per value head")
        decay = A_log.float().reshape(HV, 1).exp()
    if lower_bound is None:
        return -decay * F.softplus(x)
    return float(lower_bound) * torch.sigmoid(x if decay is None else decay * x)


def _run(q: Tensor, k: Tensor, v: Tensor, *, g_head: Optional[Tensor], g_chan: Optional[Tensor],
         g_val: Optional[Tensor], beta: Tensor, scale: Optional[float], initial_state: Optional[Tensor],
         output_final_state: bool, l2norm: bool, state_v_first: bool, cu_seqlens: Optional[Tensor],
         chunk_size: int) -> Tuple[Tensor, Optional[Tensor]]:
    """The delta rule H_t = Diag(exp(g_chan + g_head)) H_{t-1} Diag(exp(g_val)), then the delta step
    with beta [B, T, HV] or [B, T, HV, V], on flat's kernels. Returns o in v's dtype (float16 inputs
    widened) and the final state in the caller's layout."""
    q, k, v = _wide(q), _wide(k), _wide(v)
    B, T, HV, V = v.shape
    K = q.shape[3]
    if scale is None:
        scale = K ** -0.5
    h0 = None if initial_state is None else initial_state.float()
    split = g_val is not None or beta.dim() == 4
    if split:
        # Every value channel j of head i is its own head i * V + j of width 1: the V-side gate becomes
        # that head's scalar gate, a per-channel beta its strength. Head i * V + j reads key head
        # (i * V + j) // (HV * V / H) = i // (HV / H), as value head i does.
        NS = HV * V
        if beta.dim() == 3:
            beta = beta.unsqueeze(-1).expand(B, T, HV, V)
        beta = beta.reshape(B, T, NS)
        scalar = None
        if g_head is not None:
            scalar = g_head.unsqueeze(-1).expand(B, T, HV, V)
        if g_val is not None:
            scalar = g_val if scalar is None else scalar + g_val
        g_head = None if scalar is None else scalar.reshape(B, T, NS)
        if g_chan is not None:
            g_chan = g_chan.unsqueeze(3).expand(B, T, HV, V, K).reshape(B, T, NS, K)
        v = v.reshape(B, T, NS, 1)
        if h0 is not None:
            # [N, HV, V, K] is [N, HV * V, K, 1]: the V-first layout is this one's
            h0 = (h0 if state_v_first else h0.transpose(-1, -2)).reshape(h0.shape[0], NS, K, 1)
    elif h0 is not None and state_v_first:
        h0 = h0.transpose(-1, -2)

    options = dict(scale=scale, initial_state=h0, output_final_state=output_final_state, chunk_size=chunk_size,
                   use_qk_l2norm_in_kernel=l2norm, solve="auto", check_values=True, cu_seqlens=cu_seqlens,
                   initial_state_indices=None, final_state_indices=None, token_state_indices=None)
    if g_chan is not None:
        g = g_chan if g_head is None else g_chan + g_head.unsqueeze(-1)
        o, ht = _flat.kda(q=q, k=k, v=v, g=g, beta=beta, gate_group=1, **options)
    elif g_head is not None:
        o, ht = _flat.gated_deltanet(q=q, k=k, v=v, g=g_head, beta=beta, **options)
    else:
        o, ht = _flat.deltanet(q=q, k=k, v=v, beta=beta, **options)

    if split:
        o = o.reshape(B, T, HV, V)
        if ht is not None:
            ht = ht.reshape(ht.shape[0], HV, V, K)
            ht = ht if state_v_first else ht.transpose(-1, -2).contiguous()
    elif ht is not None and state_v_first:
        ht = ht.transpose(-1, -2).contiguous()
    return o, (ht if output_final_state else None)


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
    _tensor("beta", beta, (B, T, HV), "B, T, HV")
    if kwargs.get("use_gate_in_kernel", False):
        g = _gdn_gate(g, kwargs.get("A_log"), kwargs.get("dt_bias"), HV)
    beta = _strength(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    o, ht = _run(q, k, v, g_head=_wide(g), g_chan=None, g_val=None, beta=beta, scale=scale,
                 initial_state=initial_state, output_final_state=output_final_state,
                 l2norm=use_qk_l2norm_in_kernel, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
                 chunk_size=chunk_size)
    return o.to(q.dtype), ht


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
    if gk is not None:
        _tensor("gk", gk, (B, T, HV, K), "B, T, HV, K")
    if gv is not None:
        _tensor("gv", gv, (B, T, HV, V), "B, T, HV, V")
    if beta is None:
        beta = v.new_ones((B, T, HV), dtype=torch.float32)
    elif isinstance(beta, Tensor) and beta.dim() == 4:
        _tensor("beta", beta, (B, T, HV, V), "B, T, HV, V")
    else:
        _tensor("beta", beta, (B, T, HV), "B, T, HV")
    if use_gate_in_kernel:
        if g is None:
            _fail("g", "the raw gate [B, T, HV] with use_gate_in_kernel=True", None)
        g = _gdn_gate(g, A_log, dt_bias, HV)
    beta = _strength(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    o, ht = _run(q, k, v, g_head=_wide(g), g_chan=_wide(gk), g_val=_wide(gv), beta=beta, scale=scale,
                 initial_state=initial_state, output_final_state=output_final_state,
                 l2norm=use_qk_l2norm_in_kernel, state_v_first=state_v_first, cu_seqlens=cu_seqlens, chunk_size=64)
    return o.to(v.dtype), ht


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
    if safe_gate and use_gate_in_kernel and (lower_bound is None or not -5 <= lower_bound < 0):
        _fail("lower_bound", "a number in [-5, 0) with safe_gate=True and use_gate_in_kernel=True", lower_bound)
    _tensor("g", g, (B, T, HV, K), "B, T, HV, K")
    _tensor("beta", beta, (B, T, HV), "B, T, HV")
    if use_gate_in_kernel:
        g = _kda_gate(g, kwargs.get("A_log"), kwargs.get("dt_bias"), lower_bound, HV, K)
    beta = _strength(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    o, ht = _run(q, k, v, g_head=None, g_chan=_wide(g), g_val=None, beta=beta, scale=scale,
                 initial_state=initial_state, output_final_state=output_final_state,
                 l2norm=use_qk_l2norm_in_kernel, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
                 chunk_size=chunk_size)
    return o.to(q.dtype), ht


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
    if isinstance(beta, Tensor) and beta.dim() == 4:
        _tensor("beta", beta, (B, T, HV, V), "B, T, HV, V")
    else:
        _tensor("beta", beta, (B, T, HV), "B, T, HV")
    if use_gate_in_kernel:
        g = _kda_gate(g, A_log, dt_bias, lower_bound, HV, K)
    beta = _strength(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    o, ht = _run(q, k, v, g_head=None, g_chan=_wide(g), g_val=None, beta=beta, scale=scale,
                 initial_state=initial_state, output_final_state=output_final_state,
                 l2norm=use_qk_l2norm_in_kernel, state_v_first=state_v_first, cu_seqlens=cu_seqlens, chunk_size=64)
    return o.to(v.dtype), ht


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule
