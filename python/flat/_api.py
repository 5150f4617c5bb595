"""The operations' signatures, shared by flat.torch and flat.jax: one function per variant, named as
``flat run`` names it, with FLA's argument names where the meaning is the same.

Where FLA 0.6 has the function (chunk_linear_attn, chunk_simple_gla, chunk_gla, chunk_delta_rule,
chunk_gated_delta_rule, chunk_kda, chunk_gdn2), its arguments come in FLA's positional order as far
as that order runs through arguments flat has (to cu_seqlens, or kda's lower_bound); the rest, and
flat's own options, are keyword-only.

Common arguments: scale (None: K^-1/2; else a finite number), initial_state [B, H, K, V]
(float32; a bfloat16 or float16 one is widened to float32 for the kernel, its gradient coming back in
its dtype), output_final_state, chunk_size (a multiple of 16 from 16 to 256), use_qk_l2norm_in_kernel,
check_values (refuse gates above 0 and non-finite gates, strengths and states), state_v_first
(FLA's: initial_state and final_state [B, H, V, K], transposed around the kernel). The delta rule also
takes solve ("auto", "subst", "blocked", "doubling"); grouped gates gate_group (channels per gate
value). Every one takes precision ("exact", the default, or "fast"; flat::Precision): how the chunk
products take operands that are not bf16 values, as fp32 products, or rounded to bf16 once where the
CPU target has a bf16 unit, as GPU kernels do (docs/algorithm.md, "Precision"). Each returns
(o, final_state), final_state None unless output_final_state; final_state is float32.

FLA's options that form the inputs (computed in float32 around the kernel with the framework's own
operations, so differentiable): use_gate_in_kernel with A_log [H] and dt_bias (gated_deltanet:
g = -exp(A_log) softplus(g + dt_bias), dt_bias [H]; kda, gdn2: per channel, dt_bias [H * K], or
with lower_bound g = lower_bound * sigmoid(exp(A_log) (g + dt_bias)), A_log optional then; A_log
and dt_bias of any shape with that many elements, as Kimi Linear's A_log [1, 1, H, 1]), safe_gate
(a hint to FLA's kernels; here it only checks lower_bound as FLA does), use_beta_sigmoid_in_kernel
(beta = sigmoid(beta)) and allow_neg_eigval (beta = 2 sigmoid(beta)); retnet and mamba2 take g_gamma [H] (FLA's
chunk_simple_gla), la takes normalize (FLA's chunk_linear_attn; flat's default is False).

Variable-length batches and a state pool (flat::Sequences; 1-D int32 or int64 arrays):

- cu_seqlens [num_seqs + 1]: offsets of sequences packed along T of one batch row, each with its
  own state: initial_state and final_state [num_seqs, H, K, V] (an empty array is refused);
- initial_state_indices [num_seqs]: initial_state is a pool [P, H, K, V] and sequence i starts from
  its row initial_state_indices[i] (from zero where -1); final_state stays [num_seqs, H, K, V];
- final_state_indices [num_seqs]: sequence i's final state goes to the pool's row
  final_state_indices[i] (nowhere where -1);
- token_state_indices [B * T]: the state after each token goes to the pool's row
  token_state_indices[t] (nowhere where -1), for speculative decoding.

With final_state_indices or token_state_indices the pool initial_state is updated in place (read
through initial_state_indices; without them every sequence starts from zero) and returned as the
second value: (o, initial_state). That call is for inference: no gradient flows through it.

An empty batch (B = 0 or T = 0) returns an empty o and the initial state as the final state (zeros
without one); over a pool, the rows read (none with B = 0, every index array empty).
"""

import math
from typing import Callable, NamedTuple, Optional

from . import _core
from ._args import Sequences, norm_activation

# The recurrence's options (flat::Options) as the functions take them: the library's name -> (the
# functions' keyword, the kind of its values). A new option of the library is a keyword here and in
# the functions' signatures below: the record Options, flat.torch's custom ops and flat.jax's calls
# take every option the library lists (_core.option_names). A keyword of None leaves a number or a
# flag at the library's default (scale: K^-1/2; gate_group: the variant's); None is refused for a
# name, which has its default in the signature.
OPTIONS = {"scale": ("scale", float), "chunk": ("chunk_size", int), "l2norm_qk": ("use_qk_l2norm_in_kernel", bool),
           "solve": ("solve", str), "precision": ("precision", str), "gate_group": ("gate_group", int),
           "check_values": ("check_values", bool)}

