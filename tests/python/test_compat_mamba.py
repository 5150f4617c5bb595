"""flat.compat.causal_conv1d and flat.compat.mamba_ssm against transformers' own torch fallbacks
(modeling_mamba2's causal_conv1d_fn, causal_conv1d_update, mamba2_chunk_scan,
mamba2_selective_state_update, and Mamba2Mixer's composition of them for the fused mixer) in
float32: outputs and states within 1e-5, gradients within 1e-4 (relative L2 per tensor); packed
sequences against separate calls; states updated in place; bfloat16 inputs against the float32
reference; bad input."""


import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
from transformers.models.mamba2 import modeling_mamba2 as hf  # noqa: E402

from flat.compat import causal_conv1d as cc  # noqa: E402
from flat.compat import mamba_ssm as ms  # noqa: E402
from torch_fallbacks import GRAD, OUT, plain, rel  # noqa: E402

ref_conv = plain(hf.causal_conv1d_fn)
ref_update = plain(hf.causal_conv1d_update)
ref_scan = plain(hf.mamba2_chunk_scan)
ref_step = plain(hf.mamba2_selective_state_update)


def close(a, b, bound, what=""):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    err = rel(a, b)
    assert err <= bound, f"{what}: relative L2 {err:.2e} > {bound:.0e}"


def leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in ts]


def grads_of(outputs, inputs, seed=0):
    """The gradients of a fixed random projection of the outputs."""
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o.float() * torch.randn(o.shape, generator=gen)).sum() for o in outputs if o is not None)
    wanted = [t for t in inputs if t is not None]
    return torch.autograd.grad(loss, wanted, allow_unused=True)


def check_grads(ours, theirs, names):
    for g1, g2, name in zip(ours, theirs, names):
        assert g1 is not None and g2 is not None, name
        close(g1, g2, GRAD, f"d{name}")


# ---- causal_conv1d -----------------------------------------------------------------------------


@pytest.mark.parametrize("W,T", [(4, 1), (4, 17), (2, 5)])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_fn_matches_the_fallback(W, T, activation, bias):
    torch.manual_seed(W * 100 + T)
    Bn, D = 2, 6
    # As transformers passes it: the [B, D, T] view of a column block of a [B, T, *] projection.
    proj = torch.randn(Bn, T, D + 3)
    weight, b = torch.randn(D, W), (torch.randn(D) if bias else None)
    p1, w1, b1 = leaves(proj, weight, b)
    x2, w2, b2 = leaves(proj[..., :D], weight, b)
    out = cc.causal_conv1d_fn(p1[..., :D].transpose(1, 2), w1, b1, activation=activation)
    ref = ref_conv(x2.transpose(1, 2), w2, b2, activation=activation)
    close(out, ref, OUT, "out")
    assert out.shape == (Bn, D, T) and out.stride(1) == 1  # a [B, D, T] view of a [B, T, D] output
    dproj, *rest = grads_of([out], [p1, w1, b1])
    ours = [dproj[..., :D], *rest]
    assert torch.all(dproj[..., D:] == 0)
    check_grads(ours, grads_of([ref], [x2, w2, b2]), ["x", "weight", "bias"])


def _conv_with_state(x, weight, bias, init, activation):
    """The package's reference (causal_conv1d_ref) on transformers' fallback: positions before 0
    read init [B, D, W-1]; the final state the last W-1 inputs."""
    W = weight.shape[1]
    state = init.clone()
    out = ref_update(x, state, weight, bias, activation=activation)
    final = torch.cat([init, x], dim=-1)[..., -(W - 1):]
    return out, final


@pytest.mark.parametrize("T", [1, 2, 9])
@pytest.mark.parametrize("initial", [True, False])
def test_conv_fn_initial_and_final_states(T, initial):
    torch.manual_seed(T)
    Bn, D, W = 2, 5, 4
    x, weight, bias = torch.randn(Bn, D, T), torch.randn(D, W), torch.randn(D)
    init = torch.randn(Bn, D, W - 1) if initial else torch.zeros(Bn, D, W - 1)
    x1, w1, b1, i1 = leaves(x, weight, bias, init)
    x2, w2, b2, i2 = leaves(x, weight, bias, init)
    out, final = cc.causal_conv1d_fn(x1, w1, b1, initial_states=i1 if initial else None, return_final_states=True,
                                     activation="swish")
    ref, ref_final = _conv_with_state(x2, w2, b2, i2, "silu")
    close(out, ref, OUT, "out")
    close(final, ref_final, OUT, "final_states")
    names = ["x", "weight", "bias", "initial_states"]
    ours = grads_of([out, final], [x1, w1, b1, i1 if initial else None])
    check_grads(ours, grads_of([ref, ref_final], [x2, w2, b2, i2 if initial else None]), names)

    # final_states_out is written and returned.
    buffer = torch.empty(Bn, D, W - 1)
    with torch.no_grad():
        _, returned = cc.causal_conv1d_fn(x, weight, bias, initial_states=init if initial else None,
                                          return_final_states=True, final_states_out=buffer)
    assert returned is buffer
    close(buffer, ref_final, OUT, "final_states_out")


