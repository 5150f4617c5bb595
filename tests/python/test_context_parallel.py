"""flat.torch.context_parallel on 2 and 3 processes (gloo, loopback): every variant's share of o, the
final state and every gradient, and the short convolution's, against the float64 oracle on the
whole sequence, at the oracle tests' bounds; uneven shares, a share shorter than a chunk, an empty
share. Packed batches (cu_seqlens) against the oracle on each sequence alone: sequences shorter
than a chunk, across one and two share boundaries, ending exactly at one, empty; a share of no
tokens, one holding only the middle of a sequence; initial states on and off, each row's gradient on
the rank where its sequence starts. One all-gather of states per call whatever the length; a rank
whose arguments are refused raises its error and every other rank one naming it, none waits. A
user's script ending through the interpreter's own exit exits 0 on every rank, its group's gloo
threads gone at destroy_process_group."""

import datetime
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flat._process import exit_after_process_group
from oracle import NAMES, Problem, bound, expect_close, reference, round_to

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Tokens per rank of a 70-token sequence (chunk 64): uneven, shorter than a chunk, empty.
SPLITS = {2: [(35, 35), (5, 65), (0, 70)], 3: [(20, 0, 50), (1, 64, 5)]}

# A packed batch (chunk 16): sequences of 5 (shorter than a chunk), 25, 0, 20 and 25 tokens, offsets
# [0, 5, 30, 30, 50, 75], and the shares it is cut into: 30 | 45 ends sequence 1 exactly at the boundary,
# sequences 2 (empty) and 3 starting there; 40 | 35 cuts sequence 3; 0 | 75 an empty share; 40 | 5 | 30
# cuts sequence 3 twice, rank 1 holding only its middle; 30 | 0 | 45 an empty middle share; 3 | 60 | 12
# cuts sequences 0 and 4.
PACKED_CHUNK = 16
PACKED_LENGTHS = [5, 25, 0, 20, 25]
PACKED_SPLITS = {2: [(30, 45), (40, 35), (0, 75)], 3: [(40, 5, 30), (30, 0, 45), (3, 60, 12)]}

# The convolution's packed batch (W = 4 reaches 3 inputs back): offsets [0, 1, 6, 6, 9, 16]; 8 | 8 cuts
# sequence 3, 7 | 1 | 8 cuts it twice (rank 2's window reaching into ranks 1 and 0), 10 | 2 | 4 has
# rank 2's window on sequence 4 span ranks 1 and 0.
CONV_LENGTHS = [1, 5, 0, 3, 7]
CONV_SPLITS = {2: [(6, 10), (8, 8), (0, 16)], 3: [(7, 1, 8), (2, 0, 14), (10, 2, 4)]}


def _share(x, start, end, dtype):
    if x is None:
        return None
    return torch.tensor(np.ascontiguousarray(x[:, start:end]), dtype=dtype).requires_grad_()


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _starts_on(cu, split):
    """The rank each sequence starts on: the first whose share ends at or after its offset."""
    ends = np.cumsum(split)
    return np.array([int(np.argmax(ends >= start)) for start in cu[:-1]])


def _problem(variant, dtype, **sizes):
    shared = {"q": 1, "k": 1, "g": 1, "b": 1} if variant == "sla" else {"q": 1, "k": 1}
    return Problem(variant, dtype, G=4 if variant == "sla" else None, heads=shared, **sizes)


def _call_on_share(cp, p, start, end, initial_state, **options):
    """The variant on the share [start, end) of p's tokens: (o, final_state, the inputs by name)."""
    narrow = DTYPES[p.dtype]
    per_head_gate = p.g is not None and p.g.ndim == 1
    inputs = dict(q=_share(p.q, start, end, narrow), k=_share(p.k, start, end, narrow),
                  v=_share(p.v, start, end, narrow),
                  g=(torch.tensor(p.g, dtype=torch.float32).requires_grad_() if per_head_gate
                     else _share(p.g, start, end, torch.float32)),
                  beta=_share(p.beta, start, end, narrow), b=_share(p.b, start, end, narrow),
                  w=_share(p.w, start, end, narrow),
                  initial_state=(None if initial_state is None
                                 else torch.tensor(initial_state, dtype=torch.float32).requires_grad_()))
    kwargs = {name: t for name, t in inputs.items() if t is not None}
    if p.variant in ("kda", "gdn2", "sla"):
        kwargs["gate_group"] = p.G
    o, final_state = getattr(cp, p.variant)(**kwargs, output_final_state=True, **options)
    return o, final_state, inputs