OPTION_NAMES = tuple(_core.option_names("forward"))
if set(OPTION_NAMES) != set(OPTIONS):
    raise ImportError(f"flat: the library's recurrence options {OPTION_NAMES} are not _api.OPTIONS' {tuple(OPTIONS)}")

# A call's options by the library's names, in its order (None: the library's default).
Options = NamedTuple("Options", [(name, Optional[OPTIONS[name][1]]) for name in OPTION_NAMES])


def _option(keyword: str, kind: type, value):
    """An option's value as the library takes it: a name as given (the library checks it), others of
    their kind."""
    if kind is str:
        if value is None:
            raise ValueError(f"flat: {keyword}: expected a name, got None (leave the argument out for its default)")
        return value
    return None if value is None else kind(value)


def options(arguments: dict) -> Options:
    """A call's options from its function's arguments by name (its locals()); an option the function
    does not take is left at the library's default."""
    return Options(*(_option(*OPTIONS[name], arguments[OPTIONS[name][0]]) if OPTIONS[name][0] in arguments else None
                     for name in OPTION_NAMES))


def _sequences(arguments: dict) -> Sequences:
    return Sequences(*(arguments[name] for name in Sequences._fields))


class Xp(NamedTuple):
    """The few array operations the functions below need, from a framework (torch, jax.numpy)."""

    float32: Callable  # x widened (or narrowed) to float32, differentiably
    narrow_float: Callable  # whether x is bfloat16 or float16
    cast_like: Callable  # x in the dtype of y
    sigmoid: Callable
    softplus: Callable
    exp: Callable
    swap: Callable  # the last two axes swapped
    ones: Callable  # float32 ones of a shape
    activations: dict  # the norm's activations by the library's names (silu, sigmoid, none)


def _size(x) -> int:
    """x's element count from its shape (torch and JAX arrays alike), in a form torch.compile traces
    (a generator passed to math.prod breaks its graph)."""
    return math.prod([int(s) for s in x.shape])


def _check_lower_bound(use_gate_in_kernel: bool, safe_gate: bool, lower_bound) -> None:
    if lower_bound is not None and not use_gate_in_kernel:
        raise ValueError(f"flat: lower_bound: bounds the gate formed with use_gate_in_kernel=True (g is taken as the "
                         f"log-decay as it is otherwise), got lower_bound={lower_bound} with use_gate_in_kernel=False")
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError("flat: lower_bound: safe_gate=True with use_gate_in_kernel=True takes a lower_bound in "
                             "[-5, 0) (as FLA's), got None")
        if not -5 <= float(lower_bound) < 0:
            raise ValueError(f"flat: lower_bound: expected a number in [-5, 0) with safe_gate=True, got {lower_bound}")


