"""flat as the CPU kernels of Hugging Face transformers' linear-attention models.

One line::

    model = flat.transformers.enable(model)

replaces, process-wide, the kernel functions of every family in ``FAMILIES`` (module globals of
transformers' modeling modules, called by name from the layers' forwards) with a dispatcher: CPU
tensors go to flat.compat's function (FLA's, mamba_ssm's or causal_conv1d's calling convention on
flat's kernels), anything else to the function it replaced, so a GPU model, and the FLA or
mamba_ssm path where those packages are installed, are untouched. ``disable()`` puts the originals
back. Why not transformers' ``kernelize``, and what each family swaps: docs/transformers.md.
"""

import importlib
import threading
import warnings
from typing import Dict, List, Optional, Tuple

from ._dispatch import dispatcher
from ._families import FAMILIES

__all__ = ["FAMILIES", "enable", "disable", "is_enabled", "swapped"]

_lock = threading.Lock()
# (module, global name) -> the function that was there before enable().
_originals: Dict[Tuple[str, str], object] = {}


def _resolve(spec: Tuple[str, str]):
    module, name = spec
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _served_modules() -> Dict[str, str]:
    return {f["module"]: family for family, f in FAMILIES.items()}


def _check_model(model) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"flat.transformers.enable: model: expected a torch.nn.Module (or None), got "
                        f"{type(model).__name__}")
    served = _served_modules()
    if not any(type(m).__module__ in served for m in model.modules()):
        warnings.warn(f"flat.transformers.enable: model: {type(model).__name__} has no layer of a family "
                      f"flat serves ({', '.join(FAMILIES)}); it runs as before", RuntimeWarning, stacklevel=3)


def enable(model=None):
    """Serve every family's kernel functions on CPU tensors with flat, process-wide, and return
    `model` (optional, only checked: a RuntimeWarning where it has no layer flat serves).
    Idempotent.

    A family whose modeling module the installed transformers lacks is passed over; a listed
    function the installed transformers lacks, or whose flat.compat function is not there, is left
    as it is, with a RuntimeWarning naming it."""
    if model is not None:
        _check_model(model)
    left: List[str] = []
    with _lock:
        for family, spec in FAMILIES.items():
            try:
                module = importlib.import_module(spec["module"])
            except ImportError:
                continue
            for name, target_spec in spec["functions"].items():
                key = (spec["module"], name)
                if key in _originals:
                    continue
                current = getattr(module, name, None)
                if current is None:
                    left.append(f"{spec['module']}.{name} (not in this transformers)")
                    continue
                target = _resolve(target_spec)
                if target is None:
                    left.append(f"{spec['module']}.{name} ({'.'.join(target_spec)} is not there)")
                    continue
                _originals[key] = current
                setattr(module, name, dispatcher(current, target, target_spec[1], f"{spec['module']}.{name}"))
    if left:
        warnings.warn("flat.transformers.enable: left on transformers' own path: " + "; ".join(left),
                      RuntimeWarning, stacklevel=2)
    return model


def disable() -> None:
    """Put back every function enable() replaced. Idempotent."""
    with _lock:
        for (module_name, name), original in list(_originals.items()):
            module = importlib.import_module(module_name)
            current = getattr(module, name, None)
            if getattr(current, "flat_original", None) is original:
                setattr(module, name, original)
            del _originals[(module_name, name)]


def is_enabled() -> bool:
    """Whether enable() has replaced anything (and disable() not put it back)."""
    return bool(_originals)


def swapped() -> Dict[str, Dict[str, str]]:
    """What enable() replaced: {module: {global name: the flat.compat function serving it}}."""
    out: Dict[str, Dict[str, str]] = {}
    for module_name, name in _originals:
        target = FAMILIES[_served_modules()[module_name]]["functions"][name]
        out.setdefault(module_name, {})[name] = ".".join(target)
    return out