def _backward_and_check(what, p, o, final_state, inputs, start, end, rank, want_grads, want_dh0):
    """The loss: every rank its share of <o, dy>, rank 0 the final state's <ht, dht>; then every input's
    gradient on the share against want_grads (q .. w, [B, T, ...] of the whole batch; a per-head gate's
    summed over the ranks) and the initial state's against want_dh0."""
    outputs, cotangents = [o], [torch.tensor(p.dy[:, start:end], dtype=o.dtype)]
    if rank == 0:
        outputs.append(final_state)
        cotangents.append(torch.tensor(p.dht, dtype=torch.float32))
    torch.autograd.backward(outputs, cotangents)
    per_head_gate = p.g is not None and p.g.ndim == 1
    for name, want in zip(["q", "k", "v", "g", "beta", "b", "w"], want_grads):
        if want is None:
            continue
        got = inputs[name].grad.float()
        if name == "g" and per_head_gate:  # one gate per head for every token: summed over the ranks
            dist.all_reduce(got)
        else:
            want = want[:, start:end]
        if got.numel():
            expect_close(f"{what}: d{name}", got, want, bound("d" + name, p.dtype))
    if want_dh0 is not None:
        expect_close(f"{what}: dinitial_state", inputs["initial_state"].grad, want_dh0,
                     bound("dinitial_state", p.dtype))


def _check_variant(cp, rank, variant, dtype, split):
    p = _problem(variant, dtype)
    (y, ht), grads = p.reference()
    start = sum(split[:rank])
    end = start + split[rank]
    o, final_state, inputs = _call_on_share(cp, p, start, end, p.h0 if rank == 0 else None)
    what = f"{variant} {dtype} split {split} rank {rank}"
    assert o.shape[1] == end - start, what
    if end > start:
        expect_close(f"{what}: o", o.float().detach(), y[:, start:end], bound("o", dtype))
    expect_close(f"{what}: final_state", final_state.detach(), ht, bound("final_state", dtype))
    _backward_and_check(what, p, o, final_state, inputs, start, end, rank, grads[:7],
                        grads[7] if rank == 0 else None)


def _packed_reference(p, cu, h0):
    """The oracle on each sequence of p's packed batch alone, from its row of h0 [N, H, K, V] (None:
    from zero): y [1, T, H, V], the final states [N, H, K, V], the gradients of q .. w for p.dy and
    p.dht [N, H, K, V] ([1, T, ...]; a per-head gate's summed over the sequences) and of h0."""
    inputs = p.inputs()[:7]
    per_head_gate = p.g is not None and p.g.ndim == 1
    y, final_states, dh0 = np.zeros(p.dy.shape), np.zeros(p.dht.shape), np.zeros(p.dht.shape)
    grads = [None if x is None else np.zeros(x.shape) for x in inputs]
    for n, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
        state = None if h0 is None else h0[n:n + 1]
        if start == end:  # nothing runs: the state passes through, its gradient too
            final_states[n], dh0[n] = 0 if h0 is None else h0[n], p.dht[n]
            continue
        alone = [x if x is None or (i == 3 and per_head_gate) else np.ascontiguousarray(x[:, start:end])
                 for i, x in enumerate(inputs)]
        args = (p.variant, [1, end - start, p.Nq, p.Nk, p.Nv, p.Ng, p.Nb, p.Nw, p.K, p.V], p.G, p.scale, False,
                *alone, state)
        y1, ht1 = reference.reference_forward(*args)
        d = reference.reference_backward(*args, np.ascontiguousarray(p.dy[:, start:end]), p.dht[n:n + 1])
        y[:, start:end], final_states[n], dh0[n] = y1, ht1[0], d[7][0]
        for i, grad in enumerate(d[:7]):
            if grad is None:
                continue
            if i == 3 and per_head_gate:
                grads[i] += grad
            else:
                grads[i][:, start:end] = grad
    return y, final_states, grads, dh0


