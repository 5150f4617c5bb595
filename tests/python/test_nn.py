"""flat.nn: every layer against a float64 copy of itself on the plain-PyTorch reference (forward and
the gradient of every parameter and of the input), state passing across calls, bf16, and bad
hyperparameters."""

import copy

import pytest
import torch

from flat.nn import LAYERS, State

# Small shapes that still exercise head sharing and two chunks of 64 tokens.
CONFIGS = {
    "la": dict(hidden_size=32, num_heads=2, num_kv_heads=1, use_short_conv=True),
    "retnet": dict(hidden_size=32, num_heads=2),
    "mamba2": dict(hidden_size=32, head_dim=16, state_size=8, n_groups=2),
    "gla": dict(hidden_size=32, num_heads=2, num_kv_heads=1, use_short_conv=True),
    "deltanet": dict(hidden_size=32, num_heads=2, use_gate=True),
    "gated_deltanet": dict(hidden_size=32, num_heads=2, num_v_heads=4, head_dim=16, expand_v=1),
    "kda": dict(hidden_size=32, num_heads=2, head_dim=16),
    "gdn2": dict(hidden_size=32, num_heads=2, head_dim=16),
    "sla": dict(hidden_size=32, num_heads=1, num_v_heads=4, head_dim=32, expand_v=0.25, gate_group=8),
}
BOUND = 1e-4  # the library's fp32 bound for gradients (docs/variants.md), for outputs and gradients alike


def relative_error(got, want):
    got, want = got.detach().double(), want.detach().double()
    if not torch.isfinite(got).all():
        return float("nan")
    return float((got - want).norm() / max(want.norm(), 1e-30))


def make(variant, seed=0):
    torch.manual_seed(seed)
    layer = LAYERS[variant](**CONFIGS[variant])
    with torch.no_grad():  # gates away from their initial values, so every parameter matters
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    reference = copy.deepcopy(layer).double()
    reference.ops = "reference"
    return layer, reference


@pytest.mark.parametrize("variant", list(LAYERS))
def test_layer_matches_its_float64_reference(variant):
    layer, reference = make(variant)
    torch.manual_seed(1)
    x = torch.randn(2, 70, 32)
    y, state = layer(x.requires_grad_(), output_final_state=True)
    xr = x.detach().double().requires_grad_()
    yr, state_r = reference(xr, output_final_state=True)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    (yr * dy.double()).sum().backward()
    assert relative_error(y, yr) <= BOUND
    assert relative_error(state.recurrent, state_r.recurrent) <= BOUND
    if state_r.conv is not None:
        assert relative_error(state.conv, state_r.conv) <= BOUND
    assert relative_error(x.grad, xr.grad) <= BOUND
    for (name, p), (_, pr) in zip(layer.named_parameters(), reference.named_parameters()):
        assert p.grad is not None, name
        assert relative_error(p.grad, pr.grad) <= BOUND, name


@pytest.mark.parametrize("variant", list(LAYERS))
def test_packed_sequences_match_the_float64_reference_one_by_one(variant):
    """cu_seqlens through a layer, states given and returned per sequence, an empty sequence among
    them: the kernels' packed call against the float64 reference run on each sequence alone."""
    layer, reference = make(variant)
    torch.manual_seed(2)
    cu_seqlens = torch.tensor([0, 1, 64, 64, 130])
    _, first = layer(torch.randn(4, 9, 32), output_final_state=True)  # states of the right shapes
    state = State(*(None if t is None else torch.randn_like(t) for t in first))
    x = torch.randn(1, 130, 32, requires_grad=True)
    y, final = layer(x, initial_state=state, output_final_state=True, cu_seqlens=cu_seqlens)
    xr = x.detach().double().requires_grad_()
    yr, final_r = reference(xr, initial_state=State(*(None if t is None else t.double() for t in state)),
                            output_final_state=True, cu_seqlens=cu_seqlens)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    (yr * dy.double()).sum().backward()
    assert relative_error(y, yr) <= BOUND
    assert relative_error(final.recurrent, final_r.recurrent) <= BOUND
    assert torch.equal(final.recurrent[2], state.recurrent[2])  # the empty sequence's state passes through
    if final.conv is not None:
        assert relative_error(final.conv, final_r.conv) <= BOUND
    assert relative_error(x.grad, xr.grad) <= BOUND
    for (name, p), (_, pr) in zip(layer.named_parameters(), reference.named_parameters()):
        assert relative_error(p.grad, pr.grad) <= BOUND, name


@pytest.mark.parametrize("variant", list(LAYERS))
def test_chunked_calls_equal_one_call(variant):
    """A sequence in two calls, the first's state passed to the second, gives one call's output and
    final state; and the state is differentiable (a gradient reaches the first chunk)."""
    layer, _ = make(variant)
    x = torch.randn(1, 50, 32)
    whole, state = layer(x, output_final_state=True)
    first, mid = layer(x[:, :21], output_final_state=True)
    second, end = layer(x[:, 21:], initial_state=mid, output_final_state=True)
    assert relative_error(torch.cat([first, second], 1), whole) <= 1e-5
    assert relative_error(end.recurrent, state.recurrent) <= 1e-5
    xs = x.clone().requires_grad_()
    _, mid = layer(xs[:, :21], output_final_state=True)
    layer(xs[:, 21:], initial_state=mid)[0].sum().backward()
    assert xs.grad[:, :21].abs().sum() > 0


@pytest.mark.parametrize("variant", list(LAYERS))
def test_bfloat16_layer_is_finite_and_close(variant):
    layer, reference = make(variant)
    x = torch.randn(2, 40, 32)
    yr, _ = reference(x.double())
    y, _ = layer.to(torch.bfloat16)(x.to(torch.bfloat16).requires_grad_())
    y.float().sum().backward()
    assert torch.isfinite(y.float()).all()
    assert relative_error(y.float(), yr) <= 3e-2  # bf16 parameters, activations and projections
    for name, p in layer.named_parameters():
        assert torch.isfinite(p.grad.float()).all(), name


@pytest.mark.parametrize("variant, config, message", [
    ("gla", dict(hidden_size=30, num_heads=4), "num_heads = 4 must divide key_dim = 15"),
    ("gated_deltanet", dict(hidden_size=32, num_heads=3, num_v_heads=4), "num_heads = 3 must divide num_v_heads"),
    ("mamba2", dict(hidden_size=32, head_dim=24), "num_heads \\* head_dim"),
    ("sla", dict(hidden_size=32, head_dim=48, gate_group=64), "gate_group = 64 must divide head_dim = 48"),
])
def test_bad_hyperparameters_raise_before_any_work(variant, config, message):
    with pytest.raises(ValueError, match=message):
        LAYERS[variant](**config)


def test_state_is_a_named_tuple():
    layer, _ = make("kda")
    _, state = layer(torch.randn(1, 5, 32), output_final_state=True)
    assert isinstance(state, State) and state.recurrent.shape == (1, 2, 16, 16) and state.conv.shape[-1] == 3
