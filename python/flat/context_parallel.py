"""Context parallelism on ``torch.distributed``: one sequence cut along T across the ranks of a
process group, only states crossing between them (flat.torch.context_parallel).

    cp = flat.torch.context_parallel(group)          # None: the default group
    o, final_state = cp.gated_deltanet(q, k, v, g, beta, initial_state=h0, output_final_state=True)

Every rank passes its share of the tokens, rank 0 the first (``[B, T_r, H, K]``; the shares may be
uneven, shorter than a chunk or empty) and every other argument as flat.torch takes it. The
functions are flat.torch's (la, retnet, mamba2, gla, deltanet, gated_deltanet, kda, gdn2, sla, and the
short convolution conv), with the same arguments, and return the rank's share of ``o`` and, on every
rank, the final state of the whole sequence. Forward and backward equal one process's on the whole
sequence within rounding. The convolution exchanges each rank's last W-1 inputs the same way (one
all-gather), each rank taking its predecessors' as its initial state.

How (the seed's all-gather of states; FLA's context parallelism and LASP-2 do the same): every
variant's state update is ``H_t = A_t H_{t-1} + k_t u_t^T``, with ``A_t`` acting on the state's K
rows alone and its V columns independent. So a share's effect on any state is ``H -> M H + S``:
``S`` the share's final state from zero, ``M`` its transition (K x K: the product of its ``A_t``;
a decay vector for the additive family, ``prod (I - beta k k^T) Diag(decay)`` for the delta family).
Both come from one run of the fused kernels over the share with K columns appended to the values
(zero values, gdn2's write gate one) and the initial state ``[0, I]``: the final state is ``[S, M]``,
formed chunkwise by the same kernels, never token by token. One all-gather of ``[S, M]`` (and rank
0's initial state) per call, of ``B H K (2V + K)`` floats whatever T is; each rank folds its
predecessors' into its true initial state and runs its share from it. The backward is autograd's
through the same steps: the all-gather's gradient is one all-reduce of that size.

Cost per rank: the share's forward twice (once V + K wide, once V wide) and the backward of both.

The initial state is read on rank 0 (the other ranks' ``initial_state`` is ignored and may be None),
and its gradient arrives whole on rank 0's tensor. The final state is computed on every rank from
the gathered states: a loss that uses it on every rank counts it once per rank.

The backward's all-reduce is a collective: every rank must run its backward through its outputs
(as every rank of data parallelism runs its backward), or the others wait for it.

Before the all-gather every rank says whether its own share's pass succeeded (a one-element
all-reduce): a rank whose arguments are refused raises its own error and the others raise one that
names it, so no rank waits on the all-gather. Not yet: ``cu_seqlens`` and state pools (refused),
la's ``normalize`` (refused).
"""

from types import SimpleNamespace
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor


class _AllGather(torch.autograd.Function):
    """Every rank's tensor stacked [world, ...] on every rank; the gradient of a rank's own tensor
    is the sum of every rank's gradient of its slot (one all-reduce)."""

    @classmethod
    def apply(cls, group, x: Tensor) -> Tensor:
        # Every rank joins the backward's collective: a rank whose own share needs no gradient (no
        # tokens, inputs without one) still gets one for the tensors it gathered from the others.
        if torch.is_grad_enabled() and not x.requires_grad:
            x = x.detach().requires_grad_()
        return super().apply(group, x)

    @staticmethod
    def forward(ctx, group, x: Tensor) -> Tensor:
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return None, grad[dist.get_rank(ctx.group)]


def _agree(group, error: Optional[BaseException]) -> None:
    """Raises on every rank when any rank's share failed: the failing rank its own error, the
    others one naming the first rank that failed."""
    failed = torch.tensor([dist.get_world_size(group) if error is None else dist.get_rank(group)], dtype=torch.int64)
    dist.all_reduce(failed, op=dist.ReduceOp.MIN, group=group)
    if error is not None:
        raise error
    if failed.item() < dist.get_world_size(group):
        raise RuntimeError(f"flat.torch.context_parallel: rank {failed.item()} of the group raised on its share "
                           "(its own error says why); this rank stops too")


def _attached(out: Tensor, state: Tensor) -> Tensor:
    """out, made to depend on the gathered states when it is empty (a share of no tokens), so that
    this rank's backward reaches the all-gather's gradient, a collective every rank must join."""
    if out.numel():
        return out
    return out + (state.sum() * 0).to(out.dtype)


def _widened(x: Optional[Tensor], columns: int, fill: float) -> Optional[Tensor]:
    """x [.., V] with `columns` more columns of `fill` (values, gdn2's write gate)."""
    if x is None:
        return None
    return torch.cat([x, x.new_full((*x.shape[:-1], columns), fill)], dim=-1)


