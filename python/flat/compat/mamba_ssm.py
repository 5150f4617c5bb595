"""The ``mamba_ssm`` package's Mamba-2 functions on flat's kernels, for CPU tensors, with the
package's signatures, layouts and returns:

    mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, cu_seqlens=None, dt_softplus=False,
                              dt_limit=(0.0, float("inf")), return_final_states=False,
                              return_varlen_states=False)
        x [b, l, h, p], dt [b, l, h], A [h], B and C [b, l, g, n] (g dividing h: head i reads
        group i // (h / g)), D [h] or [h, p], z [b, l, h, p], dt_bias [h], initial_states
        [b, h, p, n], seq_idx [b, l], cu_seqlens [num_seqs + 1]. Returns out [b, l, h, p]; with
        return_final_states (out, final_states [b, h, p, n] float32); with return_varlen_states
        (out, varlen_states [num_seqs, h, p, n]) or (out, final_states, varlen_states).

    mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                     initial_states=None, seq_idx=None, dt_limit=(0.0, float("inf")),
                                     return_final_states=False, activation="silu",
                                     rmsnorm_weight=None, rmsnorm_eps=1e-6, outproj_weight=None,
                                     outproj_bias=None, headdim=None, ngroups=1,
                                     norm_before_gate=True)
        zxbcdt [b, l, 2 d_nonssm + 2 dim + 2 ngroups n + h] split into (x0 y0, z, xBC, dt); flat's
        convolution on xBC; the scan (dt_softplus); flat's gated RMS norm over groups of
        dim / ngroups channels (or without rmsnorm_weight the gate out * silu(z) in the scan);
        silu(x0) * y0 before it when d_nonssm > 0; the out projection (F.linear). Returns out, or
        (out, final_states).

    selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None)
        One decoding step: state [b, h, p, n] (or [b, p, n] without heads) updated in place,
        x and dt [b, h, p], A [h, p, n], B and C [b, g, n], D and dt_bias [h, p], z [b, h, p].
        Returns out [b, h, p] in x's dtype.

The scan is ``flat.torch.mamba2`` with q = C, k = B, v = x * dt, g = A * dt (dt after dt_bias,
softplus and the clamp to dt_limit, in float32), scale 1; mamba's states [.., p, n] are flat's
[.., K = n, V = p] transposed. The D skip, the z gate, dt's preparation are vectorised torch around
the kernel, in float32; out has x's dtype. mamba_chunk_scan_combined and
mamba_split_conv1d_scan_combined are differentiable in every float input (as in mamba_ssm).

selective_state_update is vectorised torch math in float32, not flat's decode: mamba's state is
[.., headdim, dstate] in the model's dtype while flat's pool is float32 [P, H, K = dstate,
V = headdim], so flat's decode would need a transposed float32 copy of the state and a copy back,
more memory traffic than the update itself (one token: a few elementwise passes over the state);
and A [h, p, n] may vary along p and n, which flat's mamba2 (one decay per head) cannot express.
Like the package's kernel it is not differentiable (it runs under torch.no_grad()).

Differences from the package:

- Packed sequences: seq_idx [b, l] (nondecreasing along l; each run of equal ids one sequence) or
  cu_seqlens (b = 1), or both when they agree. mamba_ssm uses cu_seqlens only for the varlen
  states and segments by seq_idx; here cu_seqlens alone segments the scan too. As in the package,
  initial_states[i] starts row i's first sequence when that sequence's seq_idx is 0 (always
  without seq_idx); the other sequences start from zero; final_states are each row's last
  sequence's; varlen_states (which need cu_seqlens, b = 1) each sequence's, in C's dtype as in the
  package, and differentiable here.
- chunk_size is a computational choice: flat runs chunks of a multiple of 16 from 16 to 256
  (chunk_size rounded down to one, within that range); the results do not depend on it.
- Gates are not checked (flat.torch's check_values=False), as mamba_ssm does not: A * dt > 0 or
  non-finite values compute what they compute.
- mamba_split_conv1d_scan_combined: activation is None, "silu" or "swish" (mamba_ssm treats any
  other name as none; here it is refused).
- selective_state_update: state_batch_indices must address distinct rows of state.
- Bad input raises ValueError naming the argument ("flat: <arg>: expected ..., got ...").
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

import flat.torch as _ft
from flat._args import conv_activation

from ._checks import bad as _bad, cpu_tensor as _check, describe as _describe, pool_rows
from .causal_conv1d import sequence_offsets

__all__ = ["mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined", "selective_state_update"]


def _chunk(chunk_size) -> int:
    """flat's chunk for mamba's chunk_size: a multiple of 16 from 16 to 256."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise _bad("chunk_size", "a positive integer", repr(chunk_size))
    return min(256, max(16, chunk_size - chunk_size % 16))