def _check_packed_variant(cp, rank, variant, dtype, splits, with_initial_state):
    """The packed batch of PACKED_LENGTHS cut as each of `splits`, every rank passing the whole batch's
    cu_seqlens (and the same initial states), against the oracle on each sequence alone; each initial
    state row's gradient arrives on the rank where its sequence starts, zero on the others."""
    cu = _offsets(PACKED_LENGTHS)
    p = _problem(variant, dtype, B=1, S=int(cu[-1]), seed=2)
    rng = np.random.default_rng(5)
    rows = (len(PACKED_LENGTHS), p.N, p.K, p.V)
    h0 = round_to(rng.standard_normal(rows), "float32") if with_initial_state else None
    p.dht = round_to(rng.standard_normal(rows), "float32")
    y, final_states, grads, dh0 = _packed_reference(p, cu, h0)
    for split in splits:
        start = sum(split[:rank])
        end = start + split[rank]
        o, final_state, inputs = _call_on_share(cp, p, start, end, h0, chunk_size=PACKED_CHUNK,
                                                cu_seqlens=torch.tensor(cu))
        what = f"{variant} {dtype} packed split {split} rank {rank} initial state {with_initial_state}"
        assert o.shape[1] == end - start, what
        if end > start:
            expect_close(f"{what}: o", o.float().detach(), y[:, start:end], bound("o", dtype))
        expect_close(f"{what}: final_state", final_state.detach(), final_states, bound("final_state", dtype))
        starts_here = (_starts_on(cu, split) == rank).reshape(-1, 1, 1, 1)
        _backward_and_check(what, p, o, final_state, inputs, start, end, rank, grads,
                            np.where(starts_here, dh0, 0.0) if with_initial_state else None)


def _check_conv_gradients(what, tx, tw, tb, dx, dweight, dbias):
    """The share's input gradient against dx (its share of the oracle's) and the weight's and bias's,
    each rank's share summed over the ranks, against the oracle's."""
    if tx.shape[1]:
        expect_close(f"{what}: dx", tx.grad, dx, 1e-5)
    for name, got, want in (("dweight", tw.grad, dweight), ("dbias", tb.grad, dbias)):
        dist.all_reduce(got)
        expect_close(f"{what}: {name}", got, want, 1e-5)


def _check_conv(cp, rank, split, W):
    """The short convolution (W taps) split as `split` against the oracle on the whole sequence;
    weight and bias gradients are each rank's share, summed over the ranks."""
    rng = np.random.default_rng(3)
    B, T, C = 2, sum(split), 24
    arrays = (rng.standard_normal((B, T, C)), rng.standard_normal((C, W)), rng.standard_normal(C),
              rng.standard_normal((B, C, W - 1)), rng.standard_normal((B, T, C)), rng.standard_normal((B, C, W - 1)))
    x, weight, bias, state0, dy, dstate = [np.asarray(a, np.float32).astype(np.float64) for a in arrays]
    y, state, dx, dweight, dbias, dstate0 = reference.reference_conv(B, T, C, W, "silu", x, weight, bias, state0, dy,
                                                                     dstate)
    start = sum(split[:rank])
    end = start + split[rank]
    tx = torch.tensor(x[:, start:end], dtype=torch.float32, requires_grad=True)
    tw, tb = (torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in (weight, bias))
    ts = torch.tensor(state0, dtype=torch.float32, requires_grad=True) if rank == 0 and W > 1 else None
    got_y, got_state = cp.conv(tx, tw, tb, initial_state=ts, output_final_state=True, activation="silu")
    what = f"conv W={W} split {split} rank {rank}"
    expect_close(f"{what}: y", got_y.detach(), y[:, start:end], 1e-5)
    if W > 1:
        expect_close(f"{what}: state", got_state.detach(), state, 1e-5)
    outputs, cotangents = [got_y], [torch.tensor(dy[:, start:end], dtype=torch.float32)]
    if ts is not None:
        outputs.append(got_state)
        cotangents.append(torch.tensor(dstate, dtype=torch.float32))
    torch.autograd.backward(outputs, cotangents)
    _check_conv_gradients(what, tx, tw, tb, dx[:, start:end], dweight, dbias)
    if ts is not None:
        expect_close(f"{what}: dstate0", ts.grad, dstate0, 1e-5)


