"""flat in the kernels library's mapping: the door transformers 5.25 opens to faster kernels.

One call::

    import flat.kernels
    flat.kernels.register()

adds, process-wide (``kernels.register_kernel_mapping``, merged with what is there), flat's
functions for the device ``"cpu"`` in both modes (``Mode.INFERENCE``, ``Mode.TRAINING``) under the
names transformers' layers declare (``use_kernel_func_from_hub_with_fallback``). After it,
``kernelize(model, device="cpu", mode=...)`` (the kernels library's, or transformers'
``model.kernelize()``) and ``from_pretrained(..., use_kernels=True)`` run those functions on flat.
Call it before either: kernelize reads the mapping when it runs. ``mapping()`` gives the same
entries for ``kernels.use_kernel_mapping(flat.kernels.mapping())``, which applies them within a
``with`` block only.

Each name's replacement is the same dispatcher ``flat.transformers.enable()`` installs: the call is
bound to the transformers function's own signature and handed to flat.compat's function (FLA's,
mamba_ssm's or causal_conv1d's convention); tensors on any other device go to the function it
replaced. Names, by transformers' ``_KERNEL_MAPPING`` (transformers maps them to ``cuda``, ``rocm``
and ``xpu`` only):

- ``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule`` (Qwen3.5, Qwen3-Next, OLMo-hybrid),
  ``chunk_kda``, ``fused_recurrent_kda`` (Kimi Linear): ``flat.compat.fla``;
- ``causal_conv1d_fn``, ``causal_conv1d_update`` (every family's short convolution):
  ``flat.compat.causal_conv1d``;
- ``mamba_chunk_scan_combined``, ``mamba_split_conv1d_scan_combined``, ``selective_state_update``
  (the Mamba-2 families): ``flat.compat.mamba_ssm``;
- ``RMSNormGated``, a layer (transformers maps it to FLA's ``FusedRMSNormGated`` on GPUs): a
  stateless layer reading the replaced one's weight, eps and activation, on
  ``flat.torch.rms_norm_gated`` for the classes in GATED_NORMS (Qwen3.5, Qwen3.5-MoE, Qwen3-Next,
  OLMo-hybrid, Kimi Linear); another class under that name keeps its own forward. flat's fused norm
  rounds once: in bfloat16, Qwen3.5's forward rounds the normalised input before the weight, flat's
  does not.

Differences from ``enable()``: the Gated DeltaNet layers' whole-layer forward (the gate and beta
formed in flat's call) stays transformers' own, and transformers 5.24, which has no kernels
mechanism, is served by ``enable()`` alone (docs/transformers.md).
"""

import functools
import importlib
import inspect
from typing import Callable, Dict, Tuple

import torch
from kernels import Mode, register_kernel_mapping

from . import torch as flat_torch
from .transformers._dispatch import dispatcher

__all__ = ["GATED_NORMS", "NAMES", "mapping", "register"]

_FLA = "flat.compat.fla"
_CONV = "flat.compat.causal_conv1d"
_SSM = "flat.compat.mamba_ssm"

_QWEN = "qwen3_5"
_KIMI = "kimi_linear"
_MAMBA2 = "mamba2"

# transformers' kernel name -> (flat.compat module, function), (a transformers model whose modeling
# module holds that kernel function, the global's name there).
NAMES: Dict[str, Tuple[Tuple[str, str], Tuple[str, str]]] = {
    "chunk_gated_delta_rule": ((_FLA, "chunk_gated_delta_rule"), (_QWEN, "torch_chunk_gated_delta_rule")),
    "fused_recurrent_gated_delta_rule": ((_FLA, "fused_recurrent_gated_delta_rule"),
                                         (_QWEN, "torch_recurrent_gated_delta_rule")),
    "chunk_kda": ((_FLA, "chunk_kda"), (_KIMI, "chunk_kimi_delta_attention")),
    "fused_recurrent_kda": ((_FLA, "fused_recurrent_kda"), (_KIMI, "recurrent_kimi_delta_attention")),
    "causal_conv1d_fn": ((_CONV, "causal_conv1d_fn"), (_QWEN, "causal_conv1d_fn")),
    "causal_conv1d_update": ((_CONV, "causal_conv1d_update"), (_QWEN, "causal_conv1d_update")),
    "mamba_chunk_scan_combined": ((_SSM, "mamba_chunk_scan_combined"), (_MAMBA2, "mamba2_chunk_scan")),
    "mamba_split_conv1d_scan_combined": ((_SSM, "mamba_split_conv1d_scan_combined"),
                                         (_MAMBA2, "mamba2_split_conv1d_scan_combined")),
    "selective_state_update": ((_SSM, "selective_state_update"), (_MAMBA2, "mamba2_selective_state_update")),
}


