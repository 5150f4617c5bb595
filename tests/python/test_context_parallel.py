"""flat.torch.context_parallel on 2 and 3 processes (gloo, loopback): every variant's share of o, the
final state and every gradient, and the short convolution's, against the float64 oracle on the
whole sequence, at the oracle tests' bounds; uneven shares, a share shorter than a chunk, an empty
share; one all-gather per call whatever the length; a rank whose arguments are refused raises its
error and every other rank one naming it, none waits."""

import datetime
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from oracle import NAMES, Problem, bound, expect_close, reference

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Tokens per rank of a 70-token sequence (chunk 64): uneven, shorter than a chunk, empty.
SPLITS = {2: [(35, 35), (5, 65), (0, 70)], 3: [(20, 0, 50), (1, 64, 5)]}


def _share(x, start, end, dtype):
    if x is None:
        return None
    return torch.tensor(np.ascontiguousarray(x[:, start:end]), dtype=dtype).requires_grad_()


def _check_variant(cp, rank, world, variant, dtype, split):
    shared = {"q": 1, "k": 1, "g": 1, "b": 1} if variant == "sla" else {"q": 1, "k": 1}
    p = Problem(variant, dtype, G=4 if variant == "sla" else None, heads=shared)
    (y, ht), grads = p.reference()
    start = sum(split[:rank])
    end = start + split[rank]
    narrow = DTYPES[dtype]
    per_sequence_gate = p.g is not None and p.g.ndim == 1
    inputs = dict(q=_share(p.q, start, end, narrow), k=_share(p.k, start, end, narrow),
                  v=_share(p.v, start, end, narrow),
                  g=(torch.tensor(p.g, dtype=torch.float32).requires_grad_() if per_sequence_gate
                     else _share(p.g, start, end, torch.float32)),
                  beta=_share(p.beta, start, end, narrow), b=_share(p.b, start, end, narrow),
                  w=_share(p.w, start, end, narrow),
                  initial_state=torch.tensor(p.h0, dtype=torch.float32).requires_grad_() if rank == 0 else None)
    kwargs = {name: t for name, t in inputs.items() if t is not None}
    if variant in ("kda", "gdn2", "sla"):
        kwargs["gate_group"] = p.G
    o, final_state = getattr(cp, variant)(**kwargs, output_final_state=True)
    what = f"{variant} {dtype} split {split} rank {rank}"
    assert o.shape[1] == end - start, what
    if end > start:
        expect_close(f"{what}: o", o.float().detach(), y[:, start:end], bound("o", dtype))
    expect_close(f"{what}: final_state", final_state.detach(), ht, bound("final_state", dtype))
    # The loss: every rank its share of <o, dy>, rank 0 the final state's <ht, dht>.
    outputs, cotangents = [o], [torch.tensor(p.dy[:, start:end], dtype=o.dtype)]
    if rank == 0:
        outputs.append(final_state)
        cotangents.append(torch.tensor(p.dht, dtype=torch.float32))
    torch.autograd.backward(outputs, cotangents)
    for name, want in zip(["q", "k", "v", "g", "beta", "b", "w", "initial_state"], grads):
        if want is None or (name == "initial_state" and rank != 0):
            continue
        got = inputs[name].grad.float()
        if name == "g" and per_sequence_gate:  # one gate per head for every token: summed over the ranks
            dist.all_reduce(got)
        elif name != "initial_state":
            want = want[:, start:end]
        if got.numel():
            expect_close(f"{what}: d{name}", got, want, bound("d" + name, dtype))


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
    if end > start:
        expect_close(f"{what}: dx", tx.grad, dx[:, start:end], 1e-5)
    for name, got, want in (("dweight", tw.grad, dweight), ("dbias", tb.grad, dbias)):
        dist.all_reduce(got)
        expect_close(f"{what}: {name}", got, want, 1e-5)
    if ts is not None:
        expect_close(f"{what}: dstate0", ts.grad, dstate0, 1e-5)


