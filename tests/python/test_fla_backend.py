"""flat.fla: flat as flash-linear-attention 0.6's CPU backend. FLA's functions (chunk_gated_delta_rule,
chunk_kda through FLA's registry; chunk_gla routed) against FLA's own naive references in float32,
outputs and final states within 1e-5, every input's gradient within 1e-4 by relative L2 (the
bounds of test_compat_fla.py), with flat's functions counted; the verifiers' and the routed names'
decisions (CPU calls taken, other devices and CUDA-only options declined); FLA's layers forward and
backward against the layer with FLA's naive recurrence in its place (FLA's Mamba2: its gated norm
against FLA's norm reference), and their recurrent form (eval, no gradients) against their chunked
one; a tiny fla.models Gated DeltaNet decoding through its cache (against the full forward's
argmax) and training; and a transformers Qwen3.5 giving the same greedy tokens with FLA installed as
without it."""

import functools
import inspect
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("fla")
warnings.filterwarnings("ignore", message="Triton is not supported")

import flat.fla as flat_fla  # noqa: E402
from fla import backends as fla_backends  # noqa: E402
from fla.layers import (GatedDeltaNet, GatedDeltaNet2, GatedLinearAttention, KimiDeltaAttention,  # noqa: E402
                        LinearAttention, Mamba2, MultiScaleRetention)
from fla.layers import gated_deltanet as gdn_layer  # noqa: E402
from fla.layers import gdn2 as gdn2_layer  # noqa: E402
from fla.layers import gla as gla_layer  # noqa: E402
from fla.layers import kda as kda_layer  # noqa: E402
from fla.layers import linear_attn as la_layer  # noqa: E402
from fla.layers import multiscale_retention as retention_layer  # noqa: E402
from fla.modules.norm import layernorm_gated  # noqa: E402
from fla.ops import chunk_gated_delta_rule, chunk_gla, chunk_kda  # noqa: E402
from fla.ops.gated_delta_rule.gate import naive_gdn_gate  # noqa: E402
from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule  # noqa: E402
from fla.ops.gdn2.naive import naive_recurrent_gdn2  # noqa: E402
from fla.ops.linear_attn.naive import naive_recurrent_linear_attn  # noqa: E402
from fla.ops.retention.naive import naive_retention  # noqa: E402
from fla.ops.gla.naive import naive_recurrent_gla  # noqa: E402
from fla.ops.kda.gate import naive_kda_gate  # noqa: E402
from fla.ops.kda.naive import naive_recurrent_kda  # noqa: E402
from torch_fallbacks import GRAD, OUT, rel  # noqa: E402

B, T, H, K, V = 2, 37, 2, 16, 8


def _inputs(HV, per_channel, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    return dict(q=F.normalize(r(B, T, H, K), dim=-1), k=F.normalize(r(B, T, H, K), dim=-1), v=r(B, T, HV, V),
                g=F.logsigmoid(r(B, T, HV, K) + 2) if per_channel else F.logsigmoid(r(B, T, HV) + 2),
                beta=torch.rand(B, T, HV, generator=gen), initial_state=r(B, HV, K, V))


def _run(fn, x):
    """fn on leaf copies of x: output, final state and each input's gradient of a fixed linear
    function of both."""
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, ht = fn(**leaves)
    gen = torch.Generator().manual_seed(7)
    ((o * torch.randn(o.shape, generator=gen)).sum() + (ht * torch.randn(ht.shape, generator=gen)).sum()).backward()
    return o, ht, {n: t.grad for n, t in leaves.items()}


def _counting(monkeypatch, module, name):
    """Counts the calls of module.name (what flat.fla calls) in the returned list."""
    calls, target = [], getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(name)
        return target(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def _assert_close(got, want):
    o, ht, grads = got
    o_ref, ht_ref, grads_ref = want
    assert rel(o, o_ref) < OUT
    assert rel(ht, ht_ref) < OUT
    for name, grad in grads.items():
        assert rel(grad, grads_ref[name]) < GRAD, name


# ---- FLA's functions against FLA's naive references --------------------------------------------


def _gla_inputs(x):
    """FLA's GLA takes no beta: q, k, v, its per-channel gate g and the initial state."""
    return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], initial_state=x["initial_state"])


# (FLA's function, its naive reference, the flat module and name whose call is counted, heads,
# a per-channel gate, the inputs from _inputs' set)
FUNCTIONS = {
    "chunk_gated_delta_rule": (chunk_gated_delta_rule, naive_recurrent_gated_delta_rule, "_compat",
                               "chunk_gated_delta_rule", H, False, dict),
    "chunk_kda": (chunk_kda, naive_recurrent_kda, "_compat", "chunk_kda", 2 * H, True, dict),
    "chunk_gla": (chunk_gla, lambda g, **a: naive_recurrent_gla(gk=g, **a), "_flat", "gla", H, True, _gla_inputs),
}


