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
layer (trunk and heads) in preallocated tensors with a length pointer per row; rewinding
rejected drafts moves pointers and reallocates nothing, and rows of a batch may stand at
different lengths (each row of a speculative batch accepts its own number of drafts).

`StackedHeads` is the decoding fast path: the weights of the first k independent heads stacked,
so that all k run as one batched layer (one matmul per projection instead of k), reading and
writing the same cache as the heads one by one. `logits(..., stacked=)` uses it; the per-head
modules stay the reference it is tested against.

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
    """Keys and values of every layer for decoding, preallocated, with a length pointer per row.

    Row b has `lengths[b]` valid positions; a forward pass with the cache writes each row's T new
    positions after its own valid ones and the caller advances the pointers (`ByteMTP.logits`
    does). `rewind(n)` forgets the newest n positions (of every row, or n[b] of row b), which the
    next forward pass overwrites; `keep(rows)` drops the other rows of the batch.
    """

    def __init__(self, *, n_layers: int, batch_size: int, max_len: int, n_heads: int,
                 head_dim: int, device: torch.device | str, dtype: torch.dtype):
        shape = (n_layers, batch_size, n_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.lengths = [0] * batch_size

    @classmethod
    def for_model(cls, model: ByteMTP, batch_size: int, max_len: int | None = None) -> KVCache:
        cfg = model.config
        param = model.embed.weight
        return cls(n_layers=cfg.total_layers, batch_size=batch_size, max_len=max_len or cfg.seq_len,
                   n_heads=cfg.n_attn_heads, head_dim=cfg.head_dim, device=param.device,
                   dtype=param.dtype)

    @property
    def length(self) -> int:
        """The rows' common length (an error when they differ)."""
        assert min(self.lengths) == max(self.lengths), self.lengths
        return self.lengths[0]

    def start(self, T: int) -> int | torch.Tensor:
        """Where T new positions go: an int when all rows stand alike, else each row's (B,) start."""
        lo, hi = min(self.lengths), max(self.lengths)
        assert hi + T <= self.max_len, (self.lengths, T, self.max_len)
        return lo if lo == hi else torch.tensor(self.lengths, device=self.k.device)

    def advance(self, n: int) -> None:
        assert 0 <= n and max(self.lengths) + n <= self.max_len, (self.lengths, n, self.max_len)
        self.lengths = [length + n for length in self.lengths]

    def rewind(self, n: int | list[int]) -> None:
        ns = [n] * len(self.lengths) if isinstance(n, int) else list(n)
        assert len(ns) == len(self.lengths) and all(0 <= m <= length for m, length in zip(ns, self.lengths)), \
            (ns, self.lengths)
        self.lengths = [length - m for length, m in zip(self.lengths, ns)]

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows of the batch, in this order (a copy of the kept rows)."""
        index = torch.tensor(rows, device=self.k.device, dtype=torch.long)
        self.k, self.v = self.k.index_select(1, index), self.v.index_select(1, index)
        self.lengths = [self.lengths[r] for r in rows]

    def reset(self) -> None:
        self.lengths = [0] * len(self.lengths)


def rope_at(rope: tuple[torch.Tensor, torch.Tensor], start: int | torch.Tensor,
            T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for T positions from `start`: (T, E/2), or (B, 1, T, E/2) for per-row starts."""
    if isinstance(start, int):
        return rope[0][start:start + T], rope[1][start:start + T]
    pos_BT = start[:, None] + torch.arange(T, device=start.device)
    return rope[0][pos_BT][:, None], rope[1][pos_BT][:, None]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor,
           cache_k: torch.Tensor | None, cache_v: torch.Tensor | None, dropout: float = 0.0) -> torch.Tensor:
    """Causal attention of T new queries (..., B, H, T, E) over the cached past and each other.

    With a cache, the new keys and values are written into `cache_k`/`cache_v` (..., B, H, L, E)
    at `start` (an int, or a (B,) tensor of per-row starts) and the queries attend to every
    valid position before them. Leading dims (stacked heads) fold into the batch for SDPA.
    """
    T = q.shape[-2]
    mask, causal = None, isinstance(start, int) and start == 0 and T > 1
    if cache_k is not None:
        if isinstance(start, int):
            cache_k[..., start:start + T, :] = k
            cache_v[..., start:start + T, :] = v
            L = start + T
            if start > 0 and T > 1:  # new queries see the whole cached past and causally each other
                mask = torch.arange(L, device=q.device) <= torch.arange(start, L, device=q.device)[:, None]
        else:
            rows = torch.arange(len(start), device=q.device)[:, None]
            pos_BT = start[:, None] + torch.arange(T, device=q.device)
            # (..., B, L, H, E) views put the row and position indices side by side
            cache_k.transpose(-3, -2)[..., rows, pos_BT, :, :] = k.transpose(-3, -2)
            cache_v.transpose(-3, -2)[..., rows, pos_BT, :, :] = v.transpose(-3, -2)
            L = int(start.max()) + T
            mask = (torch.arange(L, device=q.device) <= pos_BT[..., None])[:, None]  # (B, 1, T, L)
        k, v = cache_k[..., :L, :], cache_v[..., :L, :]
    lead, shape = q.shape[:-4], q.shape
    if lead:  # SDPA wants (N, H, T, E): fold the stacked heads into the batch
        B, H, E = q.shape[-4], q.shape[-3], q.shape[-1]
        n = math.prod(lead)
        q, k, v = (x.reshape(n * B, H, x.shape[-2], E) for x in (q, k, v))
        if mask is not None and mask.dim() == 4:
            mask = mask.repeat(n, 1, 1, 1)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout)
    return y.reshape(shape) if lead else y


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.n_heads, self.head_dim, self.layer_idx = cfg.n_attn_heads, cfg.head_dim, layer_idx
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x_BTD: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                start: int | torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(x_BTD).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = rope_at(rope, start, T)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # (B, H, T, E)
        ck, cv = (cache.k[self.layer_idx], cache.v[self.layer_idx]) if cache is not None else (None, None)
        y = attend(q, k, v, start, ck, cv, self.dropout if self.training else 0.0)
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

    def _start(self, T: int, cache: KVCache | None) -> int | torch.Tensor:
        end = (max(cache.lengths) if cache is not None else 0) + T
        if end > self.config.seq_len:
            raise ValueError(f"sequence of {end} positions exceeds the context of "
                             f"{self.config.seq_len} (model.seq_len)")
        return cache.start(T) if cache is not None else 0

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
               n_heads: int | None = None, stacked: StackedHeads | None = None) -> torch.Tensor:
        """Logits (B, T, K, V) of the first n_heads heads (all by default); advances the cache.

        Heads past n_heads do not run, so with a cache their keys and values for these positions
        are not written: a cache used with n_heads=1 serves next-byte decoding only. `stacked`
        (from `stack_heads(n_heads)`) runs the heads as one batched layer.
        """
        z_BTD = self(ids_BT, cache)  # through __call__, so wrappers' hooks run
        if stacked is not None:
            assert n_heads in (None, stacked.k), (n_heads, stacked.k)
            out = stacked(z_BTD, self._start(ids_BT.shape[1], cache), cache)
        else:
            heads, h_BTD = [], None
            for k in range(self.config.n_future if n_heads is None else n_heads):
                h_BTD = self.head_state(k, self.head_input(k, z_BTD, h_BTD), cache)
                heads.append(self.head_logits(k, h_BTD))
            out = torch.stack(heads, dim=2)
        if cache is not None:
            cache.advance(ids_BT.shape[1])
        return out

    def stack_heads(self, k: int) -> StackedHeads | None:
        """The first k heads stacked for decoding, or None where they cannot run side by side
        (causal heads: each needs the previous one's state)."""
        if self.config.head_type == "causal":
            return None
        return StackedHeads(self, k)

    def num_params(self, part: str = "all") -> int:
        """Parameters in the whole model, or in one part: embed, trunk, heads, unembed."""
        modules = {"embed": self.embed, "trunk": self.trunk, "heads": self.heads,
                   "unembed": self.unembed}
        params = self.parameters() if part == "all" else modules[part].parameters()
        return sum(p.numel() for p in params)