def gate_in_kernel(xp: Xp, g, use_gate_in_kernel: bool, A_log, dt_bias, lower_bound, safe_gate: bool = False):
    """FLA's use_gate_in_kernel: the log-decay from the raw gate g, in float32. A scalar gate per head
    (g [B, T, H], gated_deltanet): -exp(A_log) softplus(g + dt_bias), A_log and dt_bias [H]; a gate
    per channel (g [B, T, H, D], kda, gdn2): the same per channel, A_log [H], dt_bias [H * D], or
    with lower_bound, lower_bound * sigmoid(exp(A_log) (g + dt_bias)) (lower_bound * sigmoid(g + dt_bias)
    without A_log, as FLA's chunk_kda). A_log and dt_bias may have any shape of that many elements
    (Kimi Linear's A_log is [1, 1, H, 1])."""
    _check_lower_bound(use_gate_in_kernel, safe_gate, lower_bound)
    if not use_gate_in_kernel:
        for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
            if x is not None:
                raise ValueError(f"flat: {name}: forms the gate with use_gate_in_kernel=True (g is taken as the "
                                 f"log-decay as it is otherwise), got {name} {list(x.shape)} with "
                                 "use_gate_in_kernel=False")
        return g
    if len(g.shape) not in (3, 4):
        raise ValueError(f"flat: g: expected the raw gate [B, T, H] or [B, T, H, D] with use_gate_in_kernel=True, got "
                         f"rank {len(g.shape)} {list(g.shape)}")
    H = int(g.shape[2])
    D = int(g.shape[3]) if len(g.shape) == 4 else 1
    if A_log is None and (lower_bound is None or len(g.shape) == 3):
        raise ValueError(f"flat: A_log: use_gate_in_kernel=True forms the gate from A_log [{H}], got None" +
                         (" (or with a lower_bound from g + dt_bias alone)" if len(g.shape) == 4 else ""))
    if A_log is not None and _size(A_log) != H:
        raise ValueError(f"flat: A_log: expected one value per head of g, [{H}], got {list(A_log.shape)}")
    if dt_bias is not None and _size(dt_bias) != H * D:
        raise ValueError(f"flat: dt_bias: expected [{H * D}] (H * D of g {list(g.shape)}), got {list(dt_bias.shape)}")
    shape = (H, D) if len(g.shape) == 4 else (H,)
    x = xp.float32(g)
    if dt_bias is not None:
        x = x + xp.float32(dt_bias).reshape(shape)
    A = None if A_log is None else xp.exp(xp.float32(A_log).reshape((H, 1) if len(g.shape) == 4 else (H,)))
    if lower_bound is None:
        return -A * xp.softplus(x)
    return float(lower_bound) * xp.sigmoid(x if A is None else A * x)


