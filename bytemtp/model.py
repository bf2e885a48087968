"""The byte transformer with n future-byte heads (Gloeckle et al. 2024), in pure single-device PyTorch.

A shared trunk turns byte ids into a state z; head k (k = 0..n_future-1 here, predicting the
byte k+1 positions ahead) turns z into its own state and, through a final RMSNorm and an
unembedding, into logits. `forward` returns the trunk state only; `head_state` and
`head_logits` apply one head, so the memory-efficient training step can run the heads one at a
time; `logits` runs everything and returns (B, T, K, V).

Heads: `transformer` heads are independent stacks of `head_layers` blocks on z; `causal` heads
run on the previous head's output state (head 0 on z), so head k sees head k-1, like
DeepSeek-V3's sequential modules; `linear` heads are one D x D matrix each. The unembedding is
one matrix per head (`replicated`) or one shared matrix.

The model is a pre-norm decoder: RMSNorm, rotary positions, SwiGLU (or GELU) feed-forward, and
attention through `scaled_dot_product_attention`. A `KVCache` holds keys and values of every
layer (trunk and heads) in preallocated tensors with one length pointer; rewinding rejected
drafts moves the pointer and reallocates nothing.

Legend: B batch, T time, K heads, V vocabulary, D width, H attention heads, E head size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bytemtp.config import ModelConfig
from bytemtp.vocab import VOCAB_SIZE


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (seq_len, head_dim // 2), in float32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x_BHTE: torch.Tensor, cos_TE: torch.Tensor, sin_TE: torch.Tensor) -> torch.Tensor:
    x1, x2 = x_BHTE.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos_TE - x2 * sin_TE, x1 * sin_TE + x2 * cos_TE), dim=-1)
    return rotated.type_as(x_BHTE)


class KVCache:
    """Keys and values of every layer for decoding, preallocated, with one length pointer.

    `length` positions are valid; a forward pass with the cache writes its T new positions at
    `length` and the caller advances the pointer (`ByteMTP.logits` does). `rewind(n)` forgets the
    newest n positions, which the next forward pass overwrites.
    """

    def __init__(self, *, n_layers: int, batch_size: int, max_len: int, n_heads: int,
                 head_dim: int, device: torch.device | str, dtype: torch.dtype):
        shape = (n_layers, batch_size, n_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0

    @classmethod
    def for_model(cls, model: ByteMTP, batch_size: int, max_len: int | None = None) -> KVCache:
        cfg = model.config
        param = model.embed.weight
        return cls(n_layers=cfg.total_layers, batch_size=batch_size, max_len=max_len or cfg.seq_len,
                   n_heads=cfg.n_attn_heads, head_dim=cfg.head_dim, device=param.device,
                   dtype=param.dtype)

    def advance(self, n: int) -> None:
        assert 0 <= n and self.length + n <= self.max_len, (self.length, n, self.max_len)
        self.length += n

    def rewind(self, n: int) -> None:
        assert 0 <= n <= self.length, (n, self.length)
        self.length -= n

    def reset(self) -> None:
        self.length = 0


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.n_heads, self.head_dim, self.layer_idx = cfg.n_attn_heads, cfg.head_dim, layer_idx
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x_BTD: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], start: int,
                cache: KVCache | None) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(x_BTD).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = rope[0][start:start + T], rope[1][start:start + T]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # (B, H, T, E)
        if cache is not None:
            cache.k[self.layer_idx, :, :, start:start + T] = k
            cache.v[self.layer_idx, :, :, start:start + T] = v
            k = cache.k[self.layer_idx, :, :, :start + T]
            v = cache.v[self.layer_idx, :, :, :start + T]
        mask, causal = None, start == 0 and T > 1
        if start > 0 and T > 1:  # new queries attend to the whole cached past and causally to each other
            mask = torch.arange(start + T, device=x_BTD.device) <= torch.arange(
                start, start + T, device=x_BTD.device)[:, None]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, D))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        self.up = nn.Linear(cfg.d_model, (2 if self.swiglu else 1) * cfg.ffn_dim, bias=False)
        self.out = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        h = self.up(x_BTD)
        if self.swiglu:
            gate, h = h.chunk(2, dim=-1)
            h = F.silu(gate) * h
        else:
            h = F.gelu(h)
        return self.out(h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg, layer_idx)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x_BTD, rope, start: int, cache: KVCache | None) -> torch.Tensor:
        x_BTD = x_BTD + self.drop(self.attn(self.attn_norm(x_BTD), rope, start, cache))
        return x_BTD + self.drop(self.mlp(self.mlp_norm(x_BTD)))


class Head(nn.Module):
    """One future-byte head: its layers (or one linear map) and its final norm."""

    def __init__(self, cfg: ModelConfig, first_layer_idx: int):
        super().__init__()
        if cfg.head_type == "linear":
            self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        else:
            self.layers = nn.ModuleList(Block(cfg, first_layer_idx + i) for i in range(cfg.head_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)

    def forward(self, x_BTD, rope, start: int, cache: KVCache | None) -> torch.Tensor:
        if hasattr(self, "proj"):
            return self.proj(x_BTD)
        for layer in self.layers:
            x_BTD = layer(x_BTD, rope, start, cache)
        return x_BTD


class ByteMTP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        self.embed = nn.Embedding(VOCAB_SIZE, cfg.d_model)
        self.trunk = nn.ModuleList(Block(cfg, i) for i in range(cfg.trunk_layers))
        self.heads = nn.ModuleList(
            Head(cfg, cfg.trunk_layers + k * cfg.layers_per_head) for k in range(cfg.n_future))
        n_unembed = cfg.n_future if cfg.unembed == "replicated" else 1
        self.unembed = nn.ModuleList(
            nn.Linear(cfg.d_model, VOCAB_SIZE, bias=False) for _ in range(n_unembed))
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) everywhere; the projections into the residual stream are scaled
        down by sqrt(2 x layers) so the stream's variance does not grow with depth."""
        std = self.config.init_std
        out_std = std / math.sqrt(2 * max(1, self.config.total_layers))
        for name, p in self.named_parameters():
            if p.dim() < 2:
                nn.init.ones_(p)
            else:
                is_out = name.endswith(("attn.out.weight", "mlp.out.weight"))
                nn.init.normal_(p, 0.0, out_std if is_out else std, generator=generator)

    def reset_rope(self) -> None:
        """Recompute the rotary tables (after building on the meta device and moving off it)."""
        cfg = self.config
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
        self.rope_cos, self.rope_sin = cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)

    def _start(self, T: int, cache: KVCache | None) -> int:
        start = cache.length if cache is not None else 0
        if start + T > self.config.seq_len:
            raise ValueError(f"sequence of {start + T} positions exceeds the context of "
                             f"{self.config.seq_len} (model.seq_len)")
        return start

    def forward(self, ids_BT: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Trunk state (B, T, D) for ids (B, T). With a cache, the ids follow its valid positions."""
        start = self._start(ids_BT.shape[1], cache)
        rope = (self.rope_cos, self.rope_sin)
        x_BTD = self.embed(ids_BT)
        for block in self.trunk:
            x_BTD = block(x_BTD, rope, start, cache)
        return x_BTD

    def head_input(self, k: int, z_BTD: torch.Tensor, prev_BTD: torch.Tensor | None) -> torch.Tensor:
        """What head k runs on: the trunk state, or head k-1's state for causal heads."""
        if self.config.head_type == "causal" and k > 0:
            assert prev_BTD is not None, "causal head k needs head k-1's state"
            return prev_BTD
        return z_BTD

    def head_state(self, k: int, x_BTD: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        start = self._start(x_BTD.shape[1], cache)
        return self.heads[k](x_BTD, (self.rope_cos, self.rope_sin), start, cache)

    def head_logits(self, k: int, h_BTD: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of head k from its state."""
        unembed = self.unembed[k if len(self.unembed) > 1 else 0]
        return unembed(self.heads[k].norm(h_BTD))

    def logits(self, ids_BT: torch.Tensor, cache: KVCache | None = None,
               n_heads: int | None = None) -> torch.Tensor:
        """Logits (B, T, K, V) of the first n_heads heads (all by default); advances the cache.

        Heads past n_heads do not run, so with a cache their keys and values for these positions
        are not written: a cache used with n_heads=1 serves next-byte decoding only.
        """
        z_BTD = self.forward(ids_BT, cache)
        out, h_BTD = [], None
        for k in range(self.config.n_future if n_heads is None else n_heads):
            h_BTD = self.head_state(k, self.head_input(k, z_BTD, h_BTD), cache)
            out.append(self.head_logits(k, h_BTD))
        if cache is not None:
            cache.advance(ids_BT.shape[1])
        return torch.stack(out, dim=2)

    def num_params(self, part: str = "all") -> int:
        """Parameters in the whole model, or in one part: embed, trunk, heads, unembed."""
        modules = {"embed": self.embed, "trunk": self.trunk, "heads": self.heads,
                   "unembed": self.unembed}
        params = self.parameters() if part == "all" else modules[part].parameters()
        return sum(p.numel() for p in params)
