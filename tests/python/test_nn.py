"""flat.nn: every layer against a float64 copy of itself on the plain-PyTorch reference (forward and
the gradient of every parameter and of the input), state passing across calls, bf16, bad
hyperparameters, and serving over a pool of states (a decode loop, a speculative step, bitwise the
calls with a state per sequence, a refused call changing neither pool, a backward refused once a pool
it read is written); a layer's precision reaching its recurrence; FLA 0.6's state dicts loading
strictly where its parameter names depend on hyperparameters."""

import copy

import pytest
import torch

import flat.torch as ft
from flat.nn import LAYERS, State
from flat.nn.ops import KERNEL_OPTIONS, KERNELS, Ops, kernel_options_of
from oracle import UPDATE

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


def make(variant, seed=0, **config):
    """The layer of CONFIGS[variant] (updated by config) with its parameters moved, and a float64
    copy of it on the reference ops."""
    torch.manual_seed(seed)
    layer = LAYERS[variant](**{**CONFIGS[variant], **config})
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


def test_one_gate_value_per_head_is_a_group_of_channels():
    """SLA with gate_group = head_dim (SystolicLinearAttention(head_dim=64) with the default
    gate_group = 64): its forget gate [B, T, heads, 1] is one group of channels per head, not
    Gated DeltaNet's gate per head [B, T, heads]; the layer matches its float64 reference."""
    layer, reference = make("sla", gate_group=CONFIGS["sla"]["head_dim"])
    x = torch.randn(1, 20, 32)
    y, state = layer(x, output_final_state=True)
    yr, state_r = reference(x.double(), output_final_state=True)
    assert relative_error(y, yr) <= BOUND and relative_error(state.recurrent, state_r.recurrent) <= BOUND


@pytest.mark.parametrize("variant", sorted(CONFIGS))
def test_a_layers_kernel_options_reach_its_recurrence(variant):
    """Every option of the library's a layer's caller may choose (KERNEL_OPTIONS, from _api.OPTIONS)
    is a keyword of every layer, its name checked when the layer is built (its size by the call) and
    passed to each call; one left out is not passed (the library's default)."""
    seen = []

    def recording(*args, **kwargs):
        seen.append({name: kwargs[name] for name in KERNEL_OPTIONS if name in kwargs})
        return KERNELS.recurrence(*args, **kwargs)

    ops = Ops(recurrence=recording, conv=KERNELS.conv, norm=KERNELS.norm)
    every = dict(chunk_size=32, solve="auto", precision="fast", check_values=True)
    assert set(every) == set(KERNEL_OPTIONS)
    chosen = {name: every[name] for name in kernel_options_of(variant)}
    assert set(every) - set(chosen) == (set() if UPDATE[variant] != "additive" else {"solve"})
    LAYERS[variant](**CONFIGS[variant], ops=ops)(torch.randn(1, 5, 32))
    LAYERS[variant](**CONFIGS[variant], ops=ops, **chosen)(torch.randn(1, 5, 32))
    assert seen == [{}, chosen]
    with pytest.raises(ValueError, match=f"flat.nn.{LAYERS[variant].__name__}: precision: expected exact or fast, "
                       "got 'high'"):
        LAYERS[variant](**CONFIGS[variant], precision="high")
    with pytest.raises(ValueError, match="options.chunk: expected a multiple of 16 from 16 to 256, got 7"):
        LAYERS[variant](**CONFIGS[variant], chunk_size=7)(torch.randn(1, 5, 32))  # sizes: the call checks them


def test_state_is_a_named_tuple():
    layer, _ = make("kda")
    _, state = layer(torch.randn(1, 5, 32), output_final_state=True)
    assert isinstance(state, State) and state.recurrent.shape == (1, 2, 16, 16) and state.conv.shape[-1] == 3


