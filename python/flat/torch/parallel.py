"""Context parallelism on ``torch.distributed``: a batch's sequences cut along T across the ranks of
a process group, only states crossing between them (flat.torch.context_parallel).

    cp = flat.torch.context_parallel(group)          # None: the default group
    o, final_state = cp.gated_deltanet(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, final_state = cp.gated_deltanet(q, k, v, g, beta, cu_seqlens=cu_seqlens, output_final_state=True)

Every rank passes its share of the tokens, rank 0 the first, and every other argument as flat.torch
takes it: a dense batch ``[B, T_r, H, K]``, each batch row one sequence, or a packed one
``[1, T_r, H, K]`` with ``cu_seqlens`` the WHOLE batch's offsets ``[N + 1]`` (N sequences; offsets
into the concatenation of every rank's share, ``cu_seqlens[N]`` the sum of the ``T_r``; the same
tensor values on every rank). The shares may be uneven, shorter than a chunk or empty; a sequence
may lie in one share or run across several, a share may hold only the middle of one, and sequences
may be shorter than a chunk or empty. The functions are flat.torch's (la, retnet, mamba2, gla,
deltanet, gated_deltanet, kda, gdn2, sla, and the short convolution conv), with the same arguments,
and return the rank's share of ``o`` and, on every rank, every sequence's final state
``[N, H, K, V]`` (``N = B`` for a dense batch). Forward and backward equal one process's on the whole
batch within rounding.

How (the seed's all-gather of states; FLA's context parallelism and LASP-2 do the same): every
variant's state update is ``H_t = A_t H_{t-1} + k_t u_t^T``, with ``A_t`` acting on the state's K
rows alone and its V columns independent. So a rank's part of a sequence acts on that sequence's
state as ``H -> M H + S``: ``S`` the part's final state from zero, ``M`` its transition (K x K: the
product of its ``A_t``; a decay vector for the additive family, ``prod (I - beta k k^T) Diag(decay)``
for the delta family). A rank cuts its share by the global offsets (the local ``cu_seqlens``: the
global ones clipped to the share, so a part for every sequence, most of them empty) and runs the
fused kernels once over it with K columns appended to the values (zero values, gdn2's write gate
one), each sequence from ``[0, I]``, or from ``[h0_n, 0]`` (its initial state, no transition) where
the sequence starts: the final states are every sequence's ``[S, M]``, ``M = 0`` where it starts,
formed chunkwise by the same kernels, never token by token. One all-gather of them per call,
``N H K (V + K)`` floats per rank whatever T is. Every rank folds them in rank order from zero,
``H <- M H + S``, which gives the states entering each rank and every sequence's final state. The
same run gives the share's output: ``o_t = scale H_t^T q_t`` is affine in the entering state, and
the run's output columns are ``[o_t from the start, scale q_t^T A]`` (``A`` the product of the
part's ``A_t`` through t, what the K identity columns became), so the true output is the first V
plus the last K times the entering state ``[K, V]``: one small product per token, no second pass
(only a share's first part can continue a sequence; every later one starts there, its last K
columns zero). A dense batch is the case of B sequences that all start on rank 0. The backward is
autograd's through the same steps: the all-gather's gradient is one all-reduce of that size.

The convolution's state is a sequence's last W-1 inputs, which a rank's part of a sequence sets to
the last W-1 of (the state, the part's inputs). One run of the convolution over the share, each
sequence from zero, or from its h0 where it starts, gives those inputs as its final states; they
are gathered with how many of them the part sets (W-1 where the sequence starts, else as many as
it holds): ``N C (W-1) + N`` floats per rank, folded the same way, so a window reaching back across
several short shares reads every one of them.

Cost per rank: the share's forward and backward once, V + K wide (1.6-1.75 times V wide for K = V,
docs/performance.md), a product of ``[T_r, K]`` by ``[K, V]`` per head, the convolution's forward
twice, and the collectives above.

The initial state (``[N, H, K, V]``; conv ``[N, C, W-1]``) may be passed on every rank, the same:
sequence n's row is read on the rank where it starts, the first rank whose share ends at or after
its offset ``cu_seqlens[n]`` (the rank holding its first token, or an earlier one where the sequence
starts exactly at the end of that one's share, an empty sequence too; rank 0 for every row of a
dense batch), and the row's gradient arrives on that rank's tensor, zero on the others' (sum the
ranks' gradients, as data parallelism sums a parameter's). A rank where no sequence starts ignores
its ``initial_state``, which may be None. The final states are computed on every rank from the
gathered states: a loss that uses them on every rank counts them once per rank.

The backward's all-reduce is a collective: every rank must run its backward through its outputs
(as every rank of data parallelism runs its backward), or the others wait for it.

Before the all-gather of states the ranks exchange, in one all-gather of four integers, whether
each accepted its arguments, its share's length (the offsets the cut needs), the size of its states
and a fingerprint of its ``cu_seqlens`` (refused unless every rank's are the same); the all-gather of
states then carries whether each rank's first run succeeded. A rank whose arguments are refused
raises its own error and the others one that names it, so no rank waits on a collective. Not
supported: state pools (``initial_state_indices``, ``final_state_indices``, ``token_state_indices``:
they are for serving, which cuts no sequence across ranks, not for training), la's ``normalize``
(refused).
"""