def _limits(dt_limit) -> Tuple[float, float]:
    try:
        lo, hi = (float(v) for v in dt_limit)
    except (TypeError, ValueError):
        raise _bad("dt_limit", "a pair (min, max) of numbers", repr(dt_limit)) from None
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise _bad("dt_limit", "a pair (min, max) with min <= max", repr(dt_limit))
    return lo, hi


def _time_steps(dt: Tensor, dt_bias: Optional[Tensor], dt_softplus: bool, dt_limit) -> Tensor:
    """dt in float32 after the bias, softplus (threshold 20, as mamba_ssm's) and the clamp."""
    lo, hi = _limits(dt_limit)
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    if lo != -math.inf or hi != math.inf:
        dt = torch.clamp(dt, min=lo, max=hi)
    return dt


def _ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit,
         final: bool, varlen: bool):
    """The scan of mamba_chunk_scan_combined: (out [b, l, h, p] in x's dtype, final_states or None,
    varlen_states or None)."""
    x = _check("x", x, (None, None, None, None), "[b, l, h, p]")
    b, l, h, p = (int(n) for n in x.shape)
    dt = _check("dt", dt, (b, l, h), f"[b={b}, l={l}, h={h}]")
    A = _check("A", A, (h,), f"[h={h}]")
    B = _check("B", B, (b, l, None, None), f"[b={b}, l={l}, g, n]")
    g, n = int(B.shape[2]), int(B.shape[3])
    if g < 1 or h % g:
        raise _bad("B", f"a group count g dividing h={h}", list(B.shape))
    C = _check("C", C, (b, l, g, n), f"[b={b}, l={l}, g={g}, n={n}] (B's shape)")
    if D is not None:
        D = _check("D", D, (h,) if isinstance(D, Tensor) and D.dim() == 1 else (h, p), f"[h={h}] or [h={h}, p={p}]")
    if z is not None:
        z = _check("z", z, (b, l, h, p), f"[b={b}, l={l}, h={h}, p={p}] (x's shape)")
    if dt_bias is not None:
        dt_bias = _check("dt_bias", dt_bias, (h,), f"[h={h}]")
    if initial_states is not None:
        initial_states = _check("initial_states", initial_states, (b, h, p, n), f"[b={b}, h={h}, p={p}, n={n}]")
    chunk = _chunk(chunk_size)

    # The sequences: one per batch row, or packed along the flattened rows.
    cu = None
    if seq_idx is not None:
        cu = sequence_offsets(seq_idx, b, l)
    if cu_seqlens is not None:
        given = _check("cu_seqlens", cu_seqlens, (None,), "[num_seqs + 1]", kind="index").long()
        if b != 1:
            raise _bad("cu_seqlens", "batch size 1 (x [1, l, h, p])", f"x {list(x.shape)}")
        if given.numel() < 1 or int(given[0]) != 0 or int(given[-1]) != l or bool((given[1:] < given[:-1]).any()):
            raise _bad("cu_seqlens", f"nondecreasing offsets from 0 to l={l}", given.tolist())
        if cu is not None and not torch.equal(cu, _nonempty(given)):
            raise _bad("cu_seqlens", f"the sequences of seq_idx {cu.tolist()}", given.tolist())
        cu = given
    if varlen and cu_seqlens is None:
        raise _bad("cu_seqlens", "the sequences' offsets when return_varlen_states is True", None)

    dtf = _time_steps(dt, dt_bias, dt_softplus, dt_limit)  # [b, l, h] float32
    if b * l == 0:
        return _empty(x, C, initial_states, cu, final, varlen)
    gate = dtf * A.float()
    v = x.float() * dtf[..., None]
    q, k = C.float(), B.float()
    h0 = None if initial_states is None else initial_states.float().transpose(-1, -2)  # [b, h, n, p]
    options = dict(scale=1.0, chunk_size=chunk, use_qk_l2norm_in_kernel=False, check_values=False,
                   final_state_indices=None, token_state_indices=None)
    want_state = final or varlen
    if cu is None:
        y, ht = _ft.mamba2(q=q, k=k, v=v, g=gate, initial_state=h0, output_final_state=want_state, cu_seqlens=None,
                           initial_state_indices=None, **options)
        last = None
    else:
        starts, ends = cu[:-1], cu[1:]
        # Row i's first sequence reads initial_states[i] when its seq_idx is 0 (mamba_ssm's rule).
        reads = None
        if h0 is not None:
            first = (starts % l == 0) & (ends > starts)
            if seq_idx is not None:
                first &= seq_idx.reshape(-1)[starts.clamp(max=b * l - 1)] == 0
            reads = torch.where(first, torch.div(starts, l, rounding_mode="floor"), -1)
        flat = (1, b * l)
        y, ht = _ft.mamba2(q=q.reshape(*flat, g, n), k=k.reshape(*flat, g, n), v=v.reshape(*flat, h, p),
                           g=gate.reshape(*flat, h), initial_state=h0, output_final_state=want_state,
                           cu_seqlens=cu, initial_state_indices=reads, **options)
        y = y.reshape(b, l, h, p)
        # Each row's last sequence: the nonempty one ending at the row's end.
        nonempty = torch.nonzero(ends > starts).reshape(-1)
        last = nonempty[torch.searchsorted(ends[nonempty], torch.arange(1, b + 1) * l)]

    if D is not None:
        y = y + x.float() * (D.float()[:, None] if D.dim() == 1 else D.float())
    if z is not None:
        y = y * F.silu(z.float())
    out = y.to(x.dtype)

    final_states = varlen_states = None
    if final:
        states = ht if last is None else ht.index_select(0, last)
        final_states = states.transpose(-1, -2).contiguous()  # [b, h, p, n]
    if varlen:
        varlen_states = ht.transpose(-1, -2).to(C.dtype).contiguous()
    return out, final_states, varlen_states


