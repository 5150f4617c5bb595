"""Random problems for every variant and the library's float64 oracle on them, in numpy, for the
framework tests. Inputs are rounded to the call's dtype first, so the kernels and the oracle see
the same values.

The oracles are the extension flat_oracle (python/src/oracle_module.cpp), which the wheel does not
ship: scripts/test.sh builds it beside the wheel (scripts/python.sh -C cmake.define.FLAT_ORACLE=ON),
in build-python/<wheel tag>/, where `reference` below finds it."""

import sys
from pathlib import Path

import numpy as np

from flat import VARIANTS


def _oracle_module():
    built = sorted((Path(__file__).resolve().parents[2] / "build-python").glob("*/flat_oracle*.so"))
    if built:
        sys.path.insert(0, str(built[-1].parent))
    try:
        import flat_oracle
    except ImportError as e:
        raise ImportError("flat_oracle, the tests' float64 oracles, is not built: run scripts/test.sh, or "
                          "scripts/python.sh -C cmake.define.FLAT_ORACLE=ON") from e
    return flat_oracle


reference = _oracle_module()

GATE = {name: gate for name, gate, _, _ in VARIANTS}
UPDATE = {name: update for name, _, update, _ in VARIANTS}
DEFAULT_G = {name: group for name, _, _, group in VARIANTS}
NAMES = tuple(GATE)

# The library's bounds (docs/variants.md): outputs, gradients; relative L2 error per tensor.
BOUNDS = {"float32": (1e-5, 1e-4), "bfloat16": (5e-3, 1e-2)}
# At precision="fast" (docs/algorithm.md, "Precision"), for either dtype, the bounds of FLA's own tests
# (its tests/ops/test_delta.py: o and ht 6e-3, dq, dk, dv, dh0 8e-3; gate and beta gradients 2e-2).
FAST_BOUNDS = {"o": 6e-3, "final_state": 6e-3, "dg": 2e-2, "dbeta": 2e-2, "db": 2e-2, "dw": 2e-2}


def bound(name: str, dtype: str, precision: str = "exact") -> float:
    """The bound of the output or gradient `name` ("o", "final_state", "dq", ...)."""
    if precision == "fast":
        return FAST_BOUNDS.get(name, 8e-3)
    return BOUNDS[dtype][0 if name in ("o", "final_state") else 1]


def round_to(x, dtype):
    x = np.asarray(x, np.float32)
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        x = bits.view(np.float32)
    return x.astype(np.float64)


def relative_error(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if not np.all(np.isfinite(got)):
        return float("nan")
    denominator = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (denominator if denominator > 0 else 1.0))


class Problem:
    """Inputs of one call: q, k, v, g, beta or b and w, h0 (all float64 numpy, rounded), dy, dht."""

    def __init__(self, variant, dtype="float32", B=2, S=70, H=2, K=16, V=8, heads=None, G=None, h0=True, seed=1):
        rng = np.random.default_rng(seed)
        heads = heads or {}
        self.variant, self.dtype = variant, dtype
        self.Nq, self.Nk, self.Nv = heads.get("q", H), heads.get("k", H), heads.get("v", H)
        self.Ng = heads.get("g", H)
        self.Nb, self.Nw = heads.get("b", H), heads.get("w", H)
        self.B, self.S, self.K, self.V = B, S, K, V
        self.G = G or DEFAULT_G[variant] or 1
        self.N = max(self.Nq, self.Nk, self.Nv, self.Ng if GATE[variant] != "none" else 1,
                     self.Nb if UPDATE[variant] != "additive" else 1,
                     self.Nw if UPDATE[variant] == "erase_write" else 1)
        r = lambda *shape: round_to(rng.standard_normal(shape), dtype)  # noqa: E731
        self.q = r(B, S, self.Nq, K)
        k = rng.standard_normal((B, S, self.Nk, K))
        if UPDATE[variant] != "additive":  # keys short enough that I - beta k k^T never expands
            k /= np.sqrt(K)
            k *= np.minimum(1.0, 0.99 / np.linalg.norm(k, axis=-1, keepdims=True))
        self.k = round_to(k, dtype)
        self.v = r(B, S, self.Nv, V)
        gate = GATE[variant]
        self.g = None
        if gate == "per_sequence":
            self.g = round_to(-0.1 * rng.random(self.Ng), "float32")
        elif gate == "per_token":
            self.g = round_to(-2.0 * rng.random((B, S, self.Ng)), "float32")
        elif gate in ("per_channel", "grouped"):
            width = K if gate == "per_channel" else K // self.G
            self.g = round_to(-2.0 * rng.random((B, S, self.Ng, width)), "float32")
        self.beta = round_to(rng.random((B, S, self.Nb)), dtype) if UPDATE[variant] == "delta" else None
        self.b = round_to(rng.random((B, S, self.Nb, K)), dtype) if UPDATE[variant] == "erase_write" else None
        self.w = round_to(rng.random((B, S, self.Nw, V)), dtype) if UPDATE[variant] == "erase_write" else None
        self.h0 = round_to(rng.standard_normal((B, self.N, K, V)), "float32") if h0 else None
        self.dy = round_to(rng.standard_normal((B, S, self.N, V)), dtype)
        self.dht = round_to(rng.standard_normal((B, self.N, K, V)), "float32")
        self.scale = float(np.float32(1.0 / np.sqrt(K)))

    def inputs(self):
        """q, k, v, g, beta, b, w, h0 in the order the operations take them (None where absent)."""
        return self.q, self.k, self.v, self.g, self.beta, self.b, self.w, self.h0

    def reference(self, l2norm=False):
        """The oracle: (y, ht), then (dq, dk, dv, dg, dbeta, db, dw, dh0) for dy and dht."""
        sizes = [self.B, self.S, self.Nq, self.Nk, self.Nv, self.Ng, self.Nb, self.Nw, self.K, self.V]
        args = (self.variant, sizes, self.G, self.scale, l2norm, *self.inputs())
        y, ht = reference.reference_forward(*args)
        grads = reference.reference_backward(*args, self.dy, self.dht)
        return (y, ht), grads


def expect_close(name, got, want, bound):
    error = relative_error(got, want)
    assert error <= bound, f"{name}: relative error {error:.3g} above {bound:g}"