from types import SimpleNamespace
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .. import _api
from .._args import Sequences, check_sequences
from . import ops

if dist.is_available():
    # Before the user's init_process_group (this module is imported with flat.torch): the first call
    # of a custom op (flat.torch's) imports torch._dynamo, which imports this module of PyTorch, whose
    # functions take ``group=group.WORLD`` as a default argument, the default group of that moment,
    # kept for good. Imported while a group is up, they would keep it, and its gloo threads, alive
    # past destroy_process_group into the interpreter's finalization, where a gloo thread releasing
    # a finished collective's tensors aborts the process now and then (python/flat/_process.py).
    import torch.distributed.nn.functional  # noqa: F401

_NAME = "flat.torch.context_parallel"


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


def _stop_if_any_failed(error: Optional[BaseException], failed: List[bool]) -> None:
    """Raises on every rank when any rank failed (failed: one flag per rank): the failing rank its
    own error, the others one naming the first rank that failed."""
    if error is not None:
        raise error
    if any(failed):
        raise RuntimeError(f"{_NAME}: rank {failed.index(True)} of the group raised on its share (its own error says "
                           "why); this rank stops too")


def _depending_on(x: Tensor, gathered: Tensor) -> Tensor:
    """x, made to depend on the gathered states (by zero), so that this rank's backward reaches the
    all-gather's gradient, a collective every rank must join."""
    return x + (gathered.sum() * 0).to(x.dtype)


