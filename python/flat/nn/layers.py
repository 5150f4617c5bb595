"""Token mixers for every variant, as PyTorch modules with the hyperparameters and parameter names of
FLA's layers (fla.layers) where they exist, and of the seeds for GDN-2 and SLA.

Every layer maps ``x [B, T, hidden_size]`` to ``(o [B, T, hidden_size], state)``. Its pipeline:

1. one fused input projection: the first-stage projections (``q_proj``, ``k_proj``, ``v_proj``,
   the gates' and the output gate's first stage, ``b_proj``) are one matrix product over their
   concatenated weights, and every later step reads a column block of its output in place;
2. the short convolution (``q_conv1d``, ``k_conv1d``, ``v_conv1d``; Mamba-2's ``conv1d``) on the
   q, k, v column block as one call, with SiLU;
3. the gates from their blocks (GLA's low-rank ``gk_proj``, Mamba-2's and Gated DeltaNet's
   ``dt``/``A_log``, KDA's ``f_proj``, the write strength ``beta``), in float32;
4. the recurrence on q, k, v read as strided views of the convolution's output;
5. the fused output norm and gate (``o_norm``; ``g_norm_swish_gate`` or ``g_norm`` for GLA and RetNet;
   Mamba-2's ``norm``), then ``o_proj``.

``initial_state`` / ``output_final_state`` carry a :class:`flat.nn.State` (the recurrent state
and the convolution's last inputs) between calls, for chunked prefill and decoding. ``cu_seqlens``
([num_seqs + 1] offsets, B = 1) packs sequences of different lengths along T, each with its own
state (``State`` rows per sequence), as FLA's layers take it. For serving, ``initial_state`` may
be a pool of states (``state_pool(P)``: a ``State`` of P rows, the recurrent and the convolution's
pools) addressed by ``initial_state_indices`` (the rows sequences start from),
``final_state_indices`` (where their final states go) and ``token_state_indices`` (where the state
after each token goes, for speculative decoding), as flat.torch takes them: with the last two
both pools are updated in place and returned, ``(o, initial_state)``, for inference (no
gradient), all or nothing: a refused call leaves both pools unchanged. ``ops`` picks the kernels
(``"kernels"``) or the plain-PyTorch reference (``"reference"``, any dtype; the tests run a
float64 copy of each layer with it). The recurrence's options a caller may choose are keywords of
every layer (``KERNEL_OPTIONS``: flat.torch's ``chunk_size``, ``solve``, ``precision``,
``check_values``), checked when the layer is built and passed to each call; the library's default
for any left out (``precision="exact"``; docs/algorithm.md, "Precision").
"""

import math
import warnings
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _api, _args
from .._args import Sequences
from .ops import State, kernel_options_of, ops_named


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"flat.nn: {message}")


def _divides(name: str, value: int, by_name: str, by: int) -> None:
    _check(by > 0 and value % by == 0, f"{by_name} = {by} must divide {name} = {value}")


def _scratch_rows(indices: Optional[Tensor], rows: int, first: int) -> Tuple[Optional[Tensor], Tensor]:
    """An index array of a pool of `rows` rows renumbered to a scratch's: the entries naming a row
    (0 to rows - 1), in order, as first, first + 1, ...; the others (-1, or out of range, which the
    recurrence refuses on the pool itself) as -1. Returns it, of the array's dtype and shape so that
    flat.torch judges it as the array, and the pool rows its entries name [count] int64."""
    if not isinstance(indices, Tensor):  # None, or what flat.torch refuses by name before any work
        return indices, torch.empty(0, dtype=torch.long)
    flat = indices.reshape(-1)
    named = (flat >= 0) & (flat < rows)
    renumbered = torch.where(named, first + named.long().cumsum(0) - 1, -1)
    return renumbered.to(indices.dtype).view(indices.shape), flat[named].long()


class _ConvStage(NamedTuple):
    """A pool-writing call's convolution, staged so that the layer call is all or nothing across its
    two pools. The convolution writes its states in place, and runs before the recurrence has
    checked its own inputs (a row it reads, its pool, its gates); so it runs on `scratch`, a copy
    of the rows the sequences read then of those they write [R + Wr, C, W-1], through `sequences`
    renumbered to it, and commit() copies the written rows to the pool's `rows` [Wr] once the
    recurrence has accepted the call. Copies of a conv row, C (W-1) floats per state: small next
    to the recurrent state the same call reads and writes."""

    pool: Tensor
    scratch: Tensor
    sequences: Sequences
    rows: Tensor

    @staticmethod
    def of(pool: Tensor, sequences: Sequences) -> "_ConvStage":
        P = pool.shape[0]
        reads, read_rows = _scratch_rows(sequences.initial_state_indices, P, 0)
        finals, final_rows = _scratch_rows(sequences.final_state_indices, P, len(read_rows))
        tokens, token_rows = _scratch_rows(sequences.token_state_indices, P, len(read_rows) + len(final_rows))
        rows = torch.cat([final_rows, token_rows])
        # One gather of the rows read, then of those written (one copy, where a fresh tensor for the
        # written rows joined to the rows read costs two); it keeps the pool's requires_grad, so
        # flat.torch refuses a pool needing a gradient as it would the pool itself.
        scratch = pool.index_select(0, torch.cat([read_rows, rows]))
        return _ConvStage(pool, scratch, Sequences(sequences.cu_seqlens, reads, finals, tokens), rows)

    def commit(self) -> None:
        self.pool.index_copy_(0, self.rows, self.scratch[self.scratch.shape[0] - len(self.rows):])