def _check_packed_conv(cp, rank, split, W, with_initial_state):
    """The convolution (W taps) on the packed batch of CONV_LENGTHS cut as `split`, against the oracle
    on each sequence alone; each initial state row's gradient on the rank where its sequence starts."""
    rng = np.random.default_rng(6)
    cu = _offsets(CONV_LENGTHS)
    T, C, N = int(cu[-1]), 24, len(CONV_LENGTHS)
    arrays = (rng.standard_normal((1, T, C)), rng.standard_normal((C, W)), rng.standard_normal(C),
              rng.standard_normal((N, C, W - 1)), rng.standard_normal((1, T, C)), rng.standard_normal((N, C, W - 1)))
    x, weight, bias, state0, dy, dstate = [np.asarray(a, np.float32).astype(np.float64) for a in arrays]
    if not with_initial_state:
        state0 = np.zeros_like(state0)
    y, state, dx = np.zeros_like(x), np.zeros_like(state0), np.zeros_like(x)
    dweight, dbias, dstate0 = np.zeros_like(weight), np.zeros_like(bias), np.zeros_like(state0)
    for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        if a == b:  # nothing runs: the state passes through, its gradient too
            state[n], dstate0[n] = state0[n], dstate[n]
            continue
        y[:, a:b], state[n:n + 1], dx[:, a:b], dweight1, dbias1, dstate0[n:n + 1] = reference.reference_conv(
            1, b - a, C, W, "silu", np.ascontiguousarray(x[:, a:b]), weight, bias, state0[n:n + 1],
            np.ascontiguousarray(dy[:, a:b]), dstate[n:n + 1])
        dweight += dweight1
        dbias += dbias1
    start = sum(split[:rank])
    end = start + split[rank]
    tx = torch.tensor(x[:, start:end], dtype=torch.float32, requires_grad=True)
    tw, tb = (torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in (weight, bias))
    ts = torch.tensor(state0, dtype=torch.float32, requires_grad=True) if with_initial_state else None
    got_y, got_state = cp.conv(tx, tw, tb, initial_state=ts, output_final_state=True, activation="silu",
                               cu_seqlens=torch.tensor(cu))
    what = f"conv W={W} packed split {split} rank {rank} initial state {with_initial_state}"
    expect_close(f"{what}: y", got_y.detach(), y[:, start:end], 1e-5)
    outputs, cotangents = [got_y], [torch.tensor(dy[:, start:end], dtype=torch.float32)]
    if W == 1:
        assert got_state is None, what
    else:
        expect_close(f"{what}: state", got_state.detach(), state, 1e-5)
        if rank == 0:
            outputs.append(got_state)
            cotangents.append(torch.tensor(dstate, dtype=torch.float32))
    torch.autograd.backward(outputs, cotangents)
    _check_conv_gradients(what, tx, tw, tb, dx[:, start:end], dweight, dbias)
    if ts is not None and W > 1:
        starts_here = (_starts_on(cu, split) == rank).reshape(-1, 1, 1)
        expect_close(f"{what}: dstate0", ts.grad, np.where(starts_here, dstate0, 0.0), 1e-5)


