"""Pallas TPU kernels of flat's variants, forward and backward: the seed paper's fused
block-recurrent forward and its two backward kernels (state passing, then the gradients walking the
chunks last to first), wired with ``jax.custom_vjp``, for the additive variants (la, mamba2, gla;
retnet is mamba2 with a constant gate) and the delta rule (deltanet, gated_deltanet, kda, gdn2; sla
is kda with its grouped gate widened and its R value heads packed per key head, below), one kernel
body parameterised by the gate's kind, the update and the values' width; and the short causal
convolution (its section below).
flat.jax.ops dispatches here with ``backend="tpu"`` (Mosaic, for a TPU) or ``backend="interpret"``
(the same kernels run by Pallas's TPU interpreter, on any platform); docs/tpu.md says what runs and
how it was checked.

Layout (one program per batch item, head group and chunk; the chunk axis is sequential):

- q, k [B, S, N*K], v [B, S, N*V]: the projection's layout ([B, S, N, K] reshaped, free), read by
  BlockSpecs of one chunk and G heads, [C, G*K]: a head is a lane-aligned column slice when K is a
  multiple of 128 (the TPU's (8, 128) tiling), so every block is rectangular.
- the gate: per channel (gla, kda) in the same layout [B, S, N*K], fp32; one value per head
  (mamba2, gated_deltanet), and the delta rule's beta, as [B, N/G, S, G], so a chunk's block [C, G]
  is whole in its last axis.
- the fp32 state of the program's G heads, [G, K, V], in a VMEM scratch for the whole sequence.
- sla's packed heads: the R value heads sharing one key head's q, k, g, beta are one head of the
  kernel whose values are R*V wide: v [B, S, Nk, R*V] (flat's [B, S, Nk*R, V], free), the state
  [G, K, R*V]. The scores, the chunk solve and the decays are computed once per key head, every
  product with values or state is one dot R*V wide, and the gradients of q, k, g, beta come out
  summed over the R value heads by the dots' contraction over R*V.

G heads share each MXU dot (a batched dot_general over the head axis): 8 for the per-channel gate,
4 otherwise (the paper's), 1 for sla's packed heads, where N allows and G*K, G*V fill the 128
lanes; else all N heads.
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._args import GATE, UPDATE

# The kernels' gate kinds, by the library's (flat.VARIANTS): none (la, deltanet), one value per head
# and token (mamba2, gated_deltanet), one per channel (gla, kda, gdn2, sla: a grouped gate is widened
# to one value per channel by the caller). A gate of one value per head for the whole sequence
# (retnet) is not a kind of the kernels: the caller broadcasts it over S and runs mamba2's.
_GATE_KINDS = {"none": "none", "per_token": "head", "per_channel": "channel", "grouped": "channel"}
GATES = {name: _GATE_KINDS[gate] for name, gate in GATE.items() if gate in _GATE_KINDS}
VARIANTS = tuple(GATES)
# Updates other than the additive one, by the library's: the delta rule's and GDN-2's erase and
# write gates, whose values u = (I + A)^-1 (vw - ...) take v's place (below).
UPDATES = {name: update for name, update in UPDATE.items() if name in GATES and update != "additive"}
# Heads per program and MXU dot to start from: the paper's 8 for a per-channel gate, 4 otherwise; 1 for
# sla, whose packed head's dots are already K x R*V wide (256 x 512 at the seed's shape: the 256-wide
# MXU filled) and whose state [K, R*V] fp32 is 512 KiB of VMEM there, which the backward keeps C/16 + 1
# times.
_HEADS = {"channel": 8, "head": 4, "none": 4}

# Rows of a sub-block for the per-channel gate: its pairwise decays are a [G, c, c, K] tensor on the
# VPU, and its rows are the only ones whose decays are not factored through the carried state.
_CHANNEL_ROWS = 16
_LANES = 128


class Config(NamedTuple):
    """A call's static shape and options (hashable: custom_vjp's and pallas_call's static part)."""

    gate: str  # GATES' kinds
    update: str  # "additive", or UPDATES' kinds
    T: int
    N: int
    K: int
    V: int
    heads: int  # G, heads per program
    chunk: int  # C, rows per grid step
    scale: float
    fast: bool  # precision="fast": dot operands that are not bf16 rounded to bf16 once
    final: bool  # output_final_state
    interpret: bool  # run by Pallas's TPU interpreter (on any platform) instead of Mosaic

    @property
    def rows(self) -> int:
        """c, rows per sub-block: the whole chunk unless the gate is per channel."""
        return min(_CHANNEL_ROWS, self.chunk) if self.gate == "channel" else self.chunk

    @property
    def chunks(self) -> int:
        return pl.cdiv(self.T, self.chunk)


def head_group(variant: str, N: int, K: int, V: int) -> int:
    """G, the heads one program and one MXU dot take: _HEADS' (the paper's 8 for a per-channel gate,
    4 otherwise; sla's 1), or the largest power of two below it dividing N whose G*K and G*V columns
    are whole lane tiles; N (a block as wide as the array, which the tiling rule allows) where none
    is. V is the values' width in the kernel (sla's R*V)."""
    G = 1 if variant == "sla" else _HEADS[GATES[variant]]
    while G >= 1:
        if N % G == 0 and (G * K) % _LANES == 0 and (G * V) % _LANES == 0:
            return G
        G //= 2
    return N


# ---- Dots ---------------------------------------------------------------------------------------