def beta_in_kernel(xp: Xp, beta, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool):
    """FLA's use_beta_sigmoid_in_kernel (beta = sigmoid(beta)) and allow_neg_eigval (2 sigmoid(beta)),
    in float32."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("flat: allow_neg_eigval: doubles sigmoid(beta), so it takes use_beta_sigmoid_in_kernel=True "
                         "(as FLA's chunk_gated_delta_rule does), got use_beta_sigmoid_in_kernel=False")
    if not use_beta_sigmoid_in_kernel:
        return beta
    beta = xp.sigmoid(xp.float32(beta))
    return 2.0 * beta if allow_neg_eigval else beta


def _state_in(xp: Xp, initial_state, sequences: Sequences, state_v_first: bool):
    """The initial state as the kernel takes it: [.., K, V] (transposed from FLA's V-first layout
    with state_v_first), float32 (a bfloat16 or float16 state widened; a pool written in place is
    passed as it is, and the library refuses one that is not float32)."""
    if initial_state is None:
        return None
    if sequences.writes_pool:
        if state_v_first:
            raise ValueError("flat: state_v_first: a pool written in place (final_state_indices, "
                             "token_state_indices) is the kernel's own [P, H, K, V], updated where it lies; pass it "
                             f"so, without state_v_first, got initial_state {list(initial_state.shape)} with "
                             "state_v_first=True")
        return initial_state
    if state_v_first and len(initial_state.shape) >= 2:
        initial_state = xp.swap(initial_state)
    return xp.float32(initial_state) if xp.narrow_float(initial_state) else initial_state


def without_normalize(la, name: str):
    """la refusing normalize=True, for functions whose sequences are cut across ranks or shards (`name`
    their module's): the normalizer's sum of every key before each token is not in the states
    exchanged."""

    def la_without_normalize(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=False,
                             cu_seqlens=None, **kwargs):
        if normalize:
            raise ValueError(f"{name}: la: normalize divides by the sum of every key before each token, which the "
                             "states exchanged do not carry; not supported")
        return la(q, k, v, scale, initial_state, output_final_state, False, cu_seqlens, **kwargs)

    la_without_normalize.__doc__ = la.__doc__
    return la_without_normalize


def variant_functions(_run, xp: Xp):
    """The functions of every variant on a framework's _run(variant, q, k, v, g, beta, b, w, *,
    initial_state, output_final_state, sequences, options), options an Options record, and its array
    operations xp."""

    def run(variant, q, k, v, g=None, beta=None, b=None, w=None, *, initial_state, output_final_state, sequences,
            state_v_first, options):
        o, final_state = _run(variant, q, k, v, g, beta, b, w,
                              initial_state=_state_in(xp, initial_state, sequences, state_v_first),
                              output_final_state=output_final_state, sequences=sequences, options=options)
        if state_v_first and final_state is not None:
            final_state = xp.swap(final_state)
        return o, final_state

    def la(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=False, cu_seqlens=None, *,
           chunk_size=64, use_qk_l2norm_in_kernel=False, check_values=True, state_v_first=False,
           initial_state_indices=None, final_state_indices=None, token_state_indices=None, precision="exact"):
        """Linear attention: H_t = H_{t-1} + k_t v_t^T, o_t = scale H_t^T q_t. With normalize=True
        (FLA's chunk_linear_attn default; flat's default is False) o_t is divided by
        <scale q_t, z_t> + 1e-10, z_t = z_0 + sum_{s<=t} k_s the sum of the keys seen, as FLA 0.6 does;
        the state is then FLA's pair (kv, z): kv the state above, z [N, 1, H, K] (a tensor alone is
        kv, with z_0 = 0), and the final state the pair (kv, z), both float32. The key sum is this
        recurrence with a value of 1, run by the same kernel in float32, so each sequence of
        cu_seqlens has its own; a pool (initial_state_indices, final_state_indices,
        token_state_indices), whose rows hold no key sum, is refused with it."""
        sequences = _sequences(locals())
        common = dict(output_final_state=output_final_state, sequences=sequences, options=options(locals()))
        kv0, z0 = _normalize_state(q, k, v, initial_state, sequences, normalize)
        o, kv = run("la", q, k, v, initial_state=kv0, state_v_first=state_v_first, **common)
        if not normalize:
            return o, kv
        H, K = q.shape[2], q.shape[3]
        z0 = None if z0 is None else xp.float32(z0).reshape((z0.shape[0], H, K, 1))
        qz, z = run("la", xp.float32(q), xp.float32(k), xp.ones(tuple(q.shape[:3]) + (1,)), initial_state=z0,
                    state_v_first=False, **common)
        o = xp.cast_like(xp.float32(o) / (qz + 1e-10), o)
        return o, ((kv, z.reshape((z.shape[0], 1, H, K))) if output_final_state else None)

    def retnet(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, *, g_gamma=None,
               chunk_size=64, use_qk_l2norm_in_kernel=False, check_values=True, state_v_first=False,
               cu_seqlens=None, initial_state_indices=None, final_state_indices=None, token_state_indices=None,
               precision="exact"):
        """RetNet: H_t = exp(g) H_{t-1} + k_t v_t^T with g [H] one log-decay per head (FLA's g_gamma,
        which may be passed by that name instead)."""
        if (g is None) == (g_gamma is None):
            raise ValueError("flat: g, g_gamma: expected the log-decay per head [H] as g or as g_gamma (one of "
                             f"them), got {'both' if g is not None else 'neither'}")
        return run("retnet", q, k, v, g if g is not None else g_gamma, initial_state=initial_state,
                   output_final_state=output_final_state, state_v_first=state_v_first, sequences=_sequences(locals()),
                   options=options(locals()))

    def mamba2(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
               state_v_first=False, cu_seqlens=None, *, chunk_size=64, use_qk_l2norm_in_kernel=False,
               check_values=True, initial_state_indices=None, final_state_indices=None, token_state_indices=None,
               precision="exact"):
        """Mamba-2 (SSD), FLA's simple GLA (chunk_simple_gla's arguments and order): H_t = exp(g_t) H_{t-1} +
        k_t v_t^T with g [B, T, H]; g_gamma [H], a log-decay per head, is added to g (alone, it is retnet)."""
        common = dict(initial_state=initial_state, output_final_state=output_final_state, state_v_first=state_v_first,
                      sequences=_sequences(locals()), options=options(locals()))
        if g is None and g_gamma is None:
            raise ValueError("flat: g: expected the log-decay [B, T, H], or g_gamma [H] (or both), got neither")
        if g is None:
            return run("retnet", q, k, v, g_gamma, **common)
        if g_gamma is not None:
            if len(g.shape) != 3 or tuple(g_gamma.shape) != (g.shape[2],):
                raise ValueError(f"flat: g_gamma: expected [H] beside g [B, T, H], got g_gamma {list(g_gamma.shape)} "
                                 f"and g {list(g.shape)}")
            g = xp.float32(g) + xp.float32(g_gamma)
        return run("mamba2", q, k, v, g, **common)

    def gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
            cu_seqlens=None, *, chunk_size=64, use_qk_l2norm_in_kernel=False, check_values=True,
            initial_state_indices=None, final_state_indices=None, token_state_indices=None, precision="exact"):
        """Gated linear attention (FLA's chunk_gla): H_t = Diag(exp(g_t)) H_{t-1} + k_t v_t^T with
        g [B, T, H, K]."""
        return run("gla", q, k, v, g, initial_state=initial_state, output_final_state=output_final_state,
                   state_v_first=state_v_first, sequences=_sequences(locals()), options=options(locals()))

    def delta_rule(variant, a):
        """deltanet, gated_deltanet and kda, on a, the call's arguments by name (its locals()): the gate
        and beta formed as FLA's options say, then the kernel. An argument the variant lacks is
        absent (no gate, no lower_bound, no gate_group)."""
        g = gate_in_kernel(xp, a.get("g"), a.get("use_gate_in_kernel", False), a.get("A_log"), a.get("dt_bias"),
                           a.get("lower_bound"), a.get("safe_gate", False))
        beta = beta_in_kernel(xp, a["beta"], a["use_beta_sigmoid_in_kernel"], a["allow_neg_eigval"])
        return run(variant, a["q"], a["k"], a["v"], g, beta, initial_state=a["initial_state"],
                   output_final_state=a["output_final_state"], state_v_first=a["state_v_first"],
                   sequences=_sequences(a), options=options(a))

    def deltanet(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, cu_seqlens=None, *, chunk_size=64, use_beta_sigmoid_in_kernel=False,
                 allow_neg_eigval=False, solve="auto", check_values=True, state_v_first=False,
                 initial_state_indices=None, final_state_indices=None, token_state_indices=None, precision="exact"):
        """DeltaNet (FLA's chunk_delta_rule): H_t = (I - beta_t k_t k_t^T) H_{t-1} + beta_t k_t v_t^T with
        beta [B, T, H]."""
        return delta_rule("deltanet", locals())

    def gated_deltanet(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                       use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                       state_v_first=False, cu_seqlens=None, *, chunk_size=64, use_gate_in_kernel=False, A_log=None,
                       dt_bias=None, solve="auto", check_values=True, initial_state_indices=None,
                       final_state_indices=None, token_state_indices=None, precision="exact"):
        """Gated DeltaNet (FLA's chunk_gated_delta_rule): H_t = exp(g_t) (I - beta_t k_t k_t^T) H_{t-1} +
        beta_t k_t v_t^T with g, beta [B, T, H]."""
        return delta_rule("gated_deltanet", locals())

    def kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
            use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
            lower_bound=None, *, chunk_size=64, A_log=None, dt_bias=None, solve="auto", gate_group=None,
            check_values=True, state_v_first=False, cu_seqlens=None, initial_state_indices=None,
            final_state_indices=None, token_state_indices=None, precision="exact"):
        """Kimi Delta Attention (FLA's chunk_kda): H_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) H_{t-1} +
        beta_t k_t v_t^T with g [B, T, H, K] (or [B, T, H, K/G] per group of G channels), beta [B, T, H]."""
        return delta_rule("kda", locals())

    def gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
             use_gate_in_kernel=False, cu_seqlens=None, *, chunk_size=64, A_log=None, dt_bias=None, safe_gate=False,
             lower_bound=None, solve="auto", gate_group=None, check_values=True, state_v_first=False,
             initial_state_indices=None, final_state_indices=None, token_state_indices=None, precision="exact"):
        """Gated DeltaNet-2 (FLA's chunk_gdn2): H_t = (I - k_t (b_t * k_t)^T) Diag(exp(g_t)) H_{t-1} +
        k_t (w_t * v_t)^T, kda with an erase gate b [B, T, H, K] and a write gate w [B, T, H, V] in place
        of beta."""
        arguments = locals()
        g = gate_in_kernel(xp, g, use_gate_in_kernel, A_log, dt_bias, lower_bound, safe_gate)
        return run("gdn2", q, k, v, g, b=b, w=w, initial_state=initial_state, output_final_state=output_final_state,
                   state_v_first=state_v_first, sequences=_sequences(arguments), options=options(arguments))

    def sla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, chunk_size=64,
            use_qk_l2norm_in_kernel=False, solve="auto", gate_group=None, check_values=True, state_v_first=False,
            cu_seqlens=None, initial_state_indices=None, final_state_indices=None, token_state_indices=None,
            precision="exact"):
        """Systolic linear attention: kda with one gate value per 64 channels (g [B, T, Hk, K/64]), keys
        shared by value heads (v [B, T, R Hk, V])."""
        return run("sla", q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
                   state_v_first=state_v_first, sequences=_sequences(locals()), options=options(locals()))

    return {f.__name__: f for f in (la, retnet, mamba2, gla, deltanet, gated_deltanet, kda, gdn2, sla)}


def _normalize_state(q, k, v, initial_state, sequences: Sequences, normalize: bool):
    """la's initial state as (kv, z): with normalize, FLA's pair (kv, z) or a tensor kv (z None),
    checked with the arguments normalize needs; without it, a state tensor (a pair refused)."""
    pair = isinstance(initial_state, (tuple, list))
    if not normalize:
        if pair:
            raise ValueError("flat: initial_state: expected a state [B, H, K, V] (the pair (kv, z) is la's state with "
                             f"normalize=True), got a {type(initial_state).__name__} with normalize=False")
        return initial_state, None
    pools = [name for name, x in sequences._asdict().items() if x is not None and name != "cu_seqlens"]
    if pools:
        raise ValueError(f"flat: normalize: divides by the sum of the keys seen, which a pool's rows do not hold, so "
                         f"it takes no pool, got {', '.join(pools)}")
    shapes = [tuple(x.shape) if hasattr(x, "shape") else () for x in (q, k, v)]
    if all(len(shape) == 4 for shape in shapes) and not shapes[0][2] == shapes[1][2] == shapes[2][2]:
        raise ValueError(f"flat: normalize: expected q, k and v with one head count, got q {list(shapes[0])}, "
                         f"k {list(shapes[1])}, v {list(shapes[2])}")
    if not pair:
        return initial_state, None
    if len(initial_state) != 2:
        raise ValueError(f"flat: initial_state: expected a tensor or the pair (kv, z) with normalize=True, got a "
                         f"{type(initial_state).__name__} of {len(initial_state)}")
    kv, z = initial_state
    if z is not None and len(shapes[0]) == 4:
        N = len(sequences.cu_seqlens) - 1 if sequences.cu_seqlens is not None else shapes[0][0]
        want = (N, 1, shapes[0][2], shapes[0][3])
        got = tuple(z.shape) if hasattr(z, "shape") else type(z).__name__
        if got != want:
            raise ValueError(f"flat: initial_state: expected the pair's key sum z [N, 1, H, K] = {list(want)} with "
                             f"normalize=True, got {list(got) if isinstance(got, tuple) else got}")
    return kv, z


def norm_gate(xp, x, g, weight, bias, activation, residual, prenorm, residual_in_fp32, eps, norm_before_gate, kernel):
    """rms_norm_gated in either framework (flat.torch's docstring): kernel(x, g, weight, activation,
    norm_before_gate, eps) on x (x + residual) and g, the bias added around it. xp: float32(x),
    cast_like(x, y), activations."""
    activation = norm_activation(activation)
    if bias is not None and tuple(bias.shape) != tuple(weight.shape):
        raise ValueError(f"flat: bias: expected weight's shape {list(weight.shape)}, got {list(bias.shape)}")
    if residual is not None and tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"flat: residual: expected x's shape {list(x.shape)}, got {list(residual.shape)}")
    given, residual_out = x, None
    if residual is not None:
        summed = xp.float32(x) + xp.float32(residual)
        residual_out = xp.cast_like(summed, residual)
        x, g = summed, (None if g is None else xp.float32(g))
    elif prenorm:
        residual_out = xp.float32(x) if residual_in_fp32 else x
    y = kernel(x, g, weight, activation, bool(norm_before_gate), float(eps))
    if bias is not None:
        b = xp.float32(bias)
        if g is not None and norm_before_gate:
            b = b * xp.activations[activation](xp.float32(g))
        y = xp.float32(y) + b
    y = xp.cast_like(y, given)
    return (y, residual_out) if prenorm else y