def test_conv_fn_of_width_one_takes_its_own_final_states_back():
    """W = 1 keeps no past input: its final states are [B, D, 0], and passed back as initial_states
    (as a caller chaining calls does for any W) they are taken, reading nothing: two chunks give the
    one call's output, the fallback's."""
    torch.manual_seed(1)
    x, weight, bias = torch.randn(2, 5, 7), torch.randn(5, 1), torch.randn(5)
    whole = cc.causal_conv1d_fn(x, weight, bias, activation="silu")
    close(whole, ref_conv(x, weight, bias, activation="silu"), OUT, "out")
    first, states = cc.causal_conv1d_fn(x[..., :3], weight, bias, return_final_states=True, activation="silu")
    second, final = cc.causal_conv1d_fn(x[..., 3:], weight, bias, initial_states=states, return_final_states=True,
                                        activation="silu")
    assert states.shape == final.shape == (2, 5, 0)
    assert torch.equal(torch.cat([first, second], -1), whole)


@pytest.mark.parametrize("Bn", [1, 2])
def test_conv_fn_seq_idx_matches_separate_calls(Bn):
    torch.manual_seed(Bn)
    D, W, T = 4, 3, 11
    ids = [[0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 5], [0, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3]][:Bn]
    seq_idx = torch.tensor(ids, dtype=torch.int32)
    x, weight, bias = torch.randn(Bn, D, T), torch.randn(D, W), torch.randn(D)
    x1, w1, b1 = leaves(x, weight, bias)
    out = cc.causal_conv1d_fn(x1, w1, b1, seq_idx=seq_idx, activation="silu")
    x2, w2, b2 = leaves(x, weight, bias)
    pieces = []
    for r in range(Bn):
        row = []
        for s in sorted(set(ids[r])):
            cols = [t for t in range(T) if ids[r][t] == s]
            row.append(ref_conv(x2[r:r + 1, :, cols[0]:cols[-1] + 1], w2, b2, activation="silu"))
        pieces.append(torch.cat(row, dim=-1))
    ref = torch.cat(pieces)
    close(out, ref, OUT, "out")
    check_grads(grads_of([out], [x1, w1, b1]), grads_of([ref], [x2, w2, b2]), ["x", "weight", "bias"])


@pytest.mark.parametrize("T,state_len", [(1, 3), (1, 6), (3, 3), (5, 4)])
def test_conv_update_matches_the_fallback_in_place(T, state_len):
    torch.manual_seed(T + state_len)
    Bn, D, W = 3, 5, 4
    x, weight, bias = torch.randn(Bn, D, T), torch.randn(D, W), torch.randn(D)
    state = torch.randn(Bn, D, state_len)
    ours, theirs = state.clone(), state.clone()
    out = cc.causal_conv1d_update(x, ours, weight, bias, activation="silu")
    ref = ref_update(x, theirs, weight, bias, activation="silu")
    close(out, ref, OUT, "out")
    close(ours, theirs, OUT, "conv_state")
    if T == 1:  # x [B, D]
        again = state.clone()
        out2 = cc.causal_conv1d_update(x[..., 0], again, weight, bias, activation="silu")
        assert out2.shape == (Bn, D)
        close(out2, ref[..., 0], OUT, "out [B, D]")
        close(again, theirs, OUT, "conv_state")

    # conv_state_indices: rows of a pool, the others untouched.
    pool = torch.randn(6, D, state_len)
    rows = torch.tensor([4, 0, 2], dtype=torch.int32)
    pool[rows.long()] = state
    before = pool.clone()
    out3 = cc.causal_conv1d_update(x, pool, weight, bias, activation="silu", conv_state_indices=rows)
    close(out3, ref, OUT, "out (pool)")
    close(pool[rows.long()], theirs, OUT, "pool rows")
    others = torch.tensor([1, 3, 5])
    assert torch.equal(pool[others], before[others])

    # cache_seqlens: a circular buffer whose next write is at cache_seqlens % state_len.
    shift = torch.tensor([0, 2, 7], dtype=torch.int32)
    ring = torch.stack([state[i].roll(int(shift[i]) % state_len, dims=-1) for i in range(Bn)])
    out4 = cc.causal_conv1d_update(x, ring, weight, bias, activation="silu", cache_seqlens=shift)
    close(out4, ref, OUT, "out (circular)")
    unrolled = torch.stack([ring[i].roll(-((int(shift[i]) + T) % state_len), dims=-1) for i in range(Bn)])
    close(unrolled, theirs, OUT, "conv_state (circular)")


