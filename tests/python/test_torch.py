"""flat.torch: every operation forward and backward against the float64 oracle at the library's
bounds (precision="fast" at FLA's); bitwise the library's results; torch.compile (every function with every
option); the custom ops' registrations (opcheck); strided inputs read in place; bad input; PyTorch's thread count."""

import numpy as np
import pytest
import torch

import flat.torch as ft
from flat.torch import ops as torch_ops
from flat import _api, _args, _core
from oracle import NAMES, Problem, bound, expect_close, reference

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def tensor(x, dtype, grad=True):
    if x is None:
        return None
    t = torch.tensor(x, dtype=DTYPES[dtype] if dtype else torch.float32)
    return t.requires_grad_(grad)


def call(p: Problem, function=None, **options):
    """The operation on the problem's inputs (gates and states float32): (o, final_state, inputs)."""
    q, k, v, g, beta, b, w, h0 = p.inputs()
    inputs = dict(q=tensor(q, p.dtype), k=tensor(k, p.dtype), v=tensor(v, p.dtype), g=tensor(g, None),
                  beta=tensor(beta, p.dtype), b=tensor(b, p.dtype), w=tensor(w, p.dtype),
                  initial_state=tensor(h0, None))
    kwargs = {name: t for name, t in inputs.items() if t is not None}
    if p.G and "gate_group" in (function or getattr(ft, p.variant)).__code__.co_varnames:
        kwargs["gate_group"] = p.G
    o, final_state = (function or getattr(ft, p.variant))(**kwargs, output_final_state=True, **options)
    return o, final_state, inputs


