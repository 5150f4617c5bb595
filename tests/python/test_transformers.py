"""flat.transformers: Hugging Face transformers' linear-attention models with flat.transformers.enable()
against the same model after disable() (transformers' own PyTorch path), in one process, per family,
on tiny randomly initialised configs built here (nothing downloaded): prefill logits in float32
and bfloat16, greedy generation (one prompt, and two of different lengths left-padded), a training
step's loss and gradients, packed sequences (cu_seq_lens_q / seq_idx, which transformers' PyTorch
path cannot keep apart), bad packing arguments refused by name, and the Mamba-2 mixers' training
and eval mode computing one function. Also the machinery: the table against the installed
transformers, idempotence, the dispatcher's routing and keyword handling, and each replacement
taking the replaced function's signature."""

import contextlib
import copy
import importlib
import inspect
import re
import subprocess
import sys
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flat.transformers as flat_tf  # noqa: E402
from flat.transformers import FAMILIES  # noqa: E402
from flat.transformers._dispatch import Unservable, _Binding, dispatcher  # noqa: E402
from torch_fallbacks import plain  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB = 128


def _attention(**kw):
    return dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, **kw)


# family -> (config class, model class, config): a few layers, the linear-attention (or
# convolution, or Mamba-2) layer mixed with attention where the family does.
CONFIGS = {
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(
        _attention(), intermediate_size=96, num_hidden_layers=3, head_dim=32, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "full_attention", "linear_attention"])),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", dict(
        _attention(), num_hidden_layers=2, head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        layer_types=["linear_attention", "full_attention"])),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
        _attention(), intermediate_size=96, num_hidden_layers=2, head_dim=32, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        layer_types=["linear_attention", "full_attention"])),
    "olmo_hybrid": ("OlmoHybridConfig", "OlmoHybridForCausalLM", dict(
        _attention(), intermediate_size=96, num_hidden_layers=2, linear_key_head_dim=16,
        linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2, pad_token_id=0,
        eos_token_id=1, layer_types=["linear_attention", "full_attention"])),
    "kimi_linear": ("KimiLinearConfig", "KimiLinearForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=16, num_experts=4, num_experts_per_token=2, linear_num_heads=2, linear_head_dim=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, mlp_layer_types=["dense", "sparse"],
        layer_types=["linear_attention", "full_attention"])),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16,
        n_groups=2, expand=2, chunk_size=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", dict(
        _attention(), layers_block_type=["linear_attention", "full_attention", "mlp"], head_dim=32,
        intermediate_size=96, ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
        chunk_size=16)),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", dict(
        _attention(), intermediate_size=32, shared_intermediate_size=64, num_local_experts=4,
        num_experts_per_tok=2, num_hidden_layers=2, layer_types=["mamba", "attention"], mamba_n_heads=8,
        mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=16)),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM", dict(
        _attention(), intermediate_size=96, num_hidden_layers=2, mamba_d_ssm=128, mamba_n_heads=8,
        mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=16)),
    "bamba": ("BambaConfig", "BambaForCausalLM", dict(
        _attention(), intermediate_size=96, num_hidden_layers=2, attn_layer_indices=[1], mamba_n_heads=8,
        mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_chunk_size=16)),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        _attention(), intermediate_size=96, num_hidden_layers=3, block_auto_adjust_ff_dim=False,
        layer_types=["conv", "full_attention", "conv"])),
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", dict(
        _attention(), intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        num_hidden_layers=2, num_dense_layers=1, layer_types=["conv", "full_attention"])),
}

# Families whose layers run sequences through mamba_ssm's functions (seq_idx is their packing).
MAMBA = {"mamba2", "nemotron_h", "granitemoehybrid", "falcon_h1", "bamba"}

# What each path reaches (of a family's functions): prefill, each decoded token, a training step.
PREFILL = {"causal_conv1d_fn", "torch_chunk_gated_delta_rule", "chunk_kimi_delta_attention", "mamba2_chunk_scan"}
DECODE = {"causal_conv1d_update", "torch_recurrent_gated_delta_rule", "recurrent_kimi_delta_attention",
          "mamba2_selective_state_update"}
TRAINING = {"causal_conv1d_fn", "torch_chunk_gated_delta_rule", "chunk_kimi_delta_attention",
            "mamba2_split_conv1d_scan_combined"}  # the Mamba-2 mixers' fused call, which flat serves


def reached(family, counts, names, at_least=1):
    for name in names & set(FAMILIES[family]["functions"]):
        if family in MAMBA and name == "causal_conv1d_fn" and names is TRAINING:
            continue  # inside the fused call
        assert counts.get(name, 0) >= at_least, (name, counts)


# The delta-rule families' chunked PyTorch function and its token-by-token twin.
STEPWISE = {"torch_chunk_gated_delta_rule": "torch_recurrent_gated_delta_rule",
            "chunk_kimi_delta_attention": "recurrent_kimi_delta_attention"}

FP32 = 1e-5  # prefill logits, float32, relative L2
GRAD = 1e-4  # a training step's loss and gradients, float32, relative L2
# bfloat16 and float16: flat's logits no further from the float32 model's than transformers' are,
# up to this fraction of that distance. Both paths share every other bfloat16 operation, which makes
# nearly all of it; where the two round differently (flat's convolution rounds once after its
# activation, transformers' twice; mamba_ssm's scan returns x's dtype, transformers' fallback
# float32) the model-level difference is noise of either sign, up to 1.6% in these configs.
HALF_NOISE = 0.03


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny matrices: torch's intra-op threads only spin (tens of ms a linear on shared cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    flat_tf.disable()


