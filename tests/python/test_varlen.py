"""flat.torch with cu_seqlens: sequences packed along T give bitwise what each gives run alone,
forward and backward, for every variant and the convolution, empty sequences included; bad offsets
are refused; torch.compile. Pools of states and flat.jax's cu_seqlens: test_serving.py."""

import re

import numpy as np
import pytest
import torch

import flat.torch as ft
from oracle import GATE, NAMES, Problem

CHUNK = 16
LENGTHS = [1, CHUNK - 1, CHUNK, CHUNK + 1, 0, 2 * CHUNK + 3]  # an empty sequence too
SHARED_GATE = "per_sequence"  # retnet's one gate per head, a parameter of every sequence


def offsets(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)


def packed_problem(variant, dtype):
    p = Problem(variant, dtype, B=1, S=sum(LENGTHS), H=2, K=12, V=7, G=4 if variant == "sla" else None,
                heads={"q": 1, "k": 1, "g": 1, "b": 1} if variant == "sla" else {"q": 1})
    rng = np.random.default_rng(7)
    h0 = rng.standard_normal((len(LENGTHS), p.N, p.K, p.V)).astype(np.float32)
    dht = rng.standard_normal((len(LENGTHS), p.N, p.K, p.V)).astype(np.float32)
    return p, h0, dht


def run(p, tensors, h0, dht, dy, cu_seqlens=None):
    """o, final_state and every input's gradient of one call."""
    dtype = torch.bfloat16 if p.dtype == "bfloat16" else torch.float32
    inputs = {}
    for name, x in tensors.items():
        if x is not None:
            inputs[name] = torch.tensor(x, dtype=torch.float32 if name == "g" else dtype, requires_grad=True)
    inputs["initial_state"] = torch.tensor(h0, requires_grad=True)
    options = {"gate_group": p.G} if p.variant == "sla" else {}
    o, final_state = getattr(ft, p.variant)(**inputs, output_final_state=True, chunk_size=CHUNK,
                                            cu_seqlens=cu_seqlens, **options)
    torch.autograd.backward([o, final_state], [torch.tensor(dy, dtype=o.dtype), torch.tensor(dht)])
    return o.detach(), final_state.detach(), {name: t.grad for name, t in inputs.items()}


def tokens(x, start, end, name, variant):
    if x is None or (name == "g" and GATE[variant] == SHARED_GATE):
        return x
    return x[:, start:end]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", NAMES)
def test_packed_sequences_equal_each_run_alone(variant, dtype):
    p, h0, dht = packed_problem(variant, dtype)
    names = ("q", "k", "v", "g", "beta", "b", "w")
    tensors = dict(zip(names, p.inputs()[:7]))
    o, final_state, grads = run(p, tensors, h0, dht, p.dy, offsets(LENGTHS))
    cu = offsets(LENGTHS).tolist()
    gate_sum = torch.zeros_like(grads["g"]) if GATE[variant] == SHARED_GATE else None
    for i, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
        if start == end:  # nothing to run alone: the state passes through, its gradient too
            assert torch.equal(final_state[i], torch.tensor(h0[i]))
            assert torch.equal(grads["initial_state"][i], torch.tensor(dht[i]))
            continue
        alone = {name: tokens(x, start, end, name, variant) for name, x in tensors.items()}
        o1, ht1, grads1 = run(p, alone, h0[i:i + 1], dht[i:i + 1], p.dy[:, start:end])
        assert torch.equal(o[:, start:end], o1)
        assert torch.equal(final_state[i:i + 1], ht1)
        assert torch.equal(grads["initial_state"][i:i + 1], grads1["initial_state"])
        for name in names:
            if tensors[name] is None:
                continue
            if name == "g" and gate_sum is not None:
                gate_sum += grads1["g"]
                continue
            assert torch.equal(grads[name][:, start:end], grads1[name]), name
    if gate_sum is not None:  # summed over sequences in another order: equal to rounding
        torch.testing.assert_close(grads["g"], gate_sum, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_convolution_equals_each_sequence_alone(dtype):
    rng = np.random.default_rng(3)
    T, C, W = sum(LENGTHS), 20, 4
    x = torch.tensor(rng.standard_normal((1, T, C)), dtype=dtype)
    weight, bias = torch.tensor(rng.standard_normal((C, W)), dtype=torch.float32), torch.randn(C)
    state0 = torch.tensor(rng.standard_normal((len(LENGTHS), C, W - 1)), dtype=torch.float32)
    dy = torch.tensor(rng.standard_normal((1, T, C)), dtype=dtype)
    dstate = torch.tensor(rng.standard_normal((len(LENGTHS), C, W - 1)), dtype=torch.float32)

    def conv(x, state0, dy, dstate, cu_seqlens=None):
        leaves = [t.clone().requires_grad_() for t in (x, weight, bias, state0)]
        y, state = ft.conv(*leaves, output_final_state=True, cu_seqlens=cu_seqlens)
        torch.autograd.backward([y, state], [dy, dstate])
        return y.detach(), state.detach(), [t.grad for t in leaves]

    y, state, (dx, dweight, dbias, dstate0) = conv(x, state0, dy, dstate, offsets(LENGTHS))
    cu = offsets(LENGTHS).tolist()
    sum_dweight, sum_dbias = torch.zeros_like(dweight), torch.zeros_like(dbias)
    for i, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
        if start == end:
            assert torch.equal(state[i], state0[i]) and torch.equal(dstate0[i], dstate[i])
            continue
        y1, state1, (dx1, dweight1, dbias1, dstate01) = conv(x[:, start:end], state0[i:i + 1], dy[:, start:end],
                                                             dstate[i:i + 1])
        assert torch.equal(y[:, start:end], y1) and torch.equal(state[i:i + 1], state1)
        assert torch.equal(dx[:, start:end], dx1) and torch.equal(dstate0[i:i + 1], dstate01)
        sum_dweight += dweight1
        sum_dbias += dbias1
    torch.testing.assert_close(dweight, sum_dweight, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dbias, sum_dbias, rtol=1e-5, atol=1e-5)


def test_compiled_call_with_cu_seqlens_is_the_eager_one():
    p, h0, dht = packed_problem("gated_deltanet", "bfloat16")
    q, k, v, g, beta = (torch.tensor(x, dtype=torch.float32 if i == 3 else torch.bfloat16)
                        for i, x in enumerate(p.inputs()[:5]))
    cu, h0 = offsets(LENGTHS), torch.tensor(h0)

    def step(q, k, v, g, beta, h0, cu):
        return ft.gated_deltanet(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)

    eager = step(q, k, v, g, beta, h0, cu)
    compiled = torch.compile(step, fullgraph=True)(q, k, v, g, beta, h0, cu)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
    assert eager[1].shape == (len(LENGTHS), p.N, p.K, p.V)


@pytest.mark.parametrize("cu_seqlens, message", [
    (torch.tensor([0, 5, 3, 72]), "cu_seqlens: expected non-decreasing offsets"),
    (torch.tensor([0, 5, 80]), "cu_seqlens: expected offsets up to S = 72"),
    (torch.tensor([1, 5, 72]), "cu_seqlens"),
    (torch.tensor([0.0, 72.0]), "cu_seqlens: expected a CPU tensor [num_seqs + 1] of int32 or int64"),
])
def test_bad_offsets_are_refused_and_nothing_is_returned(cu_seqlens, message):
    q, k, v = (torch.randn(1, 72, 2, 8) for _ in range(3))
    g = -torch.rand(1, 72, 2, 8)
    with pytest.raises(ValueError, match=re.escape(message)):
        ft.gla(q, k, v, g, cu_seqlens=cu_seqlens)