@pytest.mark.parametrize("function", FUNCTIONS)
def test_fla_function_runs_flat_within_bounds_of_fla_naive(monkeypatch, function):
    fla_function, naive, module, counted, heads, per_channel, inputs = FUNCTIONS[function]
    calls = _counting(monkeypatch, getattr(flat_fla, module), counted)
    x = inputs(_inputs(heads, per_channel=per_channel))
    got = _run(lambda **a: fla_function(**a, output_final_state=True), x)
    want = _run(lambda **a: naive(**a, output_final_state=True), x)
    _assert_close(got, want)
    assert calls == [counted]


# ---- What is served and what is declined -------------------------------------------------------


def _registered(entry):
    """FLA's registry of an operation (by name) or of a dispatched function."""
    registry = (fla_backends._operation_registries[entry] if isinstance(entry, str)
                else fla_backends._function_registries[inspect.unwrap(entry)])
    return registry._backends["flat"]


def test_every_entry_has_the_flat_backend_and_declines_other_devices():
    meta = torch.empty(B, T, H, K, device="meta")
    on_cpu = torch.empty(B, T, H, K)
    for entry, function in [("gated_delta_rule", "chunk_gated_delta_rule"),
                            (flat_fla._fla_chunk_kda, "chunk_kda"),
                            (flat_fla._fla_l2norm.l2norm_fwd, "l2norm_fwd"),
                            (flat_fla._fla_conv.causal_conv1d_fwd, "causal_conv1d_fwd")]:
        backend = _registered(entry)
        accepted, reason = backend.verify(function, meta, meta, meta)
        assert not accepted and "meta" in reason, function
        assert backend.verify(function, on_cpu, on_cpu, on_cpu) == (True, None), function


def test_cuda_only_options_and_layer_norm_are_declined():
    x = torch.empty(B, T, H, K)
    gdn = _registered("gated_delta_rule")
    accepted, reason = gdn.verify("chunk_gated_delta_rule", x, x, x, x, x, cp_context=object())
    assert not accepted and "cp_context" in reason
    kda = _registered(flat_fla._fla_chunk_kda)
    accepted, reason = kda.verify("chunk_kda", x, x, x, x, x, return_intermediate_states=True)
    assert not accepted and "return_intermediate_states" in reason
    norm = _registered(flat_fla._fla_layernorm.layer_norm_fwd)
    w = torch.ones(K)
    assert norm.verify("layer_norm_fwd", x, w, None, is_rms_norm=True) == (True, None)
    accepted, reason = norm.verify("layer_norm_fwd", x, w, None, is_rms_norm=False)
    assert not accepted and "LayerNorm" in reason


def test_routed_names_give_other_devices_to_fla():
    routed = gla_layer.chunk_gla
    assert routed is not flat_fla._fla_chunk_gla and routed.__wrapped__ is flat_fla._fla_chunk_gla
    assert gdn_layer.fused_recurrent_gated_delta_rule.__wrapped__ is flat_fla._fla_recurrent_gdr
    assert kda_layer.fused_recurrent_kda.__wrapped__ is flat_fla._fla_recurrent_kda
    assert not flat_fla.on_cpu(torch.empty(1, device="meta"), torch.empty(1))
    assert flat_fla.on_cpu(torch.empty(1), scale=0.5)


def test_a_routed_name_sends_other_devices_to_fla_and_cpu_to_flat():
    calls = []
    routed = flat_fla._routed(lambda x: calls.append("fla"), lambda x: calls.append("flat"))
    routed(torch.empty(1, device="meta"))
    routed(torch.empty(1))
    assert calls == ["fla", "flat"]


def test_fla_flat_0_turns_the_backend_and_the_routes_off(monkeypatch):
    calls = []
    routed = flat_fla._routed(lambda x: calls.append("fla"), lambda x: calls.append("flat"))
    monkeypatch.setenv("FLA_FLAT", "0")
    routed(torch.empty(1))
    assert calls == ["fla"]
    assert not _registered("gated_delta_rule").is_enabled()
    monkeypatch.setenv("FLA_FLAT", "1")
    assert _registered("gated_delta_rule").is_enabled()