def test_conv_bfloat16_within_bounds():
    torch.manual_seed(7)
    Bn, D, W, T = 2, 8, 4, 13
    x = torch.randn(Bn, T, D).bfloat16().transpose(1, 2)
    weight, bias = torch.randn(D, W).bfloat16(), torch.randn(D)
    init = torch.randn(Bn, D, W - 1).bfloat16()
    out, final = cc.causal_conv1d_fn(x, weight, bias, initial_states=init, return_final_states=True,
                                     activation="silu")
    assert out.dtype == final.dtype == torch.bfloat16
    ref, ref_final = _conv_with_state(x.float(), weight.float(), bias, init.float(), "silu")
    close(out, ref, 1e-2, "out")
    close(final, ref_final, 0, "final_states")
    state = torch.randn(Bn, D, W - 1).bfloat16()
    theirs = state.float()
    step = cc.causal_conv1d_update(x[..., :1], state, weight, bias, activation="silu")
    ref_step_out = ref_update(x[..., :1].float(), theirs, weight.float(), bias, activation="silu")
    assert step.dtype == state.dtype == torch.bfloat16
    close(step, ref_step_out, 1e-2, "update out")
    close(state, theirs, 0, "conv_state")


def test_conv_bad_input():
    x, w = torch.randn(2, 4, 5), torch.randn(4, 3)
    cases = [
        (lambda: cc.causal_conv1d_fn(x, torch.randn(5, 3)), "weight"),
        (lambda: cc.causal_conv1d_fn(x, w, activation="gelu"), "activation"),
        (lambda: cc.causal_conv1d_fn(x, w, bias=torch.randn(3)), "bias"),
        (lambda: cc.causal_conv1d_fn(x[0], w), "x"),
        (lambda: cc.causal_conv1d_fn(x, w, initial_states=torch.randn(2, 4, 3)), "initial_states"),
        (lambda: cc.causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 5, dtype=torch.int32),
                                     initial_states=torch.randn(2, 4, 2)), "initial_states"),
        (lambda: cc.causal_conv1d_fn(x, w, seq_idx=torch.tensor([[0, 1, 0, 1, 1]] * 2)), "seq_idx"),
        (lambda: cc.causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 5)), "seq_idx"),
        (lambda: cc.causal_conv1d_update(x, torch.randn(2, 4, 1), w), "conv_state"),
        (lambda: cc.causal_conv1d_update(x, torch.randn(3, 4, 2), w), "conv_state"),
        (lambda: cc.causal_conv1d_update(x, torch.randn(3, 4, 2), w, conv_state_indices=torch.tensor([0, 3])),
         "conv_state_indices"),
        (lambda: cc.causal_conv1d_update(x, torch.randn(3, 4, 2), w, conv_state_indices=torch.tensor([1, 1])),
         "conv_state_indices"),
        (lambda: cc.causal_conv1d_update(x, torch.randn(2, 4, 2), w, cache_seqlens=torch.zeros(3)),
         "cache_seqlens"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"flat: {name}:"):
            call()


# ---- mamba_ssm: the chunked scan ---------------------------------------------------------------


def scan_inputs(b, l, h, p, g, n, seed, initial=True):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    return dict(x=r(b, l, h, p), dt=r(b, l, h), A=-torch.exp(torch.rand(h, generator=gen)), B=r(b, l, g, n),
                C=r(b, l, g, n), D=r(h), dt_bias=r(h), initial_states=r(b, h, p, n) if initial else None)


NAMES = ["x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states"]