@pytest.mark.parametrize("variant", sorted(CONFIGS))
def test_layers_take_fla_s_layer_idx_and_keywords(variant):
    """FLA's layers take layer_idx and ignore keyword arguments they do not know (these warn, naming
    them); forward takes FLA's use_cache (output_final_state) and output_attentions, and refuses an
    attention_mask or a past_key_values cache by name."""
    with pytest.warns(UserWarning, match="ignoring future_option, norm_first"):
        layer = LAYERS[variant](**CONFIGS[variant], layer_idx=3, future_option=1, norm_first=False)
    assert layer.layer_idx == 3
    x = torch.randn(1, 5, 32)
    o, state = layer(x, use_cache=True, output_attentions=False)
    o2, state2 = layer(x, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(state.recurrent, state2.recurrent)
    with pytest.raises(ValueError, match="flat.nn: attention_mask: padding masks are not supported; pack the "
                                         "sequences along T with cu_seqlens"):
        layer(x, attention_mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match="flat.nn: past_key_values: no cache object; pass the State as "
                                         "initial_state"):
        layer(x, past_key_values=object())


def _fla_gla(gate=True, norm="g_norm_swish_gate", affine=True):
    """FLA 0.6's GatedLinearAttention's parameters at CONFIGS["gla"] (key_dim 16, 8 per key-value
    head group, value_dim 32, 16 per group, head_v_dim 16, gate_low_rank_dim 16, conv_size 4)."""
    names = {"q_proj.weight": (16, 32), "k_proj.weight": (8, 32), "v_proj.weight": (16, 32),
             "q_conv1d.weight": (16, 1, 4), "k_conv1d.weight": (8, 1, 4), "v_conv1d.weight": (16, 1, 4),
             "gk_proj.0.weight": (16, 32), "gk_proj.1.weight": (8, 16), "gk_proj.1.bias": (8,),
             "o_proj.weight": (32, 32)}
    if gate:
        names["g_proj.weight"] = (32, 32)
    if affine:
        names[f"{norm}.weight"] = (16,)
    return names


def _fla_retnet(gate=True, norm="g_norm_swish_gate"):
    """FLA 0.6's MultiScaleRetention's at CONFIGS["retnet"] (key_dim 32, value_dim 64, head_v_dim 32;
    its rotary embedding holds no parameter)."""
    names = {"q_proj.weight": (32, 32), "k_proj.weight": (32, 32), "v_proj.weight": (64, 32),
             "o_proj.weight": (32, 64), f"{norm}.weight": (32,)}
    if gate:
        names["g_proj.weight"] = (64, 32)
    return names


# FLA's Mamba2 at CONFIGS["mamba2"]: intermediate 64, 4 heads, conv_dim 64 + 2 * 2 * 8; its norm's
# weight covers the intermediate width, normalised in n_groups groups.
_FLA_MAMBA2 = {"conv1d.weight": (96, 1, 4), "conv1d.bias": (96,), "in_proj.weight": (164, 32), "dt_bias": (4,),
               "A_log": (4,), "norm.weight": (64,), "D": (4,), "out_proj.weight": (32, 64)}


@pytest.mark.parametrize("variant, config, fla", [
    ("gla", {}, _fla_gla()),
    ("gla", dict(use_output_gate=False), _fla_gla(gate=False, norm="g_norm")),
    ("gla", dict(gate_fn="sigmoid"), _fla_gla(norm="g_norm")),
    ("gla", dict(fuse_norm=False), _fla_gla(norm="g_norm")),
    ("gla", dict(elementwise_affine=False), _fla_gla(affine=False)),
    ("retnet", {}, _fla_retnet()),
    ("retnet", dict(use_output_gate=False), _fla_retnet(gate=False, norm="g_norm")),
    ("mamba2", {}, _FLA_MAMBA2),
])
def test_fla_s_state_dict_loads_strictly(variant, config, fla):
    """FLA 0.6's parameter names and shapes (written out above) for the same hyperparameters: the
    layer's state dict has exactly them, one of them loads strictly, and the layer computes with it
    as its float64 reference does."""
    layer = LAYERS[variant](**CONFIGS[variant], **config)
    assert {name: tuple(t.shape) for name, t in layer.state_dict().items()} == fla
    torch.manual_seed(2)
    layer.load_state_dict({name: 0.3 * torch.randn(shape) for name, shape in fla.items()}, strict=True)
    reference = copy.deepcopy(layer).double()
    reference.ops = "reference"
    x = torch.randn(1, 9, 32)
    assert relative_error(layer(x)[0], reference(x.double())[0]) <= BOUND


# ---- Serving: a pool of states --------------------------------------------------------------

PROMPTS = [5, 9, 3]  # three sequences' prompts, prefilled packed
# The float64 layer on a pool against itself run alone: its gates are float32 (as the kernels take
# them), and the packed projection's last-bit differences from the lone one's can flip a gate's
# float32 rounding (a relative 2^-24), which the recurrence carries to its outputs.
POOL_BOUND = 1e-6


def poisoned_pool(layer, size, dtype):
    """The layer's pools of `size` rows, NaN until written."""
    return State(*(None if t is None else t.fill_(float("nan")) for t in layer.state_pool(size, dtype)))


def packed(layer, pool, chunks, **indices):
    """One packed call over the pool (no gradient): chunks[i] [1, T_i, hidden_size] of sequence i;
    returns each sequence's output."""
    lengths = [c.shape[1] for c in chunks]
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0)
    with torch.no_grad():
        o, state = layer(torch.cat(chunks, 1).to(pool.recurrent.dtype), initial_state=pool, cu_seqlens=cu_seqlens,
                         **{name: torch.tensor(rows) for name, rows in indices.items()})
    assert state is pool
    return list(o.split(lengths, 1))