def _check_layer(rank, variant, split):
    """A flat.nn layer on flat.nn.context_parallel() against the same layer in one process on the
    whole sequence: the output's share, the input's gradient share, every parameter's gradient
    (each rank's share, summed over the ranks)."""
    from flat.nn import LAYERS, context_parallel
    from test_nn import BOUND, CONFIGS, relative_error

    torch.manual_seed(0)
    whole = LAYERS[variant](**CONFIGS[variant])
    split_layer = LAYERS[variant](**CONFIGS[variant], ops=context_parallel())
    split_layer.load_state_dict(whole.state_dict())
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, sum(split), 32, generator=generator, requires_grad=True)
    dy = torch.randn(2, sum(split), 32, generator=generator)
    start = sum(split[:rank])
    end = start + split[rank]
    (whole(x)[0] * dy).sum().backward()
    share = x.detach()[:, start:end].clone().requires_grad_()
    y = split_layer(share)[0]
    (y * dy[:, start:end]).sum().backward()
    what = f"{variant} layer split {split} rank {rank}"
    with torch.no_grad():
        want_y = whole(x)[0][:, start:end]
    if end > start:
        assert relative_error(y, want_y) <= BOUND, f"{what}: y {relative_error(y, want_y):.3g}"
        assert relative_error(share.grad, x.grad[:, start:end]) <= BOUND, f"{what}: dx"
    for (name, p), (_, q) in zip(whole.named_parameters(), split_layer.named_parameters()):
        got = q.grad if q.grad is not None else torch.zeros_like(q)
        dist.all_reduce(got)
        assert relative_error(got, p.grad) <= BOUND, f"{what}: d{name} {relative_error(got, p.grad):.3g}"


def _one_gather_per_call_whatever_the_length(cp, rank):
    """A forward is one all-gather of B H K (2V + K) floats per rank (and the one-element agreement),
    its backward one all-reduce of the gathered size, at any T."""
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
        for T in (8, 200):
            B, H, K, V = 2, 2, 16, 8
            q, k, g = (torch.randn(B, T, H, K, requires_grad=True) for _ in range(3))
            v = torch.randn(B, T, H, V, requires_grad=True)
            calls.clear()
            o, _ = cp.gla(q, k, v, -torch.sigmoid(g))
            assert calls == [("all_reduce", 1), ("all_gather", B * H * K * (2 * V + K))], calls
            calls.clear()
            o.sum().backward()
            assert calls == [("all_reduce", world * B * H * K * (2 * V + K))], calls
    finally:
        dist.all_gather, dist.all_reduce = all_gather, all_reduce


def _refused_argument_stops_every_rank(cp, rank):
    p = Problem("gla", "float32")
    q, k, v, g = (torch.tensor(x, dtype=torch.float32) for x in (p.q, p.k, p.v, p.g))
    if rank == 1:
        g = g[..., :3]  # a gate of the wrong width on one rank
    try:
        cp.gla(q, k, v, g)
    except ValueError as e:
        assert rank == 1 and "g" in str(e), str(e)
    except RuntimeError as e:
        assert rank != 1 and "rank 1 of the group raised" in str(e), str(e)
    else:
        raise AssertionError(f"rank {rank}: no error")


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
                    _check_variant(cp, rank, world, variant, dtype, split)
        # Shares shorter than the window, so that a rank's window reaches back past its predecessor.
        for split in SPLITS[world] + [(2,) * world, (1, 0, 2)[:world]]:
            for W in (1, 2, 4):
                _check_conv(cp, rank, split, W)
        for variant in variants:
            for split in SPLITS[world][1:]:
                _check_layer(rank, variant, split)
        _one_gather_per_call_whatever_the_length(cp, rank)
        _refused_argument_stops_every_rank(cp, rank)
        # No rank tears its connections down while another still uses them (gloo aborted at exit,
        # now and then, without it).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 3])
def test_every_variant_split_across_ranks_matches_the_oracle(world):
    mp.spawn(_worker, args=(world, _free_port(), NAMES), nprocs=world, join=True)


def test_refused_without_a_process_group():
    import flat.torch as ft

    with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
        ft.context_parallel()