@pytest.mark.parametrize("l", [1, 15, 16, 17])
@pytest.mark.parametrize("g", [1, 2, 4])
@pytest.mark.parametrize("initial", [True, False])
def test_chunk_scan_matches_the_fallback(l, g, initial):
    args = scan_inputs(2, l, 4, 3, g, 5, seed=l * 10 + g, initial=initial)
    limit = (0.0, float("inf")) if g != 2 else (0.2, 0.9)
    mine = dict(zip(NAMES, leaves(*(args[k] for k in NAMES))))
    theirs = dict(zip(NAMES, leaves(*(args[k] for k in NAMES))))
    out, final = ms.mamba_chunk_scan_combined(chunk_size=16, dt_softplus=True, dt_limit=limit,
                                              return_final_states=True, **mine)
    ref, ref_final = ref_scan(theirs["x"], theirs["dt"], theirs["A"], theirs["B"], theirs["C"], 16, D=theirs["D"],
                              dt_bias=theirs["dt_bias"], initial_states=theirs["initial_states"], dt_softplus=True,
                              dt_limit=limit, return_final_states=True)
    close(out, ref, OUT, "out")
    close(final, ref_final, OUT, "final_states")
    assert final.dtype == torch.float32 and final.shape == (2, 4, 3, 5)
    check_grads(grads_of([out, final], list(mine.values())), grads_of([ref, ref_final], list(theirs.values())),
                [k for k in NAMES if mine[k] is not None])
    # Without return_final_states: out alone.
    alone = ms.mamba_chunk_scan_combined(chunk_size=16, dt_softplus=True, dt_limit=limit, **mine)
    assert isinstance(alone, torch.Tensor)
    close(alone, ref, OUT, "out alone")


def test_chunk_scan_z_gate_and_D_per_channel():
    args = scan_inputs(1, 20, 4, 3, 2, 5, seed=3)
    b, l, h, p = args["x"].shape
    z, D2 = torch.randn(b, l, h, p), torch.randn(h, p)
    names = NAMES + ["z", "D2"]
    mine = dict(zip(names, leaves(*(args[k] for k in NAMES), z, D2)))
    theirs = dict(zip(names, leaves(*(args[k] for k in NAMES), z, D2)))
    kw = {k: mine[k] for k in NAMES if k != "D"}
    out = ms.mamba_chunk_scan_combined(chunk_size=64, D=mine["D2"], z=mine["z"], dt_softplus=True, **kw)
    t = theirs
    base = ref_scan(t["x"], t["dt"], t["A"], t["B"], t["C"], 64, D=None, dt_bias=t["dt_bias"],
                    initial_states=t["initial_states"], dt_softplus=True)
    ref = (base + t["x"] * t["D2"]) * F.silu(t["z"])
    close(out, ref, OUT, "out")
    wanted = [k for k in names if k != "D"]
    check_grads(grads_of([out], [mine[k] for k in wanted]), grads_of([ref], [theirs[k] for k in wanted]), wanted)


@pytest.mark.parametrize("how", ["seq_idx", "cu_seqlens", "both"])
def test_chunk_scan_packed_sequences_match_separate_calls(how):
    lengths = [5, 1, 18, 9]
    ends = torch.tensor([0] + lengths).cumsum(0)
    l = int(ends[-1])
    args = scan_inputs(1, l, 4, 3, 2, 5, seed=11)
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))[None]
    packing = dict(seq_idx=seq_idx if how != "cu_seqlens" else None,
                   cu_seqlens=ends.to(torch.int32) if how != "seq_idx" else None)
    mine = dict(zip(NAMES, leaves(*(args[k] for k in NAMES))))
    theirs = dict(zip(NAMES, leaves(*(args[k] for k in NAMES))))
    results = ms.mamba_chunk_scan_combined(chunk_size=16, dt_softplus=True, return_final_states=True,
                                           return_varlen_states=packing["cu_seqlens"] is not None, **packing, **mine)
    out, final = results[0], results[1]
    t = theirs
    outs, finals = [], []
    for i, (s, e) in enumerate(zip(ends[:-1].tolist(), ends[1:].tolist())):
        o, f = ref_scan(t["x"][:, s:e], t["dt"][:, s:e], t["A"], t["B"][:, s:e], t["C"][:, s:e], 16, D=t["D"],
                        dt_bias=t["dt_bias"], initial_states=t["initial_states"] if i == 0 else None,
                        dt_softplus=True, return_final_states=True)
        outs.append(o)
        finals.append(f)
    ref = torch.cat(outs, dim=1)
    close(out, ref, OUT, "out")
    close(final, finals[-1], OUT, "final_states")
    if packing["cu_seqlens"] is not None:
        varlen = results[2]
        assert varlen.shape == (len(lengths), 4, 3, 5)
        close(varlen, torch.cat(finals), OUT, "varlen_states")
    check_grads(grads_of([out, final], list(mine.values())), grads_of([ref, finals[-1]], list(theirs.values())),
                NAMES)