@contextlib.contextmanager
def path(flat: bool, counts=None, stepwise=None):
    """Run on flat (enable()) or on transformers' own path (disable()). With `counts` (a dict),
    count there the calls that reached flat.compat, per module global. With `stepwise` (a family),
    transformers' path runs the delta rule token by token (its recurrent function) where it would
    run it chunked."""
    flat_tf.disable()
    restore = {}
    if stepwise is not None and not flat:
        module = importlib.import_module(FAMILIES[stepwise]["module"])
        for chunked, recurrent in STEPWISE.items():
            if hasattr(module, chunked):
                restore[chunked] = getattr(module, chunked)
                setattr(module, chunked, _stepwise(plain(getattr(module, recurrent))))
    if flat:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            flat_tf.enable()
        if counts is not None:
            _spy(counts)
    try:
        yield
    finally:
        flat_tf.disable()
        for name, fn in restore.items():
            setattr(module, name, fn)


def _stepwise(recurrent):
    def chunked(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, **kwargs):
        return recurrent(query, key, value, g=g, beta=beta, initial_state=initial_state,
                         output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    return chunked


def _counting(counts, name, target, layer=False):
    def spy(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        if layer:
            counts["layer:" + name] = counts.get("layer:" + name, 0) + 1
        return target(*args, **kwargs)

    return spy


def _spy(counts):
    """Counts, per module global, the calls that reach flat: through the function-level dispatchers,
    and through a layer-level forward's kernels (keyed by the globals they stand in for, and also
    as "layer:<global>")."""
    for spec in FAMILIES.values():
        module = importlib.import_module(spec["module"])
        for name in spec["functions"]:
            fn = getattr(module, name)
            if hasattr(fn, "flat_target"):
                fn.flat_target = _counting(counts, name, fn.flat_target)
        for class_name in spec.get("layers", {}):
            kernels = getattr(getattr(module, class_name).forward, "flat_kernels", {})
            for name, kernel in kernels.items():
                kernels[name] = _counting(counts, name, kernel, layer=True)


def build(family, dtype=torch.float32, **changes):
    config_class, model_class, config = CONFIGS[family]
    config = {**config, **changes}
    if not hasattr(transformers, config_class):
        pytest.skip(f"this transformers ({transformers.__version__}) has no {config_class}")
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    model.generation_config.eos_token_id = None  # generate all 32 tokens
    model.generation_config.pad_token_id = 0
    return model.to(dtype).eval()


def relative(got, want):
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / max(want.norm(), 1e-30))


def tokens(*shape, seed=1):
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def logits(model, flat, ids, counts=None, **kwargs):
    with path(flat, counts), torch.no_grad():
        return model(input_ids=ids, **kwargs).logits


# ---- The machinery ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_listed_global_is_in_the_installed_transformers(family):
    """The table names module globals of transformers 5.24 and 5.25; a rename fails here, not
    silently. Each is transformers' kernel fallback: its torch function wrapped (5.24), or that
    wrapper made a module of the kernels library's, named for hub kernels (5.25)."""
    spec = FAMILIES[family]
    module = importlib.import_module(spec["module"])
    for name in spec["functions"]:
        fn = getattr(module, name, None)
        assert callable(fn), f"{spec['module']} has no function {name}"
        fallback = hasattr(fn, "__wrapped__") or getattr(fn, "kernel_layer_name", None) is not None
        assert fallback, f"{spec['module']}.{name} is not transformers' kernel fallback wrapper"
        assert plain(fn) is not fn and not hasattr(plain(fn), "__wrapped__")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_listed_compat_function_is_there(family):
    for name, (module, function) in FAMILIES[family]["functions"].items():
        assert callable(getattr(importlib.import_module(module), function, None)), f"{module}.{function} ({name})"


def test_enable_is_idempotent_and_disable_restores_the_originals():
    before = {(f, n): getattr(importlib.import_module(s["module"]), n)
              for f, s in FAMILIES.items() for n in s["functions"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        model = build("qwen3_5")
        assert flat_tf.enable(model) is model
        first = {k: getattr(importlib.import_module(FAMILIES[k[0]]["module"]), k[1]) for k in before}
        flat_tf.enable()
    second = {k: getattr(importlib.import_module(FAMILIES[k[0]]["module"]), k[1]) for k in before}
    assert first == second  # the same dispatchers, not dispatchers of dispatchers
    assert flat_tf.is_enabled()
    assert any(first[k] is not before[k] for k in before)
    for k, fn in first.items():
        if fn is not before[k]:
            assert fn.flat_original is before[k]
    flat_tf.disable()
    flat_tf.disable()
    after = {k: getattr(importlib.import_module(FAMILIES[k[0]]["module"]), k[1]) for k in before}
    assert after == before and not flat_tf.is_enabled()


def test_a_module_imported_after_enable_is_swapped_as_it_is_imported():
    """enable() imports no modeling module; one imported later, while enabled, is swapped then."""
    code = (
        "import sys, flat.transformers as ft\n"
        "ft.enable()\n"
        "assert not any(m.startswith('transformers.models.') for m in sys.modules), 'imported'\n"
        "from transformers import Lfm2ForCausalLM\n"
        "import transformers.models.lfm2.modeling_lfm2 as m\n"
        "assert m.causal_conv1d_fn.flat_original is not None\n"
        "assert list(ft.swapped()) == ['transformers.models.lfm2.modeling_lfm2'], ft.swapped()\n"
        "ft.disable()\n"
        "import transformers.models.bamba.modeling_bamba as b\n"
        "assert not hasattr(b.causal_conv1d_fn, 'flat_original')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_enable_checks_its_model_argument():
    with pytest.raises(TypeError, match="model"):
        flat_tf.enable("not a model")
    assert not flat_tf.is_enabled()
    with pytest.warns(RuntimeWarning, match="no layer of a family"):
        flat_tf.enable(torch.nn.Linear(2, 2))
    flat_tf.disable()


def _original(query, y=None, scale=0.5, **kwargs):
    return ("original", query.device.type, y, scale, kwargs)


def _probe(q, y=None, scale=None, *, chunk_size=64, cu_seqlens=None):
    return ("probe", q.device.type, y, scale, chunk_size, cu_seqlens)


def test_dispatcher_routes_by_device_and_filters_keywords():
    dispatch = dispatcher(_original, _probe, "chunk_gated_delta_rule", "probe")
    assert dispatch.__wrapped__ is _original
    meta = torch.empty(1, 5, 2, 3, device="meta")  # not a CPU tensor: the original, every argument as given
    kwargs = dict(chunk_size=32, cu_seq_lens_k=None, output_attentions=False)
    assert dispatch(meta, 1, **kwargs) == ("original", "meta", 1, 0.5, kwargs)
    cpu = torch.zeros(1, 5, 2, 3)
    # The original's arguments by its names and positions, defaults included, under the target's
    # names (query is FLA's q); keywords the target does not take are dropped, transformers' own
    # kwargs among them, and what its **kwargs caught reaches the target where it takes it.
    assert dispatch(cpu, 1, max_length_q=5, position_ids=None) == ("probe", "cpu", 1, 0.5, 64, None)
    assert dispatch(query=cpu, y=1, scale=2.0, chunk_size=32) == ("probe", "cpu", 1, 2.0, 32, None)
    with pytest.raises(TypeError):
        dispatch(cpu, 1, 2.0, 3)  # one positional argument more than the original takes
    # The packed sequences reach it: cu_seqlens as given, transformers' cu_seq_lens_q, or mamba_ssm's seq_idx.
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    assert dispatch(cpu, cu_seqlens=cu)[5] is cu
    assert dispatch(cpu, cu_seq_lens_q=cu)[5] is cu
    assert dispatch(cpu, seq_idx=torch.tensor([[0, 0, 1, 1, 1]], dtype=torch.int32))[5].tolist() == [0, 2, 5]


def _binding_subject(a, b=2, /, c=3, *, d, e=5, **rest):
    return None


@pytest.mark.parametrize("args, kwargs", [
    ((1,), dict(d=4)), ((1, 2, 3), dict(d=4, e=6)), ((1,), dict(c=7, d=4, z=9)), ((1,), dict(d=4, rest=8)),
    ((), dict(d=4)), ((1, 2, 3, 4), dict(d=4)), ((1,), dict(c=3)), ((1, 2), dict(b=5, d=4)), ((1, 2, 3), dict(c=1, d=4)),
])
def test_dispatchers_binding_is_signature_bind(args, kwargs):
    """The dispatcher's own binding (a call bound once per signature walk, not per call) gives
    Signature.bind's arguments with defaults, the **kwargs catching what has no name (a
    positional-only name given by keyword among them), and its errors for what does not bind."""
    signature = inspect.signature(_binding_subject)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        with pytest.raises(TypeError, match=re.escape(str(e))):
            _Binding(signature)(args, kwargs)
        return
    bound.apply_defaults()
    assert _Binding(signature)(args, kwargs) == dict(bound.arguments)


def test_dispatcher_refuses_an_original_it_cannot_serve():
    """An original whose arguments have no names (*args), or one naming an argument the target
    does not take, is not replaced: enable() leaves it with a warning, never drops the argument."""
    with pytest.raises(Unservable, match=r"\*args"):
        dispatcher(lambda *args, **kwargs: None, _probe, "chunk_gated_delta_rule", "probe")
    with pytest.raises(Unservable, match="takes no gate"):
        dispatcher(lambda query, gate=None: None, _probe, "chunk_gated_delta_rule", "probe")


def _conv_original(hidden_states, weight, bias=None, activation=None, **kwargs):
    return None


def _conv_probe(x, weight, bias=None, seq_idx=None, activation=None):
    return seq_idx


def test_dispatcher_gives_seq_idx_to_functions_taking_it():
    dispatch = dispatcher(_conv_original, _conv_probe, "causal_conv1d_fn", "probe")
    x, w = torch.zeros(1, 3, 5), torch.zeros(3, 4)
    assert dispatch(x, w, cu_seq_lens_q=torch.tensor([0, 2, 5])).tolist() == [[0, 0, 1, 1, 1]]
    seq_idx = torch.tensor([[4, 4, 4, 7, 7]], dtype=torch.int32)
    assert dispatch(x, w, seq_idx=seq_idx) is seq_idx


@pytest.mark.parametrize("bad, match", [
    (dict(cu_seq_lens_q=torch.tensor([0, 3, 2, 5])), "cu_seq_lens_q: expected non-decreasing offsets"),
    (dict(cu_seq_lens_q=torch.tensor([0, 2, 4])), "cu_seq_lens_q: expected non-decreasing offsets from 0 to the 5"),
    (dict(cu_seq_lens_q=torch.tensor([1, 5])), "cu_seq_lens_q"),
    (dict(cu_seqlens=torch.tensor([[0, 5]])), "cu_seqlens: expected a 1-D int32 or int64"),
    (dict(cu_seqlens=torch.tensor([0.0, 5.0])), "cu_seqlens: expected a 1-D int32 or int64"),
    (dict(seq_idx=torch.zeros(1, 4, dtype=torch.int32)), r"seq_idx: expected shape \[1, 5\]"),
])
def test_dispatcher_refuses_bad_packing_by_name(bad, match):
    dispatch = dispatcher(_original, _probe, "chunk_gated_delta_rule", "probe")
    with pytest.raises(ValueError, match=match):
        dispatch(torch.zeros(1, 5, 2, 3), **bad)


def test_dispatcher_refuses_packing_for_a_batch_of_rows():
    dispatch = dispatcher(_original, _probe, "chunk_gated_delta_rule", "probe")
    with pytest.raises(ValueError, match="cu_seq_lens_q: packed sequences lie along one batch row"):
        dispatch(torch.zeros(2, 5, 2, 3), cu_seq_lens_q=torch.tensor([0, 5]))


def _randn(g, *shape):
    return torch.randn(*shape, generator=g)


def _delta_rule_call(g, chunked, per_channel):
    """Every argument of transformers' chunked (chunk_size 4) or recurrent delta rule, positionally:
    q, k, v, the log-gate (per channel for KDA), beta, a state, output_final_state and the in-kernel
    L2 norm on."""
    B, T, H, K, V = 1, 7, 2, 8, 8
    q, k, v = _randn(g, B, T, H, K), _randn(g, B, T, H, K), _randn(g, B, T, H, V)
    gate = torch.nn.functional.logsigmoid(_randn(g, B, T, H, *((K,) if per_channel else ())))
    beta = torch.sigmoid(_randn(g, B, T, H))
    return (q, k, v, gate, beta, *((4,) if chunked else ()), _randn(g, B, H, K, V), True, True)


def _mamba_inputs(g, B=2, T=7, H=4, P=3, G=2, N=5):
    x, dt = _randn(g, B, T, H, P), _randn(g, B, T, H)
    return x, dt, -torch.rand(H, generator=g) - 0.5, _randn(g, B, T, G, N), _randn(g, B, T, G, N)


def _split_call(g, B=2, T=7, H=4, P=3, G=2, N=5, W=4):
    dim, channels = H * P, H * P + 2 * G * N
    return (_randn(g, B, T, 2 * dim + 2 * G * N + H), _randn(g, channels, W) / 2, _randn(g, channels),
            _randn(g, H), -torch.rand(H, generator=g) - 0.5, _randn(g, H), 16, _randn(g, B, H, P, N), (0.1, 1.0),
            True, "swish", 1 + _randn(g, dim) / 4, 1e-5, _randn(g, 8, dim), _randn(g, 8), P, G, False)


# Each of transformers' kernel functions called with every argument its signature names, given
# positionally, none at its default: (arguments, the positions of those it updates in place).
POSITIONAL = {
    "torch_chunk_gated_delta_rule": lambda g: (_delta_rule_call(g, True, False), ()),
    "torch_recurrent_gated_delta_rule": lambda g: (_delta_rule_call(g, False, False), ()),
    "chunk_kimi_delta_attention": lambda g: (_delta_rule_call(g, True, True), ()),
    "recurrent_kimi_delta_attention": lambda g: (_delta_rule_call(g, False, True), ()),
    "causal_conv1d_fn": lambda g: ((_randn(g, 2, 6, 7), _randn(g, 6, 4), _randn(g, 6), "silu"), ()),
    "causal_conv1d_update": lambda g: ((_randn(g, 2, 6, 1), _randn(g, 2, 6, 4), _randn(g, 6, 4), _randn(g, 6),
                                        "silu"), (1,)),
    # state [B, H, P, N], x, dt [B, H, P], A [H, P, N], B, C [B, G, N], D, dt_bias [H, P], dt_softplus, z
    "mamba2_selective_state_update": lambda g: ((_randn(g, 2, 4, 3, 5), _randn(g, 2, 4, 3), _randn(g, 2, 4, 3),
                                                 -torch.rand(4, 3, 5, generator=g) - 0.5, _randn(g, 2, 2, 5),
                                                 _randn(g, 2, 2, 5), _randn(g, 4, 3), _randn(g, 4, 3), True,
                                                 _randn(g, 2, 4, 3)), (0,)),
    # x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_softplus, dt_limit, return_final_states
    "mamba2_chunk_scan": lambda g: ((*_mamba_inputs(g), 4, _randn(g, 4), _randn(g, 4), _randn(g, 2, 4, 3, 5),
                                     True, (0.1, 1.0), True), ()),
    "mamba2_split_conv1d_scan_combined": lambda g: (_split_call(g), ()),
}


def _assert_same(got, want, what):
    got, want = (list(r) if isinstance(r, tuple) else [r] for r in (got, want))
    assert len(got) == len(want), what
    for a, b in zip(got, want):
        assert (a is None) == (b is None), what
        if a is not None:
            assert a.shape == b.shape and relative(a, b) <= FP32, (what, relative(a, b))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_replaced_function_takes_the_replaced_ones_signature(family):
    """Each replacement has the signature of the function it replaces (positional order, names,
    defaults), as inspect reads it; called with every argument positionally it computes what the
    original computes (a state updated in place too), and it refuses a call the original refuses.
    transformers' mamba2_split_conv1d_scan_combined has no torch path (it returns None, and the
    mixer takes its unfused path): there the positional call is held to mamba_ssm's function,
    whose names transformers' signature takes, called by those names."""
    module = importlib.import_module(FAMILIES[family]["module"])
    calls = {}
    for name in FAMILIES[family]["functions"]:
        args, updated = POSITIONAL[name](torch.Generator().manual_seed(3))
        copies = [[a.clone() if i in updated else a for i, a in enumerate(args)] for _ in range(2)]
        signature = inspect.signature(plain(getattr(module, name)))
        assert len(args) == sum(p.kind is not p.VAR_KEYWORD for p in signature.parameters.values()), name
        if name == "mamba2_split_conv1d_scan_combined":
            from flat.compat.mamba_ssm import mamba_split_conv1d_scan_combined as by_name
            want = by_name(**dict(zip(signature.parameters, copies[0])))
        else:
            with path(False), torch.no_grad():
                want = getattr(module, name)(*copies[0])
        calls[name] = (signature, args, updated, copies, want)
    with path(True), torch.no_grad():
        for name, (signature, args, updated, copies, want) in calls.items():
            replacement = getattr(module, name)
            assert hasattr(replacement, "flat_original") and inspect.signature(replacement) == signature, name
            _assert_same(replacement(*copies[1]), want, name)
            for i in updated:
                _assert_same(copies[1][i], copies[0][i], f"{name}: argument {i}, updated in place")
            with pytest.raises(TypeError):
                replacement(*args, None)  # one positional argument more than the original takes


# ---- The families -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(CONFIGS))
def test_prefill_float32(family):
    model = build(family)
    ids = tokens(2, 72)  # two chunks of 64 for the delta rules, five of 16 for Mamba-2
    want = logits(model, False, ids)
    counts = {}
    got = logits(model, True, ids, counts)
    reached(family, counts, PREFILL)
    assert relative(got, want) <= FP32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_prefill_half_precision(family, dtype):
    """flat's bf16 (and fp16) logits are no further from the fp32 model's than transformers' are.
    flat's kernels take float32 and bfloat16; flat.compat runs float16 inputs in float32, as a
    float16 model's other layers run in float16."""
    model = build(family)
    ids = tokens(2, 72)
    want = logits(model, False, ids)
    half = copy.deepcopy(model).to(dtype)
    torch_error = relative(logits(half, False, ids), want)
    flat_error = relative(logits(half, True, ids), want)
    assert flat_error <= torch_error * (1 + HALF_NOISE), (flat_error, torch_error)


def _generate(model, flat, ids, attention_mask=None, counts=None):
    with path(flat, counts), torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=attention_mask, max_new_tokens=32, do_sample=False)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_greedy_generation(family):
    model = build(family)
    ids = tokens(1, 11)
    want = _generate(model, False, ids)
    counts = {}
    got = _generate(model, True, ids, counts=counts)
    assert got.shape == (1, 11 + 32)
    assert torch.equal(got, want)
    reached(family, counts, PREFILL)
    reached(family, counts, DECODE, at_least=31)  # decoding went through flat, token by token


@pytest.mark.parametrize("family", list(CONFIGS))
def test_greedy_generation_left_padded_batch(family):
    model = build(family)
    long, short = tokens(1, 12, seed=2), tokens(1, 7, seed=3)
    ids = torch.cat([long, torch.cat([torch.zeros(1, 5, dtype=torch.long), short], 1)])
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    want = _generate(model, False, ids, mask)
    got = _generate(model, True, ids, mask)
    assert got.shape == (2, 12 + 32)
    assert torch.equal(got, want)


def _training_step(model, flat, ids, use_cache, counts=None, stepwise=None):
    model.zero_grad(set_to_none=True)
    model.train()
    with path(flat, counts, stepwise):
        loss = model(input_ids=ids, labels=ids, use_cache=use_cache).loss
        loss.backward()
    model.eval()
    grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    return loss.detach(), grads


# The hybrid Mamba-2 models keep use_cache's default (True) in training, and with a cache their
# mixers take the unfused path; without one (use_cache=False, as training setups pass it) the fused
# call. Mamba2Model turns the cache off in training itself.
TRAINING_CACHES = [(f, False) for f in CONFIGS] + [(f, None) for f in sorted(MAMBA - {"mamba2"})]


@pytest.mark.parametrize("family, use_cache", TRAINING_CACHES)
def test_training_step(family, use_cache):
    """Loss and every parameter's gradient. The reference is transformers' path with the delta rule
    run token by token: its chunked function loses up to 1e-3 of the gate's gradient in float32
    under the gates A_log's initialisation draws (near -17 a token; the exponentials of their sums
    over a chunk), which its token-by-token function and flat keep to 1e-6."""
    model = build(family)
    ids = tokens(2, 72)
    loss0, grads0 = _training_step(model, False, ids, use_cache, stepwise=family)
    counts = {}
    loss1, grads1 = _training_step(model, True, ids, use_cache, counts)
    reached(family, counts, TRAINING if use_cache is False else PREFILL)
    assert relative(loss1, loss0) <= GRAD
    assert grads1.keys() == grads0.keys()
    bad = {n: relative(grads1[n], grads0[n]) for n in grads0 if relative(grads1[n], grads0[n]) > GRAD}
    assert not bad


# The Mamba-2 mixers with their gated norm: FalconH1's is off by default (mamba_rms_norm), and its
# config says whether it norms before the gate; the others always norm after it.
GATED_NORMS = [(f, {}) for f in sorted(MAMBA - {"falcon_h1"})] + [
    ("falcon_h1", dict(mamba_rms_norm=True, mamba_norm_before_gate=before)) for before in (True, False)]


@pytest.mark.parametrize("family, changes", GATED_NORMS)
def test_mamba2_mixers_compute_one_function_in_training_and_eval_mode(family, changes):
    """Training mode without a cache runs the mixers' fused call (mamba2_split_conv1d_scan_combined,
    to which transformers passes FalconH1's norm_before_gate=False whatever its config says), eval
    mode their unfused path through the gated norm module: on flat both give transformers' logits."""
    model = build(family, **changes)
    ids = tokens(2, 40)
    want = logits(model, False, ids, use_cache=False)
    counts = {}
    model.train()
    try:
        trained = logits(model, True, ids, counts, use_cache=False)
    finally:
        model.eval()
    assert counts.get("mamba2_split_conv1d_scan_combined", 0) >= 1, counts
    assert relative(trained, want) <= FP32
    assert relative(logits(model, True, ids, use_cache=False), want) <= FP32


LENGTHS = (7, 19, 11)


def _packed(packing):
    cu = torch.tensor([0, 7, 26, 37], dtype=torch.int32)
    position_ids = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    kwargs = dict(position_ids=position_ids, use_cache=False)  # a cache turns off transformers' packed masks
    if packing == "cu_seq_lens_q":  # what transformers' flattening collator gives flash attention
        kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(LENGTHS), max_length_k=max(LENGTHS))
    else:  # mamba_ssm's
        kwargs.update(seq_idx=torch.repeat_interleave(torch.arange(3, dtype=torch.int32), torch.tensor(LENGTHS))[None])
    return cu, kwargs


# transformers' GraniteMoeHybridModel builds its attention mask without position_ids, so on the CPU
# (no flash attention) its attention layers run across packed sequences: its packed test runs the
# Mamba-2 layers alone.
PACKED_CONFIG = {"granitemoehybrid": dict(layer_types=["mamba", "mamba"])}


@pytest.mark.parametrize("packing", ["cu_seq_lens_q", "seq_idx"])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_packed_sequences(family, packing):
    """Sequences packed along one row give, with flat, what each gives alone."""
    model = build(family, **PACKED_CONFIG.get(family, {}))
    base = model.base_model
    ids = tokens(1, sum(LENGTHS))
    cu, kwargs = _packed(packing)
    with path(True), torch.no_grad():
        packed = base(input_ids=ids, **kwargs).last_hidden_state
        alone = [base(input_ids=ids[:, a:b], use_cache=False).last_hidden_state for a, b in zip(cu[:-1], cu[1:])]
    errors = [relative(packed[:, a:b], alone[i]) for i, (a, b) in enumerate(zip(cu[:-1], cu[1:]))]
    assert max(errors) <= FP32, errors


@pytest.mark.parametrize("family", list(CONFIGS))
def test_packed_sequences_on_the_torch_path_raise_or_mix(family):
    """What flat adds: transformers' PyTorch path refuses packed sequences (the recurrences), or runs
    the short convolution across their boundaries."""
    model = build(family, **PACKED_CONFIG.get(family, {}))
    ids = tokens(1, sum(LENGTHS))
    cu, kwargs = _packed("seq_idx" if family in MAMBA else "cu_seq_lens_q")
    with path(False), torch.no_grad():
        try:
            packed = model.base_model(input_ids=ids, **kwargs).last_hidden_state
        except ValueError as e:
            assert "packed sequences" in str(e)
            return
        alone = model.base_model(input_ids=ids[:, cu[1]:cu[2]], use_cache=False).last_hidden_state
    assert relative(packed[:, cu[1]:cu[2]], alone) > FP32


@pytest.mark.parametrize("bad, match", [
    (dict(cu_seq_lens_q=torch.tensor([0, 7, 5, 37], dtype=torch.int32)), "cu_seq_lens_q"),
    (dict(cu_seq_lens_q=torch.tensor([0, 7, 26, 40], dtype=torch.int32)), "cu_seq_lens_q"),
    (dict(cu_seq_lens_q=torch.tensor([0.0, 37.0])), "cu_seq_lens_q"),
    (dict(seq_idx=torch.zeros(1, 36, dtype=torch.int32)), "seq_idx"),
])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_bad_packing_is_refused_by_name(family, bad, match):
    model = build(family)
    ids = tokens(1, sum(LENGTHS))
    _, kwargs = _packed("none")
    kwargs.pop("seq_idx")
    with path(True), torch.no_grad(), pytest.raises(ValueError, match=match):
        model.base_model(input_ids=ids, **kwargs, **bad)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_packing_over_a_batch_of_rows_is_refused_by_name(family):
    model = build(family)
    ids = tokens(2, 37)
    cu = torch.tensor([0, 37], dtype=torch.int32)
    with path(True), torch.no_grad(), pytest.raises(ValueError, match="cu_seq_lens_q: packed sequences lie along one"):
        model.base_model(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, use_cache=False)


# ---- Layer-level forwards -----------------------------------------------------------------------

LAYER_FAMILIES = [f for f in CONFIGS if FAMILIES[f].get("layers")]
# Those whose Gated DeltaNet layers run whole on flat (FalconH1's mixer runs its original forward).
DELTANET_LAYER_FAMILIES = [f for f in LAYER_FAMILIES if f not in MAMBA]


def _layer_classes(family):
    module = importlib.import_module(FAMILIES[family]["module"])
    return module, {name: getattr(module, name) for name in FAMILIES[family]["layers"]}


@pytest.mark.parametrize("family", DELTANET_LAYER_FAMILIES)
def test_layer_forward_is_installed_used_and_restored(family):
    """enable() replaces the layer class's forward (swapped() lists it); a prefill and a decode run
    every kernel through it, none through the function-level dispatchers; disable() restores the
    class's own forward."""
    module, classes = _layer_classes(family)
    originals = {name: cls.__dict__["forward"] for name, cls in classes.items()}
    model = build(family)
    counts = {}
    with path(True, counts):
        listed = flat_tf.swapped()[FAMILIES[family]["module"]]
        for name, cls in classes.items():
            assert listed[f"{name}.forward"] == ".".join(FAMILIES[family]["layers"][name])
            assert cls.forward.flat_original is originals[name]
        with torch.no_grad():
            model.generate(input_ids=tokens(1, 9), max_new_tokens=3, do_sample=False)
    layers = sum(cfg == "linear_attention" for cfg in CONFIGS[family][2]["layer_types"])
    for name in ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"):
        assert counts.get("layer:" + name) == layers, counts
    for name in ("causal_conv1d_update", "torch_recurrent_gated_delta_rule"):
        assert counts.get("layer:" + name) == 2 * layers, counts
    assert counts.get("layer:rms_norm_gated") == 3 * layers, counts
    assert all(counts[k] == counts.get("layer:" + k, 0) for k in counts if not k.startswith("layer:")), counts
    for name, cls in classes.items():
        assert cls.__dict__["forward"] is originals[name]


# (on flat?, tokens): a prefill, decoded tokens, a chunk continuing a cache, the path switched
# between steps (enable() / disable() mid-generation, the cache written by either).
# transformers 5.25's caches keep the recurrent states of the last tokens they are asked to.
KEEPS_STATES = hasattr(transformers.DynamicCache, "get_recurrent_states_to_keep")
SCHEDULE = [(True, 9), (True, 1), (False, 1), (True, 1), (True, 5), (False, 1), (True, 2), (False, 3), (True, 1)]


@pytest.mark.parametrize("record_past", [False, True])
@pytest.mark.parametrize("family", DELTANET_LAYER_FAMILIES)
def test_layer_forward_keeps_the_cache_protocol(family, record_past):
    """Step by step with a cache (prefill, single-token decode, chunked prefill on a cache, the cache
    recording the past as for speculative decoding), switching between flat and transformers'
    path: each step's logits are the full sequence's (transformers' path, no cache)."""
    model = build(family)
    ids = tokens(2, sum(n for _, n in SCHEDULE), seed=4)
    want = logits(model, False, ids, use_cache=False)
    cache = transformers.DynamicCache(config=model.config)
    if record_past:  # transformers 5.25 also keeps the last tokens' recurrent states (speculative decoding)
        cache.activate_past_recording(**({"recurrent_states_to_keep": 2} if KEEPS_STATES else {}))
    counts, at = {}, 0
    for flat, n in SCHEDULE:
        with path(flat, counts if flat else None), torch.no_grad():
            got = model(input_ids=ids[:, at:at + n], cache=cache, use_cache=True).logits
        assert relative(got, want[:, at:at + n]) <= FP32, (flat, at, n)
        at += n
    layers = sum(cfg == "linear_attention" for cfg in CONFIGS[family][2]["layer_types"])
    single = sum(flat and n == 1 for flat, n in SCHEDULE)  # a cache recording the past convolves them whole
    chunks = sum(flat for flat, _ in SCHEDULE) - (0 if record_past else single)
    assert counts.get("layer:causal_conv1d_update", 0) == (0 if record_past else single) * layers, counts
    assert counts.get("layer:causal_conv1d_fn", 0) == chunks * layers, counts
    assert counts.get("layer:torch_recurrent_gated_delta_rule", 0) == single * layers, counts


@pytest.mark.skipif(not KEEPS_STATES, reason="transformers before 5.25 keeps no recurrent states to go back to")
@pytest.mark.parametrize("family", DELTANET_LAYER_FAMILIES)
def test_layer_forward_keeps_the_states_speculative_decoding_goes_back_to(family):
    """transformers 5.25's speculative decoding on flat: a cache recording the past keeps the states
    after each of the last drafted tokens; four drafts verified in one call (the last two wrong),
    the two cropped, and decoding going on from there gives the full sequence's logits."""
    model = build(family)
    ids = tokens(2, 14, seed=5)
    want = logits(model, False, ids, use_cache=False)
    drafts = torch.cat([ids[:, 6:8], (ids[:, 8:10] + 1) % VOCAB], dim=1)
    cache = transformers.DynamicCache(config=model.config)
    counts = {}
    with path(True, counts), torch.no_grad():
        model(input_ids=ids[:, :6], cache=cache, use_cache=True)
        cache.activate_past_recording(recurrent_states_to_keep=4)
        verified = model(input_ids=drafts, cache=cache, use_cache=True).logits
        cache.crop(-2)
        got = model(input_ids=ids[:, 8:], cache=cache, use_cache=True).logits
    assert relative(verified[:, :2], want[:, 6:8]) <= FP32
    assert relative(got, want[:, 8:]) <= FP32
    layers = sum(cfg == "linear_attention" for cfg in CONFIGS[family][2]["layer_types"])
    # The prefill chunked; the 4 drafts in one call keeping their states; then 2 tokens chunked and
    # the last 4 kept.
    assert counts.get("layer:torch_chunk_gated_delta_rule", 0) == (1 + 1) * layers, counts
    assert counts.get("layer:kept_states_gated_delta_rule", 0) == (1 + 1) * layers, counts


def test_layer_kept_states_are_each_tokens_state_in_one_call():
    """The delta rule keeping each token's state (a cache recording the past): one pooled call gives
    the outputs and states of the tokens run one call each, from a state or from zeros, with value
    heads sharing key heads, float32 and bfloat16; where a gradient flows it runs token by token
    and the gradient reaches the inputs."""
    from flat.transformers._layers import _delta_rule, _delta_rule_kept

    g = torch.Generator().manual_seed(9)
    B, T, HK, HV, K, V = 3, 5, 2, 4, 16, 24
    for dtype in (torch.float32, torch.bfloat16):
        q, k = (torch.randn(B, T, HK, K, generator=g).to(dtype) for _ in range(2))
        v = torch.randn(B, T, HV, V, generator=g).to(dtype)
        a, b = (torch.randn(B, T, HV, generator=g).to(dtype) for _ in range(2))
        A_log, dt_bias = torch.randn(HV, generator=g), torch.randn(HV, generator=g)
        for start in (torch.randn(B, HV, K, V, generator=g), None):
            want_o, want_states, state = [], [], start
            for t in range(T):
                o, state = _delta_rule(*(x[:, t:t + 1] for x in (q, k, v, a, b)), A_log, dt_bias, state, True, None)
                want_o.append(o)
                want_states.append(state)
            before = None if start is None else start.clone()
            with torch.no_grad():
                o, states = _delta_rule_kept(q, k, v, a, b, A_log, dt_bias, start)
            assert o.dtype == dtype and o.shape == (B, T, HV, V)
            assert relative(o, torch.cat(want_o, dim=1)) <= FP32, (dtype, start is None)
            assert len(states) == T
            for got, want in zip(states, want_states):
                assert got.dtype == torch.float32 and got.shape == (B, HV, K, V) and got.is_contiguous()
                assert relative(got, want) <= FP32, (dtype, start is None)
            if start is not None:
                assert torch.equal(start, before)

    A = A_log.clone().requires_grad_(True)
    o, states = _delta_rule_kept(q, k, v, a, b, A, dt_bias, None)
    (o.float().sum() + states[-1].sum()).backward()
    assert A.grad is not None and torch.isfinite(A.grad).all() and A.grad.abs().sum() > 0


def test_layer_decode_step_updates_a_float32_state_in_place():
    """The layer forward's single-token delta rule writes the cache's float32 state in place (and
    returns that tensor) with the values of a step into a fresh state; a bfloat16 state, one whose
    last axis is strided, or inputs that need a gradient, get a fresh state and leave the cache's as
    it was."""
    from flat.transformers._layers import _delta_rule, _delta_rule_step

    g = torch.Generator().manual_seed(7)
    B, HK, HV, K, V = 3, 2, 4, 16, 24
    q, k = (torch.randn(B, 1, HK, K, generator=g) for _ in range(2))
    v = torch.randn(B, 1, HV, V, generator=g)
    a, b = (torch.randn(B, 1, HV, generator=g) for _ in range(2))
    A_log, dt_bias = torch.randn(HV, generator=g), torch.randn(HV, generator=g)
    state = torch.randn(B, HV, K, V, generator=g)
    want_o, want_state = _delta_rule(q, k, v, a, b, A_log, dt_bias, state.clone(), True, None)
    with torch.no_grad():
        o, final = _delta_rule_step(q, k, v, a, b, A_log, dt_bias, state, True, None)
    assert final is state
    assert relative(o, want_o) <= FP32 and relative(state, want_state) <= FP32

    for case in ("bf16", "strided", "grad"):
        kept = {"bf16": state.to(torch.bfloat16),
                "strided": state.transpose(-1, -2).contiguous().transpose(-1, -2)}.get(case, state.clone())
        before = kept.clone()
        A = A_log.clone().requires_grad_(case == "grad")
        o, final = _delta_rule_step(q, k, v, a, b, A, dt_bias, kept, True, None)
        assert final is not kept and torch.equal(kept, before), case
        if case == "strided":
            want_o, want_state = _delta_rule(q, k, v, a, b, A_log, dt_bias, kept.clone(), True, None)
            assert relative(o, want_o) <= FP32 and relative(final, want_state) <= FP32


def test_layer_forward_left_padded_generation_runs_on_the_layer():
    model = build("qwen3_5")
    long, short = tokens(1, 10, seed=5), tokens(1, 6, seed=6)
    ids = torch.cat([long, torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1)])
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    want = _generate(model, False, ids, mask)
    counts = {}
    got = _generate(model, True, ids, mask, counts)
    assert torch.equal(got, want)
    assert counts.get("layer:causal_conv1d_update", 0) >= 2 * 31, counts


@pytest.mark.parametrize("family", LAYER_FAMILIES)
def test_every_listed_layer_is_in_the_installed_transformers(family):
    module, classes = _layer_classes(family)
    for name, cls in classes.items():
        assert isinstance(cls, type) and "forward" in cls.__dict__, f"{module.__name__}.{name}"


def test_layer_forward_leaves_what_it_does_not_serve_to_the_original():
    """float16 (which flat's kernels do not take) runs the layer's original forward, which reaches
    flat through the function-level dispatchers."""
    model = build("qwen3_5", torch.float16)
    counts = {}
    logits(model, True, tokens(1, 9), counts)
    assert counts.get("torch_chunk_gated_delta_rule", 0) == 2 and not any(k.startswith("layer:") for k in counts)
