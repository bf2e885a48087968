"""The byte transformer with n future-byte heads (Gloeckle et al. 2024), in pure single-device PyTorch.

A shared trunk turns byte ids into a state z; head k (k = 0..n_future-1 here, predicting the
byte k+1 positions ahead) turns z into its own state and, through a final RMSNorm and an
unembedding, into logits. `forward` returns the trunk state only; `head_state` and
`head_logits` apply one head, so the memory-efficient training step can run the heads one at a
time; `logits` runs everything and returns (B, T, K, V).

Heads: `transformer` heads are independent stacks of `head_layers` blocks on z; `causal` heads
run on the previous head's output state (head 0 on z), so head k sees head k-1, like
DeepSeek-V3's sequential modules; `linear` heads are one D x D matrix each. What the code needs
of a head type it asks `config.head` (`bytemtp.config.HeadType`: layered, stackable, skippable,
its input, its cache layers), never the type's name. The unembedding is one matrix per head
(`replicated`) or one shared matrix.

The model is a pre-norm decoder: RMSNorm, rotary positions, SwiGLU (or GELU) feed-forward, and
attention through `scaled_dot_product_attention`. Every pass is handed its layout
(`bytemtp.model.layout.build_layout`): where each new position goes in the cache, its rotary
position and what it may attend to, built once a pass by the caller and passed to the trunk and
to every head. `forward`, `head_state`, `head_states`, `logits` and every `PassHeads` take it as a
required argument and never build one, so a pass whose layout differs from the plain causal one
(a tree of drafts, say) cannot reach one layer without reaching them all.

What a decoding pass runs after the trunk is `decode_heads()`, one interface
(`bytemtp.model.pass_heads.PassHeads`) over its kinds: the heads stacked into one batched layer
(`StackedHeads`), the heads one by one (`HeadsInTurn`, the reference that `logits` runs), or head 1
and the draft heads (`bytemtp.model.draft.DraftPass`).

Legend: B batch, T time, K heads, V vocabulary, D width, H attention heads, E head size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from bytemtp.config import ModelConfig
from bytemtp.vocab import BYTES, Vocabulary, emitted
from bytemtp.model.draft import DraftHeads, DraftPass, build_drafts
from bytemtp.model.pass_heads import HeadsInTurn, PassHeads, StackedHeads
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import Layout, attend
from bytemtp.model.transfer import to_device


def rope_tables(seq_len: int, head_dim: int, theta: float, *,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (seq_len, head_dim // 2), in float32, on `device`
    (None: the device modules are being built on, as nn.Linear's weights). Computed on the CPU and
    moved, so the tables are the same on every device."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device="cpu"), inv_freq)
    device = torch.get_default_device() if device is None else device
    return angles.cos().to(device), angles.sin().to(device)


def ngram_ids(ids_BT: torch.Tensor, history_BTJ: torch.Tensor, n: int, rows: int) -> torch.Tensor:
    """Rows (B, T) of the hashed n-gram table for n (`model.ngram_embeds`): a hash of each position's
    id and the n - 1 ids before it, `history_BTJ[..., j - 1]` the id j positions back (-1: the
    sequence had begun, so none). The hash is a polynomial modulo a prime, then modulo `rows`."""
    h = ids_BT.long() + 1
    for j in range(n - 1):
        h = (h * 1000003 + history_BTJ[..., j].long() + 1) % 2147483647
    return h % rows


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.n_attn_heads, self.head_dim, self.layer_idx = cfg.n_attn_heads, cfg.head_dim, layer_idx
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        # the first model.value_embeds trunk layers: an embedding of each position's id added to its values
        if layer_idx < min(cfg.value_embeds, cfg.trunk_layers):
            self.value_embed = nn.Embedding(cfg.table_rows, cfg.d_model)

    def forward(self, x_BTD: torch.Tensor, layout: Layout, cache: KVCache | None,
                ids_BT: torch.Tensor | None = None) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(x_BTD).view(B, T, 3, self.n_attn_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if hasattr(self, "value_embed"):  # a trunk layer's: its ids are the pass's
            v = v + self.value_embed(ids_BT).view(B, T, self.n_attn_heads, self.head_dim).transpose(1, 2)
        q, k = layout.rotate(q), layout.rotate(k)  # (B, H, T, E)
        ck, cv = (cache.k[self.layer_idx], cache.v[self.layer_idx]) if cache is not None else (None, None)
        y = attend(q, k, v, layout, ck, cv, self.dropout if self.training else 0.0)
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

    def forward(self, x_BTD, layout: Layout, cache: KVCache | None, ids_BT: torch.Tensor | None = None) -> torch.Tensor:
        x_BTD = x_BTD + self.drop(self.attn(self.attn_norm(x_BTD), layout, cache, ids_BT))
        return x_BTD + self.drop(self.mlp(self.mlp_norm(x_BTD)))


class Head(nn.Module):
    """One future-byte head: its layers (or one linear map) and its final norm."""

    def __init__(self, cfg: ModelConfig, first_layer_idx: int):
        super().__init__()
        if cfg.head.layered:
            self.layers = nn.ModuleList(Block(cfg, first_layer_idx + i) for i in range(cfg.head_layers))
        else:
            self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)

    def forward(self, x_BTD, layout: Layout, cache: KVCache | None) -> torch.Tensor:
        if hasattr(self, "proj"):
            return self.proj(x_BTD)
        for layer in self.layers:
            x_BTD = layer(x_BTD, layout, cache)
        return x_BTD


class ByteMTP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        # what the ids stand for: the bytes, or a BPE baseline's tokens (`bytemtp.vocab`), which a
        # checkpoint's tokenizer.json gives back (`runtime.checkpoint.load_model`)
        self.vocab: Vocabulary = BYTES
        self.embed = nn.Embedding(cfg.table_rows, cfg.d_model)
        # hashed n-gram tables (model.ngram_embeds), for n = 2, 3, ...: added to the byte embedding
        self.ngram = nn.ModuleList(nn.Embedding(cfg.ngram_rows, cfg.d_model) for _ in range(cfg.ngram_embeds - 1))
        self.trunk = nn.ModuleList(Block(cfg, i) for i in range(cfg.trunk_layers))
        self.heads = nn.ModuleList(
            Head(cfg, cfg.trunk_layers + k * cfg.layers_per_head) for k in range(cfg.n_future))
        n_unembed = cfg.n_future if cfg.unembed == "replicated" else 1
        self.unembed = nn.ModuleList(
            nn.Linear(cfg.d_model, cfg.table_rows, bias=False) for _ in range(n_unembed))
        self.drafter: DraftHeads | None = build_drafts(cfg)  # model.draft's heads (bytemtp.model.draft)
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @classmethod
    def build(cls, config: ModelConfig, device: torch.device | str, *,
              generator: torch.Generator | None = None) -> ByteMTP:
        """The model of `config` made on `device` and initialised from `generator` (a CPU one,
        see `init_weights`): built on the meta device and materialised once, so that nothing
        is drawn twice and no tensor lands wherever the process's default device points."""
        with torch.device("meta"):
            model = cls(config)
        model.to_empty(device=device)
        model.reset_rope()
        model.init_weights(generator)
        return model

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) everywhere; the projections into the residual stream are scaled
        down by sqrt(2 x layers) so the stream's variance does not grow with depth.

        Every draw is made on the CPU, from `generator` (a CPU generator; None: the global CPU
        one), and copied to wherever the parameter lives, so a seed gives the same weights on any
        device; parameters on the meta device (a model not yet materialised) draw nothing."""
        if generator is not None and generator.device.type != "cpu":
            raise ValueError(f"init_weights draws on the CPU, so that a seed gives the same weights on any "
                             f"device; pass a CPU generator, not one on {generator.device}")
        std = self.config.init_std
        out_std = std / math.sqrt(2 * max(1, self.config.total_layers))
        for name, p in self.named_parameters():
            if p.dim() < 2:
                nn.init.ones_(p)
            elif not p.is_meta:
                is_out = name.endswith(("attn.out.weight", "mlp.out.weight"))
                drawn = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                p.copy_(drawn.normal_(0.0, out_std if is_out else std, generator=generator))
        self.init_drafts()

    def init_drafts(self) -> None:
        """The draft heads (if any) as copies of head 1 (`DraftHeads.init_from`): where a tune starts."""
        if self.drafter is not None:
            self.drafter.init_from(self.heads[0].norm.weight, self.unembed[0].weight)

    def reset_rope(self) -> None:
        """Recompute the unsaved buffers, the rotary tables and the draft heads' mask (after building
        on the meta device and moving off it)."""
        cfg, device = self.config, self.embed.weight.device
        self.rope_cos, self.rope_sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta, device=device)
        if self.drafter is not None:
            self.drafter.allowed = to_device(emitted(cfg.vocab_size), device, torch.bool)

    def forward(self, ids_BT: torch.Tensor, cache: KVCache | None = None, *, layout: Layout) -> torch.Tensor:
        """Trunk state (B, T, D) for ids (B, T), placed as the pass's `layout` says (after the
        cache's valid positions, with a cache)."""
        x_BTD = self.embed(ids_BT)
        for n, table in enumerate(self.ngram, start=2):  # the ids before each node: the layout's (`ngram_history`)
            x_BTD = x_BTD + table(ngram_ids(ids_BT, layout.history, n, self.config.ngram_rows))
        for block in self.trunk:
            x_BTD = block(x_BTD, layout, cache, ids_BT)
        return x_BTD

    def head_input(self, k: int, z_BTD: torch.Tensor, prev_BTD: torch.Tensor | None) -> torch.Tensor:
        """What head k runs on: the trunk state, or head k-1's state for chained (causal) heads."""
        return self.config.head.head_input(k, z_BTD, prev_BTD)

    def head_state(self, k: int, x_BTD: torch.Tensor, cache: KVCache | None = None, *,
                   layout: Layout) -> torch.Tensor:
        """Head k's state (B, T, D) from its input, in the pass's `layout` (the trunk's)."""
        return self.heads[k](x_BTD, layout, cache)

    def head_states(self, z_BTD: torch.Tensor, cache: KVCache | None = None, *, layout: Layout,
                    heads: int | None = None, skip: frozenset[int] = frozenset()) -> Iterator[tuple[int, torch.Tensor]]:
        """(k, state) of the first `heads` heads (all by default), in order: each head runs on the
        trunk state z, or, for causal heads, on the previous head's state. The one loop over heads;
        a caller may run backward on head k before it asks for head k + 1. Heads in `skip` do not
        run (independent heads only: a causal head's state is the next one's input)."""
        assert not skip or self.config.head.skippable, f"{self.config.head_type} heads cannot skip a head"
        h_BTD = None
        for k in range(self.config.n_future if heads is None else heads):
            if k in skip:
                continue
            h_BTD = self.head_state(k, self.head_input(k, z_BTD, h_BTD), cache, layout=layout)
            yield k, h_BTD

    def head_logits(self, k: int, h_BTD: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of head k from its state."""
        unembed = self.unembed[k if len(self.unembed) > 1 else 0]
        return unembed(self.heads[k].norm(h_BTD))

    def logits(self, ids_BT: torch.Tensor, cache: KVCache | None = None, heads: int | None = None, *,
               layout: Layout, last: list[int] | None = None) -> torch.Tensor:
        """Logits (B, T, K, V) of the first `heads` output heads (all by default), the heads run one
        by one (`HeadsInTurn`, the reference); advances the cache.

        Heads past the first `heads` do not run, so with a cache their keys and values for these
        positions are not written: a cache used with heads=1 serves next-byte decoding only. `layout`
        (from `build_layout`) places the ids for the trunk and every head: a chain after the cache,
        or a tree of drafts. With `last` (one position per row) only those positions are unembedded:
        (B, 1, K, V), what a prefill needs. Decoding runs `decode_heads()` instead (`PassHeads.logits`).
        """
        return HeadsInTurn(self).logits(ids_BT, cache, heads=self.config.n_future if heads is None else heads,
                                        layout=layout, last=last)

    def decode_heads(self, *, stacked: bool = True) -> PassHeads:
        """What a decoding pass runs after the trunk (`pass_heads.PassHeads`): head 1 and the draft
        heads where the model has them (`model.draft`), else the training heads, stacked where they
        can run side by side (`StackedHeads`; not causal heads, nor with stacked=False: the
        reference), else one by one (`HeadsInTurn`)."""
        if self.drafter is not None:
            return DraftPass(self)
        if stacked and self.config.head.stackable:
            return StackedHeads(self)
        return HeadsInTurn(self)

    def cache_layers(self, heads: int, *, stacked: bool = False) -> tuple[int, ...]:
        """The cache layers that a pass of the first `heads` heads writes, in the order it writes
        them (`layout.written`): the trunk's, then each head's layers one by one, or with `stacked`
        (the pass runs `StackedHeads`) layer i of every head in turn."""
        cfg = self.config
        return cfg.head.cache_layers(trunk_layers=cfg.trunk_layers, head_layers=cfg.head_layers,
                                     heads=heads, stacked=stacked)

    def layers_written(self, heads: int) -> int:
        """How many cache layers a pass of the first `heads` heads writes: they are the cache's first
        this many (the trunk's, then heads 1..heads'), what `KVCache.compact(layers=)` takes; asked
        every pass, so counted rather than listed."""
        return self.config.trunk_layers + heads * self.config.layers_per_head

    def draft_heads(self) -> list[nn.Module]:
        """What `tune-heads` trains: the draft heads where the model has them (`model.draft`), else
        the modules that only heads 2..n use, their heads and their own unembeddings (a shared
        unembedding is head 1's too)."""
        if self.drafter is not None:
            return [self.drafter]
        own_unembed = list(self.unembed)[1:] if len(self.unembed) > 1 else []
        return list(self.heads)[1:] + own_unembed

    def num_params(self, part: str = "all") -> int:
        """Parameters in the whole model, or in one part: embed, ngram, trunk, heads, unembed."""
        modules = {"embed": self.embed, "ngram": self.ngram, "trunk": self.trunk, "heads": self.heads,
                   "unembed": self.unembed, "drafter": self.drafter or nn.Module()}
        params = self.parameters() if part == "all" else modules[part].parameters()
        return sum(p.numel() for p in params)
