"""What the framework bindings share: the variants' table, the sequence arrays' checks, the activations'
names (the recurrence's options are _api.py's)."""

import atexit
import functools
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

from . import VARIANTS, _core

GATE = {name: gate for name, gate, _, _ in VARIANTS}
UPDATE = {name: update for name, _, update, _ in VARIANTS}
DEFAULT_GATE_GROUP = {name: group for name, _, _, group in VARIANTS}


def checked_options(operation: str, values: dict):
    """A call's options by the library's names (None: the default) as the library checked them once
    (_core.options), which _core.call and _core.output_shapes take; kept per operation and values, as a
    decode step passes the same ones every token."""
    return _checked_options(operation, tuple(values.items()))


@functools.lru_cache(maxsize=1024)
def _checked_options(operation: str, values: tuple):
    """checked_options' answer (refusals are not kept: lru_cache keeps what returns)."""
    return _core.options(operation, dict(values))


# The kept options are the extension's objects: freed before the interpreter tears its modules down,
# or nanobind reports them at exit as leaked instances of flat._core.Options (so is every cache that
# keeps them).
atexit.register(_checked_options.cache_clear)


class Sequences(NamedTuple):
    """A call's variable-length batch and state pool (flat::Sequences) as the framework's integer
    arrays, None where not given."""

    cu_seqlens: Any = None
    initial_state_indices: Any = None
    final_state_indices: Any = None
    token_state_indices: Any = None

    @property
    def writes_pool(self) -> bool:
        """Whether the call writes states into the pool initial_state, in place."""
        return self.final_state_indices is not None or self.token_state_indices is not None


def rowless(sequences: Sequences, pool, B: int) -> bool:
    """Whether a call over a pool has no sequence, so reads and writes no row: B = 0 without
    cu_seqlens, every index array given empty. The library takes an empty index array for one not
    given, so it would judge the pool a state per sequence, [B = 0, ...]: the front ends run such a
    call without the arrays on the pool's first 0 rows (and return the pool as it was from a call
    that writes it)."""
    indices = [x for x in sequences[1:] if x is not None]
    return (pool is not None and sequences.cu_seqlens is None and int(B) == 0 and bool(indices) and
            all(int(x.shape[0]) == 0 for x in indices))


def sequence_count(B: int, cu_seqlens) -> int:
    """How many sequences a call has, so how many rows its states: B, or num_seqs with cu_seqlens."""
    return B if cu_seqlens is None else max(int(cu_seqlens.shape[0]) - 1, 0)


_SEQUENCE_SHAPES = {"cu_seqlens": "[num_seqs + 1]", "initial_state_indices": "[num_seqs]",
                    "final_state_indices": "[num_seqs]", "token_state_indices": "[B * T]"}


def check_sequences(sequences: Sequences, kind: str, problem: Callable[[Any], Optional[str]]) -> None:
    """What the library cannot see of the arrays: each a 1-D array of int32 or int64 (it checks the
    values). problem(x) says what is wrong with x (its dtype, shape, device), or None."""
    for name, x in sequences._asdict().items():
        wrong = None if x is None else problem(x)
        if wrong is not None:
            raise ValueError(f"flat: {name}: expected {kind} {_SEQUENCE_SHAPES[name]} of int32 or int64, got {wrong}")
    check_offsets_given(sequences.cu_seqlens)


def check_offsets_given(cu_seqlens) -> None:
    """An empty cu_seqlens is not "not given" (that is None): it has not even the first offset 0."""
    if cu_seqlens is not None and int(cu_seqlens.shape[0]) == 0:
        raise ValueError("flat: cu_seqlens: expected num_seqs + 1 offsets from 0 to T (None for one sequence per "
                         "batch row), got an empty array")


def accepted_rows(token_state_indices: List[int], cu_seqlens: List[int], num_accepted: List[int]) -> List[int]:
    """accepted_state_indices on host integers, checked: the row of each sequence's last accepted
    token, token_state_indices[cu_seqlens[i] + num_accepted[i] - 1]; -1 for an empty sequence
    (num_accepted 0), which kept no state in this step."""
    if not cu_seqlens or cu_seqlens[0] != 0 or any(a > b for a, b in zip(cu_seqlens, cu_seqlens[1:])):
        raise ValueError(f"flat: cu_seqlens: expected non-decreasing offsets from 0, got {cu_seqlens}")
    if len(token_state_indices) != cu_seqlens[-1]:
        raise ValueError(f"flat: token_state_indices: expected one index per token, cu_seqlens[-1] = "
                         f"{cu_seqlens[-1]}, got {len(token_state_indices)}")
    lengths = [b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])]
    if len(num_accepted) != len(lengths) or any(not (1 <= n <= length or n == length == 0)
                                                for n, length in zip(num_accepted, lengths)):
        raise ValueError(f"flat: num_accepted: expected a count per sequence from 1 to its length {lengths} (0 for an "
                         f"empty sequence), got {num_accepted}")
    rows = []
    for i, (start, n) in enumerate(zip(cu_seqlens, num_accepted)):
        row = token_state_indices[start + n - 1] if n else -1
        if n and row < 0:
            raise ValueError(f"flat: token_state_indices: sequence {i}'s last accepted token, "
                             f"token_state_indices[{start + n - 1}], kept no state (-1), expected a pool row to "
                             "resume from")
        rows.append(row)
    return rows


def check_pool(sequences: Sequences, pool) -> None:
    if sequences.writes_pool and pool is None:
        raise ValueError("flat: initial_state: final_state_indices and token_state_indices write states into the pool "
                         "initial_state [P, ...], got none")


def pool_error(what: str) -> ValueError:
    """The error of a pool write that would need a gradient (what: how to avoid one)."""
    return ValueError("flat: final_state_indices, token_state_indices: writing states into the pool initial_state in "
                      f"place is for inference, and no gradient flows through it; {what} (initial_state_indices alone, "
                      "reading the pool, is differentiable)")


# The output norm and gate: FLA's activation names too ("swish" is SiLU); None is no activation.
_NORM_ACTIVATIONS = {"silu": "silu", "swish": "silu", "sigmoid": "sigmoid", "none": "none", None: "none"}

# The short convolution: FLA's causal_conv1d takes None, "silu" and "swish".
_CONV_ACTIVATIONS = {"silu": "silu", "swish": "silu", "none": "none", None: "none"}


def _activation(table: dict, activation, expected: str) -> str:
    if not (activation is None or isinstance(activation, str)) or activation not in table:
        raise ValueError(f"flat: activation: expected {expected}, got {activation!r}")
    return table[activation]


def norm_activation(activation) -> str:
    return _activation(_NORM_ACTIVATIONS, activation, "'swish' (or 'silu'), 'sigmoid', or None (or 'none') for no "
                       "activation")


def conv_activation(activation) -> str:
    return _activation(_CONV_ACTIVATIONS, activation, "None (or 'none') for no activation, or 'silu' (or 'swish')")


def rows4(shape: Sequence[int]) -> tuple:
    """The [B, S, N, D] shape the library's norm takes for a tensor of shape [..., D]: leading axes
    of 1 added below rank 4, the leading axes merged above it."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        raise ValueError("flat: x: expected at least one axis [..., D], got a scalar")
    if len(shape) <= 4:
        return (1,) * (4 - len(shape)) + shape
    lead = 1
    for s in shape[:-3]:
        lead *= s
    return (lead,) + shape[-3:]