class ShortConvolution(nn.Module):
    """The parameters of a depthwise causal convolution, named and shaped as ``nn.Conv1d``'s (FLA's
    ShortConvolution): ``weight [C, 1, W]``, ``bias [C]`` or None. The layer runs several of them as
    one call of the kernel."""

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False):
        super().__init__()
        self.hidden_size, self.kernel_size = hidden_size, kernel_size
        self.weight = nn.Parameter(torch.empty(hidden_size, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Conv1d's initialisation
        if self.bias is not None:
            bound = 1 / math.sqrt(kernel_size)
            nn.init.uniform_(self.bias, -bound, bound)


class FusedRMSNormGated(nn.Module):
    """The output norm and gate (FLA's FusedRMSNormGated): ``x / rms(x) * weight * act(g)`` over the
    last axis, or with ``norm_before_gate=False`` (Mamba-2) the gate applied first; ``g=None`` gives
    a plain RMSNorm. ``weight [groups * hidden_size]`` (FLA's Mamba-2 norm's with ``groups`` groups
    of ``hidden_size`` channels, each normalised alone), a parameter; with
    ``elementwise_affine=False`` ones, not a parameter (FLA's norms then have no weight)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, activation: str = "silu", norm_before_gate: bool = True,
                 groups: int = 1, elementwise_affine: bool = True):
        super().__init__()
        self.hidden_size, self.eps, self.activation = hidden_size, eps, activation
        self.norm_before_gate, self.groups = norm_before_gate, groups
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(groups * hidden_size))
        else:
            self.register_buffer("weight", torch.ones(groups * hidden_size), persistent=False)

    def forward(self, x: Tensor, g: Optional[Tensor] = None, ops: str = "kernels") -> Tensor:
        weight = self.weight if self.groups == 1 else self.weight.view(self.groups, self.hidden_size)
        return ops_named(ops).norm(x, g, weight, activation=self.activation, eps=self.eps,
                                   norm_before_gate=self.norm_before_gate)


class _Mixer(nn.Module):
    """The pipeline every layer shares. A subclass sets ``variant``, builds its modules, and says
    which projections read x (``_projections``), how their output splits into named column
    blocks (``_blocks``; "conv" the convolution's input), which convolutions run on that block
    (``_convs``), and how the blocks become the recurrence's inputs (``_inputs``) and its output
    the layer's (``_output``)."""

    variant: str = ""

    def __init__(self, ops: str, layer_idx: Optional[int] = None, kwargs: Optional[dict] = None):
        super().__init__()
        ops_named(ops)
        self.ops = ops
        kwargs = {} if kwargs is None else kwargs
        # The recurrence's options the layer's caller chose (those of KERNEL_OPTIONS its variant
        # takes), checked once here and passed to every call (the reference ops compute exactly
        # whatever they are).
        self.kernel_options = {name: kwargs.pop(name) for name in kernel_options_of(self.variant) if name in kwargs}
        try:
            _args.checked_options("forward", _api.options(self.kernel_options)._asdict())
        except ValueError as e:
            raise ValueError(f"flat.nn.{type(self).__name__}: {str(e).removeprefix('flat: ')}") from None
        # FLA's layers take their index in the model (for its cache) and ignore keyword arguments they
        # do not know; so do these, saying which they ignore.
        self.layer_idx = layer_idx
        if kwargs:
            warnings.warn(f"flat.nn.{type(self).__name__}: ignoring {', '.join(sorted(kwargs))} (not hyperparameters "
                          "of this layer)", stacklevel=3)

    # -- what a subclass provides ---------------------------------------------------------------

    def _projections(self) -> List[nn.Linear]:
        raise NotImplementedError

    def _blocks(self) -> List[Tuple[str, int]]:
        raise NotImplementedError

    def _convs(self) -> List[ShortConvolution]:
        return []

    def _out_proj(self) -> nn.Linear:
        return self.o_proj

    def _inputs(self, x: Tensor, blocks: Dict[str, Tensor]) -> dict:
        """The recurrence's arguments (q, k, v, g, beta, b, w, scale, gate_group,
        use_qk_l2norm_in_kernel) from the blocks, "conv" replaced by the convolution's output."""
        raise NotImplementedError

    def _output(self, o: Tensor, x: Tensor, blocks: Dict[str, Tensor]) -> Tensor:
        """The norm and gate on the recurrence's output o [B, T, N, V], flattened to [B, T, N V]."""
        raise NotImplementedError

    def _state_dims(self) -> Tuple[int, int, int]:
        """N, K, V of the recurrent state [B, N, K, V]."""
        raise NotImplementedError

    # -- the pipeline ---------------------------------------------------------------------------

    def state_pool(self, size: int, dtype: torch.dtype = torch.float32) -> State:
        """A pool of `size` zero states for serving: State(recurrent [size, N, K, V], conv
        [size, C, W-1] or None without a convolution), float32 as the kernels keep states (float64
        for a float64 layer on the reference ops)."""
        N, K, V = self._state_dims()
        conv = self._conv_state_dims()
        return State(torch.zeros(size, N, K, V, dtype=dtype),
                     None if conv is None else torch.zeros((size,) + conv, dtype=dtype))

    def _conv_state_dims(self) -> Optional[Tuple[int, int]]:
        """C, W-1 of the convolution's state [B, C, W-1], None without a convolution."""
        convs = self._convs()
        return (sum(c.hidden_size for c in convs), convs[0].kernel_size - 1) if convs else None

    def forward(self, hidden_states: Tensor, initial_state: Optional[State] = None,
                output_final_state: bool = False, cu_seqlens: Optional[Tensor] = None, *,
                initial_state_indices: Optional[Tensor] = None, final_state_indices: Optional[Tensor] = None,
                token_state_indices: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                **kwargs) -> Tuple[Tensor, Optional[State]]:
        """(o, state): o [B, T, hidden_size]; state the final State with output_final_state (or FLA's
        use_cache=True), else None; with final_state_indices or token_state_indices, the pool
        initial_state updated in place. FLA's layers return (o, None, past_key_values) instead: the
        state is passed in and out explicitly here, with no cache object."""
        output_final_state = bool(output_final_state) or bool(kwargs.pop("use_cache", False))
        kwargs.pop("output_attentions", None)  # FLA's: no attention weights either way
        _check(attention_mask is None, "attention_mask: padding masks are not supported; pack the sequences along T "
               f"with cu_seqlens, got a mask {list(attention_mask.shape) if attention_mask is not None else ''}")
        _check(kwargs.pop("past_key_values", None) is None, "past_key_values: no cache object; pass the State as "
               "initial_state and take it back with output_final_state=True, got a past_key_values")
        if kwargs:
            warnings.warn(f"flat.nn.{type(self).__name__}.forward: ignoring {', '.join(sorted(kwargs))}", stacklevel=2)
        _check(hidden_states.dim() == 3, f"hidden_states: expected [B, T, hidden_size], got {list(hidden_states.shape)}")
        ops = ops_named(self.ops)
        sequences = Sequences(cu_seqlens, initial_state_indices, final_state_indices, token_state_indices)
        conv_pool = None if initial_state is None else initial_state.conv
        stage = None
        if sequences.writes_pool and conv_pool is not None and self._convs():
            expected = tuple(initial_state.recurrent.shape[:1]) + self._conv_state_dims()
            _check(tuple(conv_pool.shape) == expected,
                   f"initial_state: expected conv [P, C, W-1] = {list(expected)} beside recurrent "
                   f"{list(initial_state.recurrent.shape)} (a row of each pool per sequence slot), got conv "
                   f"{list(conv_pool.shape)}")
            stage = _ConvStage.of(conv_pool, sequences)
        fused = self._projections()
        weight = torch.cat([p.weight for p in fused]) if len(fused) > 1 else fused[0].weight
        bias = None
        if any(p.bias is not None for p in fused):
            bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.out_features) for p in fused])
        projection = F.linear(hidden_states, weight, bias)  # [B, T, sum of the blocks' widths]
        # Views of the projection's column blocks; split's backward writes their gradients into one
        # buffer, where a view per block would zero a projection-sized gradient for each.
        names, widths = zip(*self._blocks())
        blocks = dict(zip(names, projection.split(list(widths), dim=-1)))

        conv_state = None
        convs = self._convs()
        if convs:
            conv_weight = torch.cat([c.weight.squeeze(1) for c in convs])
            conv_bias = None
            if any(c.bias is not None for c in convs):
                conv_bias = torch.cat([c.bias if c.bias is not None else c.weight.new_zeros(c.hidden_size)
                                       for c in convs])
            blocks["conv"], conv_state = ops.conv(
                blocks["conv"], conv_weight, conv_bias, conv_pool if stage is None else stage.scratch,
                output_final_state, "silu", **(sequences if stage is None else stage.sequences)._asdict())
        args = self._inputs(hidden_states, blocks)
        q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
        o, recurrent = ops.recurrence(self.variant, q, k, v, **args, **self.kernel_options,
                                      initial_state=None if initial_state is None else initial_state.recurrent,
                                      output_final_state=output_final_state, **sequences._asdict())
        if stage is not None:
            stage.commit()
        o = self._out_proj()(self._output(o, hidden_states, blocks))
        if sequences.writes_pool:
            return o, initial_state
        return o, (State(recurrent, conv_state) if output_final_state else None)