def test_chunk_scan_seq_idx_rows():
    # Two rows, each with its own packing; initial_states[i] starts row i's sequence 0.
    ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 2, 2]], dtype=torch.int32)
    args = scan_inputs(2, 7, 2, 2, 1, 3, seed=5)
    out, final = ms.mamba_chunk_scan_combined(chunk_size=16, dt_softplus=True, seq_idx=ids,
                                              return_final_states=True, **args)
    for r, cut in ((0, 3), (1, 5)):
        a = {k: (v[r:r + 1] if k not in ("A", "D", "dt_bias") else v) for k, v in args.items()}
        first = ref_scan(a["x"][:, :cut], a["dt"][:, :cut], a["A"], a["B"][:, :cut], a["C"][:, :cut], 16, D=a["D"],
                         dt_bias=a["dt_bias"], initial_states=a["initial_states"], dt_softplus=True)
        second, f = ref_scan(a["x"][:, cut:], a["dt"][:, cut:], a["A"], a["B"][:, cut:], a["C"][:, cut:], 16,
                             D=a["D"], dt_bias=a["dt_bias"], dt_softplus=True, return_final_states=True)
        close(out[r:r + 1], torch.cat([first, second], dim=1), OUT, f"out row {r}")
        close(final[r:r + 1], f, OUT, f"final row {r}")


def test_chunk_scan_bfloat16_within_bounds():
    args = scan_inputs(2, 33, 4, 8, 2, 8, seed=9)
    half = {k: (v.bfloat16() if k in ("x", "dt", "B", "C") else v) for k, v in args.items()}
    out, final = ms.mamba_chunk_scan_combined(chunk_size=16, dt_softplus=True, return_final_states=True, **half)
    assert out.dtype == torch.bfloat16 and final.dtype == torch.float32
    widened = {k: v.float() if v is not None else None for k, v in half.items()}
    ref, ref_final = ref_scan(widened["x"], widened["dt"], widened["A"], widened["B"], widened["C"], 16,
                              D=widened["D"], dt_bias=widened["dt_bias"], initial_states=widened["initial_states"],
                              dt_softplus=True, return_final_states=True)
    close(out, ref, 1e-2, "out")
    close(final, ref_final, 1e-5, "final_states")


# ---- mamba_ssm: the fused mixer ----------------------------------------------------------------