def alone(reference, x):
    """A whole sequence through the float64 reference layer: (o, final State)."""
    with torch.no_grad():
        return reference(x.double(), output_final_state=True)


def test_state_pool_has_the_shapes_of_a_state():
    for variant in LAYERS:
        layer, _ = make(variant)
        _, state = layer(torch.randn(1, 3, 32), output_final_state=True)
        pool = layer.state_pool(5)
        assert pool.recurrent.shape == (5,) + state.recurrent.shape[1:], variant
        assert (pool.conv is None) == (state.conv is None), variant
        if pool.conv is not None:
            assert pool.conv.shape == (5,) + state.conv.shape[1:], variant


@pytest.mark.parametrize("variant", list(LAYERS))
def test_decode_loop_over_a_pool_is_each_sequence_alone(variant):
    """Prefill of three prompts packed (final_state_indices writing their rows, from zero), then
    three one-token steps of all of them packed (each reading and writing its row): every output
    and final state is the sequence's run alone through the float64 reference, within fp32's bound
    for the kernels and POOL_BOUND for the reference layer on a pool; the other rows stay NaN."""
    layer, reference = make(variant)
    steps, rows = 3, [4, 1, 2]
    torch.manual_seed(3)
    xs = [torch.randn(1, n + steps, 32) for n in PROMPTS]
    for model, dtype, bound in ((layer, torch.float32, BOUND), (reference, torch.float64, POOL_BOUND)):
        pool = poisoned_pool(model, 6, dtype)
        outputs = packed(model, pool, [x[:, :n] for x, n in zip(xs, PROMPTS)], final_state_indices=rows)
        for t in range(steps):
            step = packed(model, pool, [x[:, n + t:n + t + 1] for x, n in zip(xs, PROMPTS)],
                          initial_state_indices=rows, final_state_indices=rows)
            outputs = [torch.cat([o, s], 1) for o, s in zip(outputs, step)]
        for i, x in enumerate(xs):
            want, final = alone(reference, x)
            assert relative_error(outputs[i], want) <= bound, i
            for got, expected in zip(pool, final):
                if got is not None:
                    assert relative_error(got[rows[i]], expected[0]) <= bound, i
        for t in pool:
            if t is not None:
                assert torch.isnan(t[[0, 3, 5]]).all()


