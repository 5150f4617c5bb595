"""Argument checks shared by flat.compat's modules: every refusal is a ValueError
``flat: <argument>: expected ..., got ...``."""

import torch
from torch import Tensor

FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

# kind: (what the message calls it, whether a dtype is of that kind)
_KINDS = {
    "float": ("a float", lambda d: d in FLOATS),
    "integer": ("an integer", lambda d: not d.is_floating_point and not d.is_complex and d != torch.bool),
    "index": ("an int32 or int64", lambda d: d in (torch.int32, torch.int64)),
}


def bad(name: str, expected: str, got) -> ValueError:
    return ValueError(f"flat: {name}: expected {expected}, got {got}")


def describe(t) -> str:
    if isinstance(t, Tensor):
        return f"{t.dtype} {list(t.shape)} on {t.device}"
    return type(t).__name__


def cpu_tensor(name: str, t, shape: tuple, expected: str, kind: str = "float") -> Tensor:
    """t, checked: a CPU tensor of the kind ("float", "integer", "index": int32 or int64), its rank
    len(shape) and its sizes (None: any)."""
    what, of_kind = _KINDS[kind]
    if not (isinstance(t, Tensor) and t.device.type == "cpu" and of_kind(t.dtype) and t.dim() == len(shape)
            and all(s is None or int(n) == s for n, s in zip(t.shape, shape))):
        raise bad(name, f"{what} CPU tensor {expected}", describe(t))
    return t


def pool_rows(name: str, indices, count: int, pool: str, P: int, expected: str, kind: str) -> Tensor:
    """indices [count], checked as rows of a pool (named pool) of P rows: each in [0, P), no two
    alike. Returns them as int64."""
    rows = cpu_tensor(name, indices, (count,), expected, kind=kind).long()
    if count and (int(rows.min()) < 0 or int(rows.max()) >= P):
        raise bad(name, f"rows of {pool} in [0, {P})", rows.tolist())
    if rows.unique().numel() != count:
        raise bad(name, "distinct rows", rows.tolist())
    return rows