def _rms_norm(x: torch.Tensor, weight_K1D: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), eps=eps) * weight_K1D


class StackedHeads:
    """The first k independent heads with their weights stacked along a new leading dim: they
    run on the trunk state as one batched layer, into the same cache slots as `Head` by `Head`.

    A snapshot for inference: built from the model's weights when made, not kept in step with
    later training.
    """

    def __init__(self, model: ByteMTP, k: int):
        cfg = model.config
        assert cfg.head_type != "causal" and 1 <= k <= cfg.n_future, (cfg.head_type, k)
        self.k, self.cfg, self.model = k, cfg, model
        heads = list(model.heads)[:k]
        stack = lambda get: torch.stack([get(h) for h in heads]).detach()  # noqa: E731
        self.final_norm = stack(lambda h: h.norm.weight)[:, None, None, :]  # (K, 1, 1, D)
        if cfg.head_type == "linear":
            self.proj = stack(lambda h: h.proj.weight).transpose(1, 2)  # (K, D, D) as x @ W
            self.layers = []
        else:
            self.layers = [{
                "attn_norm": stack(lambda h: h.layers[i].attn_norm.weight)[:, None, None, :],
                "qkv": stack(lambda h: h.layers[i].attn.qkv.weight).transpose(1, 2),
                "out": stack(lambda h: h.layers[i].attn.out.weight).transpose(1, 2),
                "mlp_norm": stack(lambda h: h.layers[i].mlp_norm.weight)[:, None, None, :],
                "up": stack(lambda h: h.layers[i].mlp.up.weight).transpose(1, 2),
                "down": stack(lambda h: h.layers[i].mlp.out.weight).transpose(1, 2),
            } for i in range(cfg.head_layers)]
        if len(model.unembed) > 1:
            self.unembed = torch.stack([u.weight for u in list(model.unembed)[:k]]).detach().transpose(1, 2)
        else:
            self.unembed = model.unembed[0].weight.detach().t()  # (D, V), shared

    def _mm(self, x_KBTD: torch.Tensor, w_KDF: torch.Tensor) -> torch.Tensor:
        K, B, T, D = x_KBTD.shape
        return torch.bmm(x_KBTD.reshape(K, B * T, D), w_KDF).view(K, B, T, -1)

    def _attention(self, x_KBTD, layer: dict, i: int, start, cache: KVCache | None) -> torch.Tensor:
        cfg = self.cfg
        K, B, T, D = x_KBTD.shape
        H, E = cfg.n_attn_heads, cfg.head_dim
        qkv = self._mm(x_KBTD, layer["qkv"]).view(K, B, T, 3, H, E).permute(3, 0, 1, 4, 2, 5)
        cos, sin = rope_at((self.model.rope_cos, self.model.rope_sin), start, T)
        q, k, v = apply_rope(qkv[0], cos, sin), apply_rope(qkv[1], cos, sin), qkv[2]  # (K, B, H, T, E)
        ck = cv = None
        if cache is not None:  # head j's layer i sits at trunk + j * layers_per_head + i
            first, step = cfg.trunk_layers + i, cfg.layers_per_head
            ck = cache.k[first:first + self.k * step:step]
            cv = cache.v[first:first + self.k * step:step]
        y = attend(q, k, v, start, ck, cv)
        return self._mm(y.transpose(2, 3).reshape(K, B, T, D), layer["out"])

    def _mlp(self, x_KBTD, layer: dict) -> torch.Tensor:
        h = self._mm(x_KBTD, layer["up"])
        if self.cfg.mlp == "swiglu":
            gate, h = h.chunk(2, dim=-1)
            h = F.silu(gate) * h
        else:
            h = F.gelu(h)
        return self._mm(h, layer["down"])

    def __call__(self, z_BTD: torch.Tensor, start: int | torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """Logits (B, T, K, V) of the k heads on trunk state z (B, T, D)."""
        eps = self.cfg.norm_eps
        x = z_BTD.expand(self.k, *z_BTD.shape)
        if not self.layers:
            x = self._mm(x, self.proj)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(_rms_norm(x, layer["attn_norm"], eps), layer, i, start, cache)
            x = x + self._mlp(_rms_norm(x, layer["mlp_norm"], eps), layer)
        x = _rms_norm(x, self.final_norm, eps)
        if self.unembed.dim() == 3:
            logits = self._mm(x, self.unembed)
        else:
            logits = x @ self.unembed
        return logits.permute(1, 2, 0, 3)