def _check_layer(rank, variant, split, lengths=None):
    """A flat.nn layer on flat.nn.context_parallel() against the same layer in one process on the
    whole batch (two rows, or one packing sequences of `lengths`): the output's share, the input's
    gradient share, every parameter's gradient (each rank's share, summed over the ranks)."""
    from flat.nn import LAYERS, context_parallel
    from test_nn import BOUND, CONFIGS, relative_error

    torch.manual_seed(0)
    whole = LAYERS[variant](**CONFIGS[variant])
    split_layer = LAYERS[variant](**CONFIGS[variant], ops=context_parallel())
    split_layer.load_state_dict(whole.state_dict())
    generator = torch.Generator().manual_seed(1)
    B, cu_seqlens = (2, None) if lengths is None else (1, torch.tensor(_offsets(lengths)))
    x = torch.randn(B, sum(split), 32, generator=generator, requires_grad=True)
    dy = torch.randn(B, sum(split), 32, generator=generator)
    start = sum(split[:rank])
    end = start + split[rank]
    (whole(x, cu_seqlens=cu_seqlens)[0] * dy).sum().backward()
    share = x.detach()[:, start:end].clone().requires_grad_()
    y = split_layer(share, cu_seqlens=cu_seqlens)[0]
    (y * dy[:, start:end]).sum().backward()
    what = f"{variant} layer split {split} lengths {lengths} rank {rank}"
    with torch.no_grad():
        want_y = whole(x, cu_seqlens=cu_seqlens)[0][:, start:end]
    if end > start:
        assert relative_error(y, want_y) <= BOUND, f"{what}: y {relative_error(y, want_y):.3g}"
        assert relative_error(share.grad, x.grad[:, start:end]) <= BOUND, f"{what}: dx"
    for (name, p), (_, q) in zip(whole.named_parameters(), split_layer.named_parameters()):
        got = q.grad if q.grad is not None else torch.zeros_like(q)
        dist.all_reduce(got)
        assert relative_error(got, p.grad) <= BOUND, f"{what}: d{name} {relative_error(got, p.grad):.3g}"