@pytest.mark.parametrize("variant", list(LAYERS))
def test_speculative_step_resumes_from_the_last_accepted_token(variant):
    """After a prefill into rows 0, 4, 8, a step of 3 draft tokens per sequence keeps the state after
    each in rows 1-3, 5-7, 9-11 (token_state_indices); with 1, 3, 2 of them accepted, the next token
    starts from the row accepted_state_indices gives and ends in the sequence's first row: its
    output and final state are those of the prompt, the accepted drafts and that token alone."""
    layer, reference = make(variant)
    accepted, draft = [1, 3, 2], 3
    first = [0, 4, 8]
    tokens = [r + 1 + j for r in first for j in range(draft)]
    torch.manual_seed(4)
    xs = [torch.randn(1, n + draft + 1, 32) for n in PROMPTS]
    for model, dtype, bound in ((layer, torch.float32, BOUND), (reference, torch.float64, POOL_BOUND)):
        pool = poisoned_pool(model, 13, dtype)
        prompts = packed(model, pool, [x[:, :n] for x, n in zip(xs, PROMPTS)], final_state_indices=first)
        drafts = packed(model, pool, [x[:, n:n + draft] for x, n in zip(xs, PROMPTS)], initial_state_indices=first,
                        token_state_indices=tokens)
        resume = ft.accepted_state_indices(torch.tensor(tokens), torch.tensor([0, 3, 6, 9]), torch.tensor(accepted))
        nexts = packed(model, pool, [x[:, n + draft:] for x, n in zip(xs, PROMPTS)],
                       initial_state_indices=resume.tolist(), final_state_indices=first)
        for i, (x, n, a) in enumerate(zip(xs, PROMPTS, accepted)):
            kept = torch.cat([x[:, :n + a], x[:, n + draft:]], 1)
            want, final = alone(reference, kept)
            got = torch.cat([prompts[i], drafts[i][:, :a], nexts[i]], 1)
            assert relative_error(got, want) <= bound, i
            for state, expected in zip(pool, final):
                if state is not None:
                    assert relative_error(state[first[i]], expected[0]) <= bound, i
        for t in pool:
            if t is not None:
                assert torch.isnan(t[12]).all()


# ---- Serving: all or nothing across the two pools --------------------------------------------

# RetNet with its convolution too, so that every layer runs with both pools.
WITH_CONV = {"retnet": dict(use_short_conv=True)}


def random_pool(layer, size):
    """The layer's pools of `size` rows, random: every row's bits tell whether it was written."""
    return State(*(None if t is None else torch.randn_like(t) for t in layer.state_pool(size)))


def bits(t):
    """t's bits as integers, a copy: NaN rows compare equal to themselves."""
    return t.detach().view({4: torch.int32, 2: torch.int16}[t.element_size()]).clone()


def gathered(pool, rows):
    """A State of the pool's rows, one per sequence (a copy)."""
    return State(*(None if t is None else t[rows].clone() for t in pool))


def assert_bitwise(got, want, what):
    assert torch.equal(bits(got), bits(want)), what


@pytest.mark.parametrize("variant", list(LAYERS))
def test_pool_calls_are_bitwise_the_calls_with_a_state_per_sequence(variant):
    """A prefill (final_state_indices, from zero), a decode step (each sequence reading and writing
    its row) and a speculative step of two draft tokens each (token_state_indices) over a pool give
    bitwise the outputs and states of the same tokens through the layer with a state per sequence
    (cu_seqlens, initial_state rows, output_final_state), in both pools; rows no index names keep
    their bits. (The states after the first drafts: a call cutting each sequence after its first
    token.)"""
    layer, _ = make(variant, **WITH_CONV.get(variant, {}))
    rows, drafts = [4, 1, 2], [6, 7, 8, 9, 10, 11]  # drafts: sequence i's two tokens write 6 + 2i, 7 + 2i
    pool = random_pool(layer, 12)
    untouched = [0, 3, 5]
    before = [bits(t[untouched]) for t in pool]
    torch.manual_seed(5)

    def per_sequence(x, cu_seqlens, start=None):
        return layer(x, initial_state=start, output_final_state=True, cu_seqlens=torch.tensor(cu_seqlens))

    with torch.no_grad():
        x = torch.randn(1, 17, 32)
        o, _ = layer(x, initial_state=pool, cu_seqlens=torch.tensor([0, 5, 14, 17]),
                     final_state_indices=torch.tensor(rows))
        want, final = per_sequence(x, [0, 5, 14, 17])
        assert_bitwise(o, want, "prefill output")
        for got, expected in zip(pool, final):
            assert_bitwise(got[rows], expected, "prefill states")

        x = torch.randn(1, 3, 32)
        start = gathered(pool, rows)
        o, _ = layer(x, initial_state=pool, cu_seqlens=torch.arange(4), initial_state_indices=torch.tensor(rows),
                     final_state_indices=torch.tensor(rows))
        want, final = per_sequence(x, [0, 1, 2, 3], start)
        assert_bitwise(o, want, "decode output")
        for got, expected in zip(pool, final):
            assert_bitwise(got[rows], expected, "decode states")

        x = torch.randn(1, 6, 32)
        start = gathered(pool, rows)
        o, _ = layer(x, initial_state=pool, cu_seqlens=torch.tensor([0, 2, 4, 6]),
                     initial_state_indices=torch.tensor(rows), token_state_indices=torch.tensor(drafts))
        want, final = per_sequence(x, [0, 2, 4, 6], start)
        _, cut = per_sequence(x, list(range(7)), gathered(pool, [r for r in rows for _ in range(2)]))
        assert_bitwise(o, want, "speculative output")
        for got, last, first in zip(pool, final, cut):
            assert_bitwise(got[drafts[1::2]], last, "states after the second drafts")
            assert_bitwise(got[drafts[0::2]], first[0::2], "states after the first drafts")
    for got, kept in zip(pool, before):
        assert torch.equal(bits(got[untouched]), kept)