@functools.lru_cache(maxsize=None)
def _dispatch(func_class: type, name: str) -> Callable:
    """The dispatcher for the function a kernels ``Func`` module class wraps (its forward's
    ``func``): transformers' function, with its signature."""
    (module, function), _ = NAMES[name]
    original = inspect.getclosurevars(func_class.forward).nonlocals["func"]
    target = getattr(__import__(module, fromlist=[function]), function)
    return dispatcher(original, target, function, f"{original.__module__}.{original.__name__} (kernel {name!r})")


def _layer(name: str) -> type:
    """The stateless layer kernelize puts in place of the ``Func`` modules named `name`. Its forward
    shows the signature of the NAMES model's Func (kernelize checks the replacement's against the
    first module it replaces; a model whose function of that name differs in its defaults runs the
    same layer, whose call is bound to that model's own function's signature)."""
    def forward(self, *args, **kwargs):
        return _dispatch(type(self), name)(*args, **kwargs)

    _, (model, attribute) = NAMES[name]
    modeling = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    forward.__signature__ = inspect.signature(type(getattr(modeling, attribute)).forward)
    return type(f"Flat_{name}", (torch.nn.Module,), {"forward": forward, "has_backward": True})


# transformers' gated RMS norms (``@use_kernel_forward_from_hub("RMSNormGated")``) whose forward is
# flat's rms_norm_gated: x / rms(x) * weight * act(gate), act the layer's ``activation``. Other
# classes under that name keep their own forward.
GATED_NORMS = frozenset({"Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated", "Qwen3NextRMSNormGated",
                         "OlmoHybridRMSNormGated", "KimiLinearRMSNormGated"})


class _RMSNormGated(torch.nn.Module):
    """The stateless layer for ``RMSNormGated``: reads the replaced layer's weight, eps and activation;
    CPU tensors of a GATED_NORMS class go to ``flat.torch.rms_norm_gated``, anything else to the
    class's own forward."""

    has_backward = True

    def forward(self, hidden_states, gate):
        if type(self).__name__ in GATED_NORMS and hidden_states.device.type == "cpu":
            return flat_torch.rms_norm_gated(hidden_states, gate, self.weight, activation=self.activation,
                                             eps=self.variance_epsilon)
        return type(self).forward(self, hidden_states, gate)


class _Repository:
    """What the kernels library's mapping holds for a name: ``load()`` returns the layer."""

    def __init__(self, name: str):
        self.name = name

    def load(self) -> type:
        return _RMSNormGated if self.name == "RMSNormGated" else _layer(self.name)

    def __repr__(self) -> str:
        return f"flat.kernels repository for {self.name!r}"


def mapping() -> Dict[str, dict]:
    """flat's entries for the kernels library's mapping: ``"cpu"`` in inference and training mode
    under every name in NAMES and ``RMSNormGated`` (for ``kernels.use_kernel_mapping``, which applies
    a mapping within a ``with`` block)."""
    return {name: {"cpu": {Mode.INFERENCE: _Repository(name), Mode.TRAINING: _Repository(name)}}
            for name in (*NAMES, "RMSNormGated")}


def register() -> Dict[str, dict]:
    """Registers mapping() process-wide, merged into the kernels library's mapping; returns it."""
    entries = mapping()
    register_kernel_mapping(entries, inherit_mapping=True)
    return entries
