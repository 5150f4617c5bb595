"""The small language models flat.train trains: token embedding, ``layers`` blocks of
(RMSNorm, token mixer, residual; RMSNorm, SwiGLU MLP, residual), a final RMSNorm and the output
head. The mixer is a flat.nn layer of any variant, or causal softmax attention with rotary
positions as the baseline.

Every linear-attention mixer is sized to the same recurrent state, ``state_size`` floats per layer
(N K V), so a comparison across variants is at equal memory: ``mixer_config`` says how each
variant reaches it at a given width. Every mixer, softmax attention included, runs its q, k, v
through the same 4-tap short convolution, so that the comparison is between the token mixers
themselves.
"""

import math
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn import KERNELS, LAYERS, ShortConvolution
from ..nn.ops import Ops

SOFTMAX = "softmax"
MIXERS = tuple(LAYERS) + (SOFTMAX,)


def _exact(name: str, value: float) -> int:
    if value != int(value) or value < 1:
        raise ValueError(f"flat.train: {name} = {value} is not a whole number of at least 1")
    return int(value)


def mixer_config(variant: str, hidden_size: int, num_heads: int, state_size: int) -> dict:
    """The layer's keyword arguments at width hidden_size with num_heads heads (value heads for
    SLA; Mamba-2's heads are its own) and a recurrent state of state_size floats per layer.

    Keys are hidden_size / num_heads wide (K); values fill the state: V = state_size / (N K).
    Mamba-2: expand 2, head_dim P = K, state_size per head S = state / (H P) with H = 2 d / P.
    SLA: keys 4 K wide shared by 4 value heads (SLA-R4 at this width), the gate per K channels."""
    if variant == SOFTMAX:
        return dict(hidden_size=hidden_size, num_heads=num_heads)
    if hidden_size % num_heads:
        raise ValueError(f"flat.train: num_heads = {num_heads} must divide hidden_size = {hidden_size}")
    K = hidden_size // num_heads
    V = _exact(f"the value width state_size / (num_heads * K) = {state_size} / ({num_heads} * {K})",
               state_size / (num_heads * K))
    common = dict(hidden_size=hidden_size)
    if variant in ("la", "retnet", "gla"):
        return dict(common, num_heads=num_heads, expand_k=1.0, expand_v=V / K, use_short_conv=True)
    if variant == "deltanet":
        return dict(common, num_heads=num_heads, expand_k=1.0, expand_v=V / K)
    if variant == "mamba2":
        heads = 2 * hidden_size // K
        return dict(common, head_dim=K, expand=2,
                    state_size=_exact(f"Mamba-2's state per head state_size / (heads * head_dim) = {state_size} / "
                                      f"({heads} * {K})", state_size / (heads * K)))
    if variant in ("gated_deltanet", "kda", "gdn2"):
        return dict(common, num_heads=num_heads, head_dim=K, expand_v=V / K)
    if variant == "sla":
        key_heads = max(1, num_heads // 4)
        width = hidden_size // key_heads
        return dict(common, num_heads=key_heads, num_v_heads=4 * key_heads, head_dim=width,
                    expand_v=state_size / (4 * key_heads * width) / width, gate_group=max(1, width // 4))
    raise ValueError(f"flat.train: unknown variant '{variant}' (expected one of {', '.join(MIXERS)})")


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: Tensor) -> Tensor:
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def _rotary(x: Tensor) -> Tensor:
    """Rotary position embedding of x [B, H, T, D] (D even), base 10000."""
    T, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class SoftmaxAttention(nn.Module):
    """The baseline: causal multi-head softmax attention with rotary positions, its q, k, v through
    the short convolution as the other mixers' (its KV cache, not a fixed state, grows with the
    sequence)."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv_proj = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.qkv_conv1d = ShortConvolution(3 * hidden_size, 4)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, x: Tensor, initial_state=None, output_final_state: bool = False):
        B, T, d = x.shape
        qkv, _ = KERNELS.conv(self.qkv_proj(x), self.qkv_conv1d.weight.squeeze(1), activation="silu")
        q, k, v = qkv.view(B, T, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(_rotary(q), _rotary(k), v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, d)), None


class MLP(nn.Module):
    """SwiGLU, 4 d hidden units in two halves (gate and value)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        self.down_proj = nn.Linear(2 * hidden_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, value = self.gate_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * value)


class Block(nn.Module):
    def __init__(self, mixer: nn.Module, hidden_size: int):
        super().__init__()
        self.mixer_norm, self.mixer = RMSNorm(hidden_size), mixer
        self.mlp_norm, self.mlp = RMSNorm(hidden_size), MLP(hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.mixer_norm(x))[0]
        return x + self.mlp(self.mlp_norm(x))


class LanguageModel(nn.Module):
    """Embedding, ``layers`` blocks with a ``variant`` mixer, final norm, output head: tokens [B, T]
    to logits [B, T, vocab_size]. ``precision`` and ``ops``: the linear-attention mixers' (flat.nn's
    precision= and ops=; ``flat.nn.context_parallel(group)`` splits every sequence along T across a
    group, each rank passing its share of the tokens, which the token-wise rest of the model takes
    as it is)."""

    def __init__(self, variant: str, vocab_size: int, hidden_size: int, layers: int, num_heads: int,
                 state_size: int, precision: str = "exact", ops: Union[str, Ops] = "kernels"):
        super().__init__()
        config = mixer_config(variant, hidden_size, num_heads, state_size)
        if variant == SOFTMAX and ops != "kernels":
            raise ValueError("flat.train: ops is for the linear-attention mixers; softmax attention runs on whole "
                             "sequences (each token attends to every earlier one, at rotary positions counted from "
                             "the sequence's start)")
        if variant != SOFTMAX:
            config.update(precision=precision, ops=ops)
        mixer = SoftmaxAttention if variant == SOFTMAX else LAYERS[variant]
        self.variant = variant
        self.embeddings = nn.Embedding(vocab_size, hidden_size)
        self.blocks = nn.ModuleList(Block(mixer(**config), hidden_size) for _ in range(layers))
        self.norm = RMSNorm(hidden_size)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)
        nn.init.normal_(self.embeddings.weight, std=1.0 / math.sqrt(hidden_size))

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embeddings(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def state_floats(model: LanguageModel) -> Optional[int]:
    """The recurrent state per layer in floats (N K V), None for softmax attention."""
    if model.variant == SOFTMAX:
        return None
    return int(model.blocks[0].mixer.state_pool(1).recurrent[0].numel())