def _empty(x, C, initial_states, cu, final: bool, varlen: bool):
    """_ssd's results without tokens: the initial states (zeros without) as the final states."""
    b, _, h, p = x.shape
    n = C.shape[-1]
    start = (initial_states.float() if initial_states is not None
             else torch.zeros((b, h, p, n), dtype=torch.float32))
    varlen_states = None
    if varlen:
        varlen_states = torch.zeros((int(cu.numel()) - 1, h, p, n), dtype=C.dtype)
        if initial_states is not None and varlen_states.shape[0]:
            varlen_states = torch.cat([start[:1].to(C.dtype), varlen_states[1:]])
    return x.new_empty(x.shape), start if final else None, varlen_states


def _nonempty(cu: Tensor) -> Tensor:
    """cu_seqlens without its empty sequences."""
    keep = torch.cat([torch.tensor([True]), cu[1:] > cu[:-1]])
    return cu[keep]


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """Mamba-2's chunked scan (SSD): h_t = exp(A dt_t) h_{t-1} + dt_t x_t B_t^T per head,
    out_t = h_t C_t + D x_t, times silu(z_t) with z. Returns out, (out, final_states),
    (out, varlen_states) or (out, final_states, varlen_states) as mamba_ssm does."""
    out, final_states, varlen_states = _ssd(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                            cu_seqlens, bool(dt_softplus), dt_limit, bool(return_final_states),
                                            bool(return_varlen_states))
    if not return_varlen_states:
        return (out, final_states) if return_final_states else out
    return (out, final_states, varlen_states) if return_final_states else (out, varlen_states)