def _heads_view(x: Tensor, heads: int) -> Tensor:
    """A [B, T, heads * D] block as [B, T, heads, D], in place."""
    B, T, width = x.shape
    return x.view(B, T, heads, width // heads)


def _feature_map(name: Optional[str], x: Tensor) -> Tensor:
    if name in (None, "identity"):
        return x
    if name == "elu":
        return F.elu(x) + 1
    if name == "relu":
        return F.relu(x)
    raise ValueError(f"flat.nn: feature_map: expected None, 'identity', 'elu' or 'relu', got '{name}'")


def _dt_bias(size: int, dt_min: float = 0.001, dt_max: float = 0.1, dt_floor: float = 1e-4) -> Tensor:
    """Mamba's time-step bias: softplus^-1 of time steps log-uniform in [dt_min, dt_max]."""
    dt = torch.exp(torch.rand(size) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=dt_floor)
    return dt + torch.log(-torch.expm1(-dt))


def _a_log(size: int) -> Tensor:
    """log A for A uniform in [1, 16] (FLA's Gated DeltaNet and KDA)."""
    return torch.log(torch.empty(size).uniform_(1, 16))


class _QKVMixer(_Mixer):
    """The layers whose q, k, v come from q_proj, k_proj, v_proj, optionally through
    q_conv1d / k_conv1d / v_conv1d, with an output norm and gate after the recurrence."""

    def _head_sizes(self, hidden_size: int, expand_k: float, expand_v: float, num_heads: int,
                    num_kv_heads: Optional[int]) -> Tuple[int, int]:
        """Checks and sets the head counts and widths of FLA's expand_k / expand_v layers; returns
        (key_dim, value_dim)."""
        num_kv_heads = num_kv_heads or num_heads
        key_dim, value_dim = int(hidden_size * expand_k), int(hidden_size * expand_v)
        _divides("key_dim", key_dim, "num_heads", num_heads)
        _divides("value_dim", value_dim, "num_heads", num_heads)
        _divides("num_heads", num_heads, "num_kv_heads", num_kv_heads)
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_k_dim, self.head_v_dim = key_dim // num_heads, value_dim // num_heads
        return key_dim, value_dim

    def _qkv_modules(self, hidden_size: int, key_dim: int, key_dim_kv: int, value_dim_kv: int, use_short_conv: bool,
                     conv_size: int, conv_bias: bool, qkv_bias: bool = False) -> None:
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, key_dim_kv, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, value_dim_kv, bias=qkv_bias)
        self.use_short_conv = use_short_conv
        if use_short_conv:
            self.q_conv1d = ShortConvolution(key_dim, conv_size, conv_bias)
            self.k_conv1d = ShortConvolution(key_dim_kv, conv_size, conv_bias)
            self.v_conv1d = ShortConvolution(value_dim_kv, conv_size, conv_bias)

    def _extra(self) -> List[Tuple[str, nn.Linear]]:
        """The projections after q, k, v that read x, by block name."""
        raise NotImplementedError

    def _projections(self) -> List[nn.Linear]:
        return [self.q_proj, self.k_proj, self.v_proj] + [linear for _, linear in self._extra()]

    def _qkv_widths(self) -> List[int]:
        return [self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features]

    def _blocks(self) -> List[Tuple[str, int]]:
        qkv = [("conv", sum(self._qkv_widths()))] if self.use_short_conv else list(
            zip(("q", "k", "v"), self._qkv_widths()))
        return qkv + [(name, linear.out_features) for name, linear in self._extra()]

    def _convs(self) -> List[ShortConvolution]:
        return [self.q_conv1d, self.k_conv1d, self.v_conv1d] if self.use_short_conv else []

    def _state_dims(self) -> Tuple[int, int, int]:
        return self.num_heads, self.head_k_dim, self.head_v_dim

    def _qkv(self, blocks: Dict[str, Tensor], heads: Tuple[int, int, int]) -> List[Tensor]:
        """q, k, v as [B, T, H, D] views of the convolution's output, or of the projection."""
        parts = blocks["conv"].split(self._qkv_widths(), dim=-1) if self.use_short_conv else (
            blocks["q"], blocks["k"], blocks["v"])
        return [_heads_view(p, h) for p, h in zip(parts, heads)]


