"""The function that takes a kernel function's place in a modeling module: CPU tensors go to
flat.compat's function, anything else to the function it replaced. It takes the replaced function's
signature (positional order, names, defaults): a call is bound to that signature and handed to
flat.compat's function by keyword, under flat.compat's names."""

import contextlib
import contextvars
import functools
import inspect
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch

from ..compat.causal_conv1d import sequence_offsets
from ._families import SEQUENCE_FUNCTIONS

# The packed-sequence arguments a layer hands its kernel functions: cu_seqlens (the Gated DeltaNet
# layers pass transformers' cu_seq_lens_q under that name), transformers' own cu_seq_lens_q (in the
# **kwargs every layer forwards), and mamba_ssm's seq_idx.
PACKING = ("cu_seqlens", "cu_seq_lens_q", "seq_idx")

# transformers' names for its kernel functions' arguments where flat.compat's function (FLA's,
# mamba_ssm's or causal_conv1d's convention) names them otherwise.
RENAMED = {"query": "q", "key": "k", "value": "v", "hidden_states": "x"}

# Arguments of transformers' functions that a flat.compat function not naming them has no use for:
# the chunk the torch fallbacks of the delta rules tile the sequence by (FLA's functions, like
# flat's kernels, choose their own; the result is the same).
UNUSED = ("chunk_size",)

# Arguments fixed for the calls made inside a layer's forward (flat.compat function -> {argument:
# value}), over what the call passes: fixed_arguments().
_fixed: contextvars.ContextVar = contextvars.ContextVar("flat_transformers_fixed", default={})


class Unservable(TypeError):
    """A function the dispatcher cannot take the place of: its signature cannot be read, or it has
    an argument flat.compat's function does not take."""


@contextlib.contextmanager
def fixed_arguments(target_name: str, **arguments) -> Iterator[None]:
    """Within it (this thread or task), calls that reach flat.compat's `target_name` through a
    dispatcher take `arguments` whatever the caller passed for them."""
    token = _fixed.set({**_fixed.get(), target_name: arguments})
    try:
        yield
    finally:
        _fixed.reset(token)


def signature_of(original: Callable) -> inspect.Signature:
    """The signature of the transformers function `original` stands for: its own (5.24's hub-kernel
    wrapper carries its torch function's), or for transformers 5.25's kernel functions, modules of
    the kernels library's whose forward takes (*args, **kwargs), that of the function their forward
    calls."""
    function = original
    if isinstance(original, torch.nn.Module):
        function = inspect.getclosurevars(type(original).forward).nonlocals.get("func", original)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as e:
        raise Unservable(f"its signature cannot be read ({e})") from None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values()):
        raise Unservable(f"its signature {signature} takes *args, which have no names to pass on")
    return signature


def _renamed(name: str, takes: Tuple[str, ...]) -> str:
    """The name flat.compat's function (taking `takes`) gives the original's argument `name`."""
    return name if name in takes else RENAMED.get(name, name)


class _Binding:
    """``signature.bind(*args, **kwargs)`` with its defaults applied, as a dict of the arguments by
    name, from the parameters walked once here: Signature.bind and apply_defaults take 20-25 us a
    call, which a decode step pays per layer and kernel function. A call this does not bind plainly
    (more positional arguments than names, a name given twice or positional-only by keyword, one
    missing, a keyword the signature lacks) is bound by Signature.bind, for its error. Signatures
    with *args are refused before (signature_of)."""

    def __init__(self, signature: inspect.Signature):
        P = inspect.Parameter
        parameters = list(signature.parameters.values())
        self.signature = signature
        self.positional = tuple(p.name for p in parameters if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD))
        self.positional_only = frozenset(p.name for p in parameters if p.kind is P.POSITIONAL_ONLY)
        self.var_keyword = next((p.name for p in parameters if p.kind is P.VAR_KEYWORD), None)
        self.names = frozenset(p.name for p in parameters if p.kind is not P.VAR_KEYWORD)
        self.defaults = {p.name: p.default for p in parameters
                         if p.kind is not P.VAR_KEYWORD and p.default is not P.empty}
        self.required = self.names - self.defaults.keys()

    def __call__(self, args: tuple, kwargs: dict) -> Dict[str, Any]:
        if len(args) > len(self.positional):
            return self._bound(args, kwargs)
        given = dict(zip(self.positional, args))
        caught = {}
        for name, value in kwargs.items():
            if name in self.names and name not in given and name not in self.positional_only:
                given[name] = value
            elif self.var_keyword is not None and name not in given and name not in self.names:
                caught[name] = value
            else:
                return self._bound(args, kwargs)
        if not self.required <= given.keys():
            return self._bound(args, kwargs)
        arguments = {**self.defaults, **given}
        if self.var_keyword is not None:
            arguments[self.var_keyword] = caught
        return arguments

    def _bound(self, args: tuple, kwargs: dict) -> Dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)


