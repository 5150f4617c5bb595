"""precision= in flat.torch, flat.jax and the flat.nn layers (docs/algorithm.md, "Precision"):
"fast" against the float64 oracle at the bounds of FLA's own tests, forward and backward, every
variant; "exact" the default, bitwise; an unknown name refused by both bindings; a layer's
precision reaching its recurrence."""

import re

import numpy as np
import pytest
import torch

import flat.nn as fnn
import flat.torch as ft
from flat.nn.ops import KERNELS, Ops
from oracle import NAMES, Problem, expect_close

# FLA's tests/ops/test_delta.py: o and ht 6e-3, dq, dk, dv, dh0 8e-3; its gate and beta gradients 2e-2.
FAST_BOUNDS = {"o": 6e-3, "final_state": 6e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dinitial_state": 8e-3,
               "dg": 2e-2, "dbeta": 2e-2, "db": 2e-2, "dw": 2e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_call(p: Problem, **options):
    q, k, v, g, beta, b, w, h0 = p.inputs()
    dtypes = dict(q=p.dtype, k=p.dtype, v=p.dtype, g=None, beta=p.dtype, b=p.dtype, w=p.dtype, initial_state=None)
    inputs = {name: torch.tensor(x, dtype=DTYPES[dtypes[name]] if dtypes[name] else torch.float32,
                                 requires_grad=True)
              for name, x in zip(dtypes, (q, k, v, g, beta, b, w, h0)) if x is not None}
    if p.variant in ("kda", "gdn2", "sla"):
        options["gate_group"] = p.G
    o, final_state = getattr(ft, p.variant)(**inputs, output_final_state=True, **options)
    return o, final_state, inputs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", NAMES)
def test_fast_matches_the_oracle_at_flas_bounds(variant, dtype):
    shared = {"q": 1, "k": 1, "g": 1, "b": 1} if variant == "sla" else {"q": 1, "k": 1}
    p = Problem(variant, dtype, G=4 if variant == "sla" else None, heads=shared)
    o, final_state, inputs = torch_call(p, precision="fast")
    (y, ht), grads = p.reference()
    expect_close("o", o.float().detach(), y, FAST_BOUNDS["o"])
    expect_close("final_state", final_state.detach(), ht, FAST_BOUNDS["final_state"])
    torch.autograd.backward([o, final_state], [torch.tensor(p.dy, dtype=o.dtype), torch.tensor(p.dht)])
    for name, want in zip(["q", "k", "v", "g", "beta", "b", "w", "initial_state"], grads):
        if want is not None:
            expect_close("d" + name, inputs[name].grad.float(), want, FAST_BOUNDS["d" + name])


def test_exact_is_the_default_bitwise():
    p = Problem("gated_deltanet", "bfloat16")
    default, default_state, _ = torch_call(p)
    exact, exact_state, _ = torch_call(p, precision="exact")
    assert torch.equal(default, exact) and torch.equal(default_state, exact_state)


def test_unknown_precision_names_are_refused_by_both_bindings():
    message = re.escape("flat: precision: expected exact or fast, got 'high'")
    p = Problem("gla", "float32")
    with pytest.raises(ValueError, match=message):
        torch_call(p, precision="high")
    jax = pytest.importorskip("jax")
    fj = pytest.importorskip("flat.jax")
    q, k, v, g, _, _, _, _ = p.inputs()
    with pytest.raises(Exception, match=message):
        fj.gla(*(jax.numpy.asarray(x, jax.numpy.float32) for x in (q, k, v, g)), precision="high")[0].block_until_ready()


def test_jax_fast_is_torchs_bitwise():
    jax = pytest.importorskip("jax")
    fj = pytest.importorskip("flat.jax")
    p = Problem("kda", "bfloat16")
    o, final_state, _ = torch_call(p, precision="fast")
    q, k, v, g, beta, _, _, h0 = p.inputs()
    jnp = jax.numpy
    o_jax, final_jax = fj.kda(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), jnp.asarray(g, jnp.float32),
                              jnp.asarray(beta, jnp.bfloat16), initial_state=jnp.asarray(h0, jnp.float32),
                              output_final_state=True, gate_group=p.G, precision="fast")
    assert np.array_equal(np.asarray(o_jax.astype(jnp.float32)), o.detach().float().numpy())
    assert np.array_equal(np.asarray(final_jax), final_state.detach().numpy())


def test_a_layers_precision_reaches_its_recurrence():
    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs["precision"])
        return KERNELS.recurrence(*args, **kwargs)

    ops = Ops(recurrence=recording, conv=KERNELS.conv, norm=KERNELS.norm)
    x = torch.randn(1, 20, 64)
    for precision in ("exact", "fast"):
        layer = fnn.GatedDeltaNet(hidden_size=64, head_dim=16, num_heads=4, ops=ops, precision=precision)
        layer(x)
    assert seen == ["exact", "fast"]
    with pytest.raises(ValueError, match="precision: expected 'exact' or 'fast', got 'high'"):
        fnn.GatedDeltaNet(hidden_size=64, head_dim=16, num_heads=4, precision="high")
