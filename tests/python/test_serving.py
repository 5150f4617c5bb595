"""Serving in flat.torch and flat.jax: a pool of states read through initial_state_indices and
written in place through final_state_indices (bitwise the call with a state per sequence) and
token_state_indices (against the float64 reference token by token), for every variant and the
convolution; the library's refusals, with the pool untouched; no gradient through a pool write,
gradients through pool reads, a backward refused once a pool it read is written; torch.compile of a
decode step; accepted_state_indices; flat.jax's cu_seqlens and pools, bitwise flat.torch's, under
jax.jit, in place when the pool is donated."""

import re

import numpy as np
import pytest
import torch

import flat.torch as ft
from flat.nn.ops import reference_conv, reference_recurrence
from oracle import NAMES, Problem, relative_error

CHUNK = 16
NAN = float("nan")

# Sequences packed along T, an empty one among them, over a pool of P rows: the rows each starts
# from (-1: zero) and the rows its final state goes to (-1: nowhere). Sequence 0 updates its own
# row; rows 0, 7, 5, 2 are only read; row 9 is neither read nor written.
LENGTHS = [1, CHUNK - 1, CHUNK, CHUNK + 1, 0, 2 * CHUNK + 3]
P = 10
READS = [3, -1, 0, 7, 5, 2]
WRITES = [3, 8, -1, 1, 6, 4]

# The speculative layout: the state after each token to its own row (-1: none), the final states
# of sequences 2 and 3 beside their last tokens', the empty sequence's (its initial one) to row 10;
# rows 8 and 15 are never written.
TOKEN_LENGTHS = [3, 0, 5, 1]
TOKEN_P = 16
TOKEN_READS = [12, 13, -1, 14]
TOKEN_WRITES = [-1, 10, 11, 9]
TOKENS = [0, 1, 2, 3, 4, -1, 5, 6, 7]


def offsets(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)