def _context_parallel_run(run, group):
    """flat.torch's _run with the sequence split across `group` (the module's docstring)."""

    def cp_run(variant, q, k, v, g=None, beta=None, b=None, w=None, *, initial_state, output_final_state, sequences,
               **options):
        rank = dist.get_rank(group)
        error, local = None, None
        try:
            if any(x is not None for x in sequences):
                raise ValueError("flat.torch.context_parallel: cu_seqlens and state pools are not supported yet: "
                                 "pass each rank's share of one dense batch")
            # The state's heads: the most of any input's (one with fewer is shared, python/flat/_api.py).
            H = max(x.shape[2] for x in (q, k, v, g, beta, b, w) if x is not None and x.dim() >= 3)
            B, K, V = v.shape[0], k.shape[3], v.shape[3]
            # [S, M]: the share's final state from zero and its transition, in one run V + K wide.
            start = torch.cat([torch.zeros(B, H, K, V), torch.eye(K).expand(B, H, K, K)], dim=-1)
            _, local = run(variant, q, k, _widened(v, K, 0.0), g, beta, b, _widened(w, K, 1.0), initial_state=start,
                           output_final_state=True, sequences=sequences, **options)
            first = initial_state if rank == 0 and initial_state is not None else torch.zeros(B, H, K, V)
            if tuple(first.shape) != (B, H, K, V):
                raise ValueError(f"flat.torch.context_parallel: initial_state: expected [B, H, K, V] = "
                                 f"{[B, H, K, V]}, got {list(first.shape)}")
        except Exception as e:  # every rank learns of it before the all-gather, so none waits there
            error = e
        _agree(group, error)
        # [world, B, H, K, 2V + K]: every rank's S, M and (rank 0's) initial state.
        gathered = _AllGather.apply(group, torch.cat([local, first.float()], dim=-1))
        state = gathered[0, ..., V + K:]
        for j in range(dist.get_world_size(group)):
            if j == rank:
                o, _ = run(variant, q, k, v, g, beta, b, w, initial_state=state, output_final_state=False,
                           sequences=sequences, **options)
                o = _attached(o, state)
                if not output_final_state:
                    return o, None
            state = gathered[j, ..., V:V + K] @ state + gathered[j, ..., :V]
        return o, state

    return cp_run


def _context_parallel_conv(conv, group):
    """flat.torch.conv with the sequence split across `group`: each rank's last W-1 inputs (and rank
    0's initial state) in one all-gather, folded into each rank's initial state."""

    def cp_conv(x, weight, bias=None, initial_state=None, output_final_state=False, activation=None,
                cu_seqlens=None, **pool):
        if weight.shape[-1] == 1:  # no window reaches back: nothing to exchange
            return conv(x, weight, bias, initial_state, output_final_state, activation, cu_seqlens, **pool)
        rank = dist.get_rank(group)
        error, payload = None, None
        try:
            if cu_seqlens is not None or any(v is not None for v in pool.values()):
                raise ValueError("flat.torch.context_parallel: conv: cu_seqlens and state pools are not supported "
                                 "yet: pass each rank's share of one dense batch")
            B, T, C = x.shape
            width = weight.shape[1] - 1  # the state's inputs
            kept = min(T, width)
            # The share's last W-1 inputs [B, C, W-1], those it lacks zero (its length says how many hold).
            tail = torch.zeros(B, C, width)
            if kept:
                tail = torch.cat([torch.zeros(B, C, width - kept), x[:, T - kept:].float().transpose(1, 2)], dim=-1)
            first = initial_state if rank == 0 and initial_state is not None else torch.zeros(B, C, width)
            if tuple(first.shape) != (B, C, width):
                raise ValueError(f"flat.torch.context_parallel: conv: initial_state: expected [B, C, W-1] = "
                                 f"{[B, C, width]}, got {list(first.shape)}")
            payload = torch.cat([tail.reshape(-1), first.float().reshape(-1), torch.tensor([float(kept)])])
        except Exception as e:  # every rank learns of it before the all-gather, so none waits there
            error = e
        _agree(group, error)
        gathered = _AllGather.apply(group, payload)  # [world, 2 B C (W-1) + 1]
        size = B * C * width
        state = gathered[0, size:2 * size].reshape(B, C, width)
        for j in range(dist.get_world_size(group)):
            if j == rank:
                y, _ = conv(x, weight, bias, initial_state=state, activation=activation)
                y = _attached(y, state)
                if not output_final_state:
                    return y, None
            held = int(gathered[j, -1].item())
            share = gathered[j, :size].reshape(B, C, width)[..., width - held:]
            state = torch.cat([state, share], dim=-1)[..., held:]
        return y, state

    return cp_conv


def context_parallel(group=None) -> SimpleNamespace:
    """flat.torch's variant functions, each running one sequence split along T across the ranks of
    `group` (a torch.distributed process group; None: the default one). See the module's docstring
    (python/flat/context_parallel.py) and docs/python.md, "Context parallelism"."""
    from . import _api
    from . import torch as flat_torch

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flat.torch.context_parallel: torch.distributed is not initialised "
                           "(torch.distributed.init_process_group first)")
    functions = _api.variant_functions(_context_parallel_run(flat_torch._run, group), flat_torch._XP)
    la = functions["la"]

    def la_without_normalize(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=False,
                             **kwargs):
        if normalize:
            raise ValueError("flat.torch.context_parallel: la: normalize divides by the sum of every key before each "
                             "token, which the states exchanged do not carry; not supported")
        return la(q, k, v, scale, initial_state, output_final_state, **kwargs)

    la_without_normalize.__doc__ = la.__doc__
    functions["la"] = la_without_normalize
    functions["conv"] = _context_parallel_conv(flat_torch.conv, group)
    functions["conv"].__doc__ = flat_torch.conv.__doc__
    return SimpleNamespace(**functions)