def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                     initial_states=None, seq_idx=None, dt_limit=(0.0, float("inf")),
                                     return_final_states=False, activation="silu", rmsnorm_weight=None,
                                     rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                     ngroups=1, norm_before_gate=True):
    """Mamba-2's mixer after the input projection: the convolution of xBC, the scan, the gated
    RMS norm and the out projection. Returns out [b, l, out_dim] (or [b, l, d_nonssm + dim]
    without outproj_weight), or (out, final_states [b, h, p, n])."""
    zxbcdt = _check("zxbcdt", zxbcdt, (None, None, None), "[b, l, 2 d_nonssm + 2 dim + 2 ngroups n + h]")
    b, l, width = (int(s) for s in zxbcdt.shape)
    if isinstance(D, Tensor) and D.dim() == 1:
        h = int(_check("D", D, (None,), "[h] or [h, p]").shape[0])
        if isinstance(headdim, bool) or not isinstance(headdim, int) or headdim < 1:
            raise _bad("headdim", "a positive integer when D is [h]", repr(headdim))
        p = headdim
    else:
        h, p = (int(s) for s in _check("D", D, (None, None), "[h] or [h, p]").shape)
    if isinstance(ngroups, bool) or not isinstance(ngroups, int) or ngroups < 1 or h % ngroups:
        raise _bad("ngroups", f"a positive integer dividing h={h}", repr(ngroups))
    dim = h * p
    conv1d_weight = _check("conv1d_weight", conv1d_weight, (None, None), "[dim + 2 ngroups n, W]")
    channels = int(conv1d_weight.shape[0])
    n = (channels - dim) // ngroups // 2
    if n < 1 or channels != dim + 2 * ngroups * n:
        raise _bad("conv1d_weight", f"[dim + 2 ngroups n, W] with dim={dim}, ngroups={ngroups}",
                   list(conv1d_weight.shape))
    d_nonssm = (width - 2 * dim - 2 * ngroups * n - h) // 2
    if d_nonssm < 0 or width != 2 * d_nonssm + 2 * dim + 2 * ngroups * n + h:
        raise _bad("zxbcdt", f"[b, l, 2 d_nonssm + 2 dim + 2 ngroups n + h] with dim={dim}, ngroups={ngroups}, "
                   f"n={n}, h={h}", list(zxbcdt.shape))
    if conv1d_bias is not None:
        conv1d_bias = _check("conv1d_bias", conv1d_bias, (channels,), f"[{channels}]")
    dt_bias = _check("dt_bias", dt_bias, (h,), f"[h={h}]")
    if rmsnorm_weight is not None:
        rmsnorm_weight = _check("rmsnorm_weight", rmsnorm_weight, (dim,), f"[dim={dim}]")
    if outproj_weight is not None:
        outproj_weight = _check("outproj_weight", outproj_weight, (None, d_nonssm + dim),
                                f"[out_dim, {d_nonssm + dim}]")
        if outproj_bias is not None:
            _check("outproj_bias", outproj_bias, (int(outproj_weight.shape[0]),), f"[{int(outproj_weight.shape[0])}]")
    elif outproj_bias is not None:
        raise _bad("outproj_bias", "None without outproj_weight", _describe(outproj_bias))
    act = conv_activation(activation)

    zx0, z, xBC, dt = zxbcdt.split([2 * d_nonssm, dim, channels, h], dim=-1)
    cu = None if seq_idx is None else sequence_offsets(seq_idx, b, l)
    xin = xBC if xBC.dtype in (torch.float32, torch.bfloat16) else xBC.float()
    if cu is not None:
        xin = xin.reshape(1, b * l, channels)
    xBC, _ = _ft.conv(x=xin, weight=conv1d_weight.float(),
                      bias=None if conv1d_bias is None else conv1d_bias.float(), initial_state=None,
                      output_final_state=False, activation=act, cu_seqlens=cu, initial_state_indices=None,
                      final_state_indices=None, token_state_indices=None)
    xBC = xBC.reshape(b, l, channels)
    x, B, C = xBC.split([dim, ngroups * n, ngroups * n], dim=-1)
    x, B, C = x.reshape(b, l, h, p), B.reshape(b, l, ngroups, n), C.reshape(b, l, ngroups, n)
    zh = z.reshape(b, l, h, p)
    y, final_states, _ = _ssd(x, dt, A, B, C, chunk_size, D, zh if rmsnorm_weight is None else None, dt_bias,
                              initial_states, seq_idx, None, True, dt_limit, bool(return_final_states), False)
    y = y.reshape(b, l, dim)
    if rmsnorm_weight is not None:
        # Normalised over groups of dim / ngroups channels: flat's norm per head, a weight row per group.
        groups = (b, l, ngroups, dim // ngroups) if ngroups > 1 else (b, l, dim)
        gate = z if z.dtype == y.dtype else z.to(y.dtype)
        y = _ft.rms_norm_gated(x=y.reshape(groups), g=gate.reshape(groups), weight=rmsnorm_weight.reshape(groups[2:]),
                               activation="silu", eps=float(rmsnorm_eps),
                               norm_before_gate=bool(norm_before_gate)).reshape(b, l, dim)
    if d_nonssm:
        x0, y0 = zx0.chunk(2, dim=-1)
        y = torch.cat([(F.silu(x0.float()) * y0.float()).to(y.dtype), y], dim=-1)
    out = y.to(zxbcdt.dtype)
    if outproj_weight is not None:
        out = F.linear(out.to(outproj_weight.dtype), outproj_weight, outproj_bias)
    return (out, final_states) if return_final_states else out


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None):
    """One token of the recurrence, state updated in place: state = state * exp(dt A) +
    dt x B^T; out = state C + D x, times silu(z) with z. Returns out in x's dtype."""
    with torch.no_grad():
        if isinstance(state, Tensor) and state.dim() == 3:  # no head axis: one head
            def head(t):
                return None if t is None or not isinstance(t, Tensor) else t.unsqueeze(1) if t.dim() == 2 else t

            out = _step(state.unsqueeze(1), head(x), head(dt), A.unsqueeze(0) if isinstance(A, Tensor) else A,
                        head(B), head(C), D.unsqueeze(0) if isinstance(D, Tensor) else D, head(z),
                        dt_bias.unsqueeze(0) if isinstance(dt_bias, Tensor) else dt_bias, dt_softplus,
                        state_batch_indices)
            return out.squeeze(1)
        return _step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)