def nan_read_row(layer, pool):
    pool.recurrent[1, 0, 0, 0] = float("nan")  # row 1: sequence 1's initial state
    return pool


def bf16_recurrent_pool(layer, pool):
    return State(pool.recurrent.bfloat16(), pool.conv)


def fewer_recurrent_rows(layer, pool):
    return State(pool.recurrent[:4].clone(), pool.conv)  # row 4, sequence 0's, only in the conv's pool


def nan_gate(layer, pool):
    """A NaN in what the layer forms its gate (or write strength, DeltaNet's beta) from."""
    parameter = {"gla": lambda: layer.gk_proj[1].bias, "deltanet": lambda: layer.b_proj.weight}.get(
        layer.variant, lambda: layer.A_log)()
    with torch.no_grad():
        parameter.view(-1)[0] = float("nan")
    return pool


REFUSALS = [nan_read_row, bf16_recurrent_pool, fewer_recurrent_rows, nan_gate]
GATED = {"mamba2", "gla", "deltanet", "gated_deltanet", "kda", "gdn2", "sla"}  # LA and RetNet: no gate to poison


@pytest.mark.parametrize("variant, refusal",
                         [(v, r) for r in REFUSALS for v in LAYERS if r is not nan_gate or v in GATED],
                         ids=lambda p: p if isinstance(p, str) else p.__name__)
def test_refused_call_changes_neither_pool(variant, refusal):
    """A decode step the recurrence refuses (a NaN in a row it reads, a bf16 pool, a row past its
    pool, a NaN gate) raises ValueError and leaves both pools bitwise as they were: the convolution,
    which runs first, has not moved its rows on."""
    layer, _ = make(variant, **WITH_CONV.get(variant, {}))
    pool = refusal(layer, random_pool(layer, 6))
    before = [bits(t) for t in pool]
    rows = torch.tensor([4, 1, 2])
    with torch.no_grad(), pytest.raises(ValueError):
        layer(torch.randn(1, 3, 32), initial_state=pool, cu_seqlens=torch.arange(4), initial_state_indices=rows,
              final_state_indices=rows)
    for got, kept in zip(pool, before):
        assert torch.equal(bits(got), kept)


def test_a_pool_written_after_a_differentiable_read_refuses_the_backward():
    """A layer trained from pool rows (initial_state_indices, with gradients), then a serving call
    writing that pool in place before backward(): backward raises PyTorch's error for a tensor
    modified in place instead of differentiating the rows written since, with the recurrent pool
    alone (RetNet) and with both pools."""
    for config in ({}, WITH_CONV["retnet"]):
        layer, _ = make("retnet", **config)
        pool = random_pool(layer, 6)
        rows = torch.tensor([4, 1, 2])
        o, _ = layer(torch.randn(1, 3, 32), initial_state=pool, cu_seqlens=torch.arange(4),
                     initial_state_indices=rows)
        with torch.no_grad():
            layer(torch.randn(1, 3, 32), initial_state=pool, cu_seqlens=torch.arange(4), initial_state_indices=rows,
                  final_state_indices=rows)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            o.sum().backward()