def _one_gather_per_call_whatever_the_length(cp, rank):
    """A forward is the agreement (an all-gather of 4 integers) and one all-gather of the states,
    N H K (V + K) floats per rank and a flag (N: the batch rows, or the packed batch's sequences), its
    backward one all-reduce of the gathered size, at any T."""
    calls = []
    all_gather, all_reduce = dist.all_gather, dist.all_reduce

    def gather(parts, x, **kwargs):
        calls.append(("all_gather", x.numel()))
        return all_gather(parts, x, **kwargs)

    def reduce(x, **kwargs):
        calls.append(("all_reduce", x.numel()))
        return all_reduce(x, **kwargs)

    dist.all_gather, dist.all_reduce = gather, reduce
    try:
        world = dist.get_world_size()
        H, K, V = 2, 16, 8
        for T in (8, 200):
            # A dense batch of 2 rows; 3 sequences packed along the ranks' world * T tokens.
            for B, N, cu_seqlens in ((2, 2, None), (1, 3, torch.tensor([0, T // 2, T * world - 3, T * world]))):
                q, k, g = (torch.randn(B, T, H, K, requires_grad=True) for _ in range(3))
                v = torch.randn(B, T, H, V, requires_grad=True)
                calls.clear()
                o, _ = cp.gla(q, k, v, -torch.sigmoid(g), cu_seqlens=cu_seqlens)
                size = N * H * K * (V + K) + 1
                assert calls == [("all_gather", 4), ("all_gather", size)], (T, N, calls)
                calls.clear()
                o.sum().backward()
                assert calls == [("all_reduce", world * size)], (T, N, calls)
    finally:
        dist.all_gather, dist.all_reduce = all_gather, all_reduce


def _refused_argument_stops_every_rank(cp, rank):
    p = Problem("gla", "float32")
    q, k, v, g = (torch.tensor(x, dtype=torch.float32) for x in (p.q, p.k, p.v, p.g))
    wrong = g[..., :3] if rank == 1 else g  # a gate of the wrong width on one rank
    try:
        cp.gla(q, k, v, wrong)
    except ValueError as e:
        assert rank == 1 and "g" in str(e), str(e)
    except RuntimeError as e:
        assert rank != 1 and "rank 1 of the group raised" in str(e), str(e)
    else:
        raise AssertionError(f"rank {rank}: no error")
    # Every rank its own offsets instead of the whole batch's; a state pool; other offsets on rank 0;
    # narrower values on rank 0.
    packed = [x[:1] for x in (q, k, v, g)]
    T = 70 * dist.get_world_size()
    refused = [(dict(cu_seqlens=torch.tensor([0, 70])), "cu_seqlens: expected the whole batch's non-decreasing"),
               (dict(cu_seqlens=torch.tensor([0, T]), initial_state_indices=torch.tensor([0]),
                     initial_state=torch.zeros(1, 2, 16, 8)), "initial_state_indices: state pools are for serving"),
               (dict(cu_seqlens=torch.tensor([0, 20 if rank == 0 else 30, T])),
                "cu_seqlens: expected the whole batch's offsets, the same on every rank")]
    for arguments, message in refused:
        with pytest.raises(ValueError, match=message):
            cp.gla(*packed, **arguments)
    with pytest.raises(ValueError, match="expected every rank to pass the same batch"):
        cp.gla(q, k, v[..., :4] if rank == 0 else v, g)
    with pytest.raises(ValueError, match="conv: final_state_indices: state pools are for serving"):
        cp.conv(torch.randn(1, 4, 8), torch.randn(8, 4), initial_state=torch.zeros(1, 8, 3),
                cu_seqlens=torch.tensor([0, 4 * dist.get_world_size()]), final_state_indices=torch.tensor([0]))


def _worker(rank, world, port, variants):
    import flat.torch as ft

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        torch.set_num_threads(1)
        cp = ft.context_parallel()
        for variant in variants:
            for dtype in DTYPES:
                for split in SPLITS[world]:
                    _check_variant(cp, rank, variant, dtype, split)
        for variant in variants:
            for i, dtype in enumerate(DTYPES):  # each dtype with and without initial states
                splits = PACKED_SPLITS[world]
                _check_packed_variant(cp, rank, variant, dtype, splits[i::2], with_initial_state=True)
                _check_packed_variant(cp, rank, variant, dtype, splits[1 - i::2], with_initial_state=False)
        # Shares shorter than the window, so that a rank's window reaches back past its predecessor.
        for split in SPLITS[world] + [(2,) * world, (1, 0, 2)[:world]]:
            for W in (1, 2, 4):
                _check_conv(cp, rank, split, W)
        for j, split in enumerate(CONV_SPLITS[world]):
            for W in (1, 2, 4):
                _check_packed_conv(cp, rank, split, W, with_initial_state=(j + W) % 2 == 0)
        for variant in variants:
            for split in SPLITS[world][1:]:
                _check_layer(rank, variant, split)
            _check_layer(rank, variant, PACKED_SPLITS[world][0], PACKED_LENGTHS)
        _one_gather_per_call_whatever_the_length(cp, rank)
        _refused_argument_stops_every_rank(cp, rank)
        # No rank tears its connections down while another still uses them (gloo aborted at exit,
        # now and then, without it).
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_after_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 3])
def test_every_variant_split_across_ranks_matches_the_oracle(world):
    mp.spawn(_worker, args=(world, _free_port(), NAMES), nprocs=world, join=True)


def test_a_users_script_tears_down_its_group_and_exits_normally():
    """context_parallel_user.py, a user's two-rank script (flat.torch's calls forward and backward, a
    barrier, destroy_process_group, the interpreter's own exit), three times: every rank exits 0, and
    destroy_process_group leaves no gloo thread (given 10 s to end) to run into the interpreter's
    finalization (before flat.torch imported torch.distributed.nn.functional itself, its first call
    while the group was up made that module's default arguments keep the group, and its threads,
    alive)."""
    script = os.path.join(os.path.dirname(__file__), "context_parallel_user.py")
    for run in range(3):
        port = _free_port()
        ranks = [subprocess.Popen([sys.executable, script, str(rank), "2", str(port)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=dict(os.environ)) for rank in range(2)]
        try:
            outputs = [process.communicate(timeout=120) for process in ranks]
        finally:
            for process in ranks:
                process.kill()  # a rank still running (the other timed out); nothing once both ended
        left = "[]" if sys.platform == "linux" else "None"  # None: no /proc to list threads
        for rank, (process, (out, err)) in enumerate(zip(ranks, outputs)):
            assert process.returncode == 0, f"run {run} rank {rank}: exit code {process.returncode}\n{err}"
            assert f"gloo threads after destroy_process_group: {left}\n" in out, f"run {run} rank {rank}: {out}"


def test_refused_without_a_process_group():
    import flat.torch as ft

    with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
        ft.context_parallel()