def mixer_reference(zxbcdt, conv_w, conv_b, dt_bias, A, D, chunk, initial, dt_limit, norm_w, eps, out_w, out_b,
                    headdim, ngroups, norm_before_gate):
    """Mamba2Mixer's torch path (split, causal_conv1d_fn, mamba2_chunk_scan, MambaRMSNormGated,
    out_proj); norm_before_gate=True as mamba_ssm's rmsnorm_fn computes it."""
    b, l, _ = zxbcdt.shape
    h = D.shape[0]
    dim = h * headdim
    n = (conv_w.shape[0] - dim) // ngroups // 2
    z, xBC, dt = zxbcdt.split([dim, dim + 2 * ngroups * n, h], dim=-1)
    xBC = ref_conv(xBC.transpose(1, 2), conv_w, conv_b, activation="silu").transpose(1, 2)
    x, B, C = xBC.split([dim, ngroups * n, ngroups * n], dim=-1)
    y, final = ref_scan(x.reshape(b, l, h, headdim), dt, A, B.reshape(b, l, ngroups, n),
                        C.reshape(b, l, ngroups, n), chunk, D=D, dt_bias=dt_bias, initial_states=initial,
                        dt_softplus=True, dt_limit=dt_limit, return_final_states=True)
    y = y.reshape(b, l, dim)
    if norm_before_gate:
        groups = y.reshape(b, l, ngroups, -1)
        normed = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + eps)
        y = normed.reshape(b, l, dim) * norm_w * F.silu(z)
    else:
        gated_norm = getattr(hf, "MambaRMSNormGated", None) or hf.Mamba2RMSNormGated  # 5.24's name, 5.25's
        norm = gated_norm(dim, group_size=dim // ngroups, eps=eps)
        del norm.weight
        norm.weight = norm_w  # the leaf itself, so its gradient is the test's
        y = norm(y, z)
    return F.linear(y, out_w, out_b), final


@pytest.mark.parametrize("l,ngroups,norm_before_gate,initial", [(1, 1, False, False), (17, 2, False, True),
                                                                (16, 2, True, False)])
def test_split_conv1d_scan_matches_the_mixer(l, ngroups, norm_before_gate, initial):
    torch.manual_seed(l + ngroups)
    b, h, p, n, W, out_dim = 2, 4, 3, 5, 4, 7
    dim = h * p
    channels = dim + 2 * ngroups * n
    tensors = dict(zxbcdt=torch.randn(b, l, 2 * dim + 2 * ngroups * n + h), conv_w=torch.randn(channels, W) * 0.5,
                   conv_b=torch.randn(channels), dt_bias=torch.randn(h), A=-torch.exp(torch.rand(h)),
                   D=torch.randn(h), initial=torch.randn(b, h, p, n) if initial else None,
                   norm_w=1 + 0.1 * torch.randn(dim), out_w=torch.randn(out_dim, dim), out_b=torch.randn(out_dim))
    names = [k for k, v in tensors.items() if v is not None]
    mine = dict(zip(tensors, leaves(*tensors.values())))
    theirs = dict(zip(tensors, leaves(*tensors.values())))
    limit = (0.0, float("inf")) if ngroups == 1 else (0.1, 1.5)
    m = mine
    out, final = ms.mamba_split_conv1d_scan_combined(
        m["zxbcdt"], m["conv_w"], m["conv_b"], m["dt_bias"], m["A"], D=m["D"], chunk_size=16,
        initial_states=m["initial"], dt_limit=limit, return_final_states=True, activation="silu",
        rmsnorm_weight=m["norm_w"], rmsnorm_eps=1e-5, outproj_weight=m["out_w"], outproj_bias=m["out_b"], headdim=p,
        ngroups=ngroups, norm_before_gate=norm_before_gate)
    t = theirs
    ref, ref_final = mixer_reference(t["zxbcdt"], t["conv_w"], t["conv_b"], t["dt_bias"], t["A"], t["D"], 16,
                                     t["initial"], limit, t["norm_w"], 1e-5, t["out_w"], t["out_b"], p, ngroups,
                                     norm_before_gate)
    close(out, ref, OUT, "out")
    close(final, ref_final, OUT, "final_states")
    ours = grads_of([out, final], [mine[k] for k in names])
    check_grads(ours, grads_of([ref, ref_final], [theirs[k] for k in names]), names)


def test_split_conv1d_scan_without_norm_and_with_nonssm_columns():
    torch.manual_seed(2)
    b, l, h, p, n, W, ngroups, d_nonssm = 1, 9, 2, 4, 3, 3, 1, 3
    dim = h * p
    channels = dim + 2 * ngroups * n
    zxbcdt = torch.randn(b, l, 2 * d_nonssm + 2 * dim + 2 * ngroups * n + h)
    conv_w, conv_b, dt_bias, A, D = (torch.randn(channels, W), torch.randn(channels), torch.randn(h),
                                     -torch.exp(torch.rand(h)), torch.randn(h, p))
    out = ms.mamba_split_conv1d_scan_combined(zxbcdt, conv_w, conv_b, dt_bias, A, D, 64)
    zx0, z, xBC, dt = zxbcdt.split([2 * d_nonssm, dim, channels, h], dim=-1)
    xBC = ref_conv(xBC.transpose(1, 2), conv_w, conv_b, activation="silu").transpose(1, 2)
    x, B, C = xBC.split([dim, n, n], dim=-1)
    x = x.reshape(b, l, h, p)
    y = ref_scan(x, dt, A, B.reshape(b, l, 1, n), C.reshape(b, l, 1, n), 64, dt_bias=dt_bias, dt_softplus=True)
    y = ((y + x * D) * F.silu(z.reshape(b, l, h, p))).reshape(b, l, dim)
    x0, y0 = zx0.chunk(2, dim=-1)
    close(out, torch.cat([F.silu(x0) * y0, y], dim=-1), OUT, "out")


def test_split_conv1d_scan_seq_idx_matches_separate_calls():
    torch.manual_seed(4)
    b, h, p, n, W = 1, 2, 2, 3, 4
    dim, channels = h * p, h * p + 2 * n
    lengths = [6, 3]
    zxbcdt = torch.randn(b, sum(lengths), 2 * dim + 2 * n + h)
    params = (torch.randn(channels, W), torch.randn(channels), torch.randn(h), -torch.exp(torch.rand(h)),
              torch.randn(h))
    kw = dict(rmsnorm_weight=torch.rand(dim) + 0.5, outproj_weight=torch.randn(5, dim), headdim=p,
              norm_before_gate=False)
    seq_idx = torch.tensor([[0] * lengths[0] + [1] * lengths[1]], dtype=torch.int32)
    out = ms.mamba_split_conv1d_scan_combined(zxbcdt, *params, 16, seq_idx=seq_idx, **kw)
    parts = [ms.mamba_split_conv1d_scan_combined(zxbcdt[:, :6], *params, 16, **kw),
             ms.mamba_split_conv1d_scan_combined(zxbcdt[:, 6:], *params, 16, **kw)]
    close(out, torch.cat(parts, dim=1), OUT, "out")


# ---- mamba_ssm: one decoding step --------------------------------------------------------------


@pytest.mark.parametrize("g", [1, 2])
@pytest.mark.parametrize("gate", [False, True])
def test_selective_state_update_matches_the_fallback_in_place(g, gate):
    torch.manual_seed(g + 2 * gate)
    b, h, p, n = 3, 4, 3, 5
    # As Mamba2Mixer passes them: per-head values expanded over p (and n).
    x, dt = torch.randn(b, h, p), torch.randn(b, h, 1).expand(b, h, p)
    A = (-torch.exp(torch.rand(h)))[:, None, None].expand(h, p, n)
    B, C = torch.randn(b, g, n), torch.randn(b, g, n)
    D, dt_bias = torch.randn(h)[:, None].expand(h, p), torch.randn(h)[:, None].expand(h, p)
    z = torch.randn(b, h, p) if gate else None
    state = torch.randn(b, h, p, n)
    ours, theirs = state.clone(), state.clone()
    out = ms.selective_state_update(ours, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
    ref = ref_step(theirs, x, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=True, z=z)
    close(out, ref, OUT, "out")
    close(ours, theirs, OUT, "state")

    # state_batch_indices: rows of a pool, the others untouched.
    pool = torch.randn(5, h, p, n)
    rows = torch.tensor([3, 0, 4], dtype=torch.int32)
    pool[rows.long()] = state
    before = pool.clone()
    out2 = ms.selective_state_update(pool, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
                                     state_batch_indices=rows)
    close(out2, ref, OUT, "out (pool)")
    close(pool[rows.long()], theirs, OUT, "pool rows")
    assert torch.equal(pool[torch.tensor([1, 2])], before[torch.tensor([1, 2])])

    # Without heads: state [b, p, n], x [b, p], A [p, n], B [b, n], D and dt_bias [p].
    s3 = state[:, 0].clone()
    out3 = ms.selective_state_update(s3, x[:, 0], dt[:, 0], A[0], B[:, 0], C[:, 0], D=D[0],
                                     z=None if z is None else z[:, 0], dt_bias=dt_bias[0], dt_softplus=True)
    ref3 = ref_step(state[:, :1].clone(), x[:, :1], dt[:, :1], A[:1], B[:, :1], C[:, :1], D[:1],
                    dt_bias=dt_bias[:1], dt_softplus=True, z=None if z is None else z[:, :1])
    close(out3, ref3[:, 0], OUT, "out (no heads)")


def test_steps_continue_the_chunked_scan():
    # The scan over l tokens, then selective_state_update token by token from its final state,
    # equals the scan over all the tokens.
    args = scan_inputs(2, 12, 4, 3, 2, 5, seed=21)
    out, _ = ms.mamba_chunk_scan_combined(chunk_size=16, dt_softplus=True, return_final_states=True, **args)
    first = {k: (v[:, :8] if k in ("x", "dt", "B", "C") else v) for k, v in args.items()}
    _, state = ms.mamba_chunk_scan_combined(chunk_size=16, dt_softplus=True, return_final_states=True, **first)
    h, p, n = 4, 3, 5
    A = args["A"][:, None, None].expand(h, p, n)
    for t in range(8, 12):
        step = ms.selective_state_update(state, args["x"][:, t], args["dt"][:, t, :, None].expand(-1, -1, p), A,
                                         args["B"][:, t], args["C"][:, t], D=args["D"][:, None].expand(h, p),
                                         dt_bias=args["dt_bias"][:, None].expand(h, p), dt_softplus=True)
        close(step, out[:, t], OUT, f"token {t}")


def test_selective_state_update_bfloat16_state():
    torch.manual_seed(1)
    b, h, p, n = 2, 2, 4, 8
    x, dt, B, C = torch.randn(b, h, p), torch.randn(b, h, p), torch.randn(b, 1, n), torch.randn(b, 1, n)
    A = -torch.rand(h, p, n)
    state = torch.randn(b, h, p, n).bfloat16()
    theirs = state.float()
    out = ms.selective_state_update(state, x.bfloat16(), dt, A, B, C, dt_softplus=True)
    ref = ref_step(theirs, x.bfloat16().float(), dt, A, B, C, dt_softplus=True)
    assert out.dtype == state.dtype == torch.bfloat16
    close(out, ref, 1e-2, "out")
    close(state, theirs, 1e-2, "state")


def test_mamba_bad_input():
    a = scan_inputs(1, 6, 4, 3, 2, 5, seed=0)
    scan = ms.mamba_chunk_scan_combined
    zx = torch.randn(1, 6, 2 * 12 + 2 * 5 + 4)
    cw = torch.randn(12 + 10, 4)
    st, x1 = torch.randn(2, 4, 3, 5), torch.randn(2, 4, 3)
    step_args = (torch.randn(2, 4, 3), -torch.rand(4, 3, 5), torch.randn(2, 2, 5), torch.randn(2, 2, 5))
    cases = [
        (lambda: scan(**{**a, "dt": a["dt"][..., :3]}, chunk_size=16), "dt"),
        (lambda: scan(**{**a, "B": torch.randn(1, 6, 3, 5), "C": torch.randn(1, 6, 3, 5)}, chunk_size=16), "B"),
        (lambda: scan(**{**a, "C": torch.randn(1, 6, 2, 4)}, chunk_size=16), "C"),
        (lambda: scan(**{**a, "D": torch.randn(5)}, chunk_size=16), "D"),
        (lambda: scan(**{**a, "initial_states": torch.randn(1, 4, 5, 3)}, chunk_size=16), "initial_states"),
        (lambda: scan(**a, chunk_size=0), "chunk_size"),
        (lambda: scan(**a, chunk_size=16, dt_limit=(1.0, 0.5)), "dt_limit"),
        (lambda: scan(**a, chunk_size=16, seq_idx=torch.tensor([[0, 0, 1, 1, 0, 0]])), "seq_idx"),
        (lambda: scan(**a, chunk_size=16, cu_seqlens=torch.tensor([0, 2, 5])), "cu_seqlens"),
        (lambda: scan(**a, chunk_size=16, seq_idx=torch.tensor([[0, 0, 1, 1, 1, 1]]),
                      cu_seqlens=torch.tensor([0, 3, 6])), "cu_seqlens"),
        (lambda: scan(**a, chunk_size=16, return_varlen_states=True), "cu_seqlens"),
        (lambda: ms.mamba_split_conv1d_scan_combined(zx, cw, None, torch.randn(4), -torch.rand(4), torch.randn(4),
                                                     16), "headdim"),
        (lambda: ms.mamba_split_conv1d_scan_combined(zx[..., 1:], cw, None, torch.randn(4), -torch.rand(4),
                                                     torch.randn(4, 3), 16), "zxbcdt"),
        (lambda: ms.mamba_split_conv1d_scan_combined(zx, cw, None, torch.randn(4), -torch.rand(4), torch.randn(4, 3),
                                                     16, ngroups=3), "ngroups"),
        (lambda: ms.mamba_split_conv1d_scan_combined(zx, cw, None, torch.randn(4), -torch.rand(4), torch.randn(4, 3),
                                                     16, activation="relu"), "activation"),
        (lambda: ms.mamba_split_conv1d_scan_combined(zx, cw, None, torch.randn(4), -torch.rand(4), torch.randn(4, 3),
                                                     16, rmsnorm_weight=torch.randn(5)), "rmsnorm_weight"),
        (lambda: ms.selective_state_update(st, x1, *step_args[:1], step_args[1][:, :2], *step_args[2:]), "A"),
        (lambda: ms.selective_state_update(st, x1, *step_args, state_batch_indices=torch.tensor([0, 2])),
         "state_batch_indices"),
        (lambda: ms.selective_state_update(torch.randn(3, 4, 3, 5), x1, *step_args), "state"),
        (lambda: ms.selective_state_update(st, x1, *step_args, dt_bias=torch.randn(4)), "dt_bias"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"flat: {name}:"):
            call()


def test_chunk_scan_reads_B_and_C_in_place():
    # B and C as column blocks of one projection (as the mixers split them) reach the kernel as they are.
    from flat.torch import ops as torch_ops

    args = scan_inputs(2, 10, 4, 3, 2, 5, seed=8)
    proj = torch.randn(2, 10, 2 * 2 * 5 + 1)
    B, C = proj[..., :10].unflatten(-1, (2, 5)), proj[..., 10:20].unflatten(-1, (2, 5))
    torch_ops._trace = []
    try:
        out = ms.mamba_chunk_scan_combined(**{**args, "B": B, "C": C}, chunk_size=16, dt_softplus=True)
        assert torch_ops._trace and torch_ops._trace[0][:2] == (C.data_ptr(), B.data_ptr())
    finally:
        torch_ops._trace = None
    close(out, ms.mamba_chunk_scan_combined(**{**args, "B": B.contiguous(), "C": C.contiguous()}, chunk_size=16,
                                            dt_softplus=True), 0, "out")