def _across_ranks(group, call, output_final_state: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """A call split across `group`, `call` holding its math (_Recurrence, _Convolution):

    - call.share() -> (T_r, size, fingerprint): the share's length, the floats of its effect and a
      fingerprint of the batch's cu_seqlens (0 for a dense batch); raises on refused arguments;
    - call.effect(offsets, rank) -> [size]: the share's effect on every sequence's state, given the
      ranks' offsets [world + 1] into the whole batch;
    - call.before_rank_0() -> every sequence's state before rank 0 (zero: an initial state enters
      where its sequence starts);
    - call.fold(state, effect) -> every sequence's state after a rank of that effect;
    - call.own_pass(state) -> the share's output from the states entering it.

    Returns (the share's output, every sequence's final state or None). Two collectives: the ranks'
    (failed, T_r, size, fingerprint) in one small all-gather, then every rank's effect and whether it
    failed."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    error, length, size, fingerprint = None, 0, 0, 0
    try:
        length, size, fingerprint = call.share()
    except Exception as e:  # every rank learns of it before the next collective, so none waits there
        error = e
    parts = [torch.empty(4, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([error is not None, length, size, fingerprint], dtype=torch.int64),
                    group=group)
    failed, lengths, sizes, fingerprints = zip(*torch.stack(parts).tolist())  # each [world]
    _stop_if_any_failed(error, [bool(flag) for flag in failed])
    if len(set(fingerprints)) > 1:
        others = [r for r in range(world) if fingerprints[r] != fingerprint]
        raise ValueError(f"{_NAME}: cu_seqlens: expected the whole batch's offsets, the same on every rank, got "
                         f"other ones (or none) than this rank's on ranks {others}")
    if len(set(sizes)) > 1:
        raise ValueError(f"{_NAME}: expected every rank to pass the same batch (B or num_seqs) and state (H, K, V; "
                         f"conv: C, W), got states of {list(sizes)} floats on ranks 0 to {world - 1}")
    offsets = [0]
    for share_length in lengths:
        offsets.append(offsets[-1] + share_length)
    try:
        effect = call.effect(offsets, rank)
    except Exception as e:  # carried by the all-gather: every rank raises before any other collective
        error, effect = e, torch.zeros(size)
    # [world, size + 1]: every rank's effect, then whether it failed.
    gathered = _AllGather.apply(group, torch.cat([effect.float(), torch.tensor([float(error is not None)])]))
    _stop_if_any_failed(error, [bool(flag) for flag in gathered[:, -1].tolist()])
    # Rank 0's entering states depend on no rank's effect: made to, so that its output does (an empty
    # share's too: the kernels' output depends on the initial state even without tokens).
    state = _depending_on(call.before_rank_0(), gathered)
    for j in range(world):
        if j == rank:
            out = call.own_pass(state)
            if not output_final_state:
                return out, None
        state = call.fold(state, gathered[j, :-1])
    return out, state


def _check_no_pool(sequences: Sequences, function: str) -> None:
    """Refuses a state pool; function: "" (a variant's) or "conv: "."""
    pool = [name for name, x in sequences._asdict().items() if name != "cu_seqlens" and x is not None]
    if pool:
        raise ValueError(f"{_NAME}: {function}{', '.join(pool)}: state pools are for serving, which cuts no "
                         "sequence across ranks; not supported (pass cu_seqlens alone, or a dense batch)")


def _sequence_count(sequences: Sequences, batch: int, problem) -> Tuple[int, int]:
    """N: the batch rows of a dense batch, else cu_seqlens's sequences (checked as a 1-D CPU integer
    tensor); and a fingerprint of cu_seqlens's offsets (0 without), which every rank must share."""
    check_sequences(sequences, "a CPU tensor", problem)
    if sequences.cu_seqlens is None:
        return batch, 0
    # A tuple of ints hashes alike in every process; a packed batch's fingerprint is never 0.
    return sequences.cu_seqlens.shape[0] - 1, hash(tuple(sequences.cu_seqlens.tolist())) or 1


def _segments(cu_seqlens: Optional[Tensor], count: int, offsets: List[int],
              rank: int) -> Tuple[Optional[Tensor], Tensor]:
    """The rank's part of each of the `count` sequences: its local cu_seqlens [N + 1] (the global
    ones clipped to the share; None for a dense batch, whose rows are the sequences) and which
    sequences start on it [N] (bool): those whose offset the rank's share is the first to reach."""
    if cu_seqlens is None:
        return None, torch.full((count,), rank == 0)
    whole = cu_seqlens.tolist()
    if whole[0] != 0 or whole[-1] != offsets[-1] or any(a > b for a, b in zip(whole, whole[1:])):
        raise ValueError(f"{_NAME}: cu_seqlens: expected the whole batch's non-decreasing offsets from 0 to "
                         f"T = {offsets[-1]} (every rank's share, rank 0 the first), got {whole}")
    begin, end = offsets[rank], offsets[rank + 1]
    starts = cu_seqlens[:-1]
    starts_here = (starts <= end) & ((starts > begin) | (rank == 0))
    return cu_seqlens.clamp(begin, end) - begin, starts_here


def _widened(x: Optional[Tensor], columns: int, fill: float) -> Optional[Tensor]:
    """x [.., V] with `columns` more columns of `fill` (values, gdn2's write gate)."""
    if x is None:
        return None
    return torch.cat([x, x.new_full((*x.shape[:-1], columns), fill)], dim=-1)


class _Recurrence:
    """A variant's call on the rank's share: its effect on each sequence's state [S, M] from one
    run V + K wide, its output from the states entering it (the module's docstring)."""

    def __init__(self, run, problem, variant, inputs, initial_state, sequences, options):
        self.run, self.problem, self.variant = run, problem, variant
        self.inputs = inputs  # q, k, v, g, beta, b, w
        self.initial_state, self.sequences, self.options = initial_state, sequences, options

    def share(self) -> Tuple[int, int, int]:
        _check_no_pool(self.sequences, "")
        k, v = self.inputs[1], self.inputs[2]
        # The state's heads: the most of any input's (one with fewer is shared, python/flat/_api.py).
        H = max(x.shape[2] for x in self.inputs if x is not None and x.dim() >= 3)
        (N, fingerprint), K, V = _sequence_count(self.sequences, v.shape[0], self.problem), k.shape[3], v.shape[3]
        self.shape = (N, H, K, V)
        self.h0 = torch.zeros(self.shape) if self.initial_state is None else self.initial_state
        if tuple(self.h0.shape) != self.shape:
            rows = "B" if self.sequences.cu_seqlens is None else "num_seqs"
            raise ValueError(f"{_NAME}: initial_state: expected [{rows}, H, K, V] = {list(self.shape)}, got "
                             f"{list(self.h0.shape)}")
        return v.shape[1], N * H * K * (V + K), fingerprint

    def effect(self, offsets: List[int], rank: int) -> Tensor:
        N, H, K, V = self.shape
        local, starts_here = _segments(self.sequences.cu_seqlens, N, offsets, rank)
        self.local_sequences, self.starts_here = Sequences(local), starts_here.reshape(N, 1, 1, 1)
        # [N, H, K, V + K]: [h0, 0] for a sequence starting here, [0, I] for any other.
        start = torch.cat([torch.where(self.starts_here, self.h0, 0.0),
                           torch.where(self.starts_here, 0.0, torch.eye(K).expand(N, H, K, K))], dim=-1)
        q, k, v, g, beta, b, w = self.inputs
        # o [B, T_r, H, V + K]: the share's output from [h0, 0] or [0, I], and scale A^T q per token
        # (A the product of the part's A_t so far): o's part from the state entering the rank.
        self.o, state = self.run(self.variant, q, k, _widened(v, K, 0.0), g, beta, b, _widened(w, K, 1.0),
                                 initial_state=start, output_final_state=True, sequences=self.local_sequences,
                                 options=self.options)
        return state.reshape(-1)

    def before_rank_0(self) -> Tensor:
        return torch.zeros(self.shape)

    def fold(self, state: Tensor, effect: Tensor) -> Tensor:
        N, H, K, V = self.shape
        effect = effect.reshape(N, H, K, V + K)
        return effect[..., V:] @ state + effect[..., :V]

    def own_pass(self, state: Tensor) -> Tensor:
        # o_t = scale H_t^T q_t is affine in the entering state: the widened run's first V columns
        # plus its last K times the entering state [K, V], for the tokens of a sequence that
        # continues here: a dense batch's rows (none on rank 0), a packed share's first part (every
        # later part starts here, its last K columns zero). Made to depend on `state` where nothing
        # continues too, so that every rank's backward joins the all-gather's all-reduce.
        N, H, K, V = self.shape
        head = self.o[..., :V]
        # (batch row, sequence) of each row whose first `tokens` continue a sequence here.
        if self.local_sequences.cu_seqlens is None:  # every row continues, or (rank 0) none
            tokens, rows = self.o.shape[1], [] if self.starts_here.all() else [(n, n) for n in range(N)]
        else:
            parts = self.local_sequences.cu_seqlens.diff().tolist()
            first = next((n for n, length in enumerate(parts) if length), None)
            tokens, rows = (0, []) if first is None or self.starts_here[first] else (parts[first], [(0, first)])
        if not rows:
            return _depending_on(head, state)
        # [rows, tokens, H, V]: the last K columns times the entering state, head by head.
        correction = torch.stack([torch.stack([self.o[row, :tokens, h, V:].float() @ state[sequence, h]
                                               for h in range(H)], dim=1) for row, sequence in rows])
        return torch.cat([(head[:, :tokens].float() + correction).to(self.o.dtype), head[:, tokens:]], dim=1)


class _Convolution:
    """The short convolution on the rank's share: its effect on each sequence's state (its last W-1
    inputs and how many of them the share sets) from one run, its output from the states entering it."""

    def __init__(self, conv, problem, x, weight, bias, initial_state, activation, sequences):
        self.conv, self.problem = conv, problem
        self.x, self.weight, self.bias, self.initial_state = x, weight, bias, initial_state
        self.activation, self.sequences = activation, sequences

    def share(self) -> Tuple[int, int, int]:
        _check_no_pool(self.sequences, "conv: ")
        B, T, C = self.x.shape
        (N, fingerprint), width = _sequence_count(self.sequences, B, self.problem), self.weight.shape[1] - 1
        self.shape = (N, C, width)
        self.h0 = torch.zeros(self.shape) if self.initial_state is None else self.initial_state
        if tuple(self.h0.shape) != self.shape:
            rows = "B" if self.sequences.cu_seqlens is None else "num_seqs"
            raise ValueError(f"{_NAME}: conv: initial_state: expected [{rows}, C, W-1] = {list(self.shape)}, got "
                             f"{list(self.h0.shape)}")
        return T, N * C * width + N, fingerprint

    def effect(self, offsets: List[int], rank: int) -> Tensor:
        N, C, width = self.shape
        self.local_cu_seqlens, starts_here = _segments(self.sequences.cu_seqlens, N, offsets, rank)
        self.starts_here = starts_here.reshape(N, 1, 1)
        # [N, C, W-1]: each sequence's last W-1 inputs here, after its h0 where it starts, else after zeros.
        _, last = self.conv(self.x, self.weight, self.bias, torch.where(self.starts_here, self.h0, 0.0), True,
                            self.activation, self.local_cu_seqlens)
        T = self.x.shape[1]
        lengths = torch.full((N,), T) if self.local_cu_seqlens is None else self.local_cu_seqlens.diff()
        # How many of them the share sets: all where the sequence starts here, else as many as it holds.
        held = torch.where(starts_here, width, lengths.clamp(max=width))
        return torch.cat([last.reshape(-1), held.float()])

    def before_rank_0(self) -> Tensor:
        return torch.zeros(self.shape)

    def fold(self, state: Tensor, effect: Tensor) -> Tensor:
        N, C, width = self.shape
        last, held = effect[:-N].reshape(N, C, width), effect[-N:].detach().long().reshape(N, 1)
        # The state after: the last W-1 of (state, the share's `held` inputs): state[i + held], then the share's.
        column = torch.arange(width)
        kept = state.gather(-1, (column + held).clamp(max=width - 1).unsqueeze(1).expand(N, C, width))
        return torch.where((column < width - held).unsqueeze(1), kept, last)

    def own_pass(self, state: Tensor) -> Tensor:
        y, _ = self.conv(self.x, self.weight, self.bias, torch.where(self.starts_here, self.h0, state), False,
                         self.activation, self.local_cu_seqlens)
        return y


def context_parallel(group=None) -> SimpleNamespace:
    """flat.torch's variant functions and conv, each running a batch's sequences split along T across
    the ranks of `group` (a torch.distributed process group; None: the default one): each rank passes
    its share of the tokens (``[B, T_r, ...]``, or ``[1, T_r, ...]`` with the whole batch's
    ``cu_seqlens`` on every rank) and gets its share of the output and every sequence's final state.
    State pools (serving) and la's normalize are refused. See the module's docstring
    (python/flat/torch/parallel.py) and docs/python.md, "Context parallelism"."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{_NAME}: torch.distributed is not initialised (torch.distributed.init_process_group "
                           "first)")

    def run(variant, q, k, v, g=None, beta=None, b=None, w=None, *, initial_state, output_final_state, sequences,
            options):
        call = _Recurrence(ops._run, ops._problem, variant, (q, k, v, g, beta, b, w), initial_state,
                           sequences, options)
        return _across_ranks(group, call, output_final_state)

    def conv(x, weight, bias=None, initial_state=None, output_final_state=False, activation=None, cu_seqlens=None,
             **pool):
        sequences = Sequences(cu_seqlens, **pool)
        if weight.shape[-1] == 1 and not any(v is not None for v in pool.values()):
            # No window reaches back: no state, nothing to exchange, each token alone.
            return ops.conv(x, weight, bias, activation=activation)
        call = _Convolution(ops.conv, ops._problem, x, weight, bias, initial_state, activation,
                            sequences)
        return _across_ranks(group, call, output_final_state)

    functions = _api.variant_functions(run, ops._XP)
    functions["la"] = _api.without_normalize(functions["la"], _NAME)
    conv.__doc__ = ops.conv.__doc__
    functions["conv"] = conv
    return SimpleNamespace(**functions)
