"""The additive variants (la, retnet, mamba2, gla) as Pallas TPU kernels, forward and backward: the
seed paper's fused block-recurrent forward and its two backward kernels (state passing, then the
gradients walking the chunks last to first), wired with ``jax.custom_vjp``. flat.jax.ops dispatches
here with ``backend="tpu"`` (Mosaic, for a TPU) or ``backend="interpret"`` (the same kernels run by
Pallas's TPU interpreter, on any platform); docs/tpu.md says what runs and how it was checked.

Layout (one program per batch item, head group and chunk; the chunk axis is sequential):

- q, k [B, S, N*K], v [B, S, N*V]: the projection's layout ([B, S, N, K] reshaped, free), read by
  BlockSpecs of one chunk and G heads, [C, G*K]: a head is a lane-aligned column slice when K is a
  multiple of 128 (the TPU's (8, 128) tiling), so every block is rectangular.
- the gate: per channel (gla) in the same layout [B, S, N*K], fp32; one value per head (mamba2,
  retnet broadcast over S) as [B, N/G, S, G], so a chunk's block [C, G] is whole in its last axis.
- the fp32 state of the program's G heads, [G, K, V], in a VMEM scratch for the whole sequence.

G heads share each MXU dot (a batched dot_general over the head axis): 8 for the per-channel gate,
4 otherwise (the paper's), where N allows and G*K, G*V fill the 128 lanes; else all N heads.
"""

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Gate kinds: none (la), one value per head and token (mamba2; retnet's per-head constant is
# broadcast over S before the kernel), one per channel (gla).
GATES = {"la": "none", "retnet": "head", "mamba2": "head", "gla": "channel"}
VARIANTS = tuple(GATES)

# Rows of a sub-block for the per-channel gate: its pairwise decays are a [G, c, c, K] tensor on the
# VPU, and its rows are the only ones whose decays are not factored through the carried state.
_CHANNEL_ROWS = 16
_LANES = 128


class Config(NamedTuple):
    """A call's static shape and options (hashable: custom_vjp's and pallas_call's static part)."""

    gate: str  # GATES' kinds
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


def head_group(gate: str, N: int, K: int, V: int) -> int:
    """G, the heads one program and one MXU dot take: the paper's 8 (per-channel gate) or 4, or the
    largest power of two below it dividing N whose G*K and G*V columns are whole lane tiles; N (a
    block as wide as the array, which the tiling rule allows) where none is."""
    G = 8 if gate == "channel" else 4
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
    same = jax.lax.div(i, block) == jax.lax.div(j, block)  # truncating (i, j >= 0): floor division's sign test
    # lowers through the chip's description, which export without a TPU lacks
    return jnp.where(same & ((j >= i) if upper else (j <= i)), 1.0, 0.0).astype(jnp.float32)


def _causal(c: int):
    """[1, c, c]: s <= t, the causal mask of a sub-block's scores."""
    t = jax.lax.broadcasted_iota(jnp.int32, (1, c, c), 1)
    s = jax.lax.broadcasted_iota(jnp.int32, (1, c, c), 2)
    return s <= t


# ---- One sub-block of c rows: the recurrence's chunkwise form and its gradient -------------------
#
# Per head, with gam the gate's prefix sum within the sub-block (gam_L its last row; [G, c, K] for a
# per-channel gate, [G, c, 1] for a per-head one, None without a gate):
#   o   = scale ((q * e^gam) S_in + sum_{s<=t} <q_t, k_s e^(gam_t - gam_s)> v_s)
#   S_out = e^gam_L * S_in + (k * e^(gam_L - gam))^T v
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


def _scores(q, k, decay, c: int, fast: bool):
    """A [G, c, c]: <q_t, k_s> with the decay between s and t, s <= t."""
    if decay is not None and decay.ndim == 4:  # per channel: on the VPU, pairwise
        return jnp.sum(q[:, :, None, :] * k[:, None, :, :] * decay, axis=-1)
    a = _dot(q, k, (2, 2), fast)
    return jnp.where(_causal(c), a, 0.0) if decay is None else a * decay


def _update(S, k, v, gam, fast: bool):
    """S_out from S_in [G, K, V]."""
    if gam is None:
        return S + _dot(k, v, (1, 1), fast)
    last = gam[:, -1:, :]  # [G, 1, K or 1]
    return jnp.exp(jnp.swapaxes(last, 1, 2)) * S + _dot(k * jnp.exp(last - gam), v, (1, 1), fast)


def _output(S, q, k, v, gam, c: int, scale: float, fast: bool):
    """o [G, c, V] of a sub-block from its carried state S [G, K, V]."""
    decay = None if gam is None else _decays(gam, c)
    a = _scores(q, k, decay, c, fast)
    qd = q if gam is None else q * jnp.exp(gam)
    return scale * (_dot(a, v, (2, 1), fast) + _dot(qd, S, (2, 1), fast))


def _gradient(S, dS, q, k, v, do, gam, c: int, scale: float, fast: bool):
    """A sub-block's (dq, dk, dv, dS_in) from dS = dS_out [G, K, V] and its S_in. The terms through
    o carry the scale; those through S_out do not."""
    decay = None if gam is None else _decays(gam, c)
    da = jnp.where(_causal(c), _dot(do, v, (2, 2), fast), 0.0)  # <do_t, v_s>, s <= t
    a = _scores(q, k, decay, c, fast)
    if decay is not None and decay.ndim == 4:  # per channel, pairwise on the VPU
        dq = jnp.sum(da[..., None] * k[:, None, :, :] * decay, axis=2)
        dk = jnp.sum(da[..., None] * q[:, :, None, :] * decay, axis=1)
    else:
        dw = da if decay is None else da * decay
        dq = _dot(dw, k, (2, 1), fast)
        dk = _dot(dw, q, (1, 1), fast)
    dv = _dot(a, do, (1, 1), fast)
    from_state = _dot(do, S, (2, 2), fast)  # [G, c, K]: do_t S_in^T
    to_state = _dot(v, dS, (2, 2), fast)  # [G, c, K]: dS_out v_s
    if gam is None:
        return (scale * (dq + from_state), scale * dk + to_state, scale * dv + _dot(k, dS, (2, 1), fast),
                dS + scale * _dot(q, do, (1, 1), fast))
    last = gam[:, -1:, :]
    into = jnp.exp(last - gam)  # e^(gam_L - gam_s)
    dq = scale * (dq + jnp.exp(gam) * from_state)
    dk = scale * dk + into * to_state
    dv = scale * dv + _dot(k * into, dS, (2, 1), fast)
    dS_in = jnp.exp(jnp.swapaxes(last, 1, 2)) * dS + scale * _dot(q * jnp.exp(gam), do, (1, 1), fast)
    return dq, dk, dv, dS_in


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


def _forward_kernel(cfg: Config, has_h0: bool, readout: bool, *refs):
    """The fused block-recurrent forward (readout: o, and ht at the end) or the backward's state
    passing (not readout: each chunk's starting state), one chunk of G heads per grid step."""
    refs = list(refs)
    q_ref = refs.pop(0) if readout else None
    k_ref, v_ref = refs.pop(0), refs.pop(0)
    g_ref = refs.pop(0) if cfg.gate != "none" else None
    h0_ref = refs.pop(0) if has_h0 else None
    o_ref = refs.pop(0) if readout else None
    ht_ref = refs.pop(0) if readout and cfg.final else None
    states_ref = None if readout else refs.pop(0)
    (state,) = refs
    i = pl.program_id(2)

    @pl.when(i == 0)
    def _():
        state[...] = h0_ref[0] if has_h0 else jnp.zeros(state.shape, jnp.float32)

    if states_ref is not None:
        states_ref[0, 0] = state[...]
    valid = _valid(cfg, i)
    G, c = cfg.heads, cfg.rows
    k, v = _heads(k_ref[0], valid, cfg.K, G), _heads(v_ref[0], valid, cfg.V, G)
    q = None if q_ref is None else _heads(q_ref[0], valid, cfg.K, G)
    gam = _gate_prefix(cfg, g_ref, valid)
    S = state[...]
    outputs = []
    for m in range(cfg.chunk // c):
        km, vm, gm = _rows(k, m, c), _rows(v, m, c), _rows(gam, m, c)
        if q is not None:
            outputs.append(_output(S, _rows(q, m, c), km, vm, gm, c, cfg.scale, cfg.fast))
        S = _update(S, km, vm, gm, cfg.fast)
    state[...] = S
    if o_ref is not None:
        _store(o_ref, jnp.concatenate(outputs, axis=1), cfg.V, G)

    if ht_ref is not None:
        @pl.when(i == cfg.chunks - 1)
        def _():
            ht_ref[0] = S


def _gradient_kernel(cfg: Config, has_h0: bool, has_dht: bool, *refs):
    """The gradient kernel: chunks last to first (the index maps reverse the grid's chunk axis),
    dS, the gradient of the state entering the current chunk, in a VMEM scratch."""
    refs = list(refs)
    q_ref, k_ref, v_ref = refs[:3]
    refs = refs[3:]
    g_ref = refs.pop(0) if cfg.gate != "none" else None
    states_ref, do_ref = refs.pop(0), refs.pop(0)
    dht_ref = refs.pop(0) if has_dht else None
    dq_ref, dk_ref, dv_ref = refs[:3]
    refs = refs[3:]
    dg_ref = refs.pop(0) if cfg.gate != "none" else None
    dh0_ref = refs.pop(0) if has_h0 else None
    (dstate,) = refs
    step = pl.program_id(2)
    i = cfg.chunks - 1 - step

    @pl.when(step == 0)
    def _():
        dstate[...] = dht_ref[0] if has_dht else jnp.zeros(dstate.shape, jnp.float32)

    valid = _valid(cfg, i)
    G, c, K, V = cfg.heads, cfg.rows, cfg.K, cfg.V
    q = _heads(q_ref[0], valid, K, G)
    k, v = _heads(k_ref[0], valid, K, G), _heads(v_ref[0], valid, V, G)
    do = _heads(do_ref[0], valid, V, G)
    gam = _gate_prefix(cfg, g_ref, valid)
    blocks = cfg.chunk // c
    starts = [states_ref[0, 0]]  # each sub-block's S_in, recomputed from the chunk's
    for m in range(blocks - 1):
        starts.append(_update(starts[-1], _rows(k, m, c), _rows(v, m, c), _rows(gam, m, c), cfg.fast))
    dS_end = dstate[...]
    dS = dS_end
    grads = []
    for m in reversed(range(blocks)):
        dqm, dkm, dvm, dS = _gradient(starts[m], dS, _rows(q, m, c), _rows(k, m, c), _rows(v, m, c),
                                      _rows(do, m, c), _rows(gam, m, c), c, cfg.scale, cfg.fast)
        grads.append((dqm, dkm, dvm))
    dstate[...] = dS
    dq, dk, dv = (jnp.concatenate([g[n] for g in reversed(grads)], axis=1) for n in range(3))
    _store(dq_ref, dq, K, G)
    _store(dk_ref, dk, K, G)
    _store(dv_ref, dv, V, G)

    if dg_ref is not None:
        # d log-gate: the suffix sum within the chunk of q.dq - k.dk, plus the
        # boundary term rowsum(S_end * dS_end) shared by every row (the paper's), S_end the state
        # leaving the chunk: one more update from the last sub-block's start.
        S_end = _update(starts[-1], _rows(k, blocks - 1, c), _rows(v, blocks - 1, c), _rows(gam, blocks - 1, c),
                        cfg.fast)
        x = q.astype(jnp.float32) * dq - k.astype(jnp.float32) * dk  # [G, C, K]
        boundary = jnp.sum(S_end * dS_end, axis=2)  # [G, K]
        if cfg.gate == "head":
            x, boundary = jnp.sum(x, axis=2), jnp.sum(boundary, axis=1, keepdims=True)  # [G, C], [G, 1]
            suffix = _scan(_ones(cfg.chunk, cfg.chunk, upper=True), jnp.swapaxes(x, 0, 1))  # [C, G]
            dg_ref[0, 0] = suffix + jnp.swapaxes(boundary, 0, 1)
        else:
            columns = jnp.concatenate([x[h] for h in range(G)], axis=1)  # [C, G*K]
            dg_ref[0] = _scan(_ones(cfg.chunk, cfg.chunk, upper=True), columns) + jnp.concatenate(
                [boundary[h][None, :] for h in range(G)], axis=1)

    if dh0_ref is not None:
        @pl.when(step == cfg.chunks - 1)
        def _():
            dh0_ref[0] = dS


# ---- pallas_call: grids and BlockSpecs ---------------------------------------------------------


def _specs(cfg: Config, reverse: bool):
    """The BlockSpecs of one chunk of G heads: (token columns of width w, scalar gate, state)."""
    C, G = cfg.chunk, cfg.heads
    chunk = (lambda i: cfg.chunks - 1 - i) if reverse else (lambda i: i)

    def tokens(width):  # [B, S, N*width]
        return pl.BlockSpec((1, C, G * width), lambda b, h, i: (b, chunk(i), h))

    head_gate = pl.BlockSpec((1, 1, C, G), lambda b, h, i: (b, h, chunk(i), 0))  # [B, N/G, S, G]
    state = pl.BlockSpec((1, G, cfg.K, cfg.V), lambda b, h, i: (b, h, 0, 0))  # [B, N, K, V], resident
    return tokens, head_gate, state


def _gate_spec(cfg: Config, reverse: bool):
    tokens, head_gate, _ = _specs(cfg, reverse)
    return tokens(cfg.K) if cfg.gate == "channel" else head_gate


def _call(kernel, cfg: Config, B: int, in_specs, out_specs, out_shape):
    return pl.pallas_call(
        kernel, grid=(B, cfg.N // cfg.heads, cfg.chunks), in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((cfg.heads, cfg.K, cfg.V), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=pltpu.InterpretParams() if cfg.interpret else False)


def _forward(cfg: Config, q, k, v, g, h0, out_dtype):
    B = q.shape[0]
    tokens, _, state = _specs(cfg, False)
    gate = [] if g is None else [g]
    initial = [] if h0 is None else [h0]
    out_specs = [tokens(cfg.V)] + ([state] if cfg.final else [])
    out_shape = [jax.ShapeDtypeStruct((B, cfg.T, cfg.N * cfg.V), out_dtype)]
    if cfg.final:
        out_shape.append(jax.ShapeDtypeStruct((B, cfg.N, cfg.K, cfg.V), jnp.float32))
    in_specs = [tokens(cfg.K), tokens(cfg.K), tokens(cfg.V)] + [_gate_spec(cfg, False)] * len(gate) + [state] * len(
        initial)
    results = _call(partial(_forward_kernel, cfg, h0 is not None, True), cfg, B, in_specs, out_specs, out_shape)(
        q, k, v, *gate, *initial)
    return results[0], (results[1] if cfg.final else None)


def _states(cfg: Config, k, v, g, h0):
    """The backward's state passing: each chunk's starting state, [B, chunks, N, K, V] fp32."""
    B = k.shape[0]
    tokens, _, state = _specs(cfg, False)
    gate = [] if g is None else [g]
    initial = [] if h0 is None else [h0]
    in_specs = [tokens(cfg.K), tokens(cfg.V)] + [_gate_spec(cfg, False)] * len(gate) + [state] * len(initial)
    out_spec = pl.BlockSpec((1, 1, cfg.heads, cfg.K, cfg.V), lambda b, h, i: (b, i, h, 0, 0))
    out_shape = jax.ShapeDtypeStruct((B, cfg.chunks, cfg.N, cfg.K, cfg.V), jnp.float32)
    return _call(partial(_forward_kernel, cfg, h0 is not None, False), cfg, B, in_specs, out_spec, out_shape)(
        k, v, *gate, *initial)


def _gradients(cfg: Config, q, k, v, g, h0, states, do, dht):
    B = q.shape[0]
    tokens, _, state = _specs(cfg, True)
    chunk_state = pl.BlockSpec((1, 1, cfg.heads, cfg.K, cfg.V),
                               lambda b, h, i: (b, cfg.chunks - 1 - i, h, 0, 0))
    gate = [] if g is None else [g]
    in_specs = ([tokens(cfg.K), tokens(cfg.K), tokens(cfg.V)] + [_gate_spec(cfg, True)] * len(gate) +
                [chunk_state, tokens(cfg.V)] + ([state] if dht is not None else []))
    out_specs = [tokens(cfg.K), tokens(cfg.K), tokens(cfg.V)] + [_gate_spec(cfg, True)] * len(gate) + (
        [state] if h0 is not None else [])
    out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    out_shape += [jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in gate]
    if h0 is not None:
        out_shape.append(jax.ShapeDtypeStruct(h0.shape, jnp.float32))
    results = _call(partial(_gradient_kernel, cfg, h0 is not None, dht is not None), cfg, B, in_specs, out_specs,
                    out_shape)(q, k, v, *gate, states, do, *([] if dht is None else [dht]))
    dq, dk, dv = results[:3]
    dg = results[3] if g is not None else None
    dh0 = results[-1] if h0 is not None else None
    return dq, dk, dv, dg, dh0


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _recurrence(cfg: Config, out_dtype, q, k, v, g, h0):
    return _forward(cfg, q, k, v, g, h0, out_dtype)


def _recurrence_forward(cfg, out_dtype, q, k, v, g, h0):
    return _forward(cfg, q, k, v, g, h0, out_dtype), (q, k, v, g, h0)


def _recurrence_backward(cfg, out_dtype, saved, cotangents):
    q, k, v, g, h0 = saved
    do, dht = cotangents
    states = _states(cfg, k, v, g, h0)
    return _gradients(cfg, q, k, v, g, h0, states, do, dht if cfg.final else None)


_recurrence.defvjp(_recurrence_forward, _recurrence_backward)


def recurrence(variant: str, q, k, v, g, h0, *, scale: float, chunk: int, fast: bool, final: bool, interpret: bool,
               out_dtype):
    """o [B, S, N, V] (out_dtype) and the final state [B, N, K, V] fp32 (None unless final) of an
    additive variant on arrays of one head count N: q, k [B, S, N, K], v [B, S, N, V]; g [B, S, N, K]
    (gla), [B, S, N] (mamba2, retnet's broadcast over S), None (la); h0 [B, N, K, V] fp32 or None.
    Shapes and options are the caller's to have checked (flat.jax.ops checks them as the CPU path)."""
    B, T, N, K = q.shape
    V = v.shape[3]
    gate = GATES[variant]
    G = head_group(gate, N, K, V)
    cfg = Config(gate, T, N, K, V, G, chunk, float(scale), bool(fast), bool(final), bool(interpret))
    if gate == "channel":
        g = g.reshape(B, T, N * K)
    elif gate == "head":  # [B, S, N] -> [B, N/G, S, G]: a chunk of G heads' gates is one whole block
        g = jnp.swapaxes(g.reshape(B, T, N // G, G), 1, 2)
    o, ht = _recurrence(cfg, jnp.dtype(out_dtype), q.reshape(B, T, N * K), k.reshape(B, T, N * K),
                        v.reshape(B, T, N * V), g, h0)
    return o.reshape(B, T, N, V), ht