def _dot(a, b, contract, fast: bool):
    """A batched dot over the head axis 0, fp32 accumulation, contracting a's axis contract[0] with
    b's contract[1]. Two bf16 operands are one exact bf16 pass (DEFAULT precision); otherwise
    precision="exact" runs the fp32 product (HIGHEST: a TPU's DEFAULT for fp32 is one bf16 pass,
    which interpret mode on a CPU would not show) and "fast" rounds the operands to bf16 once."""
    if a.dtype == b.dtype == jnp.bfloat16:
        precision = jax.lax.Precision.DEFAULT
    elif fast:
        a, b, precision = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), jax.lax.Precision.DEFAULT
    else:
        a, b, precision = a.astype(jnp.float32), b.astype(jnp.float32), jax.lax.Precision.HIGHEST
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((0,), (0,))), precision=precision,
                               preferred_element_type=jnp.float32)


def _scan(matrix, x):
    """matrix [C, C] (of ones, triangular) times x [C, W]: the gates' prefix or suffix sums on the
    MXU (the paper's), at HIGHEST precision: their fp32 terms (and the gate gradient's nearly
    cancelling ones) would not survive one bf16 pass."""
    return jax.lax.dot_general(matrix, x, (((1,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST,
                               preferred_element_type=jnp.float32)


def _ones(C: int, block: int, upper: bool):
    """[C, C] ones at (i, j) with i, j in the same block of `block` rows and j <= i (lower) or
    j >= i (upper): the within-block prefix (suffix) sum as one dot."""
    i = jax.lax.broadcasted_iota(jnp.int32, (C, C), 0)
    j = jax.lax.broadcasted_iota(jnp.int32, (C, C), 1)
    # Truncating division (i, j >= 0): floor division's sign test lowers through the chip's
    # description, which an export without a TPU lacks.
    same = jax.lax.div(i, block) == jax.lax.div(j, block)
    return jnp.where(same & ((j >= i) if upper else (j <= i)), 1.0, 0.0).astype(jnp.float32)


def _pairs(c: int):
    """[1, c, c] each: the row t and the column s of a sub-block's scores."""
    return jax.lax.broadcasted_iota(jnp.int32, (1, c, c), 1), jax.lax.broadcasted_iota(jnp.int32, (1, c, c), 2)


def _causal(c: int):
    """[1, c, c]: s <= t, the causal mask of a sub-block's scores."""
    t, s = _pairs(c)
    return s <= t


def _strict(c: int):
    """[1, c, c]: s < t, the delta rule's solve's."""
    t, s = _pairs(c)
    return s < t


# ---- One sub-block of c rows: the recurrence's chunkwise form and its gradient -------------------
#
# Per head, with gam the gate's prefix sum within the sub-block (gam_L its last row; [G, c, K] for a
# per-channel gate, [G, c, 1] for a per-head one, None without a gate) and the values u:
#   o   = scale ((q * e^gam) S_in + sum_{s<=t} <q_t, k_s e^(gam_t - gam_s)> u_s)
#   S_out = e^gam_L * S_in + (k * e^(gam_L - gam))^T u
# Additive variants: u = v. The delta rule (decay first, then the delta step on the decayed state):
#   u_t = beta_t (v_t - S_in^T (k_t e^gam_t) - sum_{s<t} <k_t, k_s e^(gam_t - gam_s)> u_s),
# so u = (I + A)^-1 diag(beta) (v - (k e^gam) S_in), A_ts = beta_t <k_t, k_s e^(gam_t - gam_s)>, s < t.
# Every exponent is <= 0: no decay is ever inverted, whatever the gate's strength. The scale is
# applied to the dots' fp32 results, so q stays in its dtype: bf16 q and k make one exact bf16 pass.


def _decays(gam, c: int):
    """e^(gam_t - gam_s) for s <= t, 0 above: [G, c, c] (per-head gate) or [G, c, c, K] (per
    channel); the exponent is masked before exp, so no positive one is taken."""
    if gam.shape[-1] == 1:
        pair = gam - jnp.swapaxes(gam, 1, 2)  # [G, c, c]
        return jnp.exp(jnp.where(_causal(c), pair, -jnp.inf))
    pair = gam[:, :, None, :] - gam[:, None, :, :]  # [G, c, c, K]
    return jnp.exp(jnp.where(_causal(c)[..., None], pair, -jnp.inf))


def _scores(x, y, decay, c: int, fast: bool):
    """[G, c, c]: <x_t, y_s> with the decay between s and t, s <= t."""
    if decay is not None and decay.ndim == 4:  # per channel: on the VPU, pairwise
        return jnp.sum(x[:, :, None, :] * y[:, None, :, :] * decay, axis=-1)
    a = _dot(x, y, (2, 2), fast)
    return jnp.where(_causal(c), a, 0.0) if decay is None else a * decay


def _score_gradients(d, x, y, decay, fast: bool):
    """The gradients of sum_ts d_ts * _scores(x, y)_ts (d zero above the diagonal) with respect to x
    and y, [G, c, K] each."""
    if decay is not None and decay.ndim == 4:  # per channel, pairwise on the VPU
        return (jnp.sum(d[..., None] * y[:, None, :, :] * decay, axis=2),
                jnp.sum(d[..., None] * x[:, :, None, :] * decay, axis=1))
    d = d if decay is None else d * decay
    return _dot(d, y, (2, 1), fast), _dot(d, x, (1, 1), fast)


def _update(S, k, u, gam, fast: bool):
    """S_out from S_in [G, K, V]."""
    if gam is None:
        return S + _dot(k, u, (1, 1), fast)
    last = gam[:, -1:, :]  # [G, 1, K or 1]
    return jnp.exp(jnp.swapaxes(last, 1, 2)) * S + _dot(k * jnp.exp(last - gam), u, (1, 1), fast)


def _output(S, q, k, u, gam, c: int, scale: float, fast: bool):
    """o [G, c, V] of a sub-block from its carried state S [G, K, V]."""
    decay = None if gam is None else _decays(gam, c)
    a = _scores(q, k, decay, c, fast)
    qd = q if gam is None else q * jnp.exp(gam)
    return scale * (_dot(a, u, (2, 1), fast) + _dot(qd, S, (2, 1), fast))


def _gradient(S, dS, q, k, u, do, gam, c: int, scale: float, fast: bool):
    """A sub-block's (dq, dk, du, dS_in) from dS = dS_out [G, K, V] and its S_in, u held fixed. The
    terms through o carry the scale; those through S_out do not."""
    decay = None if gam is None else _decays(gam, c)
    da = jnp.where(_causal(c), _dot(do, u, (2, 2), fast), 0.0)  # <do_t, u_s>, s <= t
    dq, dk = _score_gradients(da, q, k, decay, fast)
    du = _dot(_scores(q, k, decay, c, fast), do, (1, 1), fast)
    from_state = _dot(do, S, (2, 2), fast)  # [G, c, K]: do_t S_in^T
    to_state = _dot(u, dS, (2, 2), fast)  # [G, c, K]: dS_out u_s
    if gam is None:
        return (scale * (dq + from_state), scale * dk + to_state, scale * du + _dot(k, dS, (2, 1), fast),
                dS + scale * _dot(q, do, (1, 1), fast))
    last = gam[:, -1:, :]
    into = jnp.exp(last - gam)  # e^(gam_L - gam_s)
    dq = scale * (dq + jnp.exp(gam) * from_state)
    dk = scale * dk + into * to_state
    du = scale * du + _dot(k * into, dS, (2, 1), fast)
    dS_in = jnp.exp(jnp.swapaxes(last, 1, 2)) * dS + scale * _dot(q * jnp.exp(gam), do, (1, 1), fast)
    return dq, dk, du, dS_in


def _inverse(A, c: int):
    """(I + A)^-1 [G, c, c] of a strictly lower triangular A, by doubling: the product of
    (I + (-A)^(2^i)) over i < log2(c) is the whole Neumann series, exact because A^c = 0; 2 log2(c)
    dots on the MXU, at HIGHEST precision (the solve's error would reach every value)."""
    t, s = _pairs(c)
    power = -A
    inverse = jnp.where(t == s, 1.0, 0.0) + power
    for _ in range(max(c - 1, 1).bit_length() - 1):
        power = _dot(power, power, (2, 1), False)
        inverse = inverse + _dot(inverse, power, (2, 1), False)
    return inverse


def _delta_values(S, k, kr, vw, gam, c: int, fast: bool):
    """The values u [G, c, V] of a sub-block from its S_in, with read keys kr and written values vw
    (the delta rule's beta k and beta v; GDN-2's b * k and w * v):
    u = (I + A)^-1 (vw - (kr e^gam) S_in), A_ts = <kr_t, k_s e^(gam_t - gam_s)> for s < t; and
    (I + A)^-1, which the gradient reuses."""
    decay = None if gam is None else _decays(gam, c)
    inverse = _inverse(jnp.where(_strict(c), _scores(kr, k, decay, c, fast), 0.0), c)
    read = _dot(kr if gam is None else kr * jnp.exp(gam), S, (2, 1), fast)
    return _dot(inverse, vw - read, (2, 1), False), inverse


def _delta_gradient(S, k, kr, u, du, gam, inverse, c: int, fast: bool):
    """Back through _delta_values: (dvw, dkr, dk, dS_in's term), dk the gradient through the
    scores' right operand k_s (whose decay the gate's gradient counts with a minus; kr's, through
    e^gam_t, with a plus)."""
    decay = None if gam is None else _decays(gam, c)
    dvw = _dot(inverse, du, (1, 1), False)  # (I + A)^-T du
    dA = -jnp.where(_strict(c), _dot(dvw, u, (2, 2), False), 0.0)
    dkr, dk = _score_gradients(dA, kr, k, decay, fast)
    from_read = -_dot(dvw, S, (2, 2), fast)  # d(kr e^gam) [G, c, K]
    krd = kr if gam is None else kr * jnp.exp(gam)
    dkr = dkr + (from_read if gam is None else from_read * jnp.exp(gam))
    return dvw, dkr, dk, -_dot(krd, dvw, (1, 1), fast)


# ---- Blocks in and out of VMEM -----------------------------------------------------------------


def _valid(cfg: Config, i):
    """[C, 1]: the rows of chunk i inside the sequence (the last chunk's block may overhang S,
    and what a block reads past the array's end is unspecified)."""
    return (i * cfg.chunk + jax.lax.broadcasted_iota(jnp.int32, (cfg.chunk, 1), 0)) < cfg.T


def _heads(block, valid, width: int, G: int):
    """A [C, G*width] block as [G, C, width], its rows past S zeroed where valid is given
    (jnp.where: a multiply would keep a NaN read there): one lane-aligned column slice per head."""
    if valid is not None:
        block = jnp.where(valid, block, jnp.zeros_like(block))
    return jnp.stack([block[:, h * width:(h + 1) * width] for h in range(G)])


def _store(ref, x, width: int, G: int):
    """[G, C, width] into a [1, C, G*width] block, one head's columns at a time."""
    for h in range(G):
        ref[0, :, h * width:(h + 1) * width] = x[h].astype(ref.dtype)


def _gate_prefix(cfg: Config, g_ref, valid):
    """The gate's prefix sums within each sub-block, as one triangular-ones dot on the MXU:
    [G, C, K] (per channel) or [G, C, 1] (per head); None without a gate."""
    if cfg.gate == "none":
        return None
    g = g_ref[0] if cfg.gate == "channel" else g_ref[0, 0]  # [C, G*K] or [C, G]
    gam = _scan(_ones(cfg.chunk, cfg.rows, upper=False), jnp.where(valid, g, 0.0))
    if cfg.gate == "channel":  # rows past S keep the last prefix (their gates are 0), not zeroed
        return _heads(gam, None, cfg.K, cfg.heads)
    return jnp.swapaxes(gam, 0, 1)[:, :, None]


def _rows(x, m: int, c: int):
    return None if x is None else x[:, m * c:(m + 1) * c]


# ---- The kernels -----------------------------------------------------------------------------


def _per_head(ref, valid):
    """A per-head block [1, 1, C, G] (beta's) as [G, C, 1], its rows past S zeroed."""
    return jnp.swapaxes(jnp.where(valid, ref[0, 0], 0.0), 0, 1)[:, :, None]


def _chunk(cfg: Config, refs: dict, valid):
    """The chunk's k, v [G, C, K or V], gate prefix (None without a gate) and the update's own
    inputs, fp32: {} (additive), beta [G, C, 1] (the delta rule), b [G, C, K] and w [G, C, V]
    (GDN-2)."""
    G = cfg.heads
    k, v = _heads(refs["k"][0], valid, cfg.K, G), _heads(refs["v"][0], valid, cfg.V, G)
    gam = _gate_prefix(cfg, refs.get("g"), valid)
    extra = {}
    if cfg.update == "delta":
        extra["beta"] = _per_head(refs["beta"], valid)
    elif cfg.update == "erase_write":
        extra["b"] = _heads(refs["b"][0], valid, cfg.K, G).astype(jnp.float32)
        extra["w"] = _heads(refs["w"][0], valid, cfg.V, G).astype(jnp.float32)
    return k, v, gam, extra


def _read_write(k, v, extra: dict):
    """The read keys and written values of the delta rule (beta k, beta v) or GDN-2 (b * k, w * v)."""
    if "beta" in extra:
        return extra["beta"] * k, extra["beta"] * v
    return extra["b"] * k, extra["w"] * v


def _values(cfg: Config, S, k, v, extra: dict, gam):
    """A sub-block's values u (v, or the delta rule's and GDN-2's) and what their gradient reuses."""
    if cfg.update == "additive":
        return v, None
    kr, vw = _read_write(k, v, extra)
    return _delta_values(S, k, kr, vw, gam, cfg.rows, cfg.fast)


def _extra_rows(extra: dict, m: int, c: int) -> dict:
    return {name: _rows(x, m, c) for name, x in extra.items()}


def _forward_kernel(cfg: Config, names: tuple, *refs):
    """The fused block-recurrent forward (q given: o, and ht at the end) or the backward's state
    passing (no q: each chunk's starting state), one chunk of G heads per grid step."""
    refs = dict(zip(names, refs))
    state = refs["state"]
    i = pl.program_id(2)

    @pl.when(i == 0)
    def _():
        state[...] = refs["h0"][0] if "h0" in refs else jnp.zeros(state.shape, jnp.float32)

    if "states" in refs:
        refs["states"][0, 0] = state[...]
    valid = _valid(cfg, i)
    G, c = cfg.heads, cfg.rows
    k, v, gam, extra = _chunk(cfg, refs, valid)
    q = _heads(refs["q"][0], valid, cfg.K, G) if "q" in refs else None
    S = state[...]
    outputs = []
    for m in range(cfg.chunk // c):
        km, gm = _rows(k, m, c), _rows(gam, m, c)
        u, _ = _values(cfg, S, km, _rows(v, m, c), _extra_rows(extra, m, c), gm)
        if q is not None:
            outputs.append(_output(S, _rows(q, m, c), km, u, gm, c, cfg.scale, cfg.fast))
        S = _update(S, km, u, gm, cfg.fast)
    state[...] = S
    if q is not None:
        _store(refs["o"], jnp.concatenate(outputs, axis=1), cfg.V, G)

    if "ht" in refs:
        @pl.when(i == cfg.chunks - 1)
        def _():
            refs["ht"][0] = S


def _gate_gradient(cfg: Config, ref, x, boundary):
    """The log-gate's gradient into its block: within each sub-block, the suffix sum of x [G, C, K]
    (q.dq - k.dk; with the delta rule and GDN-2 also + kr.dkr for the read keys, whose decay
    enters as e^gam_t, and k.dk counting only k's other uses) as one dot with a
    triangular matrix of ones, plus the boundary term rowsum(S_out * dS_out) of the sub-block's
    S_out, shared by its rows (boundary [G, C, K], each sub-block's broadcast over its rows): the
    paper's gate gradient, from differentiating the decays' prefix sums."""
    suffix = _ones(cfg.chunk, cfg.rows, upper=True)
    if cfg.gate == "head":  # one value per head: summed over K, [C, G]
        per_head = lambda y: jnp.swapaxes(jnp.sum(y, axis=2), 0, 1)  # noqa: E731
        ref[0, 0] = _scan(suffix, per_head(x)) + per_head(boundary)
    else:
        columns = lambda y: jnp.concatenate([y[h] for h in range(cfg.heads)], axis=1)  # noqa: E731 [C, G*K]
        ref[0] = _scan(suffix, columns(x)) + columns(boundary)


def _gradient_kernel(cfg: Config, names: tuple, *refs):
    """The gradient kernel: chunks last to first (the index maps reverse the grid's chunk axis),
    dS, the gradient of the state entering the current chunk, in a VMEM scratch."""
    refs = dict(zip(names, refs))
    dstate = refs["dstate"]
    step = pl.program_id(2)
    i = cfg.chunks - 1 - step

    @pl.when(step == 0)
    def _():
        dstate[...] = refs["dht"][0] if "dht" in refs else jnp.zeros(dstate.shape, jnp.float32)

    valid = _valid(cfg, i)
    G, c, K, V = cfg.heads, cfg.rows, cfg.K, cfg.V
    q = _heads(refs["q"][0], valid, K, G)
    do = _heads(refs["do"][0], valid, V, G)
    k, v, gam, extra = _chunk(cfg, refs, valid)
    blocks = cfg.chunk // c
    # Each sub-block's S_in (and S_out last), and values, recomputed from the chunk's starting state.
    starts, values = [refs["states"][0, 0]], []
    for m in range(blocks):
        values.append(_values(cfg, starts[-1], _rows(k, m, c), _rows(v, m, c), _extra_rows(extra, m, c),
                              _rows(gam, m, c)))
        starts.append(_update(starts[-1], _rows(k, m, c), values[-1][0], _rows(gam, m, c), cfg.fast))
    dS = dstate[...]
    grads = []
    for m in reversed(range(blocks)):
        qm, km, vm, gm, em = _rows(q, m, c), _rows(k, m, c), _rows(v, m, c), _rows(gam, m, c), _extra_rows(extra, m, c)
        (u, inverse), boundary = values[m], jnp.sum(starts[m + 1] * dS, axis=2, keepdims=True)  # [G, K, 1]
        dq, dk, du, dS_in = _gradient(starts[m], dS, qm, km, u, _rows(do, m, c), gm, c, cfg.scale, cfg.fast)
        k32 = km.astype(jnp.float32)
        x = qm.astype(jnp.float32) * dq - k32 * dk
        dv, dextra = du, {}
        if cfg.update != "additive":
            kr, _ = _read_write(k32, vm, em)
            dvw, dkr, dk_right, dS_read = _delta_gradient(starts[m], km, kr, u, du, gm, inverse, c, cfg.fast)
            x = x + kr * dkr - k32 * dk_right
            dS_in = dS_in + dS_read
            if cfg.update == "delta":  # kr = beta k, vw = beta v
                beta = em["beta"]
                dextra["beta"] = jnp.sum(dvw * vm, axis=2, keepdims=True) + jnp.sum(dkr * k32, axis=2, keepdims=True)
                dv, dk = beta * dvw, dk + beta * dkr + dk_right
            else:  # kr = b * k, vw = w * v
                dextra = dict(b=dkr * k32, w=dvw * vm.astype(jnp.float32))
                dv, dk = dvw * em["w"], dk + dkr * em["b"] + dk_right
        grads.append(dict(dq=dq, dk=dk, dv=dv, **{"d" + name: value for name, value in dextra.items()}))
        if gam is not None:  # the gate's gradient terms, x and the boundary broadcast over the rows
            grads[-1].update(x=x, boundary=jnp.broadcast_to(jnp.swapaxes(boundary, 1, 2), x.shape))
        dS = dS_in
    dstate[...] = dS
    grads = {name: jnp.concatenate([g[name] for g in reversed(grads)], axis=1) for name in grads[0]}
    _store(refs["dq"], grads["dq"], K, G)
    _store(refs["dk"], grads["dk"], K, G)
    _store(refs["dv"], grads["dv"], V, G)
    if "dg" in refs:
        _gate_gradient(cfg, refs["dg"], grads["x"], grads["boundary"])
    if "dbeta" in refs:
        refs["dbeta"][0, 0] = jnp.swapaxes(grads["dbeta"][:, :, 0], 0, 1)
    if "db" in refs:
        _store(refs["db"], grads["db"], K, G)
        _store(refs["dw"], grads["dw"], V, G)

    if "dh0" in refs:
        @pl.when(step == cfg.chunks - 1)
        def _():
            refs["dh0"][0] = dS


# ---- pallas_call: grids and BlockSpecs ---------------------------------------------------------


def _specs(cfg: Config, reverse: bool) -> dict:
    """The BlockSpec of each array by name, one chunk of G heads (the chunk axis reversed for the
    gradient kernel)."""
    C, G = cfg.chunk, cfg.heads
    chunk = (lambda i: cfg.chunks - 1 - i) if reverse else (lambda i: i)

    def tokens(width):  # [B, S, N*width]
        return pl.BlockSpec((1, C, G * width), lambda b, h, i: (b, chunk(i), h))

    per_head = pl.BlockSpec((1, 1, C, G), lambda b, h, i: (b, h, chunk(i), 0))  # [B, N/G, S, G]
    state = pl.BlockSpec((1, G, cfg.K, cfg.V), lambda b, h, i: (b, h, 0, 0))  # [B, N, K, V], resident
    chunk_state = pl.BlockSpec((1, 1, G, cfg.K, cfg.V), lambda b, h, i: (b, chunk(i), h, 0, 0))  # [B, chunks, ..]
    gate = tokens(cfg.K) if cfg.gate == "channel" else per_head
    specs = dict(q=tokens(cfg.K), k=tokens(cfg.K), v=tokens(cfg.V), g=gate, beta=per_head, b=tokens(cfg.K),
                 w=tokens(cfg.V), h0=state, o=tokens(cfg.V), ht=state, states=chunk_state, do=tokens(cfg.V), dht=state)
    specs.update({"d" + name: specs[name] for name in ("q", "k", "v", "g", "beta", "b", "w", "h0")})
    return specs


def _call(kernel, cfg: Config, inputs: dict, outputs: dict, scratch: str, reverse: bool):
    """pallas_call of kernel(cfg, names, *refs) on the given inputs and outputs ({name: array or
    ShapeDtypeStruct}, None left out), its refs named in order, the scratch [G, K, V] fp32 last."""
    inputs = {name: x for name, x in inputs.items() if x is not None}
    outputs = {name: x for name, x in outputs.items() if x is not None}
    specs = _specs(cfg, reverse)
    B = inputs["v"].shape[0]
    results = pl.pallas_call(
        partial(kernel, cfg, tuple(inputs) + tuple(outputs) + (scratch,)), grid=(B, cfg.N // cfg.heads, cfg.chunks),
        in_specs=[specs[name] for name in inputs], out_specs=[specs[name] for name in outputs],
        out_shape=list(outputs.values()), scratch_shapes=[pltpu.VMEM((cfg.heads, cfg.K, cfg.V), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=pltpu.InterpretParams() if cfg.interpret else False)(*inputs.values())
    return dict(zip(outputs, results))


def _shape(x, dtype=None):
    return None if x is None else jax.ShapeDtypeStruct(x.shape, dtype or x.dtype)


def _forward(cfg: Config, out_dtype, q, k, v, g, beta, b, w, h0):
    B = v.shape[0]
    final = jax.ShapeDtypeStruct((B, cfg.N, cfg.K, cfg.V), jnp.float32) if cfg.final else None
    out = _call(_forward_kernel, cfg, dict(q=q, k=k, v=v, g=g, beta=beta, b=b, w=w, h0=h0),
                dict(o=jax.ShapeDtypeStruct((B, cfg.T, cfg.N * cfg.V), out_dtype), ht=final), "state", False)
    return out["o"], out.get("ht")


def _backward(cfg: Config, q, k, v, g, beta, b, w, h0, do, dht):
    """The paper's two backward kernels: state passing (each chunk's starting state, [B, chunks, N,
    K, V] fp32; the paper stores bf16, fp32 keeps the fp32 bounds), then the gradients."""
    B = v.shape[0]
    states = _call(_forward_kernel, cfg, dict(k=k, v=v, g=g, beta=beta, b=b, w=w, h0=h0),
                   dict(states=jax.ShapeDtypeStruct((B, cfg.chunks, cfg.N, cfg.K, cfg.V), jnp.float32)), "state",
                   False)["states"]
    inputs = dict(q=q, k=k, v=v, g=g, beta=beta, b=b, w=w, states=states, do=do, dht=dht)
    outputs = dict(dq=_shape(q), dk=_shape(k), dv=_shape(v), dg=_shape(g, jnp.float32),
                   dbeta=_shape(beta, jnp.float32), db=_shape(b), dw=_shape(w), dh0=_shape(h0, jnp.float32))
    grads = _call(_gradient_kernel, cfg, inputs, outputs, "dstate", True)
    return tuple(grads.get(name) for name in ("dq", "dk", "dv", "dg", "dbeta", "db", "dw", "dh0"))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _recurrence(cfg: Config, out_dtype, q, k, v, g, beta, b, w, h0):
    return _forward(cfg, out_dtype, q, k, v, g, beta, b, w, h0)


def _recurrence_forward(cfg, out_dtype, q, k, v, g, beta, b, w, h0):
    return _forward(cfg, out_dtype, q, k, v, g, beta, b, w, h0), (q, k, v, g, beta, b, w, h0)


def _recurrence_backward(cfg, out_dtype, saved, cotangents):
    do, dht = cotangents
    return _backward(cfg, *saved, do, dht if cfg.final else None)


_recurrence.defvjp(_recurrence_forward, _recurrence_backward)


def _per_head_layout(x, G: int):
    """[B, S, N] -> [B, N/G, S, G]: a chunk of G heads' values is one block whole in its last axis."""
    B, T, N = x.shape
    return jnp.swapaxes(x.reshape(B, T, N // G, G), 1, 2)


def recurrence(variant: str, q, k, v, g, beta, b, w, h0, *, scale: float, chunk: int, fast: bool, final: bool,
               interpret: bool, out_dtype):
    """o [B, S, N*R, V] (out_dtype) and the final state [B, N*R, K, V] fp32 (None unless final) of a
    variant of VARIANTS: q, k [B, S, N, K], v [B, S, N*R, V]; g [B, S, N, K] (per channel), [B, S, N]
    (per head), None; beta [B, S, N] fp32 (the delta rule) or None; b [B, S, N, K] and w [B, S, N, V]
    (GDN-2) or None; h0 [B, N*R, K, V] fp32 or None. R = 1 but for sla, whose value heads n*R..n*R+R-1
    share key head n's q, k, g, beta: they are packed into one head of the kernel, its values, outputs
    and state R*V wide side by side (v [B, S, N, R*V], free; h0 and the final state transposed
    between [B, N, R, K, V] and [B, N, K, R*V] by XLA). Shapes and options are the caller's to have
    checked (flat.jax.ops checks them as the CPU path)."""
    B, T, N, K = q.shape
    R = v.shape[2] // N
    V = R * v.shape[3]
    if R > 1 and h0 is not None:
        h0 = jnp.swapaxes(h0.reshape(B, N, R, K, V // R), 2, 3).reshape(B, N, K, V)
    gate = GATES[variant]
    G = head_group(variant, N, K, V)
    cfg = Config(gate, UPDATES.get(variant, "additive"), T, N, K, V, G, chunk, float(scale), bool(fast), bool(final),
                 bool(interpret))
    if gate == "channel":
        g = g.reshape(B, T, N * K)
    elif gate == "head":
        g = _per_head_layout(g, G)
    o, ht = _recurrence(cfg, jnp.dtype(out_dtype), q.reshape(B, T, N * K), k.reshape(B, T, N * K),
                        v.reshape(B, T, N * V), g, None if beta is None else _per_head_layout(beta, G),
                        None if b is None else b.reshape(B, T, N * K), None if w is None else w.reshape(B, T, N * V),
                        h0)
    if R > 1 and ht is not None:
        ht = jnp.swapaxes(ht.reshape(B, N, K, R, V // R), 2, 3).reshape(B, N * R, K, V // R)
    return o.reshape(B, T, N * R, V // R), ht


# ---- The short causal convolution --------------------------------------------------------------
#
# y_t = act(bias + sum_j w_j * x_{t - (W-1) + j}), depthwise (one tap vector per channel), act SiLU
# or none: W shifted copies of the block scaled and summed on the VPU, no padding (a depthwise
# convolution on the MXU would multiply mostly zeros). x [B, S, C] is read in blocks of T_c rows and
# C_b channels, with a halo of the 8 rows before (the forward, and the backward's recomputed z) and
# after (the backward's anti-causal correlation): every grid axis is then parallel, no state is
# carried between grid steps. The rows before the sequence are the initial state's (zero without).

_HALO = 8  # rows of a halo block: one sublane tile, so the W-1 <= 8 rows a window reaches fit one


class ConvConfig(NamedTuple):
    T: int
    C: int
    W: int
    rows: int  # T_c
    channels: int  # C_b
    silu: bool
    interpret: bool

    @property
    def chunks(self) -> int:
        return pl.cdiv(self.T, self.rows)


def conv_blocks(T: int, C: int):
    """(T_c, C_b): 256 rows (the paper's) or the whole sequence rounded up to the sublane tile; the
    largest of 512, 256, 128 channels dividing C, else all C (a block as wide as the array)."""
    rows = min(256, pl.cdiv(T, _HALO) * _HALO)
    channels = next((n for n in (512, 256, 128) if C % n == 0), C)
    return rows, channels


def _conv_window(cfg: ConvConfig, refs: dict, x, i):
    """[W-1 + T_c, C_b] fp32: the W-1 rows before the chunk (the halo's last, or the initial
    state's at the first chunk), then the chunk's."""
    if cfg.W == 1:
        return x
    before = refs["before"][0, _HALO - (cfg.W - 1):].astype(jnp.float32)
    first = refs["state0"][0] if "state0" in refs else jnp.zeros_like(before)
    return jnp.concatenate([jnp.where(i == 0, first, before), x], axis=0)


def _conv_z(cfg: ConvConfig, refs: dict, window, rows: int):
    """z [rows, C_b] of the rows whose windows start at window's rows 0..rows-1."""
    taps = refs["weight"][...]  # [W, C_b]
    z = sum(taps[j:j + 1] * window[j:j + rows] for j in range(cfg.W))
    return z + refs["bias"][...] if "bias" in refs else z


def _rows_valid(cfg: ConvConfig, first, rows: int):
    return (first + jax.lax.broadcasted_iota(jnp.int32, (rows, 1), 0)) < cfg.T


def _conv_forward_kernel(cfg: ConvConfig, names: tuple, *refs):
    refs = dict(zip(names, refs))
    i = pl.program_id(2)
    x = jnp.where(_rows_valid(cfg, i * cfg.rows, cfg.rows), refs["x"][0].astype(jnp.float32), 0.0)
    z = _conv_z(cfg, refs, _conv_window(cfg, refs, x, i), cfg.rows)
    refs["y"][0] = (z * jax.nn.sigmoid(z) if cfg.silu else z).astype(refs["y"].dtype)


def _conv_gradient_kernel(cfg: ConvConfig, names: tuple, *refs):
    """dx of the chunk, and its share of dweight, dbias and (the first chunk) the initial state's
    gradient: dz = dy act'(z), z recomputed, over the chunk and the W-1 rows after it (their z from
    the chunk's last inputs and the halo after)."""
    refs = dict(zip(names, refs))
    i = pl.program_id(2)
    Tc, W = cfg.rows, cfg.W
    x = jnp.where(_rows_valid(cfg, i * Tc, Tc), refs["x"][0].astype(jnp.float32), 0.0)
    dy = jnp.where(_rows_valid(cfg, i * Tc, Tc), refs["dy"][0].astype(jnp.float32), 0.0)
    window = _conv_window(cfg, refs, x, i)  # [W-1 + T_c, C_b]
    if W > 1:  # the W-1 rows after the chunk, past the sequence's end zeroed
        after = _rows_valid(cfg, (i + 1) * Tc, _HALO)
        window = jnp.concatenate([window, jnp.where(after, refs["after"][0].astype(jnp.float32), 0.0)], axis=0)
        dy = jnp.concatenate([dy, jnp.where(after, refs["dy_after"][0].astype(jnp.float32), 0.0)], axis=0)
    z = _conv_z(cfg, refs, window, Tc + _HALO if W > 1 else Tc)  # [T_c (+ 8), C_b]
    if cfg.silu:
        sigma = jax.nn.sigmoid(z)
        dz = dy * sigma * (1 + z * (1 - sigma))
    else:
        dz = dy
    taps = refs["weight"][...]
    # dx_t = sum_j w_j dz_{t + W-1-j}: the anti-causal correlation, the same taps.
    refs["dx"][0] = sum(taps[j:j + 1] * dz[W - 1 - j:W - 1 - j + Tc] for j in range(W)).astype(refs["dx"].dtype)
    # dw_j = sum_t x_{t - (W-1) + j} dz_t over the chunk's rows: the forward's shifted copies again.
    refs["dweight"][0, 0] = jnp.concatenate(
        [jnp.sum(window[j:j + Tc] * dz[:Tc], axis=0, keepdims=True) for j in range(W)], axis=0)
    if "dbias" in refs:
        refs["dbias"][0, 0] = jnp.sum(dz[:Tc], axis=0, keepdims=True)
    if "dstate0" in refs:
        # The initial state's row r is x_{r - (W-1)}: sum_j w_j dz_{r - j}, from the first chunk.
        @pl.when(i == 0)
        def _():
            refs["dstate0"][0] = jnp.concatenate(
                [sum(taps[j:j + 1] * dz[r - j:r - j + 1] for j in range(r + 1)) for r in range(W - 1)], axis=0)


def _conv_call(kernel, cfg: ConvConfig, inputs: dict, outputs: dict, semantics: tuple):
    inputs = {name: x for name, x in inputs.items() if x is not None}
    outputs = {name: x for name, x in outputs.items() if x is not None}
    Tc, Cb, W = cfg.rows, cfg.channels, cfg.W
    last_halo = pl.cdiv(cfg.T, _HALO) - 1
    per = Tc // _HALO  # halo blocks per chunk
    tokens = pl.BlockSpec((1, Tc, Cb), lambda b, c, i: (b, i, c))
    before = pl.BlockSpec((1, _HALO, Cb), lambda b, c, i: (b, jnp.maximum(i * per - 1, 0), c))
    after = pl.BlockSpec((1, _HALO, Cb), lambda b, c, i: (b, jnp.minimum((i + 1) * per, last_halo), c))
    partial_sums = lambda rows: pl.BlockSpec((1, 1, rows, Cb), lambda b, c, i: (b, i, 0, c))  # noqa: E731
    specs = dict(x=tokens, before=before, after=after, dy=tokens, dy_after=after,
                 state0=pl.BlockSpec((1, W - 1, Cb), lambda b, c, i: (b, 0, c)),
                 weight=pl.BlockSpec((W, Cb), lambda b, c, i: (0, c)), bias=pl.BlockSpec((1, Cb), lambda b, c, i: (0, c)),
                 y=tokens, dx=tokens, dweight=partial_sums(W), dbias=partial_sums(1))
    specs["dstate0"] = specs["state0"]
    B = inputs["x"].shape[0]
    results = pl.pallas_call(
        partial(kernel, cfg, tuple(inputs) + tuple(outputs)), grid=(B, cfg.C // Cb, cfg.chunks),
        in_specs=[specs[name] for name in inputs], out_specs=[specs[name] for name in outputs],
        out_shape=list(outputs.values()),
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        interpret=pltpu.InterpretParams() if cfg.interpret else False)(*inputs.values())
    return dict(zip(outputs, results))


def _halos(cfg: ConvConfig, x):
    return dict(before=x) if cfg.W > 1 else {}


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _conv(cfg: ConvConfig, x, weight, bias, state0):
    return _conv_call(_conv_forward_kernel, cfg, dict(x=x, **_halos(cfg, x), state0=state0, weight=weight, bias=bias),
                      dict(y=jax.ShapeDtypeStruct(x.shape, x.dtype)), ("parallel",) * 3)["y"]


def _conv_vjp_forward(cfg, x, weight, bias, state0):
    return _conv(cfg, x, weight, bias, state0), (x, weight, bias, state0)


def _conv_vjp_backward(cfg, saved, dy):
    x, weight, bias, state0 = saved
    B = x.shape[0]
    halos = dict(before=x, after=x, dy_after=dy) if cfg.W > 1 else {}
    sums = lambda rows: jax.ShapeDtypeStruct((B, cfg.chunks, rows, cfg.C), jnp.float32)  # noqa: E731
    grads = _conv_call(_conv_gradient_kernel, cfg,
                       dict(x=x, dy=dy, **halos, state0=state0, weight=weight, bias=bias),
                       dict(dx=jax.ShapeDtypeStruct(x.shape, x.dtype), dweight=sums(cfg.W),
                            dbias=None if bias is None else sums(1),
                            dstate0=None if state0 is None else jax.ShapeDtypeStruct(state0.shape, jnp.float32)),
                       # The chunk axis (last) sequential: the initial state's gradient, one block written
                       # by the first chunk, stays resident across it (split across cores, it would not).
                       ("parallel", "parallel", "arbitrary"))
    dbias = None if bias is None else jnp.sum(grads["dbias"], axis=(0, 1))
    return grads["dx"], jnp.sum(grads["dweight"], axis=(0, 1)), dbias, grads.get("dstate0")


_conv.defvjp(_conv_vjp_forward, _conv_vjp_backward)


def conv(x, weight, bias, state0, *, silu: bool, final: bool, interpret: bool):
    """The short convolution's y [B, S, C] (x's dtype) and final state [B, C, W-1] fp32 (None unless
    final, or W = 1) on x [B, S, C], weight [C, W] fp32, bias [C] or None, state0 [B, C, W-1] fp32 or
    None, checked by the caller. The final state, the last W-1 inputs, is a slice XLA takes (and
    differentiates)."""
    B, T, C = x.shape
    W = weight.shape[1]
    if W - 1 > _HALO:
        raise ValueError(f"flat: weight: the TPU kernel's windows reach back at most {_HALO} rows, expected W <= "
                         f"{_HALO + 1}, got W = {W}; backend='cpu' runs it")
    rows, channels = conv_blocks(T, C)
    cfg = ConvConfig(T, C, W, rows, channels, bool(silu), bool(interpret))
    before = None if state0 is None else jnp.swapaxes(state0, 1, 2)  # [B, W-1, C]: time-major rows
    y = _conv(cfg, x, jnp.swapaxes(weight, 0, 1), None if bias is None else bias.reshape(1, C), before)
    if not final or W == 1:
        return y, None
    start = jnp.zeros((B, W - 1, C), jnp.float32) if before is None else before
    last = jnp.concatenate([start, x.astype(jnp.float32)], axis=1)[:, T:]  # the last W-1 inputs
    return y, jnp.swapaxes(last, 1, 2)
