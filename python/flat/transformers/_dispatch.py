"""The function that takes a kernel function's place in a modeling module: CPU tensors go to
flat.compat's function, anything else to the function it replaced."""

import functools
import inspect
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ..compat.causal_conv1d import sequence_offsets
from ._families import SEQUENCE_FUNCTIONS

# The packed-sequence arguments a layer hands its kernel functions: cu_seqlens (the Gated DeltaNet
# layers pass transformers' cu_seq_lens_q under that name), transformers' own cu_seq_lens_q (in the
# **kwargs every layer forwards), and mamba_ssm's seq_idx.
PACKING = ("cu_seqlens", "cu_seq_lens_q", "seq_idx")


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


def _packing(kwargs: Dict[str, Any], target: str, takes: Tuple[str, ...], x: torch.Tensor) -> Dict[str, Any]:
    """The packed-sequence arguments of a call, in the form the compat function takes."""
    given = {k: kwargs.get(k) for k in PACKING if kwargs.get(k) is not None}
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
    """What replaces `original` (a modeling module's global, `where`): CPU tensors go to `target`
    (flat.compat's `target_name`) with the keyword arguments it takes, the packed-sequence ones
    translated; anything else goes to `original` as called."""
    takes = _parameters(target)

    # Its name and docstring, not its attributes: transformers 5.25's kernel functions are modules
    # (the kernels library's), whose state is theirs alone.
    @functools.wraps(original, updated=())
    def dispatch(*args, **kwargs):
        x = _first_tensor(args, kwargs)
        if x is None or x.device.type != "cpu":
            return original(*args, **kwargs)
        packing = _packing(kwargs, target_name, takes, x)
        kept = {k: v for k, v in kwargs.items() if k in takes and k not in PACKING}
        kept.update(packing)
        try:
            return dispatch.flat_target(*args, **kept)
        except Exception as e:
            e.add_note(f"(flat.transformers: {where} on CPU tensors runs {target.__module__}.{target_name})")
            raise

    dispatch.flat_original = original
    dispatch.flat_target = target
    return dispatch