def test_without_fla_the_import_says_what_to_install():
    run = subprocess.run([sys.executable, "-c", "import sys; sys.modules['fla'] = None; import flat.fla"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "flat.fla: expected flash-linear-attention 0.6 installed" in run.stderr


def test_routed_recurrent_gla_names_what_it_does_not_implement():
    x = _inputs(H, per_channel=True)
    with pytest.raises(ValueError, match="gv"):
        gla_layer.fused_recurrent_gla(x["q"], x["k"], x["v"], gk=x["g"], gv=x["v"])
    with pytest.raises(ValueError, match="reverse"):
        gla_layer.fused_recurrent_gla(x["q"], x["k"], x["v"], gk=x["g"], reverse=True)


# ---- FLA's layers ------------------------------------------------------------------------------

HIDDEN = 64


def _naive_gdn(q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
               use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, use_gate_in_kernel=False, A_log=None,
               dt_bias=None, **kwargs):
    """The Gated DeltaNet layer's call by FLA's naive gate and recurrence."""
    assert initial_state is None
    if use_qk_l2norm_in_kernel:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    if use_gate_in_kernel:
        g = naive_gdn_gate(g, A_log, dt_bias)
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * (2 if allow_neg_eigval else 1)
    return naive_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=initial_state,
                                            output_final_state=output_final_state)


def _naive_kda(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
               allow_neg_eigval=False, lower_bound=None, **kwargs):
    """The KDA layer's call (no lower_bound) by FLA's naive gate and recurrence."""
    assert lower_bound is None and initial_state is None
    if use_qk_l2norm_in_kernel:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    if use_gate_in_kernel:
        g = naive_kda_gate(g, A_log, dt_bias)
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * (2 if allow_neg_eigval else 1)
    return naive_recurrent_kda(q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state)


def _naive_gla(q, k, v, g, initial_state=None, output_final_state=False, **kwargs):
    return naive_recurrent_gla(q, k, v, g, initial_state=initial_state, output_final_state=output_final_state)


def _naive_gdn2(q, k, v, g, b, w, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                **kwargs):
    assert initial_state is None
    if use_qk_l2norm_in_kernel:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    return naive_recurrent_gdn2(q, k, v, g, b, w, output_final_state=output_final_state)


def _naive_la(q, k, v, initial_state=None, output_final_state=False, normalize=False, **kwargs):
    return naive_recurrent_linear_attn(q, k, v, initial_state=initial_state, output_final_state=output_final_state,
                                       normalize=normalize)


def _naive_retention(q, k, v, initial_state=None, output_final_state=False, **kwargs):
    """FLA's naive retention ([B, H, T, D], no state): the layer's call without a cache."""
    assert initial_state is None and not output_final_state
    return naive_retention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2), None


LAYERS = {
    "GatedDeltaNet": (lambda: GatedDeltaNet(hidden_size=HIDDEN, head_dim=16, num_heads=4), gdn_layer,
                      "chunk_gated_delta_rule", _naive_gdn),
    "KimiDeltaAttention": (lambda: KimiDeltaAttention(hidden_size=HIDDEN, head_dim=16, num_heads=4), kda_layer,
                           "chunk_kda", _naive_kda),
    "GatedLinearAttention": (lambda: GatedLinearAttention(hidden_size=HIDDEN, num_heads=4, use_short_conv=True),
                             gla_layer, "chunk_gla", _naive_gla),
    "GatedDeltaNet2": (lambda: GatedDeltaNet2(hidden_size=HIDDEN, head_dim=16, num_heads=4), gdn2_layer, "chunk_gdn2",
                       _naive_gdn2),
    "LinearAttention": (lambda: LinearAttention(hidden_size=HIDDEN, num_heads=4), la_layer, "chunk_linear_attn",
                        _naive_la),
    "MultiScaleRetention": (lambda: MultiScaleRetention(hidden_size=HIDDEN, num_heads=4), retention_layer,
                            "chunk_retention", _naive_retention),
}


