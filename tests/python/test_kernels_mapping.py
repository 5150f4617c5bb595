"""flat.kernels: flat's functions in the kernels library's mapping for "cpu". On tiny Qwen3.5, Kimi
Linear and Mamba2 models (test_transformers.py's configs), ``kernelize(model, device="cpu")`` in
inference mode gives transformers' own path's float32 prefill logits (relative L2 within 1e-5) and
greedy tokens, with flat's kernels counted in prefill and in each decode step, and in training mode
the same loss and gradients (within 1e-4, test_transformers.py's bounds; Qwen3.5's against the model
in float64, _reference_loss_and_gradients); ``from_pretrained(..., use_kernels=True)`` runs flat
too."""

import copy
import functools
import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers")
kernels = pytest.importorskip("kernels")

import flat.kernels  # noqa: E402
import flat.torch  # noqa: E402
from flat.nn.ops import reference_recurrence  # noqa: E402
from test_transformers import FP32, build, relative, tokens  # noqa: E402
from torch_fallbacks import GRAD  # noqa: E402



@pytest.fixture(scope="module", autouse=True)
def flat_mapping():
    """flat's entries in the kernels library's mapping for this module's tests only."""
    with kernels.use_kernel_mapping(flat.kernels.mapping()):
        yield


# family -> the flat.torch functions its layers reach through the mapped names, and whether its
# one-token recurrence reaches flat.torch (Mamba-2's selective_state_update is flat.compat.mamba_ssm's
# own arithmetic, so there only the convolution is counted in each decode step).
KERNELS = {"qwen3_5": ("gated_deltanet", "conv", True), "kimi_linear": ("kda", "conv", True),
           "mamba2": ("mamba2", "conv", False)}
# the families whose gated RMS norm (RMSNormGated) is served.
GATED_NORM = ("qwen3_5", "kimi_linear")


@pytest.fixture
def counts(monkeypatch):
    """Calls of each flat.torch function flat.compat reaches, by name."""
    counted = {}
    for name in ("gated_deltanet", "kda", "mamba2", "conv", "rms_norm_gated"):
        target = getattr(flat.torch, name)

        @functools.wraps(target)
        def spy(*args, _name=name, _target=target, **kwargs):
            counted[_name] = counted.get(_name, 0) + 1
            return _target(*args, **kwargs)

        monkeypatch.setattr(flat.torch, name, spy)
    return counted


def test_the_mapping_has_every_name_for_cpu_in_both_modes():
    mapping = flat.kernels.mapping()
    assert set(mapping) == {*flat.kernels.NAMES, "RMSNormGated"}
    for devices in mapping.values():
        assert set(devices) == {"cpu"}
        assert set(devices["cpu"]) == {kernels.Mode.INFERENCE, kernels.Mode.TRAINING}


def test_register_adds_the_mapping_process_wide_for_kernelize(counts):
    with kernels.use_kernel_mapping({}, inherit_mapping=False):  # an empty mapping, the previous one back after
        flat.kernels.register()
        model = kernels.kernelize(build("qwen3_5"), device="cpu", mode=kernels.Mode.INFERENCE)
    with torch.no_grad():
        model(input_ids=tokens(1, 5))
    assert counts.get("gated_deltanet", 0) == 2, counts  # the model's two Gated DeltaNet layers


@pytest.mark.parametrize("family", list(KERNELS))
def test_kernelize_inference_gives_transformers_logits_and_greedy_tokens_on_flat(family, counts):
    model = build(family)
    ids = tokens(1, 11)
    with torch.no_grad():
        want = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
        want_logits = model(input_ids=ids).logits
    assert not counts
    model = kernels.kernelize(model, device="cpu", mode=kernels.Mode.INFERENCE)
    with torch.no_grad():
        assert relative(model(input_ids=ids).logits, want_logits) <= FP32  # prefill, float32
        got = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, want)
    recurrence, conv, decoded = KERNELS[family]
    assert counts.get(recurrence, 0) >= (1 + 7 if decoded else 1), counts  # the prompt, then each decode step
    assert counts.get(conv, 0) >= 1 + 7, counts
    if family in GATED_NORM:
        assert counts.get("rms_norm_gated", 0) >= 1 + 7, counts


def _loss_and_gradients(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _gated_delta_rule_float64(query, key, value, g, beta, initial_state=None, output_final_state=False,
                              use_qk_l2norm_in_kernel=False, cu_seqlens=None, **_):
    """transformers' ``torch_chunk_gated_delta_rule`` token by token in its inputs' dtype: flat.nn's
    plain-PyTorch reference recurrence (the same heads sharing, L2 norm and K^-1/2 scale)."""
    assert cu_seqlens is None, "one sequence a row only"
    return reference_recurrence("gated_deltanet", query, key, value, g, beta, initial_state=initial_state,
                                output_final_state=output_final_state,
                                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


def _reference_loss_and_gradients(family, model, ids):
    """What kernelized training is held to: transformers' own path in float32; for Qwen3.5, the model
    in float64 with its chunked Gated DeltaNet function run token by token in float64. That function
    (torch_chunk_gated_delta_rule) computes in float32 whatever its inputs' dtype, on exponentials of
    differences of the gates' running sums, and under the tiny model's strong gates (g down to -16 a
    token) it loses digits: against this reference its gate parameters' gradients (A_log, dt_bias,
    in_proj_a) are 5.8e-4 off, flat's 7.8e-7, and at the function's boundary its dg is 2.1e-4 off the
    float64 recurrence's, flat's 1.2e-7 (Zen 3, 2026-12-06)."""
    if family != "qwen3_5":
        return _loss_and_gradients(model, ids)
    modeling = importlib.import_module(type(model).__module__)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling, "torch_chunk_gated_delta_rule", _gated_delta_rule_float64)
        return _loss_and_gradients(copy.deepcopy(model).double(), ids)


@pytest.mark.parametrize("family", list(KERNELS))
def test_kernelize_training_gives_the_models_loss_and_gradients_on_flat(family, counts):
    model = build(family).train()
    ids = tokens(2, 19)
    loss0, grads0 = _reference_loss_and_gradients(family, model, ids)
    kernelized = kernels.kernelize(copy.deepcopy(model), device="cpu", mode=kernels.Mode.TRAINING)
    loss1, grads1 = _loss_and_gradients(kernelized, ids)
    assert relative(loss1, loss0) <= GRAD
    assert grads1.keys() == grads0.keys()
    bad = {n: relative(grads1[n], grads0[n]) for n in grads0 if relative(grads1[n], grads0[n]) > GRAD}
    assert not bad
    assert counts.get(KERNELS[family][0], 0) >= 1, counts


def test_from_pretrained_with_use_kernels_runs_flat(tmp_path, counts):
    """from_pretrained's use_kernels kernelizes the model it loads with the kernels library's mapping,
    flat's entries included."""
    model = build("qwen3_5")
    model.save_pretrained(tmp_path)
    ids = tokens(1, 11)
    with torch.no_grad():
        want = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, use_kernels=True).eval()
    loaded.generation_config.eos_token_id = None
    with torch.no_grad():
        got = loaded.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want)
    assert counts.get("gated_deltanet", 0) >= 1 + 3, counts