class LinearAttention(_QKVMixer):
    """Linear attention (variant ``la``; FLA's LinearAttention with an elementwise feature map):
    ``H_t = H_{t-1} + phi(k_t) v_t^T``, ``o_t = H_t^T phi(q_t) / sqrt(K)``, an RMSNorm per head,
    ``o_proj``. ``feature_map``: ``"elu"`` (elu + 1), ``"relu"`` or ``"identity"``."""

    variant = "la"

    def __init__(self, hidden_size: int = 1024, expand_k: float = 1.0, expand_v: float = 1.0, num_heads: int = 8,
                 num_kv_heads: Optional[int] = None, feature_map: str = "elu", use_short_conv: bool = False,
                 conv_size: int = 4, conv_bias: bool = False, norm_eps: float = 1e-5, ops: str = "kernels",
                 layer_idx: Optional[int] = None, **kwargs):
        super().__init__(ops, layer_idx, kwargs)
        key_dim, value_dim = self._head_sizes(hidden_size, expand_k, expand_v, num_heads, num_kv_heads)
        _feature_map(feature_map, torch.zeros(1))
        self.feature_map = feature_map
        self._qkv_modules(hidden_size, key_dim, self.head_k_dim * self.num_kv_heads,
                          self.head_v_dim * self.num_kv_heads, use_short_conv, conv_size, conv_bias)
        self.norm = FusedRMSNormGated(self.head_v_dim, norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def _extra(self):
        return []

    def _inputs(self, x, blocks):
        q, k, v = self._qkv(blocks, (self.num_heads, self.num_kv_heads, self.num_kv_heads))
        return dict(q=_feature_map(self.feature_map, q), k=_feature_map(self.feature_map, k), v=v)

    def _output(self, o, x, blocks):
        return self.norm(o, None, self.ops).flatten(2)


class _GatedNormMixer(_QKVMixer):
    """RetNet and GLA: an RMSNorm per head then, with ``use_output_gate``, the gate ``g_proj``
    through ``gate_fn``, the norm under FLA's name: ``g_norm_swish_gate`` where FLA fuses the two
    (``gate_fn="swish"``, ``fuse_norm``, ``use_output_gate``), ``g_norm`` otherwise (FLA's norm, then
    the product with ``gate_fn(g)``: the same computation, fused here either way)."""

    def _output_gate(self, hidden_size: int, value_dim: int, use_output_gate: bool, gate_fn: str, fuse_norm: bool,
                     elementwise_affine: bool, norm_eps: float) -> None:
        self.use_output_gate = use_output_gate
        if use_output_gate:
            self.g_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.norm_name = "g_norm_swish_gate" if gate_fn == "swish" and fuse_norm and use_output_gate else "g_norm"
        self.add_module(self.norm_name, FusedRMSNormGated(self.head_v_dim, norm_eps, gate_fn,
                                                          elementwise_affine=elementwise_affine))

    def _gate_blocks(self) -> List[Tuple[str, nn.Linear]]:
        return [("gate", self.g_proj)] if self.use_output_gate else []

    def _output(self, o, x, blocks):
        gate = _heads_view(blocks["gate"], self.num_heads) if self.use_output_gate else None
        return getattr(self, self.norm_name)(o, gate, self.ops).flatten(2)


class MultiScaleRetention(_GatedNormMixer):
    """RetNet (variant ``retnet``; FLA's MultiScaleRetention without the rotary embedding): a fixed
    decay ``gamma_h = 1 - 2^(-5-h)`` per head, the output norm and gate (``g_proj``, SiLU by default),
    ``o_proj``."""

    variant = "retnet"

    def __init__(self, hidden_size: int = 1024, expand_k: float = 1.0, expand_v: float = 2.0, num_heads: int = 8,
                 num_kv_heads: Optional[int] = None, use_short_conv: bool = False, conv_size: int = 4,
                 conv_bias: bool = False, use_output_gate: bool = True, gate_fn: str = "swish",
                 elementwise_affine: bool = True, norm_eps: float = 1e-5, fuse_norm: bool = True,
                 ops: str = "kernels", layer_idx: Optional[int] = None, **kwargs):
        super().__init__(ops, layer_idx, kwargs)
        key_dim, value_dim = self._head_sizes(hidden_size, expand_k, expand_v, num_heads, num_kv_heads)
        self._qkv_modules(hidden_size, key_dim, self.head_k_dim * self.num_kv_heads,
                          self.head_v_dim * self.num_kv_heads, use_short_conv, conv_size, conv_bias)
        self._output_gate(hidden_size, value_dim, use_output_gate, gate_fn, fuse_norm, elementwise_affine, norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def _extra(self):
        return self._gate_blocks()

    def _inputs(self, x, blocks):
        q, k, v = self._qkv(blocks, (self.num_heads, self.num_kv_heads, self.num_kv_heads))
        # log gamma_h = log(1 - 2^(-5-h)), float32 (float64 for a float64 layer).
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        log_gamma = torch.log1p(-torch.pow(2.0, -5.0 - torch.arange(self.num_heads, dtype=dtype)))
        return dict(q=q, k=k, v=v, g=log_gamma)


class GatedLinearAttention(_GatedNormMixer):
    """GLA (variant ``gla``; FLA's GatedLinearAttention): a per-channel forget gate from a low-rank
    ``gk_proj``, ``logsigmoid(.) / gate_logit_normalizer``, the output norm and gate (``g_proj``, SiLU
    by default), ``o_proj``."""

    variant = "gla"

    def __init__(self, hidden_size: int = 1024, expand_k: float = 0.5, expand_v: float = 1.0, num_heads: int = 4,
                 num_kv_heads: Optional[int] = None, use_short_conv: bool = False, conv_size: int = 4,
                 conv_bias: bool = False, use_output_gate: bool = True, gate_fn: str = "swish",
                 elementwise_affine: bool = True, norm_eps: float = 1e-5, gate_logit_normalizer: int = 16,
                 gate_low_rank_dim: int = 16, clamp_min: Optional[float] = None, fuse_norm: bool = True,
                 ops: str = "kernels", layer_idx: Optional[int] = None, **kwargs):
        super().__init__(ops, layer_idx, kwargs)
        key_dim, value_dim = self._head_sizes(hidden_size, expand_k, expand_v, num_heads, num_kv_heads)
        self.gate_logit_normalizer, self.clamp_min = gate_logit_normalizer, clamp_min
        key_dim_kv = self.head_k_dim * self.num_kv_heads
        self._qkv_modules(hidden_size, key_dim, key_dim_kv, self.head_v_dim * self.num_kv_heads, use_short_conv,
                          conv_size, conv_bias)
        self.gk_proj = nn.Sequential(nn.Linear(hidden_size, gate_low_rank_dim, bias=False),
                                     nn.Linear(gate_low_rank_dim, key_dim_kv, bias=True))
        self._output_gate(hidden_size, value_dim, use_output_gate, gate_fn, fuse_norm, elementwise_affine, norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def _extra(self):
        return self._gate_blocks() + [("forget", self.gk_proj[0])]

    def _inputs(self, x, blocks):
        q, k, v = self._qkv(blocks, (self.num_heads, self.num_kv_heads, self.num_kv_heads))
        gk = F.logsigmoid(self.gk_proj[1](blocks["forget"]).float()) / self.gate_logit_normalizer
        if self.clamp_min is not None:
            gk = gk.clamp_min(self.clamp_min)
        return dict(q=q, k=k, v=v, g=_heads_view(gk, self.num_kv_heads))


class _DeltaMixer(_QKVMixer):
    """The delta-rule layers: q, k, v through q_conv1d / k_conv1d / v_conv1d with SiLU (or SiLU
    alone without them), q and k L2-normalised in the kernel, beta = sigmoid(b_proj(x)) (twice that
    with allow_neg_eigval), and an output norm ``o_norm`` gated by ``g_proj`` when the layer has
    one."""

    def _delta_inputs(self, blocks, heads, beta_logits: Optional[Tensor]) -> dict:
        """q, k, v and beta [B, T, Hb] from its logits (all ones without them)."""
        q, k, v = self._qkv(blocks, heads)
        if not self.use_short_conv:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        if beta_logits is None:
            beta = q.new_ones(q.shape[:2] + (heads[0],), dtype=torch.float32)
        else:
            beta = torch.sigmoid(beta_logits.float()) * (2 if self.allow_neg_eigval else 1)
        return dict(q=q, k=k, v=v, beta=beta, use_qk_l2norm_in_kernel=True)


class DeltaNet(_DeltaMixer):
    """DeltaNet (variant ``deltanet``; FLA's DeltaNet with qk_activation silu and qk_norm l2):
    ``H_t = (I - beta_t k_t k_t^T) H_{t-1} + beta_t k_t v_t^T``; ``o_norm`` an RMSNorm, or with
    ``use_gate`` gated by ``g_proj`` (SiLU)."""

    variant = "deltanet"

    def __init__(self, hidden_size: int = 1024, expand_k: float = 1.0, expand_v: float = 1.0, num_heads: int = 4,
                 use_beta: bool = True, use_gate: bool = False, use_short_conv: bool = True, conv_size: int = 4,
                 conv_bias: bool = False, allow_neg_eigval: bool = False, norm_eps: float = 1e-5,
                 ops: str = "kernels", layer_idx: Optional[int] = None,
                 **kwargs):
        super().__init__(ops, layer_idx, kwargs)
        key_dim, value_dim = int(hidden_size * expand_k), int(hidden_size * expand_v)
        _divides("key_dim", key_dim, "num_heads", num_heads)
        _divides("value_dim", value_dim, "num_heads", num_heads)
        self.num_heads, self.use_beta, self.use_gate = num_heads, use_beta, use_gate
        self.allow_neg_eigval = allow_neg_eigval
        self.head_k_dim, self.head_v_dim = key_dim // num_heads, value_dim // num_heads
        self._qkv_modules(hidden_size, key_dim, key_dim, value_dim, use_short_conv, conv_size, conv_bias)
        if use_beta:
            self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.o_norm = FusedRMSNormGated(self.head_v_dim, norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def _extra(self):
        return ([("beta", self.b_proj)] if self.use_beta else []) + ([("gate", self.g_proj)] if self.use_gate else [])

    def _inputs(self, x, blocks):
        H = self.num_heads
        return self._delta_inputs(blocks, (H, H, H), blocks["beta"] if self.use_beta else None)

    def _output(self, o, x, blocks):
        gate = _heads_view(blocks["gate"], self.num_heads) if self.use_gate else None
        return self.o_norm(o, gate, self.ops).flatten(2)


class _GatedDeltaMixer(_DeltaMixer):
    """Gated DeltaNet, KDA, GDN-2 and SLA: the forget gate ``-exp(A_log) * softplus(a + dt_bias)``
    per head (Gated DeltaNet) or per channel or group of channels (KDA, GDN-2, SLA; ``a`` from the
    low-rank ``f_proj``), in float32."""

    def _state_dims(self) -> Tuple[int, int, int]:  # num_v_heads value heads, num_heads or more
        return self.num_v_heads, self.head_k_dim, self.head_v_dim

    def _decay(self, a: Tensor, heads: Optional[int] = None) -> Tensor:
        """g [B, T, H] (one value per head, Gated DeltaNet's: heads None) from a [B, T, H], or
        [B, T, heads, width] (a value per channel or group of channels, width 1 included) from a
        [B, T, heads * width]."""
        a = a.float() + self.dt_bias.float()
        A = torch.exp(self.A_log.float())
        if heads is None:
            return -A * F.softplus(a)
        return -A.view(heads, 1) * F.softplus(_heads_view(a, heads))


class GatedDeltaNet(_GatedDeltaMixer):
    """Gated DeltaNet (variant ``gated_deltanet``; FLA's GatedDeltaNet): a scalar forget gate per
    head from ``a_proj``, ``A_log`` and ``dt_bias``; beta from ``b_proj``; values ``expand_v`` times
    as wide as keys; ``num_v_heads`` value heads over ``num_heads`` query-key heads; ``o_norm`` gated
    by ``g_proj`` (SiLU)."""

    variant = "gated_deltanet"

    def __init__(self, hidden_size: int = 2048, expand_v: float = 2, head_dim: int = 256, num_heads: int = 6,
                 num_v_heads: Optional[int] = None, use_gate: bool = True, use_short_conv: bool = True,
                 allow_neg_eigval: bool = False, conv_size: int = 4, conv_bias: bool = False, norm_eps: float = 1e-5,
                 ops: str = "kernels", layer_idx: Optional[int] = None,
                 **kwargs):
        super().__init__(ops, layer_idx, kwargs)
        num_v_heads = num_v_heads or num_heads
        _divides("num_v_heads", num_v_heads, "num_heads", num_heads)
        self.num_heads, self.num_v_heads, self.use_gate = num_heads, num_v_heads, use_gate
        self.allow_neg_eigval = allow_neg_eigval
        self.head_k_dim, self.head_v_dim = head_dim, int(head_dim * expand_v)
        key_dim, value_dim = num_heads * head_dim, num_v_heads * self.head_v_dim
        self._qkv_modules(hidden_size, key_dim, key_dim, value_dim, use_short_conv, conv_size, conv_bias)
        self.a_proj = nn.Linear(hidden_size, num_v_heads, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_v_heads, bias=False)
        self.A_log = nn.Parameter(_a_log(num_v_heads))
        self.dt_bias = nn.Parameter(_dt_bias(num_v_heads))
        if use_gate:
            self.g_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.o_norm = FusedRMSNormGated(self.head_v_dim, norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def _extra(self):
        return [("forget", self.a_proj), ("beta", self.b_proj)] + ([("gate", self.g_proj)] if self.use_gate else [])

    def _inputs(self, x, blocks):
        args = self._delta_inputs(blocks, (self.num_heads, self.num_heads, self.num_v_heads), blocks["beta"])
        args["g"] = self._decay(blocks["forget"])
        return args

    def _output(self, o, x, blocks):
        gate = _heads_view(blocks["gate"], self.num_v_heads) if self.use_gate else None
        return self.o_norm(o, gate, self.ops).flatten(2)


class KimiDeltaAttention(_GatedDeltaMixer):
    """Kimi Delta Attention (variant ``kda``; FLA's KimiDeltaAttention): a per-channel forget gate
    from the low-rank ``f_proj`` with ``A_log`` per head and ``dt_bias`` per channel; beta from
    ``b_proj``; ``o_norm`` gated by the low-rank ``g_proj`` through a sigmoid."""

    variant = "kda"

    def __init__(self, hidden_size: int = 2048, expand_v: float = 1, head_dim: int = 128, num_heads: int = 16,
                 num_v_heads: Optional[int] = None, use_short_conv: bool = True, allow_neg_eigval: bool = False,
                 conv_size: int = 4, conv_bias: bool = False, norm_eps: float = 1e-5, ops: str = "kernels",
                 layer_idx: Optional[int] = None, **kwargs):
        super().__init__(ops, layer_idx, kwargs)
        self._build(hidden_size, expand_v, head_dim, num_heads, num_v_heads, use_short_conv, allow_neg_eigval,
                    conv_size, conv_bias, norm_eps, gate_group=1, key_side_gates=False)

    def _build(self, hidden_size, expand_v, head_dim, num_heads, num_v_heads, use_short_conv, allow_neg_eigval,
               conv_size, conv_bias, norm_eps, gate_group, key_side_gates):
        """KDA's modules; with key_side_gates (SLA) the forget gate and beta per query-key head,
        shared by its value heads, instead of per value head."""
        num_v_heads = num_v_heads or num_heads
        _divides("num_v_heads", num_v_heads, "num_heads", num_heads)
        _divides("head_dim", head_dim, "gate_group", gate_group)
        self.num_heads, self.num_v_heads, self.gate_group = num_heads, num_v_heads, gate_group
        self.allow_neg_eigval = allow_neg_eigval
        self.head_k_dim, self.head_v_dim = head_dim, int(head_dim * expand_v)
        self.gate_heads = num_heads if key_side_gates else num_v_heads
        key_dim, value_dim = num_heads * head_dim, num_v_heads * self.head_v_dim
        gate_dim = self.gate_heads * head_dim // gate_group
        self._qkv_modules(hidden_size, key_dim, key_dim, value_dim, use_short_conv, conv_size, conv_bias)
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, gate_dim, bias=False))
        self.b_proj = nn.Linear(hidden_size, self.gate_heads, bias=False)
        self.A_log = nn.Parameter(_a_log(self.gate_heads))
        self.dt_bias = nn.Parameter(_dt_bias(gate_dim))
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, value_dim, bias=True))
        self.o_norm = FusedRMSNormGated(self.head_v_dim, norm_eps, activation="sigmoid")
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def _extra(self):
        return [("beta", self.b_proj), ("forget", self.f_proj[0]), ("gate", self.g_proj[0])]

    def _inputs(self, x, blocks):
        args = self._delta_inputs(blocks, (self.num_heads, self.num_heads, self.num_v_heads), blocks["beta"])
        args["g"] = self._decay(self.f_proj[1](blocks["forget"]), self.gate_heads)
        args["gate_group"] = self.gate_group
        return args

    def _output(self, o, x, blocks):
        gate = _heads_view(self.g_proj[1](blocks["gate"]), self.num_v_heads)
        return self.o_norm(o, gate, self.ops).flatten(2)


class SystolicLinearAttention(KimiDeltaAttention):
    """SLA (variant ``sla``; the SLA seed): KDA with wide keys (``head_dim`` 256) whose q, k,
    forget gate and beta are shared by ``num_v_heads / num_heads`` value heads (4 in SLA-R4), and
    the forget gate one value per ``gate_group`` (64) channels."""

    variant = "sla"

    def __init__(self, hidden_size: int = 2048, expand_v: float = 0.5, head_dim: int = 256, num_heads: int = 4,
                 num_v_heads: Optional[int] = 16, gate_group: int = 64, use_short_conv: bool = True,
                 allow_neg_eigval: bool = False, conv_size: int = 4, conv_bias: bool = False, norm_eps: float = 1e-5,
                 ops: str = "kernels", layer_idx: Optional[int] = None,
                 **kwargs):
        _Mixer.__init__(self, ops, layer_idx, kwargs)
        self._build(hidden_size, expand_v, head_dim, num_heads, num_v_heads, use_short_conv, allow_neg_eigval,
                    conv_size, conv_bias, norm_eps, gate_group=gate_group, key_side_gates=True)


class GatedDeltaNet2(_GatedDeltaMixer):
    """Gated DeltaNet-2 (variant ``gdn2``; the GDN-2 seed): KDA's per-channel forget gate, with an
    erase gate from ``b_proj`` (K per head) and a write gate from ``w_proj`` (V per head), both
    sigmoids, in place of beta; ``o_norm`` gated by the low-rank ``g_proj`` through a sigmoid."""

    variant = "gdn2"

    def __init__(self, hidden_size: int = 2048, expand_v: float = 1, head_dim: int = 128, num_heads: int = 16,
                 use_short_conv: bool = True, conv_size: int = 4, conv_bias: bool = False, norm_eps: float = 1e-5,
                 ops: str = "kernels", layer_idx: Optional[int] = None,
                 **kwargs):
        super().__init__(ops, layer_idx, kwargs)
        self.num_heads = self.num_v_heads = num_heads
        self.allow_neg_eigval = False
        self.head_k_dim, self.head_v_dim = head_dim, int(head_dim * expand_v)
        key_dim, value_dim = num_heads * head_dim, num_heads * self.head_v_dim
        self._qkv_modules(hidden_size, key_dim, key_dim, value_dim, use_short_conv, conv_size, conv_bias)
        self.f_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, key_dim, bias=False))
        self.b_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.w_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.A_log = nn.Parameter(_a_log(num_heads))
        self.dt_bias = nn.Parameter(_dt_bias(key_dim))
        self.g_proj = nn.Sequential(nn.Linear(hidden_size, self.head_v_dim, bias=False),
                                    nn.Linear(self.head_v_dim, value_dim, bias=True))
        self.o_norm = FusedRMSNormGated(self.head_v_dim, norm_eps, activation="sigmoid")
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def _extra(self):
        return [("erase", self.b_proj), ("write", self.w_proj), ("forget", self.f_proj[0]), ("gate", self.g_proj[0])]

    def _inputs(self, x, blocks):
        H = self.num_heads
        args = self._delta_inputs(blocks, (H, H, H), None)
        del args["beta"]
        args["b"] = _heads_view(torch.sigmoid(blocks["erase"].float()), H)
        args["w"] = _heads_view(torch.sigmoid(blocks["write"].float()), H)
        args["g"] = self._decay(self.f_proj[1](blocks["forget"]), H)
        return args

    def _output(self, o, x, blocks):
        gate = _heads_view(self.g_proj[1](blocks["gate"]), self.num_heads)
        return self.o_norm(o, gate, self.ops).flatten(2)