def _arguments(binding: _Binding, takes: Tuple[str, ...], args, kwargs) -> Dict[str, Any]:
    """A call bound to the original's signature, its defaults filled in, as keyword arguments under
    flat.compat's names: the original's own arguments over what its **kwargs caught."""
    named, caught = {}, {}
    for name, value in binding(args, kwargs).items():
        if name == binding.var_keyword:
            caught = value
        else:
            named[_renamed(name, takes)] = value
    return {**caught, **named}


def _first_tensor(args, kwargs) -> Optional[torch.Tensor]:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
    for a in kwargs.values():
        if isinstance(a, torch.Tensor):
            return a
    return None


def _parameters(fn: Callable) -> Tuple[str, ...]:
    """The names a function takes by keyword (not its *args or **kwargs)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(n for n, p in inspect.signature(fn).parameters.items() if p.kind in kinds)


def _offsets(cu: Any, name: str, batch: int, tokens: int) -> torch.Tensor:
    """cu (the caller's `name`) checked as packed sequences' offsets over one batch row of
    `tokens` tokens."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
        what = f"{cu.dtype} {list(cu.shape)}" if isinstance(cu, torch.Tensor) else type(cu).__name__
        raise ValueError(f"flat.transformers: {name}: expected a 1-D int32 or int64 tensor of num_seqs + 1 "
                         f"offsets, got {what}")
    if batch != 1:
        raise ValueError(f"flat.transformers: {name}: packed sequences lie along one batch row (batch size 1), "
                         f"got a batch of {batch} rows")
    values = cu.tolist()
    if (len(values) < 1 or values[0] != 0 or values[-1] != tokens
            or any(a > b for a, b in zip(values, values[1:]))):
        raise ValueError(f"flat.transformers: {name}: expected non-decreasing offsets from 0 to the {tokens} "
                         f"tokens of the batch row, got {values}")
    return cu


def _seq_idx_from(cu: torch.Tensor) -> torch.Tensor:
    lengths = (cu[1:] - cu[:-1]).to(torch.int64)
    return torch.repeat_interleave(torch.arange(lengths.numel(), dtype=torch.int32), lengths).unsqueeze(0)


def _check_seq_idx(seq_idx: Any, batch: int, tokens: int) -> None:
    if (not isinstance(seq_idx, torch.Tensor) or seq_idx.dim() != 2
            or seq_idx.dtype not in (torch.int32, torch.int64)):
        what = f"{seq_idx.dtype} {list(seq_idx.shape)}" if isinstance(seq_idx, torch.Tensor) else type(seq_idx).__name__
        raise ValueError(f"flat.transformers: seq_idx: expected an int32 or int64 tensor [batch, tokens], got {what}")
    if tuple(seq_idx.shape) != (batch, tokens):
        raise ValueError(f"flat.transformers: seq_idx: expected shape [{batch}, {tokens}] (batch, tokens), got "
                         f"{list(seq_idx.shape)}")


def _offsets_from(seq_idx: Any, batch: int, tokens: int) -> torch.Tensor:
    """mamba_ssm's seq_idx ([B, T], a sequence's label on each of its tokens, nondecreasing; a new
    sequence where the label changes) as offsets."""
    _check_seq_idx(seq_idx, batch, tokens)
    if batch != 1:
        raise ValueError(f"flat.transformers: seq_idx: packed sequences lie along one batch row (batch size 1) "
                         f"for this function, got a batch of {batch} rows")
    return sequence_offsets(seq_idx, batch, tokens)


def _packing(arguments: Dict[str, Any], target: str, takes: Tuple[str, ...], x: torch.Tensor) -> Dict[str, Any]:
    """The packed-sequence arguments of a call (`arguments`, by name), in the form the compat
    function takes."""
    given = {k: arguments.get(k) for k in PACKING if arguments.get(k) is not None}
    if not given:
        return {}
    axis = SEQUENCE_FUNCTIONS.get(target)
    if axis is None:  # a decode function (one token a row): whatever of them it takes, as given
        return {k: v for k, v in given.items() if k in takes}
    batch, tokens = int(x.shape[0]), int(x.shape[axis])
    cu_name = "cu_seqlens" if "cu_seqlens" in given else "cu_seq_lens_q" if "cu_seq_lens_q" in given else None
    cu = _offsets(given[cu_name], cu_name, batch, tokens) if cu_name else None
    out = {}
    if "seq_idx" in takes:  # mamba_ssm's and causal_conv1d's functions: seq_idx carries the packing
        out["seq_idx"] = given["seq_idx"] if "seq_idx" in given else _seq_idx_from(cu)
        if "seq_idx" in given:
            _check_seq_idx(given["seq_idx"], batch, tokens)
        if "cu_seqlens" in takes and "cu_seqlens" in given:
            out["cu_seqlens"] = cu
    elif "cu_seqlens" in takes:  # FLA's functions: cu_seqlens
        out["cu_seqlens"] = cu if cu is not None else _offsets_from(given["seq_idx"], batch, tokens)
    else:
        raise NotImplementedError(f"flat.transformers: {target} takes no packed sequences, given "
                                  f"{', '.join(given)}")
    return out


def dispatcher(original: Callable, target: Callable, target_name: str, where: str) -> Callable:
    """What replaces `original` (a modeling module's global, `where`), with its signature: CPU
    tensors go to `target` (flat.compat's `target_name`) with the call's arguments bound to that
    signature, by the names `target` takes (RENAMED), the packed-sequence ones translated, the
    ones it does not take dropped; anything else goes to `original` as called. Raises Unservable
    where an argument the original names would be dropped (other than UNUSED)."""
    signature = signature_of(original)
    binding = _Binding(signature)
    takes = _parameters(target)
    unserved = [name for name, p in signature.parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD
                and _renamed(name, takes) not in takes and name not in UNUSED]
    if unserved:
        raise Unservable(f"{target.__module__}.{target_name} takes no {', '.join(unserved)}")

    # Its name and docstring, not its attributes: transformers 5.25's kernel functions are modules
    # (the kernels library's), whose state is theirs alone.
    @functools.wraps(original, updated=())
    def dispatch(*args, **kwargs):
        x = _first_tensor(args, kwargs)
        if x is None or x.device.type != "cpu":
            return original(*args, **kwargs)
        try:
            arguments = _arguments(binding, takes, args, kwargs)
            arguments.update(_fixed.get().get(target_name, {}))
            kept = {k: v for k, v in arguments.items() if k in takes and k not in PACKING}
            kept.update(_packing(arguments, target_name, takes, x))
            return dispatch.flat_target(**kept)
        except Exception as e:
            e.add_note(f"(flat.transformers: {where} on CPU tensors runs {target.__module__}.{target_name})")
            raise

    dispatch.__signature__ = signature
    dispatch.flat_original = original
    dispatch.flat_target = target
    return dispatch
