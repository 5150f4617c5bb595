"""flat.compat.fla against transformers' own torch fallbacks of FLA's functions (Qwen3.5's gated
delta rule, Kimi Linear's KDA), in float32: outputs and final states within 1e-5, gradients of every
input within 1e-4, by relative L2 per tensor; bfloat16 inputs within flat's bfloat16 bounds of the
float32 fallback on the same rounded values. GDN-2 (chunk_gdn2, fused_recurrent_gdn2) against its
recurrence written out, and FLA's short convolution (causal_conv1d, causal_conv1d_update) with FLA's
state [N, D, W] against the convolution written out."""

import warnings

import pytest
import torch
import torch.nn.functional as F

fla = pytest.importorskip("flat.compat.fla")
qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")

from torch_fallbacks import GRAD, OUT, plain, rel  # noqa: E402

GDN_CHUNK = plain(qwen.torch_chunk_gated_delta_rule)
GDN_RECURRENT = plain(qwen.torch_recurrent_gated_delta_rule)
KDA_CHUNK = plain(kimi.chunk_kimi_delta_attention)
KDA_RECURRENT = plain(kimi.recurrent_kimi_delta_attention)

K, V = 16, 8


def _repeat(x, HV):
    return x.repeat_interleave(HV // x.shape[2], dim=2)


def kda_chunk_ref(q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    """Kimi's fallback has one head count: GVA by repeating q and k, as FLA's kernels read them."""
    HV = v.shape[2]
    return KDA_CHUNK(_repeat(q, HV), _repeat(k, HV), v, g=g, beta=beta, chunk_size=16, initial_state=initial_state,
                     output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


def kda_recurrent_ref(q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    HV = v.shape[2]
    return KDA_RECURRENT(_repeat(q, HV), _repeat(k, HV), v, g=g, beta=beta, initial_state=initial_state,
                         output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


def gdn_chunk_ref(q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    return GDN_CHUNK(q, k, v, g=g, beta=beta, chunk_size=16, initial_state=initial_state,
                     output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


def gdn_recurrent_ref(q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel):
    return GDN_RECURRENT(q, k, v, g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state,
                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


def inputs(B, T, H, HV, per_channel, h0, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    x = dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V),
             g=F.logsigmoid(r(B, T, HV, K) + 2) if per_channel else F.logsigmoid(r(B, T, HV) + 2),
             beta=torch.rand(B, T, HV, generator=gen))
    x = {n: t.to(dtype) for n, t in x.items()}
    x["initial_state"] = r(B, HV, K, V) if h0 else None
    return x


def run(fn, x, weights=None, **options):
    """fn on leaf copies of x; returns o, final state and every input's gradient of a fixed linear
    function of both."""
    leaves = {n: (t.clone().requires_grad_(t.is_floating_point()) if t is not None else None) for n, t in x.items()}
    o, ht = fn(**leaves, **options)
    if weights is None:
        gen = torch.Generator().manual_seed(7)
        weights = (torch.randn(o.shape, generator=gen), None if ht is None else torch.randn(ht.shape, generator=gen))
    loss = (o.float() * weights[0]).sum()
    if ht is not None:
        loss = loss + (ht.float() * weights[1]).sum()
    loss.backward()
    grads = {n: t.grad for n, t in leaves.items() if t is not None and t.requires_grad}
    return o.detach(), (None if ht is None else ht.detach()), grads, weights


def compare(ours, ref, out=OUT, grad=GRAD):
    o, ht, dx, _ = ours
    ro, rht, rdx, _ = ref
    assert o.shape == ro.shape and o.dtype == ro.dtype
    assert rel(o, ro) <= out, rel(o, ro)
    if rht is None:
        assert ht is None
    else:
        assert ht.shape == rht.shape and ht.dtype == torch.float32
        assert rel(ht, rht) <= out, rel(ht, rht)
    assert dx.keys() == rdx.keys()
    for name in dx:
        assert dx[name].shape == rdx[name].shape and dx[name].dtype == rdx[name].dtype, name
        assert rel(dx[name], rdx[name]) <= grad, (name, rel(dx[name], rdx[name]))


# B, T, H, HV, initial state, l2norm: T = 1, a chunk - 1, a chunk + 1 (chunk 16), GVA
SHAPES = [
    (1, 1, 2, 2, True, True),
    (2, 15, 1, 2, False, False),
    (1, 17, 2, 4, True, True),
    (2, 33, 2, 2, True, False),
]


@pytest.mark.parametrize("B, T, H, HV, h0, l2", SHAPES)
def test_chunk_gated_delta_rule(B, T, H, HV, h0, l2):
    x = inputs(B, T, H, HV, False, h0)
    ours = run(fla.chunk_gated_delta_rule, x, output_final_state=True, use_qk_l2norm_in_kernel=l2, chunk_size=16)
    compare(ours, run(gdn_chunk_ref, x, ours[3], output_final_state=True, use_qk_l2norm_in_kernel=l2))
    assert fla.chunk_gdn is fla.chunk_gated_delta_rule


@pytest.mark.parametrize("B, T, H, HV, h0, l2", SHAPES[:3])
def test_fused_recurrent_gated_delta_rule(B, T, H, HV, h0, l2):
    x = inputs(B, T, H, HV, False, h0)
    ours = run(fla.fused_recurrent_gated_delta_rule, x, output_final_state=True, use_qk_l2norm_in_kernel=l2)
    compare(ours, run(gdn_recurrent_ref, x, ours[3], output_final_state=True, use_qk_l2norm_in_kernel=l2))


@pytest.mark.parametrize("B, T, H, HV, h0, l2", SHAPES)
def test_chunk_kda(B, T, H, HV, h0, l2):
    x = inputs(B, T, H, HV, True, h0)
    ours = run(fla.chunk_kda, x, output_final_state=True, use_qk_l2norm_in_kernel=l2, chunk_size=32)
    compare(ours, run(kda_chunk_ref, x, ours[3], output_final_state=True, use_qk_l2norm_in_kernel=l2))


@pytest.mark.parametrize("B, T, H, HV, h0, l2", SHAPES[:3])
def test_fused_recurrent_kda(B, T, H, HV, h0, l2):
    x = inputs(B, T, H, HV, True, h0)
    ours = run(fla.fused_recurrent_kda, x, output_final_state=True, use_qk_l2norm_in_kernel=l2)
    compare(ours, run(kda_recurrent_ref, x, ours[3], output_final_state=True, use_qk_l2norm_in_kernel=l2))


def test_no_final_state_and_dtypes():
    x = inputs(1, 5, 2, 4, True, True)
    x_bf = dict(x, q=x["q"].bfloat16(), k=x["k"].bfloat16())
    for fn in (fla.chunk_kda, fla.fused_recurrent_kda):
        o, ht = fn(**x_bf)
        assert ht is None and o.shape == (1, 5, 4, V)
    # FLA casts the chunk functions' o to q's dtype, the recurrent ones' to v's
    assert fla.chunk_kda(**x_bf)[0].dtype == torch.bfloat16
    assert fla.fused_recurrent_kda(**x_bf)[0].dtype == torch.float32
    o, ht = fla.chunk_gated_delta_rule(**inputs(1, 5, 2, 4, False, False), output_final_state=True)
    assert o.dtype == torch.float32 and ht.shape == (1, 4, K, V) and ht.dtype == torch.float32


def _gdn_gate_ref(a, A_log, dt_bias):
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias)


def test_gated_delta_rule_gate_in_kernel():
    """Qwen3.5's own gate, g = -exp(A_log) softplus(a + dt_bias), and beta = sigmoid(b), made in the call."""
    x = inputs(1, 17, 2, 4, False, True)
    gen = torch.Generator().manual_seed(3)
    x.update(g=torch.randn(1, 17, 4, generator=gen), beta=torch.randn(1, 17, 4, generator=gen),
             A_log=torch.randn(4, generator=gen), dt_bias=torch.randn(4, generator=gen))

    def ref(q, k, v, g, beta, initial_state, A_log, dt_bias, **options):
        return gdn_chunk_ref(q, k, v, _gdn_gate_ref(g, A_log, dt_bias), beta.sigmoid(), initial_state, **options)

    ours = run(fla.chunk_gated_delta_rule, x, output_final_state=True, use_qk_l2norm_in_kernel=True,
               use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, chunk_size=16)
    compare(ours, run(ref, x, ours[3], output_final_state=True, use_qk_l2norm_in_kernel=True))

    def ref_recurrent(q, k, v, g, beta, initial_state, A_log, dt_bias, **options):
        return gdn_recurrent_ref(q, k, v, _gdn_gate_ref(g, A_log, dt_bias), 2 * beta.sigmoid(), initial_state,
                                 **options)

    ours = run(fla.fused_recurrent_gated_delta_rule, x, output_final_state=True, use_qk_l2norm_in_kernel=True,
               use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    compare(ours, run(ref_recurrent, x, ours[3], output_final_state=True, use_qk_l2norm_in_kernel=True))


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_kda_gate_in_kernel(lower_bound):
    """Kimi Linear's forget gate (A_log [1, 1, HV, 1], dt_bias [HV * K]), or FLA's bounded one."""
    x = inputs(1, 17, 1, 2, True, True)
    gen = torch.Generator().manual_seed(4)
    x.update(g=torch.randn(1, 17, 2, K, generator=gen), beta=torch.randn(1, 17, 2, generator=gen),
             A_log=torch.randn(1, 1, 2, 1, generator=gen), dt_bias=torch.randn(2 * K, generator=gen))

    def gate(g, A_log, dt_bias):
        a = g + dt_bias.view(2, K)
        if lower_bound is None:
            return -A_log.reshape(2, 1).exp() * F.softplus(a)
        return lower_bound * torch.sigmoid(A_log.reshape(2, 1).exp() * a)

    def ref(q, k, v, g, beta, initial_state, A_log, dt_bias, **options):
        return kda_chunk_ref(q, k, v, gate(g, A_log, dt_bias), 2 * beta.sigmoid(), initial_state, **options)

    options = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    flags = dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                 lower_bound=lower_bound)
    ours = run(fla.chunk_kda, x, **options, **flags, safe_gate=lower_bound is not None)
    reference = run(ref, x, ours[3], **options)
    compare(ours, reference)
    compare(run(fla.fused_recurrent_kda, x, ours[3], **options, **flags), reference)



def test_kda_lower_bound_gate_without_A_log():
    """FLA's bounded gate without A_log, lower_bound * sigmoid(g + dt_bias): flat.torch.kda forms it
    (the formula is flat.torch's alone), in both KDA functions."""
    x = inputs(1, 9, 1, 2, True, True)
    raw, dt_bias = torch.randn(1, 9, 2, K), torch.randn(2 * K)
    gate = -5.0 * torch.sigmoid(raw + dt_bias.view(2, K))
    want = fla.chunk_kda(**dict(x, g=gate), output_final_state=True)
    for fn in (fla.chunk_kda, fla.fused_recurrent_kda):
        got = fn(**dict(x, g=raw), output_final_state=True, use_gate_in_kernel=True, lower_bound=-5.0,
                 dt_bias=dt_bias)
        assert rel(got[0], want[0]) <= OUT and rel(got[1], want[1]) <= OUT

def _naive(q, k, v, g, gk, gv, beta, initial_state):
    """FLA's fused_recurrent_gated_delta_rule kernel token by token (GVA by repeating q, k)."""
    HV = v.shape[2]
    q, k = _repeat(q, HV) * K ** -0.5, _repeat(k, HV)
    S, out = initial_state, []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None, None] * gk[:, t].exp()[..., None] * gv[:, t].exp()[..., None, :]
        d = beta[:, t] * (v[:, t] - (S * k[:, t][..., None]).sum(-2))
        S = S + k[:, t][..., None] * d[..., None, :]
        out.append((S * q[:, t][..., None]).sum(-2))
    return torch.stack(out, 1), S


def test_fused_recurrent_gated_delta_rule_gk_gv_channel_beta():
    """The key-side and value-side gates and a beta per value channel, which flat's kernel computes as
    heads of width 1, against FLA's kernel written out."""
    x = inputs(1, 6, 1, 2, False, True)
    gen = torch.Generator().manual_seed(5)
    x.update(gk=F.logsigmoid(torch.randn(1, 6, 2, K, generator=gen) + 2),
             gv=F.logsigmoid(torch.randn(1, 6, 2, V, generator=gen) + 2), beta=torch.rand(1, 6, 2, V, generator=gen))
    ours = run(fla.fused_recurrent_gated_delta_rule, x, output_final_state=True)
    compare(ours, run(_naive, x, ours[3]))
    # V-first states: the same numbers transposed
    x_vf = dict(x, initial_state=x["initial_state"].transpose(-1, -2).contiguous())
    o, ht = fla.fused_recurrent_gated_delta_rule(**x_vf, output_final_state=True, state_v_first=True)
    assert rel(o, ours[0]) == 0 and rel(ht.transpose(-1, -2), ours[1]) == 0 and ht.is_contiguous()


def test_state_v_first():
    x = inputs(2, 9, 1, 2, True, True)
    o, ht = fla.chunk_kda(**x, output_final_state=True)
    x_vf = dict(x, initial_state=x["initial_state"].transpose(-1, -2).contiguous())
    o2, ht2 = fla.chunk_kda(**x_vf, output_final_state=True, state_v_first=True)
    assert ht2.shape == (2, 2, V, K) and torch.equal(o2, o) and torch.equal(ht2, ht.transpose(-1, -2))
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        o3, ht3 = fla.chunk_kda(**x_vf, output_final_state=True, transpose_state_layout=True)
    assert torch.equal(ht3, ht2)


@pytest.mark.parametrize("fn, per_channel", [(fla.chunk_gated_delta_rule, False), (fla.fused_recurrent_kda, True)])
def test_cu_seqlens_matches_separate_calls(fn, per_channel):
    lengths = [5, 17, 1]
    x = inputs(1, sum(lengths), 1, 2, per_channel, False)
    x["initial_state"] = torch.randn(3, 2, K, V)
    cu = torch.tensor([0, 5, 22, 23])
    packed = run(fn, x, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        part = {n: t[:, a:b] for n, t in x.items() if n != "initial_state"}
        part["initial_state"] = x["initial_state"][i:i + 1]
        weights = (packed[3][0][:, a:b], packed[3][1][i:i + 1])
        o, ht, dx, _ = run(fn, part, weights, output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert rel(packed[0][:, a:b], o) <= OUT and rel(packed[1][i:i + 1], ht) <= OUT
        for n in dx:
            got = packed[2][n][i:i + 1] if n == "initial_state" else packed[2][n][:, a:b]
            assert rel(got, dx[n]) <= GRAD, n


def test_bf16_initial_state():
    """FLA's own docstring example passes a bfloat16 h0: widened exactly, its gradient in bfloat16."""
    x = inputs(1, 9, 2, 2, False, True)
    x["initial_state"] = x["initial_state"].bfloat16()
    ours = run(fla.chunk_gated_delta_rule, x, output_final_state=True)
    wide = run(fla.chunk_gated_delta_rule, dict(x, initial_state=x["initial_state"].float()), ours[3],
               output_final_state=True)
    assert ours[1].dtype == torch.float32 and torch.equal(ours[0], wide[0]) and torch.equal(ours[1], wide[1])
    assert ours[2]["initial_state"].dtype == torch.bfloat16
    assert rel(ours[2]["initial_state"], wide[2]["initial_state"]) <= 1e-2
    kda = inputs(1, 9, 2, 2, True, True)
    kda["initial_state"] = kda["initial_state"].bfloat16()
    assert fla.fused_recurrent_kda(**kda, output_final_state=True)[1].dtype == torch.float32


@pytest.mark.parametrize("fn, ref, per_channel", [(fla.chunk_gated_delta_rule, gdn_chunk_ref, False),
                                                  (fla.chunk_kda, kda_chunk_ref, True)])
def test_bf16_inputs(fn, ref, per_channel):
    """bfloat16 q, k, v, beta with a float32 gate (as transformers passes them) against the float32
    fallback on the same rounded values."""
    x = inputs(1, 33, 2, 4, per_channel, True, dtype=torch.bfloat16)
    x["g"] = x["g"].float()
    ours = run(fn, x, output_final_state=True, use_qk_l2norm_in_kernel=True)
    wide = {n: (t.float() if t is not None else None) for n, t in x.items()}
    reference = run(ref, wide, ours[3], output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert ours[0].dtype == torch.bfloat16 and ours[1].dtype == torch.float32
    # flat's bounds for bfloat16 (docs/variants.md): o 5e-3, gradients 1e-2; the state stays float32
    assert rel(ours[0], reference[0]) <= 5e-3 and rel(ours[1], reference[1]) <= 1e-4
    for n in reference[2]:
        assert ours[2][n].dtype == x[n].dtype
        assert rel(ours[2][n], reference[2][n]) <= 1e-2, n


def test_float16_and_extra_kwargs():
    x = inputs(1, 5, 1, 1, False, False)
    o, _ = fla.chunk_gated_delta_rule(**{n: (t.half() if t is not None else None) for n, t in x.items()},
                                      some_future_option=1)
    assert o.dtype == torch.float16
    assert rel(o, fla.chunk_gated_delta_rule(**x)[0]) <= 1e-2


def _raises(name, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=f"flat: {name}: expected"):
        fn(*args, **kwargs)


def test_bad_inputs():
    x = inputs(1, 4, 2, 2, False, False)
    kx = inputs(1, 4, 2, 2, True, False)
    gdn, kda = fla.chunk_gated_delta_rule, fla.chunk_kda
    _raises("q", gdn, **dict(x, q=x["q"][0]))
    _raises("k", gdn, **dict(x, k=x["k"][:, :, :1]))
    _raises("v", gdn, **dict(x, v=torch.randn(1, 4, 3, V)))
    _raises("g", gdn, **dict(x, g=x["g"][..., None]))
    _raises("g", kda, **dict(kx, g=x["g"]))
    _raises("beta", fla.fused_recurrent_kda, **dict(kx, beta=kx["beta"][..., :1]))
    _raises("initial_state", gdn, **dict(x, initial_state=torch.zeros(2, 2, K, V)))
    _raises("initial_state", kda, **dict(kx, initial_state=torch.zeros(1, 2, K, V + 1)), state_v_first=True)
    _raises("cu_seqlens", gdn, **dict(x, **{n: torch.cat([x[n], x[n]]) for n in ("q", "k", "v", "g", "beta")}),
            cu_seqlens=torch.tensor([0, 2, 4]))
    _raises("cu_seqlens", gdn, **x, cu_seqlens=[0, 4])
    _raises("chunk_size", gdn, **x, chunk_size=128)
    _raises("chunk_size", kda, **kx, chunk_size=16)
    _raises("A_log", gdn, **x, use_gate_in_kernel=True)
    _raises("A_log", kda, **kx, use_gate_in_kernel=True, A_log=torch.zeros(3))
    _raises("dt_bias", kda, **kx, use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(2))
    _raises("lower_bound", kda, **kx, use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0)
    _raises("allow_neg_eigval", kda, **kx, allow_neg_eigval=True)
    # what only FLA's CUDA kernels do
    _raises("cp_context", kda, **kx, cp_context=object())
    _raises("cp_context", gdn, **x, cp_context=object())
    _raises("use_graph", kda, **kx, use_graph=True)
    _raises("return_intermediate_states", kda, **kx, return_intermediate_states=True)
    _raises("q", gdn, **{n: t.to("meta") for n, t in x.items() if t is not None})
    # flat checks gate values: a positive log-decay is named
    _raises("g", gdn, **dict(x, g=-x["g"] + 1))
    # FLA raises DeprecationWarning (an exception) for head_first; flat's is a ValueError too
    with pytest.raises(DeprecationWarning, match="head_first"):
        gdn(**x, head_first=False)
    _raises("head_first", gdn, **x, head_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gdn(**x, chunk_indices=None, cu_seqlens_cpu=None)


# ---- GDN-2 ---------------------------------------------------------------------------------------


def gdn2_naive(q, k, v, g, b, w, initial_state):
    """GDN-2's recurrence token by token, H = (I - k (b * k)^T) Diag(exp(g)) H + k (w * v)^T,
    o = scale H^T q (GVA by repeating q, k)."""
    HV = v.shape[2]
    q, k = _repeat(q, HV) * K ** -0.5, _repeat(k, HV)
    S, out = initial_state, []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[..., None]
        S = S - k[:, t][..., None] * ((b[:, t] * k[:, t])[..., None] * S).sum(-2, keepdim=True)
        S = S + k[:, t][..., None] * (w[:, t] * v[:, t])[..., None, :]
        out.append((S * q[:, t][..., None]).sum(-2))
    return torch.stack(out, 1), S


def gdn2_inputs(B, T, H, HV, seed=0):
    x = inputs(B, T, H, HV, True, True, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    del x["beta"]
    x.update(b=2 * torch.rand(B, T, HV, K, generator=gen), w=torch.rand(B, T, HV, V, generator=gen))
    return x


@pytest.mark.parametrize("fn", [fla.chunk_gdn2, fla.fused_recurrent_gdn2])
def test_gdn2_is_its_recurrence(fn):
    """FLA 0.6's chunk_gdn2 and fused_recurrent_gdn2 against GDN-2's recurrence written out, GVA
    (two value heads on one key head), outputs, final state and every input's gradient."""
    x = gdn2_inputs(1, 17, 1, 2)
    ours = run(fn, x, output_final_state=True)
    compare(ours, run(gdn2_naive, x, ours[3]))


def test_gdn2_gate_in_kernel_state_v_first_and_packed():
    x = gdn2_inputs(1, 12, 1, 2)
    gen = torch.Generator().manual_seed(9)
    raw, A_log, dt_bias = torch.randn(1, 12, 2, K, generator=gen), torch.randn(2, generator=gen), torch.randn(2 * K)
    gate = -A_log.exp().view(2, 1) * F.softplus(raw + dt_bias.view(2, K))
    want, state = fla.chunk_gdn2(**dict(x, g=gate), output_final_state=True)
    got, got_state = fla.chunk_gdn2(**dict(x, g=raw), output_final_state=True, use_gate_in_kernel=True, A_log=A_log,
                                    dt_bias=dt_bias)
    assert rel(got, want) <= OUT and rel(got_state, state) <= OUT
    got, got_state = fla.fused_recurrent_gdn2(x["q"], x["k"], x["v"], raw, x["b"], x["w"], A_log, dt_bias,
                                              initial_state=x["initial_state"], output_final_state=True,
                                              use_gate_in_kernel=True)
    assert rel(got, want) <= OUT and rel(got_state, state) <= OUT
    x_vf = dict(x, initial_state=x["initial_state"].transpose(-1, -2).contiguous(), g=gate)
    o_vf, state_vf = fla.chunk_gdn2(**x_vf, output_final_state=True, state_v_first=True)
    assert torch.equal(o_vf, want) and torch.equal(state_vf, state.transpose(-1, -2))
    two = {n: torch.cat([t, t]) for n, t in dict(x, g=gate).items()}
    packed = {n: t.reshape(1, 24, *t.shape[2:]) if n != "initial_state" else t for n, t in two.items()}
    o, states = fla.chunk_gdn2(**packed, output_final_state=True, cu_seqlens=torch.tensor([0, 12, 24]))
    assert torch.equal(o, torch.cat([want, want], 1)) and torch.equal(states, torch.cat([state, state]))
    bf = dict(x, g=gate, q=x["q"].bfloat16(), k=x["k"].bfloat16())
    assert fla.chunk_gdn2(**bf)[0].dtype == torch.bfloat16 and fla.fused_recurrent_gdn2(**bf)[0].dtype == torch.float32


def test_gdn2_bad_inputs():
    x = gdn2_inputs(1, 4, 1, 2)
    _raises("chunk_size", fla.chunk_gdn2, **x, chunk_size=32)
    _raises("b", fla.chunk_gdn2, **dict(x, b=x["b"][..., :1]))
    _raises("w", fla.fused_recurrent_gdn2, **dict(x, w=x["w"][..., :1]))
    _raises("g", fla.chunk_gdn2, **dict(x, g=x["g"][..., 0]))
    _raises("A_log", fla.chunk_gdn2, **x, use_gate_in_kernel=True)
    _raises("lower_bound", fla.chunk_gdn2, **x, use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0)
    _raises("return_intermediate_states", fla.chunk_gdn2, **x, return_intermediate_states=True)
    _raises("cp_context", fla.chunk_gdn2, **x, cp_context=object())


# ---- The short convolution with FLA's state [N, D, W] ------------------------------------------


def fla_conv_ref(x, weight, bias=None, residual=None, initial_state=None, activation=None, output_final_state=False,
                 cu_seqlens=None):
    """FLA's causal_conv1d written out, sequence by sequence: its W state columns, then its tokens,
    convolved (each window of W ending at a token), the activation, the residual; the final state
    each sequence's last W inputs."""
    B, T, D = x.shape
    W = weight.shape[1]
    spans = [(b, 0, T) for b in range(B)] if cu_seqlens is None else [
        (0, s, e) for s, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())]
    ys, finals = [], []
    for n, (row, s, e) in enumerate(spans):
        history = x.new_zeros(D, W) if initial_state is None else initial_state[n].to(x.dtype)
        inputs = torch.cat([history, x[row, s:e].T], 1)
        y = F.conv1d(inputs[None, :, 1:], weight[:, None, :], bias, groups=D)[0].T
        ys.append(F.silu(y) if activation in ("silu", "swish") else y)
        finals.append(inputs[:, -W:])
    y = torch.stack(ys) if cu_seqlens is None else torch.cat(ys)[None]
    return (y if residual is None else y + residual), (torch.stack(finals) if output_final_state else None)


def conv_inputs(B, T, D, W, N=None, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(B, T, D, generator=gen).to(dtype), weight=torch.randn(D, W, generator=gen),
                bias=torch.randn(D, generator=gen), residual=torch.randn(B, T, D, generator=gen).to(dtype),
                initial_state=torch.randn(N or B, D, W, generator=gen).to(dtype))


@pytest.mark.parametrize("cu_seqlens", [None, torch.tensor([0, 2, 9])])
def test_causal_conv1d_takes_fla_s_state(cu_seqlens):
    """FLA 0.6's causal_conv1d with its state [N, D, W]: output, final state (each sequence's last W
    inputs, one shorter than W reaching into its initial state) and every input's gradient."""
    x = conv_inputs(2, 9, 6, 4) if cu_seqlens is None else conv_inputs(1, 9, 6, 4, N=2)
    ours = run(fla.causal_conv1d, x, activation="silu", output_final_state=True, cu_seqlens=cu_seqlens)
    assert ours[1].shape == x["initial_state"].shape
    compare(ours, run(fla_conv_ref, x, ours[3], activation="silu", output_final_state=True, cu_seqlens=cu_seqlens))


def test_causal_conv1d_keeps_x_s_dtype_and_chains_with_its_update():
    """A bfloat16 state in and out (x's dtype, as FLA's), its columns the inputs themselves; then
    causal_conv1d_update, one token per sequence, continues the state in place as the one call over
    every token does."""
    x = conv_inputs(2, 7, 6, 3, dtype=torch.bfloat16)
    y, state = fla.causal_conv1d(**x, output_final_state=True)
    ref_y, ref_state = fla_conv_ref(**{n: t.float() for n, t in x.items()}, output_final_state=True)
    assert y.dtype == state.dtype == torch.bfloat16 and torch.equal(state, ref_state.bfloat16())
    assert rel(y, ref_y) <= 5e-3
    x32 = conv_inputs(2, 7, 6, 3)
    whole, final = fla.causal_conv1d(**x32, activation="swish", output_final_state=True)
    head = {n: t[:, :6] if n in ("x", "residual") else t for n, t in x32.items()}
    _, cache = fla.causal_conv1d(**head, activation="swish", output_final_state=True)
    for shape in ((2, 6), (1, 2, 6), (2, 1, 6)):
        step = cache.clone()
        y_last, returned = fla.causal_conv1d_update(x32["x"][:, 6].reshape(shape), step,
                                                    x32["residual"][:, 6].reshape(shape), x32["weight"],
                                                    x32["bias"], "swish")
        assert returned is step and y_last.shape == shape
        assert rel(y_last.reshape(2, 6), whole[:, 6]) <= OUT and torch.equal(step, final)


def test_causal_conv1d_bad_inputs():
    x = conv_inputs(2, 5, 6, 4)
    _raises("initial_state", fla.causal_conv1d, **dict(x, initial_state=x["initial_state"][..., 1:]))
    _raises("backend", fla.causal_conv1d, **x, backend="cudnn")
    _raises("cp_context", fla.causal_conv1d, **x, cp_context=object())
    _raises("residual", fla.causal_conv1d, **dict(x, residual=x["residual"][:, :1]))
    _raises("cu_seqlens", fla.causal_conv1d, **dict(x, initial_state=None), cu_seqlens=torch.tensor([0, 5, 10]))
    cache = x["initial_state"].clone()
    _raises("cache", fla.causal_conv1d_update, x["x"][:, 0], cache[..., 1:], weight=x["weight"])
    _raises("x", fla.causal_conv1d_update, x["x"][:, :2], cache, weight=x["weight"])
    assert torch.equal(cache, x["initial_state"])