class Mamba2(_Mixer):
    """Mamba-2's SSD block (variant ``mamba2``; FLA's Mamba2): ``in_proj`` to the output gate z,
    ``x B C`` and the time steps; ``conv1d`` on ``x B C`` with SiLU; ``dt = softplus(dt + dt_bias)``,
    the gate ``-exp(A_log) dt`` per head, the values ``x dt``; B and C shared by the heads of each of
    ``n_groups`` groups; the skip ``D x``; ``norm`` gated by z before the norm, over each group's
    heads; ``out_proj``."""

    variant = "mamba2"

    def __init__(self, num_heads: Optional[int] = None, head_dim: int = 64, hidden_size: int = 2048,
                 state_size: int = 128, expand: int = 2, n_groups: int = 1, conv_kernel: int = 4,
                 use_conv_bias: bool = True, use_bias: bool = False, norm_eps: float = 1e-5,
                 dt_min: float = 0.001, dt_max: float = 0.1, dt_init_floor: float = 1e-4,
                 dt_limit: Tuple[float, float] = (0.0, float("inf")), ops: str = "kernels",
                 layer_idx: Optional[int] = None, **kwargs):
        super().__init__(ops, layer_idx, kwargs)
        intermediate = expand * hidden_size
        num_heads = num_heads or intermediate // head_dim
        _check(num_heads * head_dim == intermediate,
               f"num_heads * head_dim = {num_heads} * {head_dim} must equal expand * hidden_size = {intermediate}")
        _divides("num_heads", num_heads, "n_groups", n_groups)
        self.num_heads, self.head_dim, self.state_size, self.n_groups = num_heads, head_dim, state_size, n_groups
        self.intermediate_size, self.dt_limit = intermediate, dt_limit
        conv_dim = intermediate + 2 * n_groups * state_size
        self.in_proj = nn.Linear(hidden_size, intermediate + conv_dim + num_heads, bias=use_bias)
        self.conv1d = ShortConvolution(conv_dim, conv_kernel, use_conv_bias)
        self.dt_bias = nn.Parameter(_dt_bias(num_heads, dt_min, dt_max, dt_init_floor))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, num_heads + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(num_heads))
        self.norm = FusedRMSNormGated(intermediate // n_groups, norm_eps, norm_before_gate=False, groups=n_groups)
        self.out_proj = nn.Linear(intermediate, hidden_size, bias=use_bias)

    def _projections(self):
        return [self.in_proj]

    def _blocks(self):
        # in_proj's columns: the output gate z, x B C (the convolution's input), the time steps dt.
        return [("gate", self.intermediate_size), ("conv", self.conv1d.hidden_size), ("dt", self.num_heads)]

    def _convs(self):
        return [self.conv1d]

    def _out_proj(self) -> nn.Linear:
        return self.out_proj

    def _state_dims(self) -> Tuple[int, int, int]:
        return self.num_heads, self.state_size, self.head_dim

    def _inputs(self, x_in, blocks):
        I, H, GS = self.intermediate_size, self.num_heads, self.n_groups * self.state_size
        x, B, C = blocks["conv"].split([I, GS, GS], dim=-1)
        dt = F.softplus(blocks["dt"].float() + self.dt_bias.float())
        lo, hi = self.dt_limit
        if lo > 0.0 or hi < float("inf"):
            dt = dt.clamp(lo, hi)
        x = _heads_view(x, H)
        return dict(q=_heads_view(C, self.n_groups), k=_heads_view(B, self.n_groups),
                    v=(x * dt.unsqueeze(-1)).to(x.dtype), g=-torch.exp(self.A_log.float()) * dt, scale=1.0)

    def _output(self, o, x_in, blocks):
        I, H, G = self.intermediate_size, self.num_heads, self.n_groups
        x = _heads_view(blocks["conv"][..., :I], H)
        y = o + x * self.D.to(x.dtype).unsqueeze(-1)
        B, T = y.shape[:2]
        z = _heads_view(blocks["gate"], G)
        return self.norm(y.reshape(B, T, G, I // G), z, self.ops).reshape(B, T, I)