def ints(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


def same(a, b):
    """Bitwise equal, NaN included."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def problem(variant, lengths, seed=1):
    """The recurrence's inputs for sequences of these lengths packed along T: (Problem, the
    function's keyword arguments as float32 tensors)."""
    p = Problem(variant, "float32", B=1, S=sum(lengths), H=2, K=12, V=7, G=4 if variant == "sla" else None,
                heads={"q": 1, "k": 1, "g": 1, "b": 1} if variant == "sla" else {"q": 1}, seed=seed)
    names = ("q", "k", "v", "g", "beta", "b", "w")
    args = {name: torch.tensor(x, dtype=torch.float32) for name, x in zip(names, p.inputs()) if x is not None}
    if variant == "sla":
        args["gate_group"] = p.G
    return p, args


def pool_of(rows, shape, read, seed=0):
    """A pool [rows, *shape]: random states in the rows read, NaN in every other (to show which are
    written and that the rest are not)."""
    pool = torch.full((rows,) + tuple(shape), NAN)
    generator = torch.Generator().manual_seed(seed)
    for r in read:
        if r >= 0:
            pool[r] = torch.randn(shape, generator=generator)
    return pool


def rows_of(pool, reads):
    """The states [num_seqs, ...] the sequences start from: the pool's rows, zero for -1."""
    return torch.stack([pool[r] if r >= 0 else torch.zeros_like(pool[0]) for r in reads])


def written(pool, finals, writes):
    """The pool after the final states [num_seqs, ...] went to their rows."""
    want = pool.clone()
    for i, r in enumerate(writes):
        if r >= 0:
            want[r] = finals[i]
    return want


# ---- flat.torch: a pool read and written through final_state_indices --------------------------


@pytest.mark.parametrize("variant", NAMES)
def test_pool_in_place_is_the_call_with_a_state_per_sequence(variant):
    p, args = problem(variant, LENGTHS)
    pool = pool_of(P, (p.N, p.K, p.V), READS)
    cu = offsets(LENGTHS)
    run = getattr(ft, variant)
    o_alone, finals = run(**args, initial_state=rows_of(pool, READS), output_final_state=True, chunk_size=CHUNK,
                          cu_seqlens=cu)
    want = written(pool, finals, WRITES)
    with torch.no_grad():
        o, state = run(**args, initial_state=pool, chunk_size=CHUNK, cu_seqlens=cu,
                       initial_state_indices=ints(READS, torch.int32), final_state_indices=ints(WRITES))
    assert state is pool
    assert same(o, o_alone) and same(pool, want)


def test_conv_pool_in_place_is_the_call_with_a_state_per_sequence():
    C, W = 20, 4
    x = torch.randn(1, sum(LENGTHS), C)
    weight, bias = torch.randn(C, W), torch.randn(C)
    pool = pool_of(P, (C, W - 1), READS)
    cu = offsets(LENGTHS)
    y_alone, finals = ft.conv(x, weight, bias, rows_of(pool, READS), True, cu_seqlens=cu)
    want = written(pool, finals, WRITES)
    y, state = ft.conv(x, weight, bias, pool, cu_seqlens=cu, initial_state_indices=ints(READS),
                       final_state_indices=ints(WRITES, torch.int32))
    assert state is pool
    assert same(y, y_alone) and same(pool, want)


def test_reads_alone_give_fresh_final_states_and_no_indices_start_from_zero():
    """initial_state_indices alone: final states [num_seqs, ...], the pool untouched. A pool write
    without initial_state_indices: every sequence starts from zero."""
    p, args = problem("gla", LENGTHS)
    pool = pool_of(P, (p.N, p.K, p.V), READS)
    cu = offsets(LENGTHS)
    before = pool.clone()
    o_alone, finals = ft.gla(**args, initial_state=rows_of(pool, READS), output_final_state=True, cu_seqlens=cu)
    o, fresh = ft.gla(**args, initial_state=pool, output_final_state=True, cu_seqlens=cu,
                      initial_state_indices=ints(READS))
    assert same(o, o_alone) and same(fresh, finals) and same(pool, before)
    o_zero, finals_zero = ft.gla(**args, output_final_state=True, cu_seqlens=cu)
    with torch.no_grad():
        o, _ = ft.gla(**args, initial_state=pool, cu_seqlens=cu, final_state_indices=ints(WRITES))
    assert same(o, o_zero) and same(pool, written(before, finals_zero, WRITES))


# ---- flat.torch: the state after each token (token_state_indices) ------------------------------


def token_pool(shape):
    return pool_of(TOKEN_P, shape, TOKEN_READS)


def check_token_pool(pool, want, bound):
    """The rows written within the bound of the float64 reference's, the last token's state and the
    final state one value, the rows read as they were, the others NaN."""
    rows = [r for r in TOKENS + TOKEN_WRITES if r >= 0]
    assert relative_error(pool[rows], want[rows]) <= bound
    assert same(pool[6], pool[11]) and same(pool[7], pool[9])
    assert all(same(pool[r], want[r].float()) for r in TOKEN_READS if r >= 0)
    assert torch.isnan(pool[[8, 15]]).all()


def token_indices():
    return dict(cu_seqlens=offsets(TOKEN_LENGTHS), initial_state_indices=ints(TOKEN_READS),
                final_state_indices=ints(TOKEN_WRITES), token_state_indices=ints(TOKENS, torch.int32))


@pytest.mark.parametrize("variant", NAMES)
def test_token_states_match_the_float64_reference(variant):
    p, args = problem(variant, TOKEN_LENGTHS)
    pool = token_pool((p.N, p.K, p.V))
    want = pool.double()
    o_want, _ = reference_recurrence(variant, **{n: t.double() for n, t in args.items() if n != "gate_group"},
                                     gate_group=args.get("gate_group"), initial_state=want, **token_indices())
    with torch.no_grad():
        o, state = getattr(ft, variant)(**args, initial_state=pool, **token_indices())
    assert state is pool
    assert relative_error(o, o_want) <= 1e-5
    check_token_pool(pool, want, 1e-5)


def test_conv_token_states_match_the_float64_reference():
    C, W = 20, 4
    x = torch.randn(1, sum(TOKEN_LENGTHS), C)
    weight, bias = torch.randn(C, W), torch.randn(C)
    pool = token_pool((C, W - 1))
    want = pool.double()
    y_want, _ = reference_conv(x.double(), weight.double(), bias.double(), want, **token_indices())
    y, state = ft.conv(x, weight, bias, pool, **token_indices())
    assert state is pool
    assert relative_error(y, y_want) <= 1e-6
    check_token_pool(pool, want, 0.0)  # the last W-1 inputs: copies


def test_accepted_state_indices():
    cu = offsets([3, 3, 1, 2])
    tokens = ints([4, 5, 6, 7, 8, 9, 10, 11, 12], torch.int32)
    rows = ft.accepted_state_indices(tokens, cu, ints([1, 3, 1, 2]))
    assert rows.tolist() == [4, 9, 10, 12] and rows.dtype == torch.int32
    for bad in ([0, 3, 1, 2], [1, 4, 1, 2], [1, 1, 1]):
        with pytest.raises(ValueError, match=re.escape("num_accepted: expected a count per sequence from 1 to its "
                                                       "length [3, 3, 1, 2]")):
            ft.accepted_state_indices(tokens, cu, ints(bad))
    with pytest.raises(ValueError, match="token_state_indices: expected one index per token, cu_seqlens"):
        ft.accepted_state_indices(tokens[:-1], cu, ints([1, 1, 1, 1]))


# ---- flat.torch: refusals, gradients, torch.compile, the custom ops ----------------------------


@pytest.mark.parametrize("indices, message", [
    (dict(final_state_indices=[3, 8, -1, 1, 6, 10]),
     "final_state_indices: expected indices from -1 (none) to P-1 = 9 (the rows of ht), got "
     "final_state_indices[5] = 10"),
    (dict(initial_state_indices=[3, -1, 0, 7, 5, -2], final_state_indices=WRITES),
     "initial_state_indices: expected indices from -1 (none) to P-1 = 9"),
    (dict(final_state_indices=[3, 8, -1, 8, 6, 4]),
     "final_state_indices: expected each row of ht written once, got final_state_indices[1] and "
     "final_state_indices[3] both writing row 8"),
    (dict(token_state_indices=[9] + [-1] * (sum(LENGTHS) - 2) + [9]),
     "token_state_indices: expected each row of ht written once"),
    (dict(final_state_indices=[3, 8, -1, 1, 6, 4], token_state_indices=[8] + [-1] * (sum(LENGTHS) - 1)),
     "expected each row of ht written once"),
    (dict(initial_state_indices=READS, final_state_indices=[3, 8, -1, 1, 6, 0]),
     "h0 and ht are one pool updated in place, so a row one sequence reads may be written by no other; "
     "got row 0 read by sequence 2"),
    (dict(final_state_indices=WRITES[:-1]), "final_state_indices: expected one index per sequence, num_seqs = 6, got 5"),
])
def test_bad_indices_are_refused_and_the_pool_is_untouched(indices, message):
    p, args = problem("gated_deltanet", LENGTHS)
    pool = pool_of(P, (p.N, p.K, p.V), READS)
    before = pool.clone()
    with torch.no_grad(), pytest.raises(ValueError, match=re.escape(message)):
        ft.gated_deltanet(**args, initial_state=pool, cu_seqlens=offsets(LENGTHS),
                          **{name: ints(values) for name, values in indices.items()})
    assert same(pool, before)


def test_bad_arguments_of_a_pool_write_are_refused():
    p, args = problem("la", LENGTHS)
    pool = pool_of(P, (p.N, p.K, p.V), READS)
    cu, writes = offsets(LENGTHS), ints(WRITES)
    with pytest.raises(ValueError, match=re.escape("final_state_indices: expected a CPU tensor [num_seqs] of int32 or "
                                                   "int64, got torch.float32 [6]")):
        ft.la(**args, initial_state=pool, cu_seqlens=cu, final_state_indices=writes.float())
    with pytest.raises(ValueError, match=re.escape("initial_state: final_state_indices and token_state_indices write "
                                                   "states into the pool initial_state [P, ...], got none")):
        ft.la(**args, cu_seqlens=cu, final_state_indices=writes)
    with pytest.raises(ValueError, match="the pool initial_state in place is for inference"):
        ft.la(**args, initial_state=pool.requires_grad_(), cu_seqlens=cu, final_state_indices=writes)
    x = torch.randn(1, sum(LENGTHS), 8, requires_grad=True)
    with pytest.raises(ValueError, match="the pool initial_state in place is for inference"):
        ft.conv(x, torch.randn(8, 4), None, torch.zeros(P, 8, 3), cu_seqlens=cu, final_state_indices=writes)


def test_gradients_through_pool_reads():
    """initial_state_indices alone is differentiable: the inputs' gradients are the call's with a
    state per sequence, the pool's its rows' summed where two sequences read one."""
    reads = [3, -1, 0, 3, 5, 2]
    p, args = problem("kda", LENGTHS)
    args = {name: t.requires_grad_() if name != "gate_group" else t for name, t in args.items()}
    pool = pool_of(P, (p.N, p.K, p.V), reads).requires_grad_()
    cu = offsets(LENGTHS)
    dy, dht = torch.randn(1, sum(LENGTHS), p.N, p.V), torch.randn(len(LENGTHS), p.N, p.K, p.V)

    def gradients(**call):
        grads = {name: t for name, t in args.items() if isinstance(t, torch.Tensor)}
        o, finals = ft.kda(**args, output_final_state=True, chunk_size=CHUNK, cu_seqlens=cu, **call)
        return torch.autograd.grad([o, finals], list(grads.values()) + [call["initial_state"]], [dy, dht])

    states = rows_of(pool, reads).detach().requires_grad_()
    *d_alone, d_states = gradients(initial_state=states)
    *d, d_pool = gradients(initial_state=pool, initial_state_indices=ints(reads))
    assert all(same(a, b) for a, b in zip(d, d_alone))
    want = torch.zeros_like(pool)
    for i, r in enumerate(reads):
        if r >= 0:
            want[r] += d_states[i]
    assert same(d_pool, want)

    C, W = 12, 4
    x, weight = torch.randn(1, sum(LENGTHS), C, requires_grad=True), torch.randn(C, W)
    conv_pool = pool_of(P, (C, W - 1), reads).requires_grad_()
    dx_alone, dstates = torch.autograd.grad(ft.conv(x, weight, None, rows_of(conv_pool, reads), cu_seqlens=cu)[0],
                                            [x, conv_pool], torch.ones_like(x))
    dx, dpool = torch.autograd.grad(ft.conv(x, weight, None, conv_pool, cu_seqlens=cu,
                                            initial_state_indices=ints(reads))[0], [x, conv_pool], torch.ones_like(x))
    assert same(dx, dx_alone) and same(dpool, dstates)


STALE = "modified by an inplace operation"


def test_a_pool_written_after_a_differentiable_read_refuses_the_backward():
    """A pool read with gradients through initial_state_indices, then written in place by a serving
    call (final_state_indices, under no_grad) before backward(): backward raises PyTorch's error for
    a tensor modified in place, as after any in-place op, instead of differentiating the rows written
    since; the recurrence and the convolution (compiled: the decode step's test below)."""
    p, args = problem("gated_deltanet", LENGTHS)
    q = args.pop("q").requires_grad_()
    cu, reads = offsets(LENGTHS), ints(READS)
    pool = pool_of(P, (p.N, p.K, p.V), READS)
    C, W = 12, 4
    x, weight = torch.randn(1, sum(LENGTHS), C, requires_grad=True), torch.randn(C, W)
    conv_pool = pool_of(P, (C, W - 1), READS)

    o, _ = ft.gated_deltanet(q, **args, initial_state=pool, cu_seqlens=cu, initial_state_indices=reads)
    y, _ = ft.conv(x, weight, None, conv_pool, cu_seqlens=cu, initial_state_indices=reads)
    with torch.no_grad():
        ft.gated_deltanet(q.detach(), **args, initial_state=pool, cu_seqlens=cu, initial_state_indices=reads,
                          final_state_indices=ints(WRITES))
        ft.conv(x.detach(), weight, None, conv_pool, cu_seqlens=cu, initial_state_indices=reads,
                final_state_indices=ints(WRITES))
    for out in (o, y):
        with pytest.raises(RuntimeError, match=STALE):
            out.sum().backward()


def decode_step(x, weight, q, k, v, g, beta, state, conv_state, rows):
    """One token per sequence (B = num_seqs, T = 1) over pools updated in place."""
    x, _ = ft.conv(x, weight, None, conv_state, initial_state_indices=rows, final_state_indices=rows)
    o, _ = ft.gated_deltanet(q + x.view(q.shape), k, v, g, beta, initial_state=state, initial_state_indices=rows,
                             final_state_indices=rows)
    return o


def test_compiled_decode_step_updates_the_pools_as_eager_does():
    torch.manual_seed(4)
    B, H, K, V = 3, 2, 16, 8
    q, k = torch.randn(B, 1, H, K), 0.2 * torch.randn(B, 1, H, K)
    v, g, beta = torch.randn(B, 1, H, V), -torch.rand(B, 1, H), torch.rand(B, 1, H)
    x, weight = torch.randn(B, 1, H * K), torch.randn(H * K, 4)
    rows = ints([4, 0, 2])
    pools = [pool_of(5, (H, K, V), rows), pool_of(5, (H * K, 3), rows, seed=1)]
    eager_pools = [t.clone() for t in pools]
    compiled = torch.compile(decode_step, fullgraph=True)
    # Reads of the pools with gradients, whose backward the compiled step's writes make stale.
    read, _ = ft.gated_deltanet(q.clone().requires_grad_(), k, v, g, beta, initial_state=pools[0],
                                initial_state_indices=rows)
    read_conv, _ = ft.conv(x.clone().requires_grad_(), weight, None, pools[1], initial_state_indices=rows)
    with torch.no_grad():
        o_eager = decode_step(x, weight, q, k, v, g, beta, *eager_pools, rows)
        o = compiled(x, weight, q, k, v, g, beta, *pools, rows)
    assert same(o, o_eager) and all(same(a, b) for a, b in zip(pools, eager_pools))
    assert not torch.isnan(pools[0][rows]).any() and torch.isnan(pools[0][[1, 3]]).all()
    for out in (read, read_conv):
        with pytest.raises(RuntimeError, match=STALE):
            out.sum().backward()


def test_pool_ops_registrations():
    """torch.library.opcheck of the ops that write a pool (their schema declares the mutation) and of
    the forward reading one (its gradient the pool's)."""
    q, k, v = (torch.randn(1, 6, 2, 16) for _ in range(3))
    pool = torch.randn(4, 2, 16, 16)
    cu, reads, writes = ints([0, 2, 6]), ints([1, -1]), ints([1, 3])
    options = dict(scale=None, chunk=16, l2norm_qk=False, solve="auto", precision="exact", gate_group=0,
                   check_values=True)
    torch.library.opcheck(torch.ops.flat.forward.default,
                          ("la", q.clone().requires_grad_(), k, v, None, None, None, None, pool.clone().requires_grad_(), cu,
                           ints([1, 1])), dict(final_state=True, **options))
    torch.library.opcheck(torch.ops.flat.forward_pool.default,
                          ("la", q, k, v, None, None, None, None, pool, cu, reads, writes, None), options)
    x, weight = torch.randn(1, 6, 8), torch.randn(8, 4)
    torch.library.opcheck(torch.ops.flat.conv_forward_pool.default,
                          (x, weight, None, torch.randn(4, 8, 3), cu, None, None, ints([0, 1, 2, 3, -1, -1]),
                           "silu"))


# ---- flat.jax: cu_seqlens and pools, bitwise flat.torch's -------------------------------------


def jax_modules():
    jax = pytest.importorskip("jax")
    fj = pytest.importorskip("flat.jax")
    return jax, jax.numpy, fj


@pytest.mark.parametrize("variant", NAMES)
def test_jax_pool_calls_under_jit_are_torchs(variant):
    """A pool read and written (reads, writes) and the state after each token, under jax.jit with the
    pool donated: flat.torch's outputs and pools, bitwise."""
    jax, jnp, fj = jax_modules()
    for lengths, P_, sequences in ((LENGTHS, P, dict(initial_state_indices=READS, final_state_indices=WRITES)),
                                   (TOKEN_LENGTHS, TOKEN_P, dict(initial_state_indices=TOKEN_READS,
                                                                 final_state_indices=TOKEN_WRITES,
                                                                 token_state_indices=TOKENS))):
        p, args = problem(variant, lengths)
        pool = pool_of(P_, (p.N, p.K, p.V), sequences["initial_state_indices"])
        pool_jax = jnp.asarray(pool.numpy())
        cu = offsets(lengths)
        tensors = {name: t for name, t in args.items() if name != "gate_group"}
        options = dict(chunk_size=CHUNK, gate_group=args.get("gate_group")) if variant in ("kda", "gdn2", "sla") else \
            dict(chunk_size=CHUNK)
        with torch.no_grad():
            o, _ = getattr(ft, variant)(**tensors, initial_state=pool, cu_seqlens=cu, **options,
                                        **{name: ints(values) for name, values in sequences.items()})

        def call(tensors, pool, cu, sequences):
            return getattr(fj, variant)(**tensors, initial_state=pool, cu_seqlens=cu, **options, **sequences)

        o_jax, pool_out = jax.jit(call, donate_argnums=1)(
            {name: jnp.asarray(t.numpy()) for name, t in tensors.items()}, pool_jax, jnp.asarray(cu.numpy()),
            {name: jnp.asarray(values, jnp.int32) for name, values in sequences.items()})
        assert np.array_equal(np.asarray(o_jax), o.numpy())
        assert np.array_equal(np.asarray(pool_out), pool.numpy(), equal_nan=True)


@pytest.mark.parametrize("variant", ["gla", "gated_deltanet"])
def test_jax_gradients_with_cu_seqlens_and_pool_reads_are_torchs(variant):
    jax, jnp, fj = jax_modules()
    reads = [3, -1, 0, 3, 5, 2]
    p, args = problem(variant, LENGTHS)
    pool = pool_of(P, (p.N, p.K, p.V), reads)
    cu = offsets(LENGTHS)
    dy, dht = torch.randn(1, sum(LENGTHS), p.N, p.V), torch.randn(len(LENGTHS), p.N, p.K, p.V)
    leaves = {name: t.clone().requires_grad_() for name, t in dict(args, initial_state=pool).items()}
    o, finals = getattr(ft, variant)(**leaves, output_final_state=True, chunk_size=CHUNK, cu_seqlens=cu,
                                     initial_state_indices=ints(reads))
    torch.autograd.backward([o, finals], [dy, dht])

    def loss(inputs, cu, reads):
        o, finals = getattr(fj, variant)(**inputs, output_final_state=True, chunk_size=CHUNK, cu_seqlens=cu,
                                         initial_state_indices=reads)
        return jnp.sum(o * jnp.asarray(dy.numpy())) + jnp.sum(finals * jnp.asarray(dht.numpy()))

    inputs = {name: jnp.asarray(t.detach().numpy()) for name, t in leaves.items()}
    grads = jax.jit(jax.grad(loss))(inputs, jnp.asarray(cu.numpy(), jnp.int32), jnp.asarray(reads, jnp.int32))
    for name, t in leaves.items():
        np.testing.assert_allclose(np.asarray(grads[name]), t.grad.numpy(), rtol=1e-6, atol=1e-6, err_msg=name)


def test_jax_conv_with_sequences_is_torchs():
    jax, jnp, fj = jax_modules()
    C, W = 20, 4
    x = torch.randn(1, sum(TOKEN_LENGTHS), C)
    weight, bias = torch.randn(C, W), torch.randn(C)
    pool = token_pool((C, W - 1))
    y, _ = ft.conv(x, weight, bias, pool, **token_indices())
    J = lambda t: jnp.asarray(t.numpy())  # noqa: E731
    y_jax, pool_jax = jax.jit(lambda x, pool, sequences: fj.conv(x, J(weight), J(bias), pool, **sequences))(
        J(x), J(token_pool((C, W - 1))), {name: J(t) for name, t in token_indices().items()})
    assert np.array_equal(np.asarray(y_jax), y.numpy())
    assert np.array_equal(np.asarray(pool_jax), pool.numpy(), equal_nan=True)

    reads, cu = [3, -1, 0, 3, 5, 2], offsets(LENGTHS)
    x = torch.randn(1, sum(LENGTHS), C, requires_grad=True)
    conv_pool = pool_of(P, (C, W - 1), reads).requires_grad_()
    y, finals = ft.conv(x, weight, bias, conv_pool, True, cu_seqlens=cu, initial_state_indices=ints(reads))
    torch.autograd.backward([y, finals], [torch.ones_like(y), torch.ones_like(finals)])

    def loss(x, pool):
        y, finals = fj.conv(x, J(weight), J(bias), pool, True, cu_seqlens=J(cu), initial_state_indices=J(ints(reads)))
        return jnp.sum(y) + jnp.sum(finals)

    dx, dpool = jax.jit(jax.grad(loss, argnums=(0, 1)))(J(x.detach()), J(conv_pool.detach()))
    assert np.array_equal(np.asarray(dx), x.grad.numpy()) and np.array_equal(np.asarray(dpool), conv_pool.grad.numpy())


def test_jax_donated_pool_is_updated_in_place():
    jax, jnp, fj = jax_modules()
    p, args = problem("mamba2", LENGTHS)
    pool = jnp.asarray(pool_of(P, (p.N, p.K, p.V), READS).numpy())
    address = pool.unsafe_buffer_pointer()
    step = jax.jit(lambda inputs, pool: fj.mamba2(**inputs, initial_state=pool, cu_seqlens=offsets(LENGTHS).numpy(),
                                                  initial_state_indices=np.asarray(READS),
                                                  final_state_indices=np.asarray(WRITES))[1], donate_argnums=1)
    out = step({name: jnp.asarray(t.numpy()) for name, t in args.items()}, pool)
    assert out.unsafe_buffer_pointer() == address and pool.is_deleted()


def test_jax_refusals_and_int64_indices():
    jax, jnp, fj = jax_modules()
    p, args = problem("la", LENGTHS)
    inputs = {name: jnp.asarray(t.numpy()) for name, t in args.items()}
    pool = jnp.asarray(pool_of(P, (p.N, p.K, p.V), READS).numpy())
    cu = jnp.asarray(offsets(LENGTHS).numpy(), jnp.int32)
    with pytest.raises(Exception, match=re.escape("final_state_indices: expected each row of ht written once")):
        fj.la(**inputs, initial_state=pool, cu_seqlens=cu, final_state_indices=jnp.array([3, 8, -1, 8, 6, 4]))[0]\
            .block_until_ready()
    with pytest.raises(ValueError, match=re.escape("initial_state_indices: expected an array [num_seqs] of int32 or "
                                                   "int64, got float32 [6]")):
        fj.la(**inputs, initial_state=pool, cu_seqlens=cu, initial_state_indices=jnp.zeros(6))
    with pytest.raises(ValueError, match="the pool initial_state in place is for inference"):
        jax.grad(lambda q: jnp.sum(fj.la(q, inputs["k"], inputs["v"], initial_state=pool, cu_seqlens=cu,
                                         final_state_indices=jnp.asarray(WRITES))[0]))(inputs["q"])
    o32, pool32 = fj.la(**inputs, initial_state=pool, cu_seqlens=cu, initial_state_indices=jnp.asarray(READS),
                        final_state_indices=jnp.asarray(WRITES))
    with jax.enable_x64(True):
        o64, pool64 = fj.la(**inputs, initial_state=pool, cu_seqlens=cu.astype(jnp.int64),
                            initial_state_indices=jnp.asarray(READS, jnp.int64),
                            final_state_indices=jnp.asarray(WRITES, jnp.int64))
        assert o64.dtype == jnp.float32
    assert np.array_equal(np.asarray(o32), np.asarray(o64))
    assert np.array_equal(np.asarray(pool32), np.asarray(pool64), equal_nan=True)


def test_jax_accepted_state_indices_is_torchs():
    jax, jnp, fj = jax_modules()
    cu, tokens, accepted = offsets([3, 3, 1, 2]), ints(range(4, 13)), ints([1, 3, 1, 2])
    rows = jax.jit(fj.accepted_state_indices)(*(jnp.asarray(t.numpy(), jnp.int32) for t in (tokens, cu, accepted)))
    assert np.asarray(rows).tolist() == ft.accepted_state_indices(tokens, cu, accepted).tolist()