def _layer_pass(layer, h):
    h = h.clone().requires_grad_()
    o = layer(h)[0]
    o.square().sum().backward()
    return o.detach(), h.grad, {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_forward_and_backward_within_bounds_of_the_layer_on_fla_naive(name, monkeypatch):
    make, module, function, naive = LAYERS[name]
    torch.manual_seed(0)
    layer = make()
    h = torch.randn(2, 23, HIDDEN)
    convs = _counting(monkeypatch, flat_fla._compat, "causal_conv1d")
    norms = _counting(monkeypatch, flat_fla._flat, "rms_norm_gated")
    o, dh, dparams = _layer_pass(layer, h)
    assert norms, norms  # FLA's output norm ran on flat
    assert convs or not getattr(layer, "use_short_conv", False), convs  # and its short convolutions
    with torch.no_grad():  # up to 64 tokens without gradients: the layer's recurrent form
        assert rel(layer.eval()(h)[0], o) < OUT
    layer.train().zero_grad()
    monkeypatch.setattr(module, function, naive)
    o_ref, dh_ref, dparams_ref = _layer_pass(layer, h)
    assert rel(o, o_ref) < OUT
    assert rel(dh, dh_ref) < GRAD
    assert dparams.keys() == dparams_ref.keys()
    for parameter, grad in dparams.items():
        assert rel(grad, dparams_ref[parameter]) < GRAD, parameter


def test_mamba2_layer_runs_its_gated_norm_on_flat(monkeypatch):
    """FLA's Mamba2 takes its fast path only on CUDA; on a CPU its own PyTorch path runs (nn.Conv1d
    and the scan written out), with the gated norm on flat: against the layer with FLA's norm
    reference (rms_norm_ref) in the norm's place."""
    torch.manual_seed(0)
    layer = Mamba2(hidden_size=HIDDEN, num_heads=4, head_dim=32, state_size=16, n_groups=2)
    h = torch.randn(2, 23, HIDDEN)
    norms = _counting(monkeypatch, flat_fla._flat, "rms_norm_gated")
    o, dh, dparams = _layer_pass(layer, h)
    assert norms
    layer.zero_grad()
    monkeypatch.setattr(layernorm_gated, "rmsnorm_fn", functools.partial(layernorm_gated.rms_norm_ref, upcast=True))
    o_ref, dh_ref, dparams_ref = _layer_pass(layer, h)
    assert rel(o, o_ref) < OUT
    assert rel(dh, dh_ref) < GRAD
    assert dparams.keys() == dparams_ref.keys()
    for parameter, grad in dparams.items():
        assert rel(grad, dparams_ref[parameter]) < GRAD, parameter


# ---- fla.models --------------------------------------------------------------------------------


def _gdn_model():
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    torch.manual_seed(0)
    config = GatedDeltaNetConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=16,
                                 expand_v=1, fuse_swiglu=False, fuse_cross_entropy=False)
    return GatedDeltaNetForCausalLM(config)


def test_fla_gated_deltanet_model_decodes_with_its_cache_the_full_forwards_greedy_tokens(monkeypatch):
    """Greedy decoding token by token through the model's cache (recurrent and convolution states,
    fused_recurrent_gated_delta_rule and causal_conv1d_update on flat) against the argmax of a full
    forward over the tokens so far. The loop is written out: FLA 0.6's generate() under transformers
    5.25 passes its cache as ``cache``, which FLA's layers do not read (``past_key_values``), so each
    decode step there starts from an empty state, on any device."""
    model = _gdn_model().eval()
    prompt = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(1))
    recurrent = _counting(monkeypatch, flat_fla._flat, "gated_deltanet")
    updates = _counting(monkeypatch, flat_fla._compat, "causal_conv1d_update")
    got = want = prompt
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        for _ in range(8):
            token = out.logits[:, -1:].argmax(-1)
            got = torch.cat([got, token], dim=1)
            out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
            want = torch.cat([want, model(input_ids=want, use_cache=False).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(got, want)
    assert len(recurrent) >= 2 * (1 + 8)  # the prompt and each decode step, in each of the two layers
    assert len(updates) >= 2 * 8


def test_fla_gated_deltanet_model_trains():
    model = _gdn_model().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(3, 128, (2, 24), generator=torch.Generator().manual_seed(2))
    losses = []
    for _ in range(5):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


# ---- transformers' models with FLA installed ---------------------------------------------------

_QWEN_WITHOUT_FLA = """
import sys, warnings, torch
warnings.filterwarnings("ignore")
sys.modules["fla"] = None  # FLA's import fails: transformers runs as where it is not installed
sys.path.insert(0, sys.argv[1])
import transformers
transformers.logging.set_verbosity_error()
from test_transformers import build, tokens
with torch.no_grad():
    print(build("qwen3_5").generate(input_ids=tokens(1, 11), max_new_tokens=16, do_sample=False).tolist())
"""


def test_transformers_qwen3_5_gives_the_same_greedy_tokens_with_fla_installed_as_without():
    """Here FLA is installed and flat.fla imported; the other side runs in a process where FLA's
    import fails."""
    from test_transformers import build, tokens

    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    with torch.no_grad():
        got = build("qwen3_5").generate(input_ids=tokens(1, 11), max_new_tokens=16, do_sample=False).tolist()
    without = subprocess.run([sys.executable, "-c", _QWEN_WITHOUT_FLA, __file__.rsplit("/", 1)[0]],
                             capture_output=True, text=True, timeout=300)
    assert without.returncode == 0, without.stderr[-2000:]
    assert got == eval(without.stdout)
    assert len(got[0]) == 11 + 16
