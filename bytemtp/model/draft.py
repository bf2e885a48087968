"""Draft heads: cheap heads that exist to be accepted at decoding, beside the training heads.

The paper's heads (training heads, `bytemtp.model.model.Head`) shape the trunk while it trains;
in a small model they are most of its layers, so a pass that drafts with them costs nearly two
plain passes. Draft heads are the other role (`model.draft`): n_future - 1 small blocks on
head 1's state h (its output before the final norm, the model's "last hidden state"), where
draft depth d (1..n_future - 1) predicts the byte d + 1 positions ahead, as training head d + 1
does. They attend to nothing, so they write no cache and need none: a pass that drafts with them
runs the trunk and head 1 as a plain pass does, then a few small matrix products.

- `MedusaDrafts` (Medusa-1, Cai et al. 2024): depth d is one residual MLP block on h,
  u_d = h + SiLU(norm(h) W_d + b_d) O_d (hidden width 4 D), then its own RMSNorm and
  unembedding; all depths in one batched product.
- `HydraDrafts` (Hydra, Ankner et al. 2024; the sequential "Markov" drafts): depth d also reads
  the byte drafted at depth d - 1 (head 1's choice for depth 1), so a draft is a chain: s_0 = h,
  s_d = s_{d-1} + SiLU(norm(s_{d-1}) W_d + E[x_d] C_d + b_d) O_d, with E the model's own (frozen)
  byte embedding and x_d the byte read. In decoding x_d is the greedy choice of the depth before
  (`allowed` bytes only, as the decoder ranks candidates); in training the text's own byte
  (teacher forcing: on the model's own greedy text the two are the same wherever the draft is
  still being accepted).

Both start as copies of head 1 (`init_from`: the blocks' way out O at zero, each depth's norm
and unembedding head 1's), and `bytemtp tune-heads --draft` trains them with the trunk and head 1
frozen, on the model's own greedy text and from head 1 as teacher (KL or total variation), so
greedy output never changes. The decoder drafts with them when a model has them: `DraftPass` is
what its passes run after the trunk (a `pass_heads.PassHeads`, as `StackedHeads` is).

Legend: B batch, T time, K draft depths (n_future - 1), D width, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bytemtp.config import ModelConfig
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import Layout
from bytemtp.model.pass_heads import PassHeads
from bytemtp.vocab import emitted


class DraftHeads(nn.Module):
    """What both designs share: K = n_future - 1 depths, each a residual MLP block of hidden width
    4 D (`w_in` then `w_out`) with its own final norm and unembedding. Each design's `forward(h_BTD,
    first_BT, *, embed, forced_BTK=None, k=None, tables=None)` gives the logits (B, T, k, V) of the
    first k depths from head 1's state h: `first_BT` is the byte depth 1 reads (head 1's choice),
    `forced_BTK` the bytes depths 1..k read instead of the drafts (training: the text's own), and
    `tables` the byte tables a hydra block reads at decoding (`HydraDrafts.byte_tables`)."""

    name: str  # the design's (`bytemtp.config.DRAFT_DESIGNS`), which says what else it is

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        K, D = cfg.n_future - 1, cfg.d_model
        H = 4 * D
        self.depths, self.eps = K, cfg.norm_eps
        self.reads_bytes = cfg.drafts.reads_bytes  # whether depth d reads the byte drafted at depth d - 1
        self.w_in = nn.Parameter(torch.zeros(K, D, H))  # the block's map of the (normed) state, x @ w_in
        self.b = nn.Parameter(torch.zeros(K, 1, H))
        self.w_out = nn.Parameter(torch.zeros(K, H, D))  # back into the state
        self.norm_in = nn.Parameter(torch.ones(K, 1, D))
        self.norm = nn.Parameter(torch.ones(K, 1, D))  # each depth's final RMSNorm weight
        self.unembed = nn.Parameter(torch.zeros(K, D, cfg.table_rows))  # x @ unembed
        # the ids a draft reads as the one drafted before it (`vocab.emitted`), on the device built on
        self.register_buffer("allowed", torch.tensor(emitted(cfg.vocab_size), device=None), persistent=False)

    @torch.no_grad()
    def init_from(self, head1_norm: torch.Tensor, head1_unembed: torch.Tensor) -> None:
        """Every depth a copy of head 1 (its norm weight (D,), its unembedding (V, D)): the blocks'
        way out (`w_out`) at zero, so an untrained draft says what head 1 says at the same position.
        The ways in keep their random initialisation (`ByteMTP.init_weights`), so that the way out
        learns from the first step."""
        for p in (self.w_out, self.b):
            p.zero_()
        self.norm_in.fill_(1.0)
        self.norm.copy_(head1_norm.expand_as(self.norm))
        self.unembed.copy_(head1_unembed.t().expand_as(self.unembed))

    def _normed(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * weight


class MedusaDrafts(DraftHeads):
    """Parallel residual blocks on head 1's state (module docstring)."""

    name = "medusa"

    def forward(self, h_BTD, first_BT=None, *, embed, forced_BTK=None, k=None, tables=None):
        k = self.depths if k is None else k
        B, T, D = h_BTD.shape
        x = h_BTD.reshape(1, B * T, D).expand(k, B * T, D)
        u = x + torch.bmm(F.silu(torch.baddbmm(self.b[:k], self._normed(x, self.norm_in[:k]), self.w_in[:k])),
                          self.w_out[:k])
        return torch.bmm(self._normed(u, self.norm[:k]), self.unembed[:k]).view(k, B, T, -1).permute(1, 2, 0, 3)


class HydraDrafts(DraftHeads):
    """Sequential blocks that read the byte drafted before (module docstring)."""

    name = "hydra"

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        K, D = cfg.n_future - 1, cfg.d_model
        self.w_byte = nn.Parameter(torch.zeros(K, D, 4 * D))  # the byte's embedding into the block, E[x] @ w_byte

    def byte_tables(self, embed: nn.Embedding) -> torch.Tensor:
        """What each byte adds to each depth's block, E @ w_byte, (K, V, 4 D): a lookup in place of
        a product at decoding, where the weights are frozen (`DraftPass` makes it once)."""
        return torch.matmul(embed.weight.detach()[None], self.w_byte.detach())

    def forward(self, h_BTD, first_BT=None, *, embed, forced_BTK=None, k=None, tables=None):
        k = self.depths if k is None else k
        B, T, D = h_BTD.shape
        s = h_BTD.reshape(B * T, D)
        read = (forced_BTK[:, :, 0] if forced_BTK is not None else first_BT).reshape(B * T)
        out = []
        for d in range(k):
            byte = embed(read) @ self.w_byte[d] if tables is None else tables[d][read]
            hidden = F.silu(self._normed(s, self.norm_in[d]) @ self.w_in[d] + byte + self.b[d])
            s = s + hidden @ self.w_out[d]
            logits = self._normed(s, self.norm[d]) @ self.unembed[d]  # (BT, V)
            out.append(logits)
            if d + 1 < k:
                read = (forced_BTK[:, :, d + 1].reshape(B * T) if forced_BTK is not None else
                        logits.masked_fill(~self.allowed, float("-inf")).argmax(-1))
        return torch.stack(out, dim=1).view(B, T, k, -1)


DRAFTERS: dict[str, type[DraftHeads]] = {cls.name: cls for cls in (MedusaDrafts, HydraDrafts)}


def build_drafts(cfg: ModelConfig) -> DraftHeads | None:
    """The draft heads of the config's design (`ModelConfig.drafts`), or None where it has none."""
    return DRAFTERS[cfg.draft](cfg) if cfg.drafts.heads else None


def forced_logits(model, ids_BW: torch.Tensor, T: int, *, layout: Layout,
                 z_BTD: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Head 1's logits (B, T, V) and the draft heads' (B, T, n_future - 1, V) on the inputs
    ids_BW[:, :T], the drafts that read bytes reading the window's own (teacher forcing: depth d
    at t reads the byte at t + d)."""
    if z_BTD is None:
        z_BTD = model(ids_BW[:, :T], layout=layout)
    h_BTD = model.head_state(0, model.head_input(0, z_BTD, None), layout=layout)
    first = model.head_logits(0, h_BTD)
    K, forced = model.config.n_future - 1, None
    if model.drafter.reads_bytes:
        forced = torch.stack([ids_BW[:, d:d + T] for d in range(1, K + 1)], dim=2)
    return first, model.drafter(h_BTD, embed=model.embed, forced_BTK=forced)


class DraftPass(PassHeads):
    """What a decoding pass of a model with draft heads runs after the trunk (`pass_heads.PassHeads`):
    head 1 on the trunk state (its one layer writing its cache as in a plain pass), then the draft
    depths on head 1's state. Called at every position asked for (a prefill's last ones), it drafts
    from head 1's greedy choice there; a decoding pass runs in two phases instead: head 1 alone over
    the pass's nodes (`in_pass`), then, once the pass's picks are made, the drafts at every node
    from head 1's pick there (`after_picks`: a sampled row's drafts read its sampled byte), so the
    drafts after the node a row keeps come back with the pass's picks. Every pass writes the cache
    layers of a plain one, and no head's cache goes stale (`whole_after`)."""

    name = "draft"

    def __init__(self, model):
        assert model.drafter is not None, "the model has no draft heads"
        super().__init__(model)
        # a snapshot for inference, as StackedHeads is: what each byte adds to each hydra block
        drafter = model.drafter
        self.tables = drafter.byte_tables(model.embed) if drafter.reads_bytes else None

    def head1(self, z_BTD: torch.Tensor, layout: Layout, cache: KVCache | None,
              last: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Head 1's logits (B, T, 1, V) and state (B, T, D) (with `last`, at those positions only)."""
        model = self.model
        h_BTD = model.head_state(0, model.head_input(0, z_BTD, None), cache, layout=layout)
        if last is not None:
            h_BTD = h_BTD[torch.arange(len(last), device=h_BTD.device), last][:, None]  # (B, 1, D)
        return model.head_logits(0, h_BTD)[:, :, None], h_BTD

    def __call__(self, z_BTD, layout, cache, *, k, last=None):
        logits, h_BTD = self.head1(z_BTD, layout, cache, last)
        if k <= 1:
            return logits
        first = logits[:, :, 0].masked_fill(~self.model.drafter.allowed, float("-inf")).argmax(-1)
        drafts = self.model.drafter(h_BTD, first, embed=self.model.embed, k=k - 1, tables=self.tables)
        return torch.cat([logits, drafts.to(logits.dtype)], dim=2)

    def graph_heads(self, k: int) -> int:
        return 1

    def in_pass(self, z_BTD, layout, cache, *, k):
        return self.head1(z_BTD, layout, cache)

    def after_picks(self, states_ND: torch.Tensor, first_N: torch.Tensor, k: int) -> torch.Tensor:
        """The first k - 1 draft depths' logits (N, k - 1, V) from head 1's state at N nodes and
        the byte chosen at each."""
        model = self.model
        return model.drafter(states_ND[:, None], first_N[:, None], embed=model.embed, k=k - 1,
                             tables=self.tables)[:, 0]

    def finish(self, logits_BTJV, states, greedy, *, heads, first, after=None):
        """Head 1's logits with the draft depths' after it, read at every node from head 1's pick
        there (the byte the row emits if it keeps that node), so that the pass's picks, the drafts
        after the kept node among them, come back in its one transfer."""
        if heads <= 1:
            return logits_BTJV, greedy
        B, T = logits_BTJV.shape[:2]
        h_ND, first_N = states.reshape(B * T, -1), first(logits_BTJV, greedy).reshape(B * T).clamp(min=0)  # -1: a NaN, refused later
        more = (after or self.after_picks)(h_ND, first_N, heads)
        return torch.cat([logits_BTJV, more.view(B, T, more.shape[1], -1).to(logits_BTJV.dtype)], dim=2), None

    def cache_layers(self, heads: int) -> tuple[int, ...]:
        """The trunk's and head 1's, whatever the heads: draft heads attend to nothing."""
        return self.model.cache_layers(1)

    def layers_written(self, heads: int) -> int:
        return self.model.layers_written(1)

    def whole_after(self, heads: int) -> int:
        """Every head's: draft heads keep no cache, so none goes stale."""
        return self.model.config.n_future

    def record_key(self) -> list:
        """The draft heads' design is more than their name: their parameters' shapes too."""
        return [self.name, [[name, list(p.shape)] for name, p in self.model.drafter.named_parameters()]]