@pytest.mark.parametrize("precision", ["exact", "fast"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", NAMES)
def test_forward_and_backward_match_the_oracle(variant, dtype, precision):
    # Head sharing: q and k read by every head (sla: every key-side input, its value heads side by side).
    shared = {"q": 1, "k": 1, "g": 1, "b": 1} if variant == "sla" else {"q": 1, "k": 1}
    p = Problem(variant, dtype, G=4 if variant == "sla" else None, heads=shared)
    o, final_state, inputs = call(p, precision=precision)
    (y, ht), grads = p.reference()
    expect_close("o", o.float().detach(), y, bound("o", dtype, precision))
    expect_close("final_state", final_state.detach(), ht, bound("final_state", dtype, precision))
    torch.autograd.backward([o, final_state], [torch.tensor(p.dy, dtype=o.dtype), torch.tensor(p.dht, dtype=torch.float32)])
    names = ["q", "k", "v", "g", "beta", "b", "w", "initial_state"]
    for name, want in zip(names, grads):
        if want is None:
            assert inputs[name] is None
            continue
        expect_close("d" + name, inputs[name].grad.float(), want, bound("d" + name, dtype, precision))


def test_exact_precision_is_the_default_bitwise():
    p = Problem("gated_deltanet", "bfloat16")
    default, default_state, _ = call(p)
    exact, exact_state, _ = call(p, precision="exact")
    assert torch.equal(default, exact) and torch.equal(default_state, exact_state)


def test_results_are_the_librarys_bitwise():
    """Through the custom op or through the binding's entry point alone: the same bits."""
    p = Problem("kda", "bfloat16", B=2, S=100, H=4, K=32, V=16)
    o, _, inputs = call(p)
    q, k, v, g, beta = (inputs[n].detach() for n in ("q", "k", "v", "g", "beta"))
    h0 = inputs["initial_state"].detach()
    y = torch.empty_like(o)
    view = torch_ops._view
    _core.call("forward", "kda", dict(q=view("q", q), k=view("k", k), v=view("v", v), g=view("g", g),
                                      beta=view("beta", beta), h0=view("h0", h0), y=view("y", y)), ([], [], [], []),
               _core.options("forward", {}), torch.get_num_threads(), "openmp")
    assert torch.equal(o.detach(), y)


def test_strided_inputs_are_read_in_place():
    """q, k, v as column slices of one fused projection reach the kernels without a copy."""
    B, T, H, K = 2, 50, 2, 16
    fused = torch.randn(B, T, 3 * H * K)
    q, k, v = (fused[..., i * H * K:(i + 1) * H * K].view(B, T, H, K) for i in range(3))
    g = -torch.rand(B, T, H, K)
    torch_ops._trace = []
    try:
        o, _ = ft.gla(q, k, v, g)
        pointers = torch_ops._trace[-1]
    finally:
        torch_ops._trace = None
    assert pointers == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    o_dense, _ = ft.gla(q.contiguous(), k.contiguous(), v.contiguous(), g)
    assert torch.equal(o, o_dense)


def test_torch_compile_gives_eager_results():
    torch.manual_seed(0)
    B, T, H, K = 1, 80, 2, 16
    q, k, v = (torch.randn(B, T, H, K) for _ in range(3))
    g = -torch.rand(B, T, H, K)
    x, weight = torch.randn(B, T, H * K), torch.randn(H * K, 4)

    def model(q, k, v, g, x, weight):
        y, _ = ft.conv(x, weight)
        o, state = ft.gla(q + y.view(B, T, H, K), k, v, g, output_final_state=True)
        return o, state

    eager = model(q, k, v, g, x, weight)
    compiled = torch.compile(model, fullgraph=True)(q, k, v, g, x, weight)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def every_option():
    """Each function's call with every option it takes set (off its default) at once, on tiny inputs:
    ({function name: its call on the tensors}, the tensors by name). Options that exclude each other
    (la's normalize) take a second call; the pool writes (final_state_indices, token_state_indices)
    are compiled in test_serving.py's decode step."""
    torch.manual_seed(0)
    T, H, K, V, G = 20, 2, 16, 8, 4
    q, k = torch.randn(1, T, H, K), torch.randn(1, T, H, K)
    v, raw_beta = torch.randn(1, T, H, V), torch.randn(1, T, H)
    pool = torch.randn(3, H, V, K)  # FLA's V-first states (state_v_first), read through initial_state_indices
    sequences = dict(cu_seqlens=torch.tensor([0, 7, T]), initial_state_indices=torch.tensor([2, -1]))
    common = dict(scale=0.5, output_final_state=True, chunk_size=16, use_qk_l2norm_in_kernel=True, check_values=False,
                  state_v_first=True, precision="fast", **sequences)
    beta = dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    bounded = dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-4.0, gate_group=G, solve="doubling")
    tensors = dict(q=q, k=k, v=v, pool=pool, raw_beta=raw_beta, beta=torch.rand(1, T, H), g_head=-torch.rand(1, T, H),
                   g_channel=-torch.rand(1, T, H, K), raw_head=torch.randn(1, T, H),
                   raw_group=torch.randn(1, T, H, K // G), A_log=torch.randn(H), dt_head=torch.randn(H),
                   dt_group=torch.randn(H * K // G), g_gamma=-torch.rand(H),
                   b=torch.rand(1, T, H, K), w=torch.rand(1, T, H, V), g_sla=-torch.rand(1, T, 1, K // G),
                   v_sla=torch.randn(1, T, 4, V), x=torch.randn(1, T, H * K), conv_weight=torch.randn(H * K, 4),
                   conv_bias=torch.randn(H * K), conv_pool=torch.randn(3, H * K, 3), norm_weight=torch.randn(K),
                   norm_bias=torch.randn(K), residual=torch.randn(1, T, H, K))
    calls = {
        "la": lambda t: (ft.la(t["q"], t["k"], t["v"], initial_state=t["pool"], **common),
                         ft.la(t["q"], t["k"], t["v"], normalize=True)),
        "retnet": lambda t: ft.retnet(t["q"], t["k"], t["v"], g_gamma=t["g_gamma"], initial_state=t["pool"], **common),
        "mamba2": lambda t: ft.mamba2(t["q"], t["k"], t["v"], t["g_head"], g_gamma=t["g_gamma"],
                                      initial_state=t["pool"], **common),
        "gla": lambda t: ft.gla(t["q"], t["k"], t["v"], t["g_channel"], initial_state=t["pool"], **common),
        "deltanet": lambda t: ft.deltanet(t["q"], t["k"], t["v"], t["raw_beta"], initial_state=t["pool"],
                                          solve="blocked", **beta, **common),
        "gated_deltanet": lambda t: ft.gated_deltanet(t["q"], t["k"], t["v"], t["raw_head"], t["raw_beta"],
                                                      use_gate_in_kernel=True, A_log=t["A_log"], dt_bias=t["dt_head"],
                                                      initial_state=t["pool"], solve="subst", **beta, **common),
        "kda": lambda t: ft.kda(t["q"], t["k"], t["v"], t["raw_group"], t["raw_beta"], A_log=t["A_log"],
                                dt_bias=t["dt_group"], initial_state=t["pool"], **bounded, **beta, **common),
        "gdn2": lambda t: ft.gdn2(t["q"], t["k"], t["v"], t["raw_group"], t["b"], t["w"], dt_bias=t["dt_group"],
                                  initial_state=t["pool"], **bounded, **common),
        "sla": lambda t: ft.sla(t["q"], t["k"], t["v_sla"], t["g_sla"], t["beta"], gate_group=G, solve="subst",
                                initial_state=t["pool"].repeat(1, 2, 1, 1), **common),
        "conv": lambda t: ft.conv(t["x"], t["conv_weight"], t["conv_bias"], t["conv_pool"], True, "silu", **sequences),
        "rms_norm_gated": lambda t: ft.rms_norm_gated(t["q"], t["k"], t["norm_weight"], t["norm_bias"], "sigmoid",
                                                      t["residual"], True, True, 1e-5, False),
    }
    return calls, tensors


@pytest.mark.parametrize("function", ["la", "retnet", "mamba2", "gla", "deltanet", "gated_deltanet", "kda", "gdn2",
                                      "sla", "conv", "rms_norm_gated"])
def test_every_option_compiles_without_a_graph_break(function):
    """torch.compile(fullgraph=True) of each function with every option it takes (FLA's
    use_gate_in_kernel with A_log, dt_bias, lower_bound among them) gives the eager results bitwise
    (aot_eager: the graph, the fake implementations and the functionalization of a full compile,
    without its code generation, which rounds the options' float32 arithmetic differently)."""
    calls, tensors = every_option()
    eager = calls[function](tensors)
    compiled = torch.compile(calls[function], fullgraph=True, backend="aot_eager")(tensors)
    eager, compiled = torch.utils._pytree.tree_leaves(eager), torch.utils._pytree.tree_leaves(compiled)
    assert len(eager) == len(compiled)
    assert all(a is None and b is None or torch.equal(a, b) for a, b in zip(eager, compiled))


def test_custom_op_registrations():
    """torch.library.opcheck: schema, fake (meta) implementation, autograd registration."""
    q, k, v = (torch.randn(1, 33, 2, 16, requires_grad=True) for _ in range(3))
    g = (-torch.rand(1, 33, 2, 16)).requires_grad_()
    h0 = torch.randn(1, 2, 16, 16, requires_grad=True)
    torch.library.opcheck(torch.ops.flat.forward.default, ("gla", q, k, v, g, None, None, None, h0, None, None),
                          dict(final_state=True, scale=None, chunk=32, l2norm_qk=False, solve="auto", precision="fast",
                               gate_group=0, check_values=True))
    x = torch.randn(2, 20, 8, requires_grad=True)
    weight, bias = torch.randn(8, 4, requires_grad=True), torch.randn(8, requires_grad=True)
    torch.library.opcheck(torch.ops.flat.conv_forward.default, (x, weight, bias, None, None, None, "silu", True))


def test_conv_matches_the_oracle():
    rng = np.random.default_rng(3)
    B, T, C, W = 2, 40, 24, 4
    x, weight, bias = rng.standard_normal((B, T, C)), rng.standard_normal((C, W)), rng.standard_normal(C)
    state0, dy, dstate = rng.standard_normal((B, C, W - 1)), rng.standard_normal((B, T, C)), rng.standard_normal(
        (B, C, W - 1))
    xs = [np.asarray(a, np.float32).astype(np.float64) for a in (x, weight, bias, state0, dy, dstate)]
    want = reference.reference_conv(B, T, C, W, "silu", *xs)
    tx, tw, tb, ts = (torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in xs[:4])
    y, state = ft.conv(tx, tw, tb, initial_state=ts, output_final_state=True, activation="silu")
    torch.autograd.backward([y, state], [torch.tensor(xs[4], dtype=torch.float32), torch.tensor(xs[5], dtype=torch.float32)])
    for name, got, expected in zip(("y", "state", "dx", "dweight", "dbias", "dstate0"),
                                   (y.detach(), state.detach(), tx.grad, tw.grad, tb.grad, ts.grad), want):
        expect_close(name, got, expected, 1e-5)


@pytest.mark.parametrize("activation, norm_before_gate, gate", [
    ("silu", True, True), ("sigmoid", True, True), ("silu", False, True), ("sigmoid", False, True),
    ("silu", True, False)])
def test_rms_norm_gated_matches_the_oracle(activation, norm_before_gate, gate):
    """The gate read in place as a column block of a wider projection [B, T, 3 H D]."""
    rng = np.random.default_rng(5)
    B, T, H, D = 2, 33, 3, 20
    x, z, weight, dy = (np.asarray(a, np.float32).astype(np.float64) for a in (
        rng.standard_normal((B, T, H, D)), 2 * rng.standard_normal((B, T, H, D)), 1 + rng.standard_normal(D),
        rng.standard_normal((B, T, H, D))))
    rows = B * T * H
    want = reference.reference_norm_gate(rows, H, D, activation, norm_before_gate, 1e-5, x.reshape(rows, D),
                                     z.reshape(rows, D) if gate else None, weight, dy.reshape(rows, D))
    tx, tw = (torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in (x, weight))
    projection = torch.zeros(B, T, 3 * H * D)
    projection[..., H * D:2 * H * D] = torch.tensor(z, dtype=torch.float32).reshape(B, T, H * D)
    projection.requires_grad_()
    tg = projection[..., H * D:2 * H * D].view(B, T, H, D) if gate else None
    y = ft.rms_norm_gated(tx, tg, tw, activation=activation, eps=1e-5, norm_before_gate=norm_before_gate)
    y.backward(torch.tensor(dy, dtype=torch.float32))
    got = [y.detach(), tx.grad, projection.grad[..., H * D:2 * H * D].reshape(B, T, H, D) if gate else None, tw.grad]
    for name, g, w in zip(("y", "dx", "dg", "dweight"), got, want):
        if w is not None:
            expect_close(name, g.reshape(w.shape), w, 1e-5)
    if gate:
        assert torch.count_nonzero(projection.grad[..., :H * D]) == 0


def test_rms_norm_gated_opcheck_and_bad_input():
    x, g = (torch.randn(2, 5, 2, 8, requires_grad=True) for _ in range(2))
    weight = torch.randn(8, requires_grad=True)
    torch.library.opcheck(torch.ops.flat.norm_gate_forward.default, (x, g, weight, "sigmoid", True, 1e-5))
    with pytest.raises(ValueError, match="flat: weight: expected shape \\[D=8\\], got \\[7\\]"):
        ft.rms_norm_gated(x, g, torch.randn(7))
    with pytest.raises(ValueError, match="flat: activation: expected 'swish' \\(or 'silu'\\), 'sigmoid', or None"):
        ft.rms_norm_gated(x, g, weight, activation="gelu")


@pytest.mark.parametrize("edit, message", [
    (lambda a: a.update(g=-torch.rand(2, 30, 3, 16)), "flat: g: head count Ng = 3 does not fit"),
    (lambda a: a.update(g=torch.rand(2, 30, 2, 16) + 0.5), "flat: g: expected finite values <= 0"),
    (lambda a: a.update(g=torch.rand(2, 30, 2, 16) + 0.5, check_values=None),  # None: the default, checked
     "flat: g: expected finite values <= 0"),
    (lambda a: a.update(q=a["q"].to(torch.float16)), "flat: q: expected dtype float32 or bfloat16"),
    (lambda a: a.update(q=a["q"][..., :8]), "flat: k: expected shape"),
    (lambda a: a.update(chunk_size=20), "flat: options.chunk: expected a multiple of 16"),
])
def test_bad_input_raises_value_error(edit, message):
    args = dict(q=torch.randn(2, 30, 2, 16), k=torch.randn(2, 30, 2, 16), v=torch.randn(2, 30, 2, 8),
                g=-torch.rand(2, 30, 2, 16))
    edit(args)
    with pytest.raises(ValueError, match=message):
        ft.gla(**args)


def test_pytorchs_thread_count_is_used():
    args = (torch.randn(2, 64, 8, 16), torch.randn(2, 64, 8, 16), torch.randn(2, 64, 8, 16), -torch.rand(2, 64, 8, 16))
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(ft.gla(*args)[0])
            assert _core.last_openmp_team() == threads
        assert torch.equal(results[0], results[1])
    finally:
        torch.set_num_threads(before)


def test_axes_of_one_element_take_any_stride():
    """A last axis of one element (V = 1, a width-2 convolution's state) with a stride other than 1,
    as PyTorch leaves on a transposed [.., 1, K] state or as as_strided makes it, reaches the library
    as it is (read in place, not copied) and gives the contiguous call's results."""
    torch.manual_seed(0)
    B, T, H, K = 2, 20, 2, 16
    q, k = (torch.randn(B, T, H, K) for _ in range(2))
    g = -torch.rand(B, T, H, K)
    v = torch.randn(B, T, H, 1)
    h0 = torch.randn(B, H, K, 1)
    # v's and the state's last axes with strides 5 and 3, in larger buffers.
    v_odd = torch.empty(B * T * H * 5).as_strided((B, T, H, 1), (T * H * 5, H * 5, 5, 5)).copy_(v)
    h0_odd = torch.empty(B * H * K * 3).as_strided((B, H, K, 1), (H * K * 3, K * 3, 3, 3)).copy_(h0)
    assert v_odd.stride(-1) == 5 and h0_odd.stride(-1) == 3
    o, ht = ft.gla(q, k, v, g, initial_state=h0, output_final_state=True)
    torch_ops._trace = []
    try:
        o_odd, ht_odd = ft.gla(q, k, v_odd, g, initial_state=h0_odd, output_final_state=True)
        pointers = torch_ops._trace[-1]
    finally:
        torch_ops._trace = None
    assert pointers[2] == v_odd.data_ptr()
    assert torch.equal(o, o_odd) and torch.equal(ht, ht_odd)
    # V-first (FLA's state_v_first): the state [B, H, 1, K] transposed to the kernel's [B, H, K, 1],
    # whose last axis has stride K.
    v_first = torch.empty(B, H, 1, K).copy_(h0.transpose(-1, -2))
    assert v_first.transpose(-1, -2).stride(-1) == K
    o_vf, ht_vf = ft.gla(q, k, v, g, initial_state=v_first, output_final_state=True, state_v_first=True)
    assert torch.equal(o, o_vf) and torch.equal(ht, ht_vf.transpose(-1, -2))
    # The convolution's state of a width-2 filter, [B, C, 1], with stride 4 on its last axis.
    x, weight, state = torch.randn(B, T, 8), torch.randn(8, 2), torch.randn(B, 8, 1)
    state_odd = torch.empty(B * 8 * 4).as_strided((B, 8, 1), (8 * 4, 4, 4)).copy_(state)
    y, final = ft.conv(x, weight, None, state, True, "silu")
    y_odd, final_odd = ft.conv(x, weight, None, state_odd, True, "silu")
    assert torch.equal(y, y_odd) and torch.equal(final, final_odd)


def test_calls_without_gradients_skip_the_dispatcher_and_give_its_results():
    """An eager call none of whose inputs needs a gradient runs the op's implementation directly (a
    decode step's per-call cost); its results are the dispatched op's bitwise, and a dispatch mode
    still sees the op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 2, 16) for _ in range(3))
    g, h0 = -torch.rand(1, 1, 2, 16), torch.randn(1, 2, 16, 16)
    x, weight, state = torch.randn(1, 1, 8), torch.randn(8, 4), torch.randn(1, 8, 3)
    assert torch_ops._direct(q, k, v, g, h0)
    with torch.no_grad():
        assert torch_ops._direct(q.requires_grad_(), k)
        o, ht = ft.gla(q, k, v, g, initial_state=h0, output_final_state=True)
        y, s = ft.conv(x, weight, None, state, True, "silu")
    q.requires_grad_(False)
    assert not torch_ops._direct(q, k.requires_grad_())
    o_op, ht_op = ft.gla(q, k, v, g, initial_state=h0, output_final_state=True)
    assert torch.equal(o, o_op.detach()) and torch.equal(ht, ht_op.detach())
    k.requires_grad_(False)
    mode = Ops()
    with mode:
        assert not torch_ops._direct(x)
        y_op, s_op = ft.conv(x, weight, None, state, True, "silu")
        ft.gla(q, k, v, g)
    assert "flat.conv_forward.default" in mode.names and "flat.forward.default" in mode.names
    assert torch.equal(y, y_op) and torch.equal(s, s_op)


def test_options_are_the_library_s():
    """The options flat.torch's custom ops take are the library's list (flat::option_names), keyword-only
    in its order, as is the record the functions pass; a call's options are checked once per set of
    values and that checked object kept."""
    names = _core.option_names("forward")
    assert _api.Options._fields == tuple(names) and "precision" in names
    for op in (torch.ops.flat.forward, torch.ops.flat.forward_pool, torch.ops.flat.backward):
        options = [a.name for a in op.default._schema.arguments if a.kwarg_only and a.name != "final_state"]
        assert options == names, op
    assert _args.checked_options("forward", dict(chunk=32)) is _args.checked_options("forward", dict(chunk=32))