def _step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices):
    state = _check("state", state, (None, None, None, None), "[batch, h, p, n] or [batch, p, n]")
    _, h, p, n = (int(s) for s in state.shape)
    x = _check("x", x, (None, h, p), f"[b, h={h}, p={p}]")
    b = int(x.shape[0])
    dt = _check("dt", dt, (b, h, p), f"[b={b}, h={h}, p={p}] (x's shape)")
    A = _check("A", A, (h, p, n), f"[h={h}, p={p}, n={n}]")
    B = _check("B", B, (b, None, n), f"[b={b}, g, n={n}]")
    g = int(B.shape[1])
    if g < 1 or h % g:
        raise _bad("B", f"a group count g dividing h={h}", list(B.shape))
    C = _check("C", C, (b, g, n), f"[b={b}, g={g}, n={n}] (B's shape)")
    if D is not None:
        D = _check("D", D, (h, p), f"[h={h}, p={p}]")
    if z is not None:
        z = _check("z", z, (b, h, p), f"[b={b}, h={h}, p={p}] (x's shape)")
    if dt_bias is not None:
        dt_bias = _check("dt_bias", dt_bias, (h, p), f"[h={h}, p={p}]")
    rows = None
    if state_batch_indices is not None:
        rows = pool_rows("state_batch_indices", state_batch_indices, b, "state", int(state.shape[0]), f"[b={b}]",
                         kind="index")
    elif int(state.shape[0]) != b:
        raise _bad("state", f"[b={b}, h={h}, p={p}, n={n}] (x's batch)", list(state.shape))

    dtf = _time_steps(dt, dt_bias, bool(dt_softplus), (-math.inf, math.inf))  # [b, h, p]
    r = h // g
    Bh = B.float().repeat_interleave(r, dim=1)  # [b, h, n]
    Ch = C.float().repeat_interleave(r, dim=1)
    old = (state if rows is None else state.index_select(0, rows)).float()
    new = old * torch.exp(dtf[..., None] * A.float()) + (dtf * x.float())[..., None] * Bh[:, :, None, :]
    out = torch.einsum("bhpn,bhn->bhp", new, Ch)
    if D is not None:
        out = out + x.float() * D.float()
    if z is not None:
        out = out * F.silu(z.float())
    if rows is None:
        state.copy_(new)
    else:
        state.index_copy_(0, rows, new.to(state.dtype))
    return out.to(x.dtype)
