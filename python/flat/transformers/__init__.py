"""flat as the CPU kernels of Hugging Face transformers' linear-attention models.

One line::

    model = flat.transformers.enable(model)

replaces, process-wide, the kernel functions of every family in ``FAMILIES`` (module globals of
transformers' modeling modules, called by name from the layers' forwards) with a dispatcher: CPU
tensors go to flat.compat's function (FLA's, mamba_ssm's or causal_conv1d's calling convention on
flat's kernels), anything else to the function it replaced, so a GPU model, and the FLA or
mamba_ssm path where those packages are installed, are untouched. ``disable()`` puts the originals
back. The Gated DeltaNet layers (Qwen3.5, Qwen3.5-MoE, Qwen3-Next, OLMo-hybrid) run whole on flat
(the gate and beta formed in flat's call, the gated RMSNorm on flat's fused norm, no copies between
the projections and the kernels): the layer class's ``forward`` is replaced too, by one that runs
CPU float32 / bfloat16 tensors on flat with the layer's own parameters and cache protocol and calls
the original for anything else. A modeling module not imported yet is swapped when it is (an import
hook while enabled), so enable() imports none of them. Why not transformers' ``kernelize``, and what each family swaps:
docs/transformers.md.
"""

import importlib
import importlib.abc
import sys
import threading
import warnings
from typing import Dict, List, Tuple

from ._dispatch import Unservable, dispatcher
from ._families import FAMILIES

__all__ = ["FAMILIES", "enable", "disable", "is_enabled", "swapped"]

_lock = threading.RLock()
_enabled = False
# (module, global name) -> the function that was there before enable().
_originals: Dict[Tuple[str, str], object] = {}
# (module, class name) -> the class's own forward before enable().
_layer_originals: Dict[Tuple[str, str], object] = {}


def _modules() -> Dict[str, dict]:
    """module name -> its family's table."""
    return {spec["module"]: spec for spec in FAMILIES.values()}


def _resolve(spec: Tuple[str, str]):
    module, name = spec
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _replace(originals: dict, key: tuple, owner, attribute: str, label: str, spec: tuple, make, left: List[str]):
    """owner.attribute (owner's own, not inherited) replaced by make(it, the object spec names),
    the original kept in originals[key]; what cannot be replaced goes to `left`, named by label."""
    if key in originals:
        return
    current = vars(owner).get(attribute) if owner is not None else None
    if current is None:
        left.append(f"{label} (not in this transformers)")
        return
    target = _resolve(spec)
    if target is None:
        left.append(f"{label} ({'.'.join(spec)} is not there)")
        return
    try:
        replacement = make(current, target)
    except Unservable as e:
        left.append(f"{label} ({e})")
        return
    originals[key] = current
    setattr(owner, attribute, replacement)


def _swap(module_name: str, module, left: List[str]) -> None:
    """Put the dispatchers and the layer forwards in `module` (a served modeling module); what
    cannot be served goes to `left`."""
    family = _modules()[module_name]
    for name, spec in family["functions"].items():
        label = f"{module_name}.{name}"
        _replace(_originals, (module_name, name), module, name, label, spec,
                 lambda current, target: dispatcher(current, target, spec[1], label), left)
    for class_name, spec in family["layers"].items():
        _replace(_layer_originals, (module_name, class_name), getattr(module, class_name, None), "forward",
                 f"{module_name}.{class_name}.forward", spec, lambda current, make_forward: make_forward(current),
                 left)


def _warn(left: List[str], stacklevel: int) -> None:
    if left:
        warnings.warn("flat.transformers: left on transformers' own path: " + "; ".join(left), RuntimeWarning,
                      stacklevel=stacklevel + 1)


class _Loader(importlib.abc.Loader):
    """A served modeling module's loader, which swaps its functions once it has run."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        left: List[str] = []
        with _lock:
            if _enabled:
                _swap(module.__name__, module, left)
        _warn(left, 2)


class _Finder(importlib.abc.MetaPathFinder):
    """While enabled: a served modeling module imported later is swapped as it is imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _modules():
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _Finder()


def _check_model(model) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"flat.transformers.enable: model: expected a torch.nn.Module (or None), got "
                        f"{type(model).__name__}")
    if not any(type(m).__module__ in _modules() for m in model.modules()):
        warnings.warn(f"flat.transformers.enable: model: {type(model).__name__} has no layer of a family "
                      f"flat serves ({', '.join(FAMILIES)}); it runs as before", RuntimeWarning, stacklevel=3)


def enable(model=None):
    """Serve every family's kernel functions on CPU tensors with flat, process-wide, and return
    `model` (optional, only checked: a RuntimeWarning where it has no layer flat serves).
    Idempotent.

    The modeling modules imported already are swapped now, the others as they are imported (until
    disable()). A listed function the installed transformers lacks, whose flat.compat function is
    not there, or whose signature flat.compat's function cannot serve, is left as it is, with a
    RuntimeWarning naming it."""
    global _enabled
    if model is not None:
        _check_model(model)
    left: List[str] = []
    with _lock:
        _enabled = True
        for module_name in _modules():
            module = sys.modules.get(module_name)
            if module is not None:
                _swap(module_name, module, left)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    _warn(left, 2)
    return model


def disable() -> None:
    """Put back every function enable() replaced, and swap no module imported later. Idempotent."""
    global _enabled
    with _lock:
        _enabled = False
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        for (module_name, name), original in list(_originals.items()):
            module = sys.modules.get(module_name)
            current = getattr(module, name, None)
            if getattr(current, "flat_original", None) is original:
                setattr(module, name, original)
            del _originals[(module_name, name)]
        for (module_name, class_name), original in list(_layer_originals.items()):
            cls = getattr(sys.modules.get(module_name), class_name, None)
            if cls is not None and getattr(cls.__dict__.get("forward"), "flat_original", None) is original:
                cls.forward = original
            del _layer_originals[(module_name, class_name)]


def is_enabled() -> bool:
    """Whether enable() is in force (and disable() has not ended it)."""
    return _enabled


def swapped() -> Dict[str, Dict[str, str]]:
    """What enable() has replaced so far: {module: {global name: the flat.compat function serving
    it}}, and for a layer whose forward is replaced {module: {"Class.forward": the
    flat.transformers._layers function that made the replacement}}."""
    out: Dict[str, Dict[str, str]] = {}
    for module_name, name in _originals:
        out.setdefault(module_name, {})[name] = ".".join(_modules()[module_name]["functions"][name])
    for module_name, class_name in _layer_originals:
        out.setdefault(module_name, {})[f"{class_name}.forward"] = ".".join(
            _modules()[module_name]["layers"][class_name])
    return out
